#include "py_regex.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include "py_regex_tables.hpp"
#include "shardplan/detail/utf8.hpp"

namespace shardplan::detail {

// ---- CharSet ----

void CharSet::add(char32_t lo, char32_t hi) {
  if (lo > hi) return;
  std::vector<Range> out;
  out.reserve(r_.size() + 1);
  bool placed = false;
  for (const Range& x : r_) {
    if (x.second + 1 < lo) {
      out.push_back(x);
    } else if (hi + 1 < x.first) {
      if (!placed) out.push_back({lo, hi}), placed = true;
      out.push_back(x);
    } else {
      lo = std::min(lo, x.first);
      hi = std::max(hi, x.second);
    }
  }
  if (!placed) out.push_back({lo, hi});
  r_ = std::move(out);
}

CharSet CharSet::from_ranges(std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end());
  CharSet s;
  for (const Range& x : ranges) {
    if (!s.r_.empty() && x.first <= s.r_.back().second + 1) {
      s.r_.back().second = std::max(s.r_.back().second, x.second);
    } else {
      s.r_.push_back(x);
    }
  }
  return s;
}

void CharSet::add(const CharSet& o) {
  std::vector<Range> all;
  all.reserve(r_.size() + o.r_.size());
  std::merge(r_.begin(), r_.end(), o.r_.begin(), o.r_.end(), std::back_inserter(all));
  r_.clear();
  for (const Range& x : all) {
    if (!r_.empty() && x.first <= r_.back().second + 1) {
      r_.back().second = std::max(r_.back().second, x.second);
    } else {
      r_.push_back(x);
    }
  }
}

CharSet CharSet::complement() const {
  CharSet s;
  char32_t next = 0;
  for (const Range& x : r_) {
    if (x.first > next) s.r_.push_back({next, x.first - 1});
    next = x.second + 1;
  }
  if (next <= kMax) s.r_.push_back({next, kMax});
  return s;
}

bool CharSet::contains(char32_t c) const {
  auto it = std::upper_bound(r_.begin(), r_.end(), c,
                             [](char32_t v, const Range& x) { return v < x.first; });
  return it != r_.begin() && std::prev(it)->second >= c;
}

namespace {
CharSet from_table(const CodeRange* t, std::size_t n) {
  std::vector<CharSet::Range> r;
  for (std::size_t i = 0; i < n; ++i) r.push_back({t[i].lo, t[i].hi});
  return CharSet::from_ranges(std::move(r));
}
}  // namespace

CharSet word_chars(bool ascii) {
  if (ascii) {
    CharSet s = CharSet::of('a', 'z');
    s.add('A', 'Z'), s.add('0', '9'), s.add('_', '_');
    return s;
  }
  static const CharSet w = from_table(kPyWord, kPyWord_size);
  return w;
}
CharSet digit_chars(bool ascii) {
  if (ascii) return CharSet::of('0', '9');
  static const CharSet d = from_table(kPyDigit, kPyDigit_size);
  return d;
}
CharSet space_chars(bool ascii) {
  if (ascii) {
    CharSet s = CharSet::of('\t', '\r');
    s.add(' ', ' ');
    return s;
  }
  static const CharSet sp = from_table(kPySpace, kPySpace_size);
  return sp;
}

// ---- UTF-8 ----

std::size_t decode_utf8(const unsigned char* p, std::size_t n, char32_t& cp, bool* incomplete) {
  const std::size_t len = utf8_decode(p, n, cp, incomplete);
  if (len != 0) return len;
  cp = 0xdc00 + p[0];  // surrogateescape
  return 1;
}

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t i = 0;
  while (i < text.size()) {
    char32_t cp = 0;
    i += decode_utf8(p + i, text.size() - i, cp);
    out.push_back(cp);
  }
  return out;
}

// ---- the parser (Python 3.11's re/_parser.py, rule for rule, on code points) ----

namespace {

constexpr char32_t kNone = 0xffffffff;

struct Flags {
  bool dotall = false, multiline = false, verbose = false, ascii = false;
};

std::string utf8(std::u32string_view s) {
  std::string out;
  for (const char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool is_oct(char32_t c) { return c >= '0' && c <= '7'; }
bool is_hex(char32_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool is_ascii_letter(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

NodePtr make(RegexNode::Kind k) {
  auto n = std::make_unique<RegexNode>();
  n->kind = k;
  return n;
}
NodePtr make_set(CharSet s) {
  auto n = make(RegexNode::kSet);
  n->set = std::move(s);
  return n;
}
NodePtr make_assert(Assertion a) {
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

  // ---- structure ----
  NodePtr parse_sub(Flags& flags, int nested) {
    auto alt = make(RegexNode::kAlt);
    while (true) {
      alt->kids.push_back(parse_seq(flags, nested + 1, nested == 0 && alt->kids.empty()));
      if (!match('|')) break;
    }
    if (alt->kids.size() == 1) return std::move(alt->kids[0]);
    return alt;
  }

  NodePtr parse_seq(Flags& flags, int nested, bool first) {
    auto seq = make(RegexNode::kConcat);
    bool last_is_repeat = false, last_is_at = false;
    while (!at_end()) {
      if (!next_escaped_ && (next_ == '|' || next_ == ')')) break;
      const char32_t c = next_;
      const bool escaped = next_escaped_;
      advance();
      if (flags.verbose && !escaped) {
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') continue;
        if (c == '#') {
          while (!at_end()) {
            const bool nl = next_is('\n');
            advance();
            if (nl) break;
          }
          continue;
        }
      }
      bool this_repeat = false, this_at = false;
      if (escaped) {
        Escape e = escape(c, flags, /*in_class=*/false);
        if (e.node) {
          this_at = e.node->kind == RegexNode::kAssert;
          seq->kids.push_back(std::move(e.node));
        } else if (e.is_class) {
          seq->kids.push_back(make_set(std::move(e.set)));
        } else {
          seq->kids.push_back(make_set(CharSet::of(e.ch, e.ch)));
        }
      } else if (c == '[') {
        seq->kids.push_back(make_set(bracket(flags)));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        const std::size_t here = tell();
        int lo = 0, hi = -1;
        if (c == '?') {
          hi = 1;
        } else if (c == '+') {
          lo = 1;
        } else if (c == '{') {
          if (next_is('}')) {
            seq->kids.push_back(make_set(CharSet::of('{', '{')));
            last_is_repeat = last_is_at = false;
            continue;
          }
          std::u32string los, his;
          while (next_len_ == 1 && is_digit(next_)) los += next_, advance();
          if (match(',')) {
            while (next_len_ == 1 && is_digit(next_)) his += next_, advance();
          } else {
            his = los;
          }
          if (!match('}')) {
            seq->kids.push_back(make_set(CharSet::of('{', '{')));
            seek(here);
            last_is_repeat = last_is_at = false;
            continue;
          }
          auto number = [&](const std::u32string& d) {
            if (d.size() > 9) return std::int64_t{1} << 40;
            std::int64_t v = 0;
            for (char32_t x : d) v = v * 10 + (x - '0');
            return v;
          };
          const std::int64_t l = los.empty() ? 0 : number(los);
          const std::int64_t h = his.empty() ? -1 : number(his);
          if (h >= 0 && h < l) throw PatternSyntaxError{"min repeat greater than max repeat", here};
          if (l > kMaxRepeat || h > kMaxRepeat)
            throw PatternSyntaxError{
                fmt::format("repeat count above {} is not supported by shardplan", kMaxRepeat),
                here - 1};
          lo = static_cast<int>(l);
          hi = static_cast<int>(h);
        }
        const std::size_t err_pos = here - 1;
        if (seq->kids.empty() || last_is_at) throw PatternSyntaxError{"nothing to repeat", err_pos};
        if (last_is_repeat) throw PatternSyntaxError{"multiple repeat", err_pos};
        auto r = make(RegexNode::kRepeat);
        r->min = lo;
        r->max = hi;
        if (match('?')) {
          // lazy: the same language
        } else if (match('+')) {
          r->possessive = true;
          needs_backtracker_ = true;
        }
        r->kids.push_back(std::move(seq->kids.back()));
        seq->kids.back() = std::move(r);
        this_repeat = true;
      } else if (c == '.') {
        seq->kids.push_back(make_set(flags.dotall ? CharSet::of(0, CharSet::kMax)
                                                  : CharSet::of('\n', '\n').complement()));
      } else if (c == '(') {
        std::optional<NodePtr> n = group(flags, nested, first && seq->kids.empty());
        if (!n) continue;  // a comment or global flags
        seq->kids.push_back(std::move(*n));
      } else if (c == '^') {
        seq->kids.push_back(
            make_assert(flags.multiline ? Assertion::kLineBegin : Assertion::kBegin));
        this_at = true;
      } else if (c == '$') {
        seq->kids.push_back(
            make_assert(flags.multiline ? Assertion::kLineEnd : Assertion::kDollar));
        this_at = true;
      } else {
        seq->kids.push_back(make_set(CharSet::of(c, c)));
      }
      last_is_repeat = this_repeat;
      last_is_at = this_at;
    }
    return seq;
  }

  void seek(std::size_t index) {
    index_ = index;
    advance();
  }

  std::u32string get_until(char32_t terminator, const char* name) {
    std::u32string result;
    while (true) {
      if (at_end()) {
        if (result.empty()) throw error(std::string("missing ") + name, 0);
        throw error(
            fmt::format("missing {}, unterminated name", utf8(std::u32string(1, terminator))),
            result.size());
      }
      const char32_t c = next_;
      const bool esc = next_escaped_;
      advance();
      if (!esc && c == terminator) {
        if (result.empty()) throw error(std::string("missing ") + name, 1);
        break;
      }
      if (esc) result += '\\';
      result += c;
    }
    return result;
  }

  static bool is_identifier(const std::u32string& name) {
    static const CharSet w = word_chars(false);
    if (name.empty() || is_digit(name[0])) return false;
    for (char32_t c : name) {
      if (!w.contains(c)) return false;
    }
    // str.isidentifier() also excludes some \w characters (e.g. digits that are not Nd as a
    // first character); names in rule tables are ASCII in practice.
    return !(name[0] < 0x80 && !is_ascii_letter(name[0]) && name[0] != '_');
  }

  void check_group_name(const std::u32string& name, std::size_t offset) {
    if (!is_identifier(name))
      throw error(fmt::format("bad character in group name '{}'", utf8(name)),
                  name.size() + offset);
  }

  std::optional<NodePtr> group(Flags& flags, int nested, bool first) {
    const std::size_t start = tell() - 1;
    // Python's parser recurses as well, and fails (RecursionError) somewhere near 1000 levels.
    if (++depth_ > kMaxDepth)
      throw PatternSyntaxError{
          fmt::format("groups nested deeper than {} are not supported by shardplan", kMaxDepth),
          start};
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    bool capture = true, atomic = false;
    std::optional<std::u32string> name;
    Flags inner = flags;
    if (match('?')) {
      if (at_end()) throw error("unexpected end of pattern", 0);
      const char32_t ch = next_;
      const bool esc = next_escaped_;
      advance();
      if (!esc && ch == 'P') {
        if (match('<')) {
          name = get_until('>', "group name");
          check_group_name(*name, 1);
        } else if (match('=')) {
          const std::u32string ref = get_until(')', "group name");
          check_group_name(ref, 1);
          auto it = names_.find(ref);
          if (it == names_.end())
            throw error(fmt::format("unknown group name '{}'", utf8(ref)), ref.size() + 1);
          if (open_.count(it->second)) throw error("cannot refer to an open group", ref.size() + 1);
          check_lookbehind_group(it->second);
          return backref(it->second);
        } else {
          if (at_end()) throw error("unexpected end of pattern", 0);
          const std::string t = token_text(next_, next_escaped_);
          const std::size_t len = next_len_;
          advance();
          throw error("unknown extension ?P" + t, len + 2);
        }
      } else if (!esc && ch == ':') {
        capture = false;
      } else if (!esc && ch == '#') {
        while (true) {
          if (at_end()) throw error("missing ), unterminated comment", tell() - start);
          const bool close = next_is(')');
          advance();
          if (close) break;
        }
        return std::nullopt;
      } else if (!esc && (ch == '=' || ch == '!' || ch == '<')) {
        bool behind = false;
        char32_t kind = ch;
        if (ch == '<') {
          if (at_end()) throw error("unexpected end of pattern", 0);
          kind = next_;
          const bool e2 = next_escaped_;
          const std::size_t len = next_len_;
          advance();
          if (e2 || (kind != '=' && kind != '!'))
            throw error("unknown extension ?<" + token_text(kind, e2), len + 2);
          behind = true;
        }
        const bool outer = lookbehind_groups_ < 0;
        if (behind && outer) lookbehind_groups_ = groups_;
        NodePtr p = parse_sub(inner, nested + 1);
        if (behind && outer) lookbehind_groups_ = -1;
        if (!match(')')) throw error("missing ), unterminated subpattern", tell() - start);
        auto n = make(RegexNode::kLook);
        n->behind = behind;
        n->negate = kind == '!';
        if (behind) {
          const auto [lo, hi] = width(*p);
          if (lo != hi) throw PatternSyntaxError{"look-behind requires fixed-width pattern", start};
          n->width = static_cast<int>(lo);
        }
        n->kids.push_back(std::move(p));
        needs_backtracker_ = true;
        return n;
      } else if (!esc && ch == '(') {
        const std::u32string cond = get_until(')', "group name");
        int g = 0;
        if (is_identifier(cond)) {
          auto it = names_.find(cond);
          if (it == names_.end())
            throw error(fmt::format("unknown group name '{}'", utf8(cond)), cond.size() + 1);
          g = it->second;
        } else {
          bool digits = !cond.empty();
          for (char32_t x : cond) digits = digits && is_digit(x);
          if (!digits || cond.size() > 9)
            throw error(fmt::format("bad character in group name '{}'", utf8(cond)),
                        cond.size() + 1);
          for (char32_t x : cond) g = g * 10 + static_cast<int>(x - '0');
          if (g == 0) throw error("bad group number", cond.size() + 1);
          cond_refs_.emplace(g, tell() - cond.size() - 1);
        }
        check_lookbehind_group(g);
        NodePtr yes = parse_seq(inner, nested + 1, false);
        NodePtr no;
        if (match('|')) {
          no = parse_seq(inner, nested + 1, false);
          if (next_is('|')) throw error("conditional backref with more than two branches", 0);
        }
        if (!match(')')) throw error("missing ), unterminated subpattern", tell() - start);
        auto n = make(RegexNode::kCond);
        n->group = g;
        n->kids.push_back(std::move(yes));
        n->kids.push_back(no ? std::move(no) : make(RegexNode::kEmpty));
        needs_backtracker_ = true;
        return n;
      } else if (!esc && ch == '>') {
        capture = false;
        atomic = true;
      } else if (!esc && (is_flag(ch) || ch == '-')) {
        flag_group_start_ = start;
        if (!parse_flags(ch, flags, inner)) {
          if (!first)
            throw error("global flags not at the start of the expression", tell() - start);
          return std::nullopt;
        }
        capture = false;
      } else {
        throw error("unknown extension ?" + token_text(ch, esc), (esc ? 2u : 1u) + 1);
      }
    }
    int gid = 0;
    if (capture) {
      gid = groups_++;
      if (name) {
        if (auto it = names_.find(*name); it != names_.end())
          throw error(fmt::format("redefinition of group name '{}' as group {}; was group {}",
                                  utf8(*name), gid, it->second),
                      name->size() + 1);
        names_.emplace(*name, gid);
      }
      open_.insert(gid);
    }
    NodePtr p = parse_sub(inner, nested + 1);
    if (!match(')')) throw error("missing ), unterminated subpattern", tell() - start);
    if (capture) {
      open_.erase(gid);
      group_widths_[gid] = width(*p);
    }
    if (atomic) {
      auto n = make(RegexNode::kAtomic);
      n->kids.push_back(std::move(p));
      needs_backtracker_ = true;
      return n;
    }
    auto n = make(RegexNode::kGroup);
    n->group = gid;
    n->kids.push_back(std::move(p));
    return n;
  }

  static bool is_flag(char32_t c) {
    return c == 'a' || c == 'i' || c == 'L' || c == 'm' || c == 's' || c == 'u' || c == 'x';
  }

  // Returns false for global flags "(?s)", true for a scoped group "(?s:" / "(?-s:".
  bool parse_flags(char32_t ch, Flags& global, Flags& scoped) {
    std::string add, del;
    bool escaped = false;
    if (ch != '-') {
      while (true) {
        if (ch == 'L') throw error("bad inline flags: cannot use 'L' flag with a str pattern", 0);
        add += static_cast<char>(ch);
        int types = 0;
        for (char f : add) types += f == 'a' || f == 'u' || f == 'L';
        if (types > 1 && (ch == 'a' || ch == 'u'))
          throw error("bad inline flags: flags 'a', 'u' and 'L' are incompatible", 0);
        if (at_end()) throw error("missing -, : or )", 0);
        ch = next_;
        escaped = next_escaped_;
        const std::size_t len = next_len_;
        advance();
        if (!escaped && (ch == ')' || ch == '-' || ch == ':')) break;
        if (escaped || !is_flag(ch))
          throw error(!escaped && is_alpha(ch) ? "unknown flag" : "missing -, : or )", len);
      }
    }
    if (ch == ')') {
      apply_flags(add, "", global);
      scoped = global;
      return false;
    }
    if (ch == '-') {
      if (at_end()) throw error("missing flag", 0);
      ch = next_;
      escaped = next_escaped_;
      std::size_t len = next_len_;
      advance();
      if (escaped || !is_flag(ch))
        throw error(!escaped && is_alpha(ch) ? "unknown flag" : "missing flag", len);
      while (true) {
        if (ch == 'a' || ch == 'u' || ch == 'L')
          throw error("bad inline flags: cannot turn off flags 'a', 'u' and 'L'", 0);
        del += static_cast<char>(ch);
        if (at_end()) throw error("missing :", 0);
        ch = next_;
        escaped = next_escaped_;
        len = next_len_;
        advance();
        if (!escaped && ch == ':') break;
        if (escaped || !is_flag(ch))
          throw error(!escaped && is_alpha(ch) ? "unknown flag" : "missing :", len);
      }
    }
    for (char f : add) {
      if (del.find(f) != std::string::npos)
        throw error("bad inline flags: flag turned on and off", 1);
    }
    apply_flags(add, del, scoped);
    return true;
  }

  static bool is_alpha(char32_t c) {
    static const CharSet w = word_chars(false);
    static const CharSet d = digit_chars(false);
    return is_ascii_letter(c) || (c >= 0x80 && w.contains(c) && !d.contains(c));
  }

  void apply_flags(const std::string& add, const std::string& del, Flags& f) {
    for (char c : add) {
      if (c == 'i')
        throw error("the flag 'i' (IGNORECASE) is not supported by shardplan rule patterns",
                    tell() - flag_group_start_);
      if (c == 's') f.dotall = true;
      if (c == 'm') f.multiline = true;
      if (c == 'x') f.verbose = true;
      if (c == 'a') f.ascii = true;
    }
    for (char c : del) {
      if (c == 's') f.dotall = false;
      if (c == 'm') f.multiline = false;
      if (c == 'x') f.verbose = false;
    }
  }

  void check_lookbehind_group(int g) {
    if (lookbehind_groups_ >= 0) {
      if (open_.count(g)) throw error("cannot refer to an open group", 0);
      if (g >= lookbehind_groups_)
        throw error("cannot refer to group defined in the same lookbehind subpattern", 0);
    }
  }

  NodePtr backref(int g) {
    auto n = make(RegexNode::kBackref);
    n->group = g;
    needs_backtracker_ = true;
    return n;
  }

  // ---- escapes ----
  Escape escape(char32_t c, const Flags& flags, bool in_class) {
    Escape e;
    auto klass = [&](CharSet s) {
      e.is_class = true;
      e.set = std::move(s);
      return std::move(e);
    };
    auto chr = [&](char32_t v) {
      e.is_char = true;
      e.ch = v;
      return std::move(e);
    };
    const std::string esc = token_text(c, true);
    switch (c) {
      case 'd':
        return klass(digit_chars(flags.ascii));
      case 'D':
        return klass(digit_chars(flags.ascii).complement());
      case 'w':
        return klass(word_chars(flags.ascii));
      case 'W':
        return klass(word_chars(flags.ascii).complement());
      case 's':
        return klass(space_chars(flags.ascii));
      case 'S':
        return klass(space_chars(flags.ascii).complement());
      case 'a':
        return chr(7);
      case 'f':
        return chr('\f');
      case 'n':
        return chr('\n');
      case 'r':
        return chr('\r');
      case 't':
        return chr('\t');
      case 'v':
        return chr('\v');
      case '\\':
        return chr('\\');
      default:
        break;
    }
    if (c == 'b') {
      if (in_class) return chr(8);
      e.node = make_assert(flags.ascii ? Assertion::kAsciiWord : Assertion::kWord);
      return e;
    }
    if (!in_class && (c == 'A' || c == 'B' || c == 'Z')) {
      e.node = make_assert(c == 'A'      ? Assertion::kBegin
                           : c == 'Z'    ? Assertion::kEnd
                           : flags.ascii ? Assertion::kAsciiNotWord
                                         : Assertion::kNotWord);
      return e;
    }
    if (c == 'x' || c == 'u' || c == 'U') {
      const std::size_t want = c == 'x' ? 2 : c == 'u' ? 4 : 8;
      std::u32string digits;
      while (digits.size() < want && next_len_ == 1 && is_hex(next_)) digits += next_, advance();
      if (digits.size() != want)
        throw error(fmt::format("incomplete escape {}{}", esc, utf8(digits)), digits.size() + 2);
      std::uint64_t v = 0;
      for (char32_t h : digits) v = v * 16 + (is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
      if (v > CharSet::kMax)
        throw error(fmt::format("bad escape {}{}", esc, utf8(digits)), digits.size() + 2);
      return chr(static_cast<char32_t>(v));
    }
    if (c == 'N') throw error("named escapes \\N{...} are not supported by shardplan", 2);
    if (in_class) {
      if (is_oct(c)) {
        std::u32string digits(1, c);
        while (digits.size() < 3 && next_len_ == 1 && is_oct(next_)) digits += next_, advance();
        char32_t v = 0;
        for (char32_t d : digits) v = v * 8 + (d - '0');
        if (v > 0377)
          throw error(fmt::format("octal escape value \\{} outside of range 0-0o377", utf8(digits)),
                      digits.size() + 1);
        return chr(v);
      }
      if (is_digit(c) || is_ascii_letter(c)) throw error("bad escape " + esc, 2);
      return chr(c);
    }
    if (c == '0') {
      std::u32string digits(1, c);
      while (digits.size() < 3 && next_len_ == 1 && is_oct(next_)) digits += next_, advance();
      char32_t v = 0;
      for (char32_t d : digits) v = v * 8 + (d - '0');
      return chr(v);
    }
    if (is_digit(c)) {
      std::u32string digits(1, c);
      if (next_len_ == 1 && is_digit(next_)) {
        digits += next_;
        advance();
        if (is_oct(digits[0]) && is_oct(digits[1]) && next_len_ == 1 && is_oct(next_)) {
          digits += next_;
          advance();
          char32_t v = 0;
          for (char32_t d : digits) v = v * 8 + (d - '0');
          if (v > 0377)
            throw error(
                fmt::format("octal escape value \\{} outside of range 0-0o377", utf8(digits)),
                digits.size() + 1);
          return chr(v);
        }
      }
      int g = 0;
      for (char32_t d : digits) g = g * 10 + static_cast<int>(d - '0');
      if (g < groups_) {
        if (open_.count(g)) throw error("cannot refer to an open group", digits.size() + 1);
        check_lookbehind_group(g);
        e.node = backref(g);
        return e;
      }
      throw error(fmt::format("invalid group reference {}", g), digits.size());
    }
    if (is_ascii_letter(c)) throw error("bad escape " + esc, 2);
    return chr(c);
  }

  CharSet bracket(const Flags& flags) {
    const std::size_t here = tell() - 1;
    const bool negate = match('^');
    CharSet set;
    bool any = false;
    while (true) {
      if (at_end()) throw error("unterminated character set", tell() - here);
      const char32_t c = next_;
      const bool esc = next_escaped_;
      const std::size_t len1 = next_len_;
      advance();
      if (!esc && c == ']' && any) break;
      any = true;
      Escape item;
      if (esc) {
        item = escape(c, flags, /*in_class=*/true);
      } else {
        item.is_char = true;
        item.ch = c;
      }
      const std::string text1 = token_text(c, esc);
      if (match('-')) {
        if (at_end()) throw error("unterminated character set", tell() - here);
        const char32_t d = next_;
        const bool esc2 = next_escaped_;
        const std::size_t len2 = next_len_;
        advance();
        if (!esc2 && d == ']') {
          if (item.is_class)
            set.add(item.set);
          else
            set.add(item.ch, item.ch);
          set.add('-', '-');
          break;
        }
        Escape hi;
        if (esc2) {
          hi = escape(d, flags, true);
        } else {
          hi.is_char = true;
          hi.ch = d;
        }
        const std::string msg = "bad character range " + text1 + "-" + token_text(d, esc2);
        // Python measures the offset with the token texts (escapes' digits included).
        if (!item.is_char || !hi.is_char || hi.ch < item.ch) throw error(msg, len1 + 1 + len2);
        set.add(item.ch, hi.ch);
      } else if (item.is_class) {
        set.add(item.set);
      } else {
        set.add(item.ch, item.ch);
      }
    }
    return negate ? set.complement() : set;
  }

  // The (min, max) width of a node in code points (max -1: unbounded), as Python's getwidth.
  std::pair<std::int64_t, std::int64_t> width(const RegexNode& n) const {
    constexpr std::int64_t kInf = -1;
    auto add = [](std::int64_t a, std::int64_t b) { return a < 0 || b < 0 ? kInf : a + b; };
    switch (n.kind) {
      case RegexNode::kEmpty:
      case RegexNode::kAssert:
      case RegexNode::kLook:
        return {0, 0};
      case RegexNode::kSet:
        return {1, 1};
      case RegexNode::kGroup:
      case RegexNode::kAtomic:
        return width(*n.kids[0]);
      case RegexNode::kConcat: {
        std::pair<std::int64_t, std::int64_t> w{0, 0};
        for (const auto& k : n.kids) {
          const auto kw = width(*k);
          w.first += kw.first;
          w.second = add(w.second, kw.second);
        }
        return w;
      }
      case RegexNode::kAlt:
      case RegexNode::kCond: {
        std::pair<std::int64_t, std::int64_t> w{-2, 0};
        for (const auto& k : n.kids) {
          const auto kw = width(*k);
          w.first = w.first == -2 ? kw.first : std::min(w.first, kw.first);
          w.second = w.second < 0 || kw.second < 0 ? kInf : std::max(w.second, kw.second);
        }
        if (w.first == -2) w.first = 0;
        return w;
      }
      case RegexNode::kRepeat: {
        const auto kw = width(*n.kids[0]);
        const std::int64_t hi =
            n.max < 0 ? (kw.second == 0 ? 0 : kInf) : (kw.second < 0 ? kInf : kw.second * n.max);
        return {kw.first * n.min, hi};
      }
      case RegexNode::kBackref: {
        auto it = group_widths_.find(n.group);
        return it == group_widths_.end() ? std::pair<std::int64_t, std::int64_t>{0, kInf}
                                         : it->second;
      }
    }
    return {0, 0};
  }

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

}  // namespace

ParsedPattern parse_py_regex(std::string_view pattern) {
  std::u32string cps;
  const auto* p = reinterpret_cast<const unsigned char*>(pattern.data());
  for (std::size_t i = 0; i < pattern.size();) {
    char32_t cp = 0;
    const std::size_t len = decode_utf8(p + i, pattern.size() - i, cp);
    if (cp >= 0xdc80 && cp <= 0xdcff && len == 1 && p[i] >= 0x80)
      throw PatternSyntaxError{"the pattern is not valid UTF-8", cps.size()};
    cps.push_back(cp);
    i += len;
  }
  return Parser(std::move(cps)).parse();
}

// ---- the backtracker: a program of instructions run with an explicit backtrack stack ----

struct Backtracker::Program {
  enum Op {
    kChar,
    kAssert,
    kSplit,
    kJmp,
    kSave,
    kMark,
    kProgress,
    kBackref,
    kLook,
    kAtomic,
    kCond,
    kMatch
  };
  struct Inst {
    Op op;
    int a = 0, b = 0;  // kChar: set; kSplit: targets; kJmp: a; kSave/kMark/kProgress: slot;
                       // kBackref/kCond: group (kCond b: else); kLook/kAtomic: sub entry
    Assertion assertion{};
    bool behind = false, negate = false;
    int width = 0;
  };
  std::vector<Inst> code;
  std::vector<CharSet> sets;
  int slots = 0;  // 2 per group, then loop marks
  int entry = 0;
  CharSet word, ascii_word;

  int emit(Inst i) {
    code.push_back(i);
    if (code.size() > 200000) throw PatternSyntaxError{"the pattern is too large for shardplan", 0};
    return static_cast<int>(code.size()) - 1;
  }

  // Appends `n` at the end of the code (fall-through continuation).
  void compile(const RegexNode& n) {
    switch (n.kind) {
      case RegexNode::kEmpty:
        return;
      case RegexNode::kSet:
        sets.push_back(n.set);
        emit({kChar, static_cast<int>(sets.size()) - 1});
        return;
      case RegexNode::kAssert: {
        Inst i{kAssert};
        i.assertion = n.assertion;
        emit(i);
        return;
      }
      case RegexNode::kConcat:
        for (const auto& k : n.kids) compile(*k);
        return;
      case RegexNode::kAlt: {
        std::vector<int> jumps;
        for (std::size_t k = 0; k < n.kids.size(); ++k) {
          if (k + 1 < n.kids.size()) {
            const int split = emit({kSplit});
            code[static_cast<std::size_t>(split)].a = split + 1;
            compile(*n.kids[k]);
            jumps.push_back(emit({kJmp}));
            code[static_cast<std::size_t>(split)].b = static_cast<int>(code.size());
          } else {
            compile(*n.kids[k]);
          }
        }
        for (int j : jumps) code[static_cast<std::size_t>(j)].a = static_cast<int>(code.size());
        return;
      }
      case RegexNode::kGroup:
        if (n.group > 0) emit({kSave, 2 * n.group});
        compile(*n.kids[0]);
        if (n.group > 0) emit({kSave, 2 * n.group + 1});
        return;
      case RegexNode::kRepeat: {
        if (n.possessive) {
          // An atomic group around the greedy repeat.
          const int jmp = emit({kJmp});
          const int sub = static_cast<int>(code.size());
          repeat(n);
          emit({kMatch});
          code[static_cast<std::size_t>(jmp)].a = static_cast<int>(code.size());
          emit({kAtomic, sub});
          return;
        }
        repeat(n);
        return;
      }
      case RegexNode::kBackref:
        emit({kBackref, n.group});
        return;
      case RegexNode::kLook:
      case RegexNode::kAtomic: {
        const int jmp = emit({kJmp});
        const int sub = static_cast<int>(code.size());
        compile(*n.kids[0]);
        emit({kMatch});
        code[static_cast<std::size_t>(jmp)].a = static_cast<int>(code.size());
        Inst i{n.kind == RegexNode::kLook ? kLook : kAtomic, sub};
        i.behind = n.behind, i.negate = n.negate, i.width = n.width;
        emit(i);
        return;
      }
      case RegexNode::kCond: {
        const int cond = emit({kCond, n.group});
        compile(*n.kids[0]);
        const int jmp = emit({kJmp});
        code[static_cast<std::size_t>(cond)].b = static_cast<int>(code.size());
        compile(*n.kids[1]);
        code[static_cast<std::size_t>(jmp)].a = static_cast<int>(code.size());
        return;
      }
    }
  }

  void repeat(const RegexNode& n) {
    const RegexNode& body = *n.kids[0];
    for (int k = 0; k < n.min; ++k) compile(body);
    if (n.max < 0) {
      // L: split(B, exit); B: mark; body; progress; jmp L. An iteration that consumes nothing
      // ends the loop (as Python does), so the loop cannot spin.
      const int slot = slots++;
      const int split = emit({kSplit});
      code[static_cast<std::size_t>(split)].a = split + 1;
      emit({kMark, slot});
      compile(body);
      emit({kProgress, slot});
      emit({kJmp, split});
      code[static_cast<std::size_t>(split)].b = static_cast<int>(code.size());
      return;
    }
    std::vector<int> splits;
    for (int k = n.min; k < n.max; ++k) {
      const int split = emit({kSplit});
      code[static_cast<std::size_t>(split)].a = split + 1;
      splits.push_back(split);
      compile(body);
    }
    for (int s : splits) code[static_cast<std::size_t>(s)].b = static_cast<int>(code.size());
  }

  bool is_word(char32_t c, bool ascii) const {
    return ascii ? ascii_word.contains(c) : word.contains(c);
  }

  bool check(Assertion a, const std::u32string& t, std::size_t pos) const {
    const std::size_t n = t.size();
    switch (a) {
      case Assertion::kBegin:
        return pos == 0;
      case Assertion::kLineBegin:
        return pos == 0 || t[pos - 1] == '\n';
      case Assertion::kDollar:
        return pos == n || (pos + 1 == n && t[pos] == '\n');
      case Assertion::kLineEnd:
        return pos == n || t[pos] == '\n';
      case Assertion::kEnd:
        return pos == n;
      case Assertion::kWord:
      case Assertion::kAsciiWord:
      case Assertion::kNotWord:
      case Assertion::kAsciiNotWord: {
        const bool ascii = a == Assertion::kAsciiWord || a == Assertion::kAsciiNotWord;
        const bool before = pos > 0 && is_word(t[pos - 1], ascii);
        const bool after = pos < n && is_word(t[pos], ascii);
        if (a == Assertion::kWord || a == Assertion::kAsciiWord) return before != after;
        return n > 0 && before == after;
      }
    }
    return false;
  }

  struct Frame {
    int pc;
    std::size_t pos;
    int slot;  // >= 0: restore slots[slot] = old (pc unused)
    std::int64_t old;
  };

  // Runs the code from `pc` at `pos` anchored; on kMatch returns true with `end` and `caps`.
  bool run(int pc, std::size_t pos, const std::u32string& t, std::vector<std::int64_t>& caps,
           std::size_t& end, std::uint64_t& steps, std::uint64_t budget) const {
    std::vector<Frame> stack;
    auto set_slot = [&](int slot, std::int64_t v) {
      stack.push_back({-1, 0, slot, caps[static_cast<std::size_t>(slot)]});
      caps[static_cast<std::size_t>(slot)] = v;
    };
    while (true) {
      if (++steps > budget) throw BacktrackBudgetExceeded{};
      const Inst& in = code[static_cast<std::size_t>(pc)];
      bool ok = true;
      switch (in.op) {
        case kChar:
          ok = pos < t.size() && sets[static_cast<std::size_t>(in.a)].contains(t[pos]);
          if (ok) ++pos, ++pc;
          break;
        case kAssert:
          ok = check(in.assertion, t, pos);
          ++pc;
          break;
        case kSplit:
          stack.push_back({in.b, pos, -1, 0});
          pc = in.a;
          break;
        case kJmp:
          pc = in.a;
          break;
        case kSave:
        case kMark:
          set_slot(in.a, static_cast<std::int64_t>(pos));
          ++pc;
          break;
        case kProgress:
          ok = caps[static_cast<std::size_t>(in.a)] != static_cast<std::int64_t>(pos);
          ++pc;
          break;
        case kBackref: {
          const std::int64_t b = caps[static_cast<std::size_t>(2 * in.a)];
          const std::int64_t e = caps[static_cast<std::size_t>(2 * in.a + 1)];
          ok = b >= 0 && e >= b;
          if (ok) {
            const auto len = static_cast<std::size_t>(e - b);
            ok = pos + len <= t.size() && std::equal(t.begin() + b, t.begin() + e,
                                                     t.begin() + static_cast<std::ptrdiff_t>(pos));
            if (ok) pos += len;
          }
          ++pc;
          break;
        }
        case kCond: {
          const bool matched = caps[static_cast<std::size_t>(2 * in.a)] >= 0 &&
                               caps[static_cast<std::size_t>(2 * in.a + 1)] >= 0;
          pc = matched ? pc + 1 : in.b;
          break;
        }
        case kLook:
        case kAtomic: {
          std::vector<std::int64_t> sub_caps = caps;
          std::size_t sub_end = 0;
          bool found = false;
          if (in.op == kLook && in.behind) {
            const auto w = static_cast<std::size_t>(in.width);
            found = pos >= w && run(in.a, pos - w, t, sub_caps, sub_end, steps, budget);
          } else {
            found = run(in.a, pos, t, sub_caps, sub_end, steps, budget);
          }
          if (in.op == kLook && in.negate) {
            ok = !found;
          } else {
            ok = found;
            if (found) {
              for (std::size_t k = 0; k < caps.size(); ++k) {
                if (sub_caps[k] != caps[k]) set_slot(static_cast<int>(k), sub_caps[k]);
              }
              if (in.op == kAtomic) pos = sub_end;
            }
          }
          ++pc;
          break;
        }
        case kMatch:
          end = pos;
          return true;
      }
      if (ok) continue;
      // Backtrack: undo slot writes down to the last choice point.
      while (true) {
        if (stack.empty()) return false;
        Frame f = stack.back();
        stack.pop_back();
        if (f.slot >= 0) {
          caps[static_cast<std::size_t>(f.slot)] = f.old;
          continue;
        }
        pc = f.pc;
        pos = f.pos;
        break;
      }
    }
  }
};

Backtracker::Backtracker(const ParsedPattern& p) : prog_(std::make_unique<Program>()) {
  prog_->slots = 2 * p.groups;
  prog_->word = word_chars(false);
  prog_->ascii_word = word_chars(true);
  prog_->compile(*p.root);
  prog_->emit({Program::kMatch});
}
Backtracker::~Backtracker() = default;
Backtracker::Backtracker(Backtracker&&) noexcept = default;
Backtracker& Backtracker::operator=(Backtracker&&) noexcept = default;

bool Backtracker::search(const std::u32string& text, std::uint64_t budget) const {
  std::uint64_t steps = 0;
  std::vector<std::int64_t> caps(static_cast<std::size_t>(prog_->slots), -1);
  for (std::size_t start = 0; start <= text.size(); ++start) {
    std::fill(caps.begin(), caps.end(), -1);
    std::size_t end = 0;
    if (prog_->run(prog_->entry, start, text, caps, end, steps, budget)) return true;
  }
  return false;
}

}  // namespace shardplan::detail
