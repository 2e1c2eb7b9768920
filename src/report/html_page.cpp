// What the HTML pages share (html_page.hpp).
#include "html_page.hpp"

#include <fmt/format.h>

#include "shardplan/detail/utf8.hpp"

namespace shardplan::detail {
namespace {

constexpr std::string_view kStyle = R"(
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f5f6f8; color: #1f2937;
  font: 15px/1.5 "Inter", "Segoe UI", "Helvetica Neue", Arial, "Liberation Sans",
        "DejaVu Sans", sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 32px 32px 40px; }
h1 { font-size: 28px; font-weight: 700; margin: 0 0 4px; letter-spacing: -0.01em; }
h2 { font-size: 18px; font-weight: 650; margin: 0 0 4px; }
.sub { color: #6b7280; margin: 0 0 20px; }
.summary { display: flex; flex-wrap: wrap; gap: 12px; margin: 0 0 24px; padding: 0; }
.summary div { background: #fff; border: 1px solid #e3e6ea; border-radius: 8px;
  padding: 10px 16px; min-width: 150px; }
.summary dt { font-size: 12px; text-transform: uppercase; letter-spacing: 0.06em; color: #6b7280; }
.summary dd { margin: 0; font-size: 20px; font-weight: 650; font-variant-numeric: tabular-nums; }
section { background: #fff; border: 1px solid #e3e6ea; border-radius: 10px;
  padding: 20px 24px; margin: 0 0 20px; }
section > p.note { color: #6b7280; margin: 0 0 12px; font-size: 14px; }
figure { margin: 0; }
figure.tensor { display: flex; flex-wrap: wrap; gap: 8px 28px; align-items: flex-start;
  border-top: 1px solid #eef0f3; padding: 16px 0 8px; }
figure.tensor:first-of-type { border-top: none; }
figcaption { font-size: 14px; color: #374151; }
figure.chart figcaption { margin-top: 6px; color: #6b7280; }
figure.tensor figcaption { flex: 1 1 320px; min-width: 300px; }
figcaption .path { display: block; font-weight: 650; margin-bottom: 6px; word-break: break-all; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0; }
dl.facts dt { color: #6b7280; }
dl.facts dd { margin: 0; font-variant-numeric: tabular-nums; word-break: break-word; }
code, .mono { font-family: "DejaVu Sans Mono", "Liberation Mono", Menlo, Consolas, monospace;
  font-size: 13px; }
svg { display: block; }
svg text { font-family: inherit; fill: #374151; }
svg .grid { stroke: #e5e7eb; stroke-width: 1; }
svg .axis { stroke: #9ca3af; stroke-width: 1; }
svg .tick { font-size: 12px; fill: #6b7280; }
svg .title { font-size: 13px; fill: #4b5563; }
svg .value { font-size: 11px; fill: #374151; }
svg .bar { fill: #4e79a7; }
svg .block { stroke: #ffffff; stroke-width: 2; }
svg .block.unspecified { fill: #f3f4f6; stroke: #9ca3af; stroke-dasharray: 6 4; }
svg .label { font-size: 12px; fill: #1f2937; }
ul.rules { margin: 4px 0 0; padding-left: 20px; font-size: 14px; }
footer { color: #9ca3af; font-size: 12px; text-align: center; margin-top: 8px; }
)";

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

}  // namespace

void escape_to(std::string& out, std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char c = p[i];
    if (c >= 0x80) {
      char32_t cp = 0;
      const std::size_t len = detail::utf8_decode(p + i, text.size() - i, cp);
      if (len == 0) {
        out += kReplacement;
        ++i;
      } else {
        out.append(text.data() + i, len);
        i += len;
      }
      continue;
    }
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7f) {
          out += kReplacement;
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
}

std::string escaped(std::string_view text) {
  std::string out;
  escape_to(out, text);
  return out;
}

std::string num(double v) { return fmt::format("{:.1f}", v); }

void write_head(std::string& out, std::string_view title, std::string_view extra_style) {
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += "<meta name=\"generator\" content=\"shardplan\">\n<title>";
  escape_to(out, title);
  out += "</title>\n<style>";
  out += kStyle;
  out += extra_style;
  out += "</style>\n</head>\n<body>\n<main>\n";
}

ByteAxis byte_axis(std::int64_t max) {
  ByteAxis a;
  if (max <= 0) return a;
  const std::int64_t need = max / 5 + (max % 5 != 0);  // step >= max / 5; at most 2^61
  while (a.step < need) a.step *= 2;
  a.ticks = max / a.step + (max % a.step != 0);
  return a;
}


}  // namespace shardplan::detail
