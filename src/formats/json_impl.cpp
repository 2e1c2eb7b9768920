#include "json_impl.hpp"

#include <fmt/format.h>

#include <array>
#include <cstdlib>
#include <limits>

#include "shardplan/detail/utf8.hpp"

namespace shardplan::detail::json {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string describe_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return fmt::format("'{}'", c);
  return fmt::format("byte 0x{:02x}", u);
}

/// Length of the well-formed UTF-8 sequence at s[i] (a byte >= 0x80), or 0 (Unicode 15, table
/// 3-7: no overlong forms, no surrogates, nothing past U+10FFFF).
std::size_t utf8_length(std::string_view s, std::size_t i) {
  char32_t cp = 0;
  return utf8_decode(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i, cp);
}

// Bytes a string holds as they are, without a closer look: ASCII but '"', '\\' and controls.
constexpr std::array<bool, 256> kPlainInString = [] {
  std::array<bool, 256> t{};
  for (int c = 0x20; c < 0x80; ++c) t[static_cast<std::size_t>(c)] = c != '"' && c != '\\';
  return t;
}();

class Parser {
 public:
  Parser(std::string_view text, std::vector<Document::Node>& nodes, std::string& strings)
      : s_(text), nodes_(nodes), strings_(strings) {}

  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    throw SyntaxError(at, what);
  }

  void skip_ws() {
    while (i_ < s_.size() && is_ws(s_[i_])) ++i_;
  }

  /// Reads the string at s_[i_] (a '"'); returns where its text is (Document::Node::number).
  /// A string without escapes is its source text; others are decoded into strings_.
  std::uint64_t string() {
    const std::size_t start = i_;
    ++i_;
    const std::size_t offset = strings_.size();
    std::size_t run = i_;  // start of the bytes not yet copied
    bool escaped = false;
    while (true) {
      // Plain ASCII runs first: a word at a time, then a table lookup a byte.
      while (i_ + 8 <= s_.size() && plain_string_word(s_.data() + i_)) i_ += 8;
      while (i_ < s_.size() && kPlainInString[static_cast<unsigned char>(s_[i_])]) ++i_;
      if (i_ >= s_.size()) fail(start, "unterminated string");
      const char c = s_[i_];
      const auto u = static_cast<unsigned char>(c);
      if (c == '"') break;
      if (u < 0x20) fail(i_, fmt::format("control character 0x{:02x} in a string (escape it)", u));
      if (u >= 0x80) {
        const std::size_t len = utf8_length(s_, i_);
        if (len == 0) fail(i_, fmt::format("invalid UTF-8 (byte 0x{:02x}) in a string", u));
        i_ += len;
        continue;
      }
      if (c != '\\') {
        ++i_;
        continue;
      }
      escaped = true;
      strings_.append(s_.data() + run, i_ - run);
      const std::size_t esc = i_;
      if (i_ + 1 >= s_.size()) fail(esc, "unterminated string");
      const char e = s_[i_ + 1];
      i_ += 2;
      switch (e) {
        case '"':
          strings_ += '"';
          break;
        case '\\':
          strings_ += '\\';
          break;
        case '/':
          strings_ += '/';
          break;
        case 'b':
          strings_ += '\b';
          break;
        case 'f':
          strings_ += '\f';
          break;
        case 'n':
          strings_ += '\n';
          break;
        case 'r':
          strings_ += '\r';
          break;
        case 't':
          strings_ += '\t';
          break;
        case 'u': {
          std::uint32_t cp = hex4(esc);
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (i_ + 1 >= s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u') {
              fail(esc, "\\u escape of a high surrogate without its low surrogate");
            }
            const std::size_t esc2 = i_;
            i_ += 2;
            const std::uint32_t lo = hex4(esc2);
            if (lo < 0xDC00 || lo > 0xDFFF) {
              fail(esc2, "\\u escape of a high surrogate without its low surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail(esc, "\\u escape of a lone low surrogate");
          }
          append_utf8(strings_, cp);
          break;
        }
        default:
          fail(esc, fmt::format("invalid escape '\\{}' in a string", e));
      }
      run = i_;
    }
    if (!escaped) {
      ++i_;  // the closing quote
      return Document::kInSource | (std::uint64_t{start + 1} << 32) | (i_ - 2 - start);
    }
    strings_.append(s_.data() + run, i_ - run);
    ++i_;
    // Offsets and sizes fit 31 bits: the text is shorter than 2 GiB.
    return (std::uint64_t{offset} << 32) | (strings_.size() - offset);
  }

  std::uint32_t hex4(std::size_t esc) {
    if (i_ + 4 > s_.size()) fail(esc, "\\u escape needs four hex digits");
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= static_cast<std::uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v |= static_cast<std::uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v |= static_cast<std::uint32_t>(h - 'A' + 10);
      } else {
        fail(esc, "\\u escape needs four hex digits");
      }
    }
    return v;
  }

  /// The number at s_[i_]: kUint, kInt (negative, fits int64) or kNumber (anything else).
  void number(Document::Node& n) {
    const std::size_t start = i_;
    const bool neg = s_[i_] == '-';
    if (neg) ++i_;
    if (i_ < s_.size() && s_[i_] == '0') {
      ++i_;
    } else if (i_ < s_.size() && is_digit(s_[i_])) {
      while (i_ < s_.size() && is_digit(s_[i_])) ++i_;
    } else {
      fail(i_, "expected a digit in a number");
    }
    const std::size_t int_end = i_;
    bool integral = true;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (i_ >= s_.size() || !is_digit(s_[i_])) fail(i_, "expected a digit after '.'");
      while (i_ < s_.size() && is_digit(s_[i_])) ++i_;
      integral = false;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (i_ >= s_.size() || !is_digit(s_[i_])) fail(i_, "expected a digit in an exponent");
      while (i_ < s_.size() && is_digit(s_[i_])) ++i_;
      integral = false;
    }
    n.kind = Kind::kNumber;
    if (!integral) return;
    std::uint64_t v = 0;
    for (std::size_t k = start + (neg ? 1 : 0); k < int_end; ++k) {
      const auto d = static_cast<std::uint64_t>(s_[k] - '0');
      if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return;  // too large
      v = v * 10 + d;
    }
    if (!neg) {
      n.kind = Kind::kUint;
      n.number = v;
    } else if (v <= std::uint64_t{1} << 63) {
      n.kind = Kind::kInt;
      n.number = static_cast<std::uint64_t>(-static_cast<std::int64_t>(v - 1) - 1);
    }
  }

  void literal(Document::Node& n, std::string_view word, Kind kind, std::uint64_t value) {
    if (s_.substr(i_, word.size()) != word) {
      fail(i_, fmt::format("unexpected {}; expected a value", describe_char(s_[i_])));
    }
    i_ += word.size();
    n.kind = kind;
    n.number = value;
  }

  std::uint32_t push(Kind kind) {
    const auto idx = static_cast<std::uint32_t>(nodes_.size());
    nodes_.push_back(Document::Node{0, idx + 1, 0, static_cast<std::uint32_t>(i_),
                                    static_cast<std::uint32_t>(i_), kind});
    return idx;
  }

  /// A key of `object` at i_ (the text at a '"'), and the ':' after it.
  void key(std::uint32_t object) {
    ++nodes_[object].size;
    const std::uint32_t k = push(Kind::kString);
    nodes_[k].number = string();
    nodes_[k].src_end = static_cast<std::uint32_t>(i_);
    skip_ws();
    if (i_ >= s_.size() || s_[i_] != ':') {
      fail(i_, i_ >= s_.size()
                   ? "unexpected end of input; expected ':'"
                   : fmt::format("unexpected {}; expected ':'", describe_char(s_[i_])));
    }
    ++i_;
  }

  /// A string, number, true, false or null starting with `c` at i_.
  void scalar(char c) {
    const std::uint32_t idx = push(Kind::kNull);
    if (c == '"') {
      nodes_[idx].number = string();
      nodes_[idx].kind = Kind::kString;
    } else if (c == '-' || is_digit(c)) {
      number(nodes_[idx]);
    } else if (c == 't') {
      literal(nodes_[idx], "true", Kind::kBool, 1);
    } else if (c == 'f') {
      literal(nodes_[idx], "false", Kind::kBool, 0);
    } else if (c == 'n') {
      literal(nodes_[idx], "null", Kind::kNull, 0);
    } else {
      fail(i_, fmt::format("unexpected {}; expected a value", describe_char(c)));
    }
    nodes_[idx].src_end = static_cast<std::uint32_t>(i_);
  }

  void run(std::size_t max_depth) {
    enum class Next { kValue, kKey, kAfter };
    Next next = Next::kValue;
    std::vector<std::uint32_t> open;  // the containers not yet closed, outermost first
    while (true) {
      skip_ws();
      if (next == Next::kKey) {
        if (i_ >= s_.size() || s_[i_] != '"') {
          fail(i_, i_ >= s_.size() ? "unexpected end of input; expected a string key"
                                   : fmt::format("unexpected {}; expected a string key",
                                                 describe_char(s_[i_])));
        }
        key(open.back());
        next = Next::kValue;
        continue;
      }
      if (next == Next::kValue) {
        if (i_ >= s_.size()) fail(i_, "unexpected end of input; expected a value");
        if (!open.empty() && nodes_[open.back()].kind == Kind::kArray) ++nodes_[open.back()].size;
        const char c = s_[i_];
        if (c == '{' || c == '[') {
          if (open.size() >= max_depth) {
            fail(i_, fmt::format("nesting deeper than {} levels", max_depth));
          }
          const std::uint32_t idx = push(c == '{' ? Kind::kObject : Kind::kArray);
          open.push_back(idx);
          ++i_;
          skip_ws();
          if (i_ < s_.size() && s_[i_] == (c == '{' ? '}' : ']')) {
            ++i_;
            nodes_[idx].src_end = static_cast<std::uint32_t>(i_);
            open.pop_back();
            next = Next::kAfter;
          } else {
            next = c == '{' ? Next::kKey : Next::kValue;
          }
          continue;
        }
        scalar(c);
        next = Next::kAfter;
        continue;
      }
      // After a value: a separator, the end of its container, or the end of the text.
      if (open.empty()) {
        if (i_ != s_.size())
          fail(i_, fmt::format("unexpected {} after the value", describe_char(s_[i_])));
        return;
      }
      Document::Node& top = nodes_[open.back()];
      const char close = top.kind == Kind::kObject ? '}' : ']';
      if (i_ >= s_.size())
        fail(i_, fmt::format("unexpected end of input; expected ',' or '{}'", close));
      if (s_[i_] == ',') {
        ++i_;
        next = top.kind == Kind::kObject ? Next::kKey : Next::kValue;
        continue;
      }
      if (s_[i_] != close) {
        fail(i_, fmt::format("unexpected {}; expected ',' or '{}'", describe_char(s_[i_]), close));
      }
      ++i_;
      top.end = static_cast<std::uint32_t>(nodes_.size());
      top.src_end = static_cast<std::uint32_t>(i_);
      open.pop_back();
    }
  }

 private:
  std::string_view s_;
  std::size_t i_ = 0;
  std::vector<Document::Node>& nodes_;
  std::string& strings_;
};

}  // namespace

Document::Document(std::string_view text, std::size_t max_depth) : text_(text) { parse(max_depth); }

void Document::parse(std::size_t max_depth) {
  if (text_.size() >= std::numeric_limits<std::int32_t>::max()) {
    throw SyntaxError(0, "text of 2 GiB or more");
  }
  nodes_.reserve(text_.size() / 8 + 1);
  Parser(text_, nodes_, strings_).run(max_depth);
}

Kind Value::kind() const { return doc_->nodes_[i_].kind; }
std::size_t Value::size() const { return doc_->nodes_[i_].size; }

std::string_view Value::str() const {
  const std::uint64_t v = doc_->nodes_[i_].number;
  const std::size_t offset = (v & ~Document::kInSource) >> 32;
  const std::size_t size = v & 0xFFFFFFFFu;
  return (v & Document::kInSource ? doc_->text_ : std::string_view(doc_->strings_))
      .substr(offset, size);
}

std::uint64_t Value::as_uint() const { return doc_->nodes_[i_].number; }

double Value::as_double() const {
  const auto& n = doc_->nodes_[i_];
  if (n.kind == Kind::kUint) return static_cast<double>(n.number);
  if (n.kind == Kind::kInt) return static_cast<double>(static_cast<std::int64_t>(n.number));
  // A JSON number's text is ASCII digits, sign, '.', 'e': strtod reads it whole (in the "C"
  // locale's format, which JSON's is); out of range gives +-HUGE_VAL or 0.
  const std::string text(doc_->text_.substr(n.src_begin, n.src_end - n.src_begin));
  return std::strtod(text.c_str(), nullptr);
}

const char* Value::type_name() const {
  switch (kind()) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "boolean";
    case Kind::kUint:
    case Kind::kInt:
    case Kind::kNumber:
      return "number";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "array";
    case Kind::kObject:
      return "object";
  }
  return "value";
}

std::string Value::source_text(std::size_t max) const {
  const auto& n = doc_->nodes_[i_];
  std::string_view t = doc_->text_.substr(n.src_begin, n.src_end - n.src_begin);
  if (t.size() <= max) return std::string(t);
  // Cut at a character boundary.
  std::size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(t[cut]) & 0xC0) == 0x80) --cut;
  return std::string(t.substr(0, cut)) + "...";
}

Value::Iterator Value::begin() const {
  Iterator it(doc_, i_ + 1);
  it.object_ = is_object();
  return it;
}

Value::Iterator Value::end() const {
  Iterator it(doc_, doc_->nodes_[i_].end);
  it.object_ = is_object();
  return it;
}

Value::Iterator& Value::Iterator::operator++() {
  i_ = doc_->nodes_[object_ ? i_ + 1 : i_].end;
  return *this;
}

}  // namespace shardplan::detail::json
