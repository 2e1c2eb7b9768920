#pragma once
// A small JSON reader for the loaders (model descriptions, safetensors headers, index files):
// one pass, no recursion, objects kept in file order, time and memory linear in the input.
// nlohmann's ordered_json looks keys up linearly (quadratic on a 90k-tensor object) and its
// printers recurse; this reader bounds the nesting depth and keeps each value's source text for
// messages instead of printing it again.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace shardplan::detail::json {

/// True when the 8 bytes at `p` may all stand as they are inside a JSON string: printable
/// ASCII (0x20-0x7f) other than '"' and '\\'. The reader and the report writer skip such
/// words whole. (Each test is exact for "some byte of the word", which is all it needs: a
/// borrow can only come from a byte that already failed.)
inline bool plain_string_word(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  constexpr std::uint64_t kOnes = 0x0101010101010101ull, kHigh = 0x8080808080808080ull;
  auto has_zero = [](std::uint64_t x) { return (x - kOnes) & ~x & kHigh; };
  const std::uint64_t below_space = (v - 0x20 * kOnes) & ~v & kHigh;
  return ((v & kHigh) | below_space | has_zero(v ^ ('"' * kOnes)) | has_zero(v ^ ('\\' * kOnes))) ==
         0;
}

/// Deeper nesting than this is rejected (model files and headers nest 3 or 4 levels).
inline constexpr std::size_t kMaxDepth = 256;

enum class Kind : std::uint8_t { kNull, kBool, kUint, kInt, kNumber, kString, kArray, kObject };

/// A syntax error: `byte` is the offset in the text where it was found.
struct SyntaxError : std::runtime_error {
  SyntaxError(std::size_t at, const std::string& what) : std::runtime_error(what), byte(at) {}
  std::size_t byte;
};

class Document;

/// A value in a Document (a cheap handle; valid while the Document lives).
class Value {
 public:
  Kind kind() const;
  bool is_object() const { return kind() == Kind::kObject; }
  bool is_array() const { return kind() == Kind::kArray; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_null() const { return kind() == Kind::kNull; }
  /// A non-negative integer that fits 64 bits.
  bool is_uint() const { return kind() == Kind::kUint; }
  /// Members of an object, elements of an array.
  std::size_t size() const;
  /// The decoded text of a string (valid UTF-8).
  std::string_view str() const;
  std::uint64_t as_uint() const;
  bool as_bool() const { return as_uint() != 0; }
  /// Any number's value as a double (from its source text; may be +-inf for huge values:
  /// callers check std::isfinite).
  double as_double() const;
  /// "object", "array", "string", "number", "boolean", "null" (as nlohmann names them).
  const char* type_name() const;
  /// The value's text in the source, cut at `max` bytes with "..." (for messages).
  std::string source_text(std::size_t max = 200) const;

  /// Iterates the elements of an array, or the members of an object (key(), value()).
  class Iterator {
   public:
    bool operator!=(const Iterator& o) const { return i_ != o.i_; }
    Iterator& operator++();
    /// An array's element.
    Value operator*() const { return Value(doc_, i_); }
    /// An object's member.
    std::string_view key() const { return Value(doc_, i_).str(); }
    Value value() const { return Value(doc_, i_ + 1); }

   private:
    friend class Value;
    Iterator(const Document* d, std::uint32_t i) : doc_(d), i_(i) {}
    const Document* doc_;
    std::uint32_t i_;
    bool object_ = false;
  };
  Iterator begin() const;
  Iterator end() const;

 private:
  friend class Document;
  friend class Iterator;
  Value(const Document* d, std::uint32_t i) : doc_(d), i_(i) {}
  const Document* doc_;
  std::uint32_t i_;
};

/// A parsed JSON text. Throws SyntaxError for text that is not JSON (RFC 8259: UTF-8, no
/// trailing commas, nothing after the value) or nests deeper than `max_depth`.
class Document {
 public:
  Document(std::string_view text, std::size_t max_depth = kMaxDepth);
  Value root() const { return Value(this, 0); }

  /// One value, in document order; an object's members are key, value, key, value...
  struct Node {
    std::uint64_t number;     // kUint/kInt value, kBool, or a string's text (see Value::str)
    std::uint32_t end;        // index of the node after this value's subtree
    std::uint32_t size;       // members or elements
    std::uint32_t src_begin;  // the value's text in the source
    std::uint32_t src_end;
    Kind kind;
  };
  /// A string's `number`: offset and size, in the source text (no escapes) or in strings_.
  static constexpr std::uint64_t kInSource = std::uint64_t{1} << 63;

 private:
  friend class Value;
  friend class Value::Iterator;
  void parse(std::size_t max_depth);
  std::string_view text_;
  std::vector<Node> nodes_;
  std::string strings_;
};

/// A set of strings for duplicate checks over many keys: open addressing in one array (a
/// std::unordered_set allocates a node per key). The strings must outlive the set.
class KeySet {
 public:
  explicit KeySet(std::size_t expected) {
    std::size_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    slots_.resize(cap);
  }
  /// Adds `key`; false if it was there already.
  bool insert(std::string_view key) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    return place(key, hash(key));
  }

 private:
  struct Slot {
    std::uint64_t hash = 0;  // 0: free
    std::string_view key;
  };
  static std::uint64_t hash(std::string_view key) {
    return std::hash<std::string_view>()(key) | 1;  // (a word at a time), never 0
  }
  bool place(std::string_view key, std::uint64_t h) {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(h ^ (h >> 29)) & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.hash == 0) {
        s.hash = h;
        s.key = key;
        ++size_;
        return true;
      }
      if (s.hash == h && s.key == key) return false;
    }
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    size_ = 0;
    for (const Slot& s : old) {
      if (s.hash != 0) place(s.key, s.hash);
    }
  }
  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace shardplan::detail::json
