#pragma once
// Text from files (tensor names, config fields, mesh axes) made safe to print to a terminal:
// control characters could otherwise move the cursor, clear the screen or retitle the window.
// JSON output escapes by itself; this is for the text outputs.
#include <string>
#include <string_view>

#include "shardplan/detail/utf8.hpp"

namespace shardplan::detail {

/// `text` with every control character and every byte that is not part of well-formed UTF-8
/// written as an escape: C0 controls (U+0000-U+001F) and DEL as \xNN, C1 controls
/// (U+0080-U+009F, which some terminals obey as ESC sequences) as \uNNNN, and an invalid byte as
/// \xNN. Everything else, other scripts included, is kept as it is.
inline std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char b = p[i];
    if (b >= 0x20 && b < 0x7f) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    char32_t cp = 0;
    const std::size_t len = b < 0x80 ? 1 : utf8_decode(p + i, text.size() - i, cp);
    if (len == 0 || b < 0x80) {  // a C0 control, DEL, or a byte outside UTF-8
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
      ++i;
    } else if (cp < 0xa0) {  // a C1 control
      out += "\\u00";
      out += kHex[(cp >> 4) & 15];
      out += kHex[cp & 15];
      i += len;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

/// printable() of each line, the line breaks kept: for messages of several lines (an error that
/// quotes a tensor name from a file).
inline std::string printable_lines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (;;) {
    const std::size_t nl = text.find('\n');
    out += printable(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    out += '\n';
    text.remove_prefix(nl + 1);
  }
  return out;
}

}  // namespace shardplan::detail
