#pragma once
// What the HTML pages (plan --html, train-plan --html) share: escaping, the style, the head, a
// byte axis. Private to the library.
#include <cstdint>
#include <string>
#include <string_view>

namespace shardplan::detail {

/// Appends `text` for HTML text or a quoted attribute: & < > " ' as entities, control
/// characters and bytes that are not well-formed UTF-8 as U+FFFD (a name read from a file or
/// built in code may hold any byte; the page is UTF-8).
void escape_to(std::string& out, std::string_view text);
/// `text` escaped as escape_to does.
std::string escaped(std::string_view text);

/// A number for an SVG attribute: one decimal is finer than a pixel.
std::string num(double v);

/// The page's start up to <main>: the charset, `title` (escaped), the shared style sheet
/// followed by `extra_style`.
void write_head(std::string& out, std::string_view title, std::string_view extra_style = {});

/// The y axis of a byte count: a power-of-two step giving 3 to 5 ticks above zero, so the
/// labels are round sizes (512.00 MiB, 1.00 GiB, 1.50 GiB).
struct ByteAxis {
  std::int64_t step = 1;
  std::int64_t ticks = 1;
  double top() const { return static_cast<double>(step) * static_cast<double>(ticks); }
};
ByteAxis byte_axis(std::int64_t max);

}  // namespace shardplan::detail
