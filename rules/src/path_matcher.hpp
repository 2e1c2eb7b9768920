#pragma once
// A rule table's patterns (Python `re` syntax, py_regex.hpp) matched against tree paths: which
// entry is the first to be found (re.search) in a path decoded from UTF-8. Private to the rules
// library (and src/program/ops/optim.cpp).
//
// PathMatcher is one DFA over Unicode code points for a list of patterns without lookaround or
// backreferences: a code point is mapped to a class (code points every set of the table treats
// alike), the class to the next state. Assertions that look one character ahead (\b, \B, $, \Z)
// are carried in the states as constraints on the next character; those that look back (^, \b)
// are known from the character just read. Built eagerly, immutable afterwards (thread-safe).
// PatternTable adds the bounded backtracker for the entries the DFA cannot decide.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "py_regex.hpp"

namespace shardplan::detail {

class PathMatcher {
 public:
  using State = std::uint32_t;
  /// Returned by scan() when the text ends inside a UTF-8 sequence that could still be valid.
  static constexpr State kIncomplete = 0xffffffffu;

  /// The DFA of these patterns (none may need the backtracker), or nullopt past `max_states`.
  static std::optional<PathMatcher> compile(const std::vector<const RegexNode*>& patterns,
                                            std::size_t max_states = 20000);

  /// The state before any text.
  State start() const { return 0; }
  /// The state after the code point `cp` following `s`.
  State step(State s, char32_t cp) const {
    return next_[s * num_classes_ + (cp < 0x80 ? ascii_class_[cp] : class_of(cp))];
  }
  /// Decodes the character at `p` (n > 0 bytes left; surrogateescape for invalid bytes) into
  /// `cp` and returns its length; `incomplete` as decode_utf8. Inline for valid 2- and 3-byte
  /// characters (Greek, CJK...), the rest in decode_utf8.
  static std::size_t decode(const unsigned char* p, std::size_t n, char32_t& cp,
                            bool* incomplete = nullptr) {
    const unsigned char b = p[0];
    if (b >= 0xc2 && b <= 0xdf && n >= 2 && (p[1] & 0xc0) == 0x80) {
      cp = (static_cast<char32_t>(b & 0x1f) << 6) | (p[1] & 0x3f);
      if (incomplete) *incomplete = false;
      return 2;
    }
    if (b >= 0xe1 && b <= 0xef && b != 0xed && n >= 3 && (p[1] & 0xc0) == 0x80 &&
        (p[2] & 0xc0) == 0x80) {
      cp = (static_cast<char32_t>(b & 0x0f) << 12) | (static_cast<char32_t>(p[1] & 0x3f) << 6) |
           (p[2] & 0x3f);
      if (incomplete) *incomplete = false;
      return 3;
    }
    return decode_utf8(p, n, cp, incomplete);
  }
  /// The state after `text` (UTF-8, invalid bytes as surrogateescape) following `s`, or, when
  /// `partial` (more text may follow), kIncomplete if it ends in the middle of a character.
  State scan(State s, std::string_view text, bool partial = true) const;
  /// The index (into the compiled list) of the first pattern found in a text that ends in
  /// state `s`, or -1.
  int first_match(State s) const { return result_[s]; }
  /// The same for a whole text.
  int first_match(std::string_view text) const { return result_[scan(start(), text, false)]; }
  std::size_t num_states() const { return result_.size(); }

 private:
  std::uint16_t class_of(char32_t cp) const {
    const std::uint16_t c = page_class_[cp >> 8];
    return c != kMixedPage ? c : class_in_mixed_page(cp);
  }
  std::uint16_t class_in_mixed_page(char32_t cp) const;
  static constexpr std::uint16_t kMixedPage = 0xffff;
  std::vector<std::uint16_t> page_class_;  // per 256 code points: their class, or kMixedPage
  std::size_t num_classes_ = 0;
  std::uint16_t ascii_class_[128] = {};
  std::vector<char32_t> starts_;      // class intervals above ASCII: first code point of each
  std::vector<std::uint16_t> class_;  // and its class
  std::vector<State> next_;           // num_states x num_classes
  std::vector<int> result_;           // per state
};

/// An entry's pattern that Python's re (or shardplan) rejects.
struct TablePatternError {
  std::size_t index;
  PatternSyntaxError error;
};
/// A search of entry `index` that went past the backtracker's step budget.
struct TableBudgetError {
  std::size_t index;
};

/// A table of patterns, searched in order: the DFA decides the entries it can, the bounded
/// backtracker the others. Immutable once built (thread-safe).
class PatternTable {
 public:
  /// Throws TablePatternError for the first bad pattern.
  explicit PatternTable(const std::vector<std::string>& patterns,
                        std::uint64_t budget = Backtracker::kDefaultBudget);
  ~PatternTable();
  PatternTable(PatternTable&&) noexcept;
  PatternTable& operator=(PatternTable&&) noexcept;

  /// The DFA of the whole table when no entry needs the backtracker (its indices are the
  /// table's), else nullptr.
  const PathMatcher* dfa() const { return all_in_dfa_ ? &*dfa_ : nullptr; }
  /// The index of the first entry found in `path`, or -1. Throws TableBudgetError.
  int first_match(std::string_view path) const;
  /// Whether entry i matches the empty path.
  bool matches_empty(std::size_t i) const { return empty_[i]; }
  std::size_t size() const { return empty_.size(); }

 private:
  int first_from(const std::u32string* decoded, std::string_view path, int dfa_result) const;
  std::optional<PathMatcher> dfa_;  // over dfa_entries_
  std::vector<int> dfa_entries_;    // DFA pattern k is table entry dfa_entries_[k]
  bool all_in_dfa_ = false;
  std::vector<std::pair<int, Backtracker>> backtracked_;  // (entry, matcher), in table order
  std::vector<bool> empty_;
  std::uint64_t budget_;
};

}  // namespace shardplan::detail
