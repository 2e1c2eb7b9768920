#pragma once
// The parser of Python `re` patterns (Python 3.11's re/_parser.py, rule for rule, on code points),
// private to py_regex_*.cpp: a pattern's structure (groups, repeats, flags) in
// py_regex_parser.cpp, its escapes and character classes in py_regex_escape.cpp. The entry point
// is parse_py_regex (py_regex.hpp).
#include <fmt/format.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "py_regex.hpp"
#include "shardplan/detail/utf8.hpp"

namespace shardplan::detail::py_re {

constexpr char32_t kNone = 0xffffffff;

struct Flags {
  bool dotall = false, multiline = false, verbose = false, ascii = false;
};

inline std::string utf8(std::u32string_view s) {
  std::string out;
  for (const char32_t c : s) append_utf8(out, c);
  return out;
}

inline bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }
inline bool is_oct(char32_t c) { return c >= '0' && c <= '7'; }
inline bool is_hex(char32_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
inline bool is_ascii_letter(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

inline NodePtr make(RegexNode::Kind k) {
  auto n = std::make_unique<RegexNode>();
  n->kind = k;
  return n;
}
inline NodePtr make_set(CharSet s) {
  auto n = make(RegexNode::kSet);
  n->set = std::move(s);
  return n;
}
inline NodePtr make_assert(Assertion a) {
  auto n = make(RegexNode::kAssert);
  n->assertion = a;
  return n;
}

/// What an escape stands for: one character, a class, or an assertion/backreference node.
struct Escape {
  bool is_char = false;
  char32_t ch = 0;
  bool is_class = false;
  CharSet set;
  NodePtr node;  // assertion or backreference (outside classes only)
};

class Parser {
 public:
  explicit Parser(std::u32string p) : s_(std::move(p)) { advance(); }

  ParsedPattern parse() {
    ParsedPattern out;
    Flags flags;
    out.root = parse_sub(flags, 0);
    if (next_len_) throw error("unbalanced parenthesis", 0);
    for (const auto& [g, pos] : cond_refs_) {
      if (g >= groups_) throw PatternSyntaxError{fmt::format("invalid group reference {}", g), pos};
    }
    out.groups = groups_;
    out.needs_backtracker = needs_backtracker_;
    return out;
  }

 private:
  // ---- the tokenizer: a token is one character or a backslash and the next one ----
  void advance() {
    if (index_ >= s_.size()) {
      next_len_ = 0;
      return;
    }
    next_ = s_[index_];
    next_len_ = 1;
    next_escaped_ = false;
    if (next_ == '\\') {
      if (index_ + 1 >= s_.size())
        throw PatternSyntaxError{"bad escape (end of pattern)", s_.size() - 1};
      next_ = s_[index_ + 1];
      next_len_ = 2;
      next_escaped_ = true;
    }
    index_ += next_len_;
  }
  bool at_end() const { return next_len_ == 0; }
  bool next_is(char32_t c) const { return next_len_ == 1 && next_ == c; }
  bool match(char32_t c) {
    if (next_is(c)) {
      advance();
      return true;
    }
    return false;
  }
  std::size_t tell() const { return index_ - next_len_; }
  PatternSyntaxError error(std::string msg, std::size_t offset) const {
    return PatternSyntaxError{std::move(msg), tell() - offset};
  }
  std::string token_text(char32_t c, bool escaped) const {
    return (escaped ? std::string("\\") : std::string()) + utf8(std::u32string(1, c));
  }

  void seek(std::size_t index) {
    index_ = index;
    advance();
  }

  // ---- structure (py_regex_parser.cpp) ----
  NodePtr parse_sub(Flags& flags, int nested);
  NodePtr parse_seq(Flags& flags, int nested, bool first);
  std::optional<std::pair<int, int>> repeat_bounds(char32_t c, std::size_t here);
  std::u32string get_until(char32_t terminator, const char* name);
  static bool is_identifier(const std::u32string& name);
  void check_group_name(const std::u32string& name, std::size_t offset);
  std::optional<NodePtr> group(Flags& flags, int nested, bool first);
  NodePtr python_extension(std::optional<std::u32string>& name);
  void skip_comment(std::size_t start);
  NodePtr lookaround(char32_t ch, Flags& inner, int nested, std::size_t start);
  NodePtr conditional(Flags& inner, int nested, std::size_t start);
  NodePtr capturing_group(Flags& inner, int nested, std::size_t start, bool capture, bool atomic,
                          const std::optional<std::u32string>& name);
  static bool is_flag(char32_t c);
  bool parse_flags(char32_t ch, Flags& global, Flags& scoped);
  static bool is_alpha(char32_t c);
  void apply_flags(const std::string& add, const std::string& del, Flags& f);
  void check_lookbehind_group(int g);
  NodePtr backref(int g);
  std::pair<std::int64_t, std::int64_t> width(const RegexNode& n) const;

  // ---- escapes (py_regex_escape.cpp) ----
  Escape escape(char32_t c, const Flags& flags, bool in_class);
  char32_t hex_escape(char32_t c, const std::string& esc);
  Escape digit_escape(char32_t c);
  CharSet bracket(const Flags& flags);

  std::u32string s_;
  std::size_t index_ = 0;
  char32_t next_ = kNone;
  std::size_t next_len_ = 0;
  bool next_escaped_ = false;
  int groups_ = 1;
  std::map<std::u32string, int> names_;
  std::map<int, std::pair<std::int64_t, std::int64_t>> group_widths_;
  std::map<int, std::size_t> cond_refs_;
  std::set<int> open_;
  int lookbehind_groups_ = -1;
  std::size_t flag_group_start_ = 0;
  static constexpr int kMaxDepth = 200;
  int depth_ = 0;
  bool needs_backtracker_ = false;
};

}  // namespace shardplan::detail::py_re
