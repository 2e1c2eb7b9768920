// The parser of Python `re` patterns, continued: escapes (classes, characters, assertions,
// backreferences) and bracketed character classes, with Python's messages and offsets.
#include "py_regex_parser.hpp"

namespace shardplan::detail::py_re {

Escape Parser::escape(char32_t c, const Flags& flags, bool in_class) {
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
  if (c == 'x' || c == 'u' || c == 'U') return chr(hex_escape(c, esc));
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
  if (is_digit(c)) return digit_escape(c);
  if (is_ascii_letter(c)) throw error("bad escape " + esc, 2);
  return chr(c);
}

// The character of \xhh, \uhhhh or \Uhhhhhhhh (`c`: x, u or U; `esc`: its text).
char32_t Parser::hex_escape(char32_t c, const std::string& esc) {
  const std::size_t want = c == 'x' ? 2 : c == 'u' ? 4 : 8;
  std::u32string digits;
  while (digits.size() < want && next_len_ == 1 && is_hex(next_)) digits += next_, advance();
  if (digits.size() != want)
    throw error(fmt::format("incomplete escape {}{}", esc, utf8(digits)), digits.size() + 2);
  std::uint64_t v = 0;
  for (char32_t h : digits) v = v * 16 + (is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
  if (v > CharSet::kMax)
    throw error(fmt::format("bad escape {}{}", esc, utf8(digits)), digits.size() + 2);
  return static_cast<char32_t>(v);
}

// A backslash and a digit 1-9 outside a class: a three-digit octal escape or a group reference.
Escape Parser::digit_escape(char32_t c) {
  Escape e;
  auto chr = [&](char32_t v) {
    e.is_char = true;
    e.ch = v;
    return std::move(e);
  };
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
        throw error(fmt::format("octal escape value \\{} outside of range 0-0o377", utf8(digits)),
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

CharSet Parser::bracket(const Flags& flags) {
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

}  // namespace shardplan::detail::py_re
