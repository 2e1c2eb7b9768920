// The parser of Python `re` patterns: a pattern's structure (alternatives, sequences, repeats,
// groups and their extensions, inline flags) and the widths look-behinds need; escapes and
// classes in py_regex_escape.cpp.
#include "py_regex_parser.hpp"

namespace shardplan::detail {
namespace py_re {

NodePtr Parser::parse_sub(Flags& flags, int nested) {
  auto alt = make(RegexNode::kAlt);
  while (true) {
    alt->kids.push_back(parse_seq(flags, nested + 1, nested == 0 && alt->kids.empty()));
    if (!match('|')) break;
  }
  if (alt->kids.size() == 1) return std::move(alt->kids[0]);
  return alt;
}

NodePtr Parser::parse_seq(Flags& flags, int nested, bool first) {
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
      const std::optional<std::pair<int, int>> bounds = repeat_bounds(c, here);
      if (!bounds) {
        seq->kids.push_back(make_set(CharSet::of('{', '{')));
        last_is_repeat = last_is_at = false;
        continue;
      }
      const auto [lo, hi] = *bounds;
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
      seq->kids.push_back(make_assert(flags.multiline ? Assertion::kLineBegin : Assertion::kBegin));
      this_at = true;
    } else if (c == '$') {
      seq->kids.push_back(make_assert(flags.multiline ? Assertion::kLineEnd : Assertion::kDollar));
      this_at = true;
    } else {
      seq->kids.push_back(make_set(CharSet::of(c, c)));
    }
    last_is_repeat = this_repeat;
    last_is_at = this_at;
  }
  return seq;
}

// The (min, max) of the repeat `c` (* + ? or {) read just before `here` (max -1: unbounded);
// none when a '{' starts no bounds (it is a literal, and what follows it is read again).
std::optional<std::pair<int, int>> Parser::repeat_bounds(char32_t c, std::size_t here) {
  if (c == '?') return std::pair{0, 1};
  if (c == '+') return std::pair{1, -1};
  if (c == '*') return std::pair{0, -1};
  if (next_is('}')) return std::nullopt;
  std::u32string los, his;
  while (next_len_ == 1 && is_digit(next_)) los += next_, advance();
  if (match(',')) {
    while (next_len_ == 1 && is_digit(next_)) his += next_, advance();
  } else {
    his = los;
  }
  if (!match('}')) {
    seek(here);
    return std::nullopt;
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
        fmt::format("repeat count above {} is not supported by shardplan", kMaxRepeat), here - 1};
  return std::pair{static_cast<int>(l), static_cast<int>(h)};
}

std::u32string Parser::get_until(char32_t terminator, const char* name) {
  std::u32string result;
  while (true) {
    if (at_end()) {
      if (result.empty()) throw error(std::string("missing ") + name, 0);
      throw error(fmt::format("missing {}, unterminated name", utf8(std::u32string(1, terminator))),
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

bool Parser::is_identifier(const std::u32string& name) {
  static const CharSet w = word_chars(false);
  if (name.empty() || is_digit(name[0])) return false;
  for (char32_t c : name) {
    if (!w.contains(c)) return false;
  }
  // str.isidentifier() also excludes some \w characters (e.g. digits that are not Nd as a
  // first character); names in rule tables are ASCII in practice.
  return !(name[0] < 0x80 && !is_ascii_letter(name[0]) && name[0] != '_');
}

void Parser::check_group_name(const std::u32string& name, std::size_t offset) {
  if (!is_identifier(name))
    throw error(fmt::format("bad character in group name '{}'", utf8(name)), name.size() + offset);
}

std::optional<NodePtr> Parser::group(Flags& flags, int nested, bool first) {
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
      if (NodePtr ref = python_extension(name)) return ref;
    } else if (!esc && ch == ':') {
      capture = false;
    } else if (!esc && ch == '#') {
      skip_comment(start);
      return std::nullopt;
    } else if (!esc && (ch == '=' || ch == '!' || ch == '<')) {
      return lookaround(ch, inner, nested, start);
    } else if (!esc && ch == '(') {
      return conditional(inner, nested, start);
    } else if (!esc && ch == '>') {
      capture = false;
      atomic = true;
    } else if (!esc && (is_flag(ch) || ch == '-')) {
      flag_group_start_ = start;
      if (!parse_flags(ch, flags, inner)) {
        if (!first) throw error("global flags not at the start of the expression", tell() - start);
        return std::nullopt;
      }
      capture = false;
    } else {
      throw error("unknown extension ?" + token_text(ch, esc), (esc ? 2u : 1u) + 1);
    }
  }
  return capturing_group(inner, nested, start, capture, atomic, name);
}

// After "(?P": a group's name "<name>" (set in `name`; null returned) or a backreference
// "=name)" (returned).
NodePtr Parser::python_extension(std::optional<std::u32string>& name) {
  if (match('<')) {
    name = get_until('>', "group name");
    check_group_name(*name, 1);
    return nullptr;
  }
  if (match('=')) {
    const std::u32string ref = get_until(')', "group name");
    check_group_name(ref, 1);
    auto it = names_.find(ref);
    if (it == names_.end())
      throw error(fmt::format("unknown group name '{}'", utf8(ref)), ref.size() + 1);
    if (open_.count(it->second)) throw error("cannot refer to an open group", ref.size() + 1);
    check_lookbehind_group(it->second);
    return backref(it->second);
  }
  if (at_end()) throw error("unexpected end of pattern", 0);
  const std::string t = token_text(next_, next_escaped_);
  const std::size_t len = next_len_;
  advance();
  throw error("unknown extension ?P" + t, len + 2);
}

// After "(?#": up to and including the ')'.
void Parser::skip_comment(std::size_t start) {
  while (true) {
    if (at_end()) throw error("missing ), unterminated comment", tell() - start);
    const bool close = next_is(')');
    advance();
    if (close) break;
  }
}

// After "(?=", "(?!" or "(?<" (`ch`): a look-ahead or look-behind up to its ')'.
NodePtr Parser::lookaround(char32_t ch, Flags& inner, int nested, std::size_t start) {
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
}

// After "(?(": a conditional "(?(group)yes|no)" up to its ')'.
NodePtr Parser::conditional(Flags& inner, int nested, std::size_t start) {
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
      throw error(fmt::format("bad character in group name '{}'", utf8(cond)), cond.size() + 1);
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
}

// The rest of a group that is not an extension: its pattern up to ')', captured (numbered,
// and named when `name` is), atomic, or neither.
NodePtr Parser::capturing_group(Flags& inner, int nested, std::size_t start, bool capture,
                                bool atomic, const std::optional<std::u32string>& name) {
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

bool Parser::is_flag(char32_t c) {
  return c == 'a' || c == 'i' || c == 'L' || c == 'm' || c == 's' || c == 'u' || c == 'x';
}

// Returns false for global flags "(?s)", true for a scoped group "(?s:" / "(?-s:".
bool Parser::parse_flags(char32_t ch, Flags& global, Flags& scoped) {
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

bool Parser::is_alpha(char32_t c) {
  static const CharSet w = word_chars(false);
  static const CharSet d = digit_chars(false);
  return is_ascii_letter(c) || (c >= 0x80 && w.contains(c) && !d.contains(c));
}

void Parser::apply_flags(const std::string& add, const std::string& del, Flags& f) {
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

void Parser::check_lookbehind_group(int g) {
  if (lookbehind_groups_ >= 0) {
    if (open_.count(g)) throw error("cannot refer to an open group", 0);
    if (g >= lookbehind_groups_)
      throw error("cannot refer to group defined in the same lookbehind subpattern", 0);
  }
}

NodePtr Parser::backref(int g) {
  auto n = make(RegexNode::kBackref);
  n->group = g;
  needs_backtracker_ = true;
  return n;
}

// The (min, max) width of a node in code points (max -1: unbounded), as Python's getwidth.
std::pair<std::int64_t, std::int64_t> Parser::width(const RegexNode& n) const {
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

}  // namespace py_re

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
  return py_re::Parser(std::move(cps)).parse();
}

}  // namespace shardplan::detail
