#pragma once
// UTF-8, defined once for the library: the JSON reader and writer, the plan report and the rule
// pattern engine all decide "is this a well-formed sequence" with utf8_decode, and encode with
// append_utf8 (a second copy could drift, and a path would then decode one way when matched and
// another when printed).
#include <cstddef>
#include <string>
#include <string_view>

namespace shardplan::detail {

/// The well-formed sequence at `p` (at most `n` bytes): its length (1..4), with `cp` set to its
/// code point, or 0 when the bytes there are not a well-formed sequence (an overlong form, a
/// surrogate, past U+10FFFF, a stray continuation byte, or cut short). When `incomplete` is given,
/// it is set to whether the bytes end inside a sequence that could still become well-formed.
inline std::size_t utf8_decode(const unsigned char* p, std::size_t n, char32_t& cp,
                               bool* incomplete = nullptr) {
  if (incomplete) *incomplete = false;
  if (n == 0) return 0;
  const unsigned char b = p[0];
  if (b < 0x80) {
    cp = b;
    return 1;
  }
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the valid range of the second byte
  if (b >= 0xc2 && b <= 0xdf) {
    len = 2;
  } else if (b >= 0xe0 && b <= 0xef) {
    len = 3;
    if (b == 0xe0) lo = 0xa0;  // no overlong forms
    if (b == 0xed) hi = 0x9f;  // no surrogates
  } else if (b >= 0xf0 && b <= 0xf4) {
    len = 4;
    if (b == 0xf0) lo = 0x90;  // no overlong forms
    if (b == 0xf4) hi = 0x8f;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  char32_t v = b & (0xff >> (len + 1));
  std::size_t k = 1;
  for (; k < len && k < n; ++k) {
    const unsigned char c = p[k];
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xbf)) return 0;
    v = (v << 6) | (c & 0x3f);
  }
  if (k < len) {
    if (incomplete) *incomplete = true;
    return 0;
  }
  cp = v;
  return len;
}

/// Appends the UTF-8 encoding of `cp` (a code point up to U+10FFFF; surrogates are encoded as
/// their three bytes, as Python's 'surrogatepass' would).
/// Whether `text` is well-formed UTF-8 throughout.
inline bool is_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  char32_t cp = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t len = utf8_decode(p + i, text.size() - i, cp);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

}  // namespace shardplan::detail
