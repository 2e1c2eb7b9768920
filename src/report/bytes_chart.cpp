// The chart of bytes over steps and the table of what is live at the peak (bytes_chart.hpp).
#include "bytes_chart.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "html_page.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan::detail {
namespace {

constexpr std::string_view kStyle = R"(
svg .phase-forward { fill: #e8f0fb; }
svg .phase-backward { fill: #fdf0e1; }
svg .phase-update { fill: #e7f5ea; }
svg .phase-label { font-size: 12px; fill: #4b5563; }
svg .live { fill: none; stroke: #4e79a7; stroke-width: 1.6; }
svg .planned { fill: none; stroke: #111827; stroke-width: 1.4; stroke-dasharray: 6 4; }
svg .series-0 { fill: none; stroke: #4e79a7; stroke-width: 1.6; }
svg .series-1 { fill: none; stroke: #f28e2b; stroke-width: 1.6; }
svg .series-2 { fill: none; stroke: #59a14f; stroke-width: 1.6; }
svg .series-3 { fill: none; stroke: #76b7b2; stroke-width: 1.6; }
svg .series-4 { fill: none; stroke: #edc948; stroke-width: 1.6; }
svg .series-5 { fill: none; stroke: #b07aa1; stroke-width: 1.6; }
svg .series-6 { fill: none; stroke: #ff9da7; stroke-width: 1.6; }
svg .series-7 { fill: none; stroke: #9c755f; stroke-width: 1.6; }
svg .peak { fill: #e15759; }
svg .peak-line { stroke: #e15759; stroke-width: 1; stroke-dasharray: 4 3; }
table.live { border-collapse: collapse; width: 100%; font-size: 13px; margin-top: 12px; }
table.live th { text-align: left; color: #6b7280; font-weight: 600; border-bottom: 1px solid #e3e6ea;
  padding: 4px 8px; }
table.live td { border-bottom: 1px solid #f0f1f3; padding: 3px 8px; vertical-align: top; }
table.live td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 13px; color: #374151;
  margin: 6px 0 0; }
.legend i { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  margin-right: 6px; vertical-align: -1px; }
)";

/// A point: x in steps (the start at 0, step s at s + 1).
struct Point {
  double x = 0;
  std::int64_t bytes = 0;
};

/// Per step, or per bucket of `bucket` consecutive steps the most any of them holds.
std::vector<Point> points_of(const BytesSeries& s, std::size_t bucket) {
  const std::size_t n = s.steps.size();
  std::vector<Point> points{{0, s.start}};
  for (std::size_t first = 0; first < n; first += bucket) {
    const std::size_t end = std::min(n, first + bucket);
    const auto from = s.steps.begin() + static_cast<std::ptrdiff_t>(first);
    const auto to = s.steps.begin() + static_cast<std::ptrdiff_t>(end);
    points.push_back({static_cast<double>(end), *std::max_element(from, to)});
  }
  return points;
}

/// The chart's frame: the plot's box and its scales.
struct Frame {
  static constexpr double kW = 1040, kH = 340, kLeft = 100, kRight = 20, kTop = 28, kBottom = 50;
  static constexpr double kPlotW = kW - kLeft - kRight, kPlotH = kH - kTop - kBottom;
  double steps = 1, top = 1;
  double x(double step) const { return kLeft + kPlotW * step / steps; }
  double y(double bytes) const { return kTop + kPlotH - kPlotH * bytes / top; }
};

void write_bands(std::string& out, const std::vector<StepBand>& bands, const Frame& f) {
  for (const StepBand& b : bands) {
    const double x0 = f.x(static_cast<double>(b.from)), x1 = f.x(static_cast<double>(b.to));
    out += fmt::format(
        "<rect class=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"><title>{}: steps "
        "{}–{}</title></rect>\n",
        escaped(b.css_class), num(x0), num(Frame::kTop), num(x1 - x0), num(Frame::kPlotH),
        escaped(b.label), b.from, b.to > 0 ? b.to - 1 : 0);
    if (x1 - x0 >= 56) {
      out += fmt::format("<text class=\"phase-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}"
                         "</text>\n",
                         num((x0 + x1) / 2), num(Frame::kTop - 8), escaped(b.label));
    }
  }
}

void write_axes(std::string& out, const Frame& f, const ByteAxis& axis, std::size_t n) {
  for (std::int64_t k = 0; k <= axis.ticks; ++k) {
    std::int64_t value = 0;
    if (!checked_mul(k, axis.step, &value)) break;  // a top tick past 8 EiB: left unlabelled
    const double y = f.y(static_cast<double>(value));
    out += fmt::format("<line class=\"{}\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>",
                       k == 0 ? "axis" : "grid", num(Frame::kLeft),
                       num(Frame::kLeft + Frame::kPlotW), num(y), num(y));
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
                       num(Frame::kLeft - 8), num(y + 4), format_bytes(value));
  }
  for (int k = 0; k <= 4; ++k) {
    const auto step = static_cast<std::size_t>(static_cast<double>(n) * k / 4);
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       num(f.x(static_cast<double>(step))), num(Frame::kTop + Frame::kPlotH + 18),
                       step);
  }
  out += fmt::format(
      "<text class=\"title\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">program step</text>\n"
      "<text class=\"title\" transform=\"translate(18 {}) rotate(-90)\" text-anchor=\"middle\">"
      "live bytes per device</text>\n",
      num(Frame::kLeft + Frame::kPlotW / 2), num(Frame::kH - 10),
      num(Frame::kTop + Frame::kPlotH / 2));
}

void write_peak(std::string& out, const BytesChart& c, const Frame& f, std::size_t n) {
  const double px = c.peak_step < n ? static_cast<double>(c.peak_step + 1) : 0;
  const double py = f.y(static_cast<double>(c.peak_bytes));
  const bool right = px > f.steps * 0.8;
  out += fmt::format(
      "<line class=\"peak-line\" x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\"/>"
      "<circle class=\"peak\" cx=\"{0}\" cy=\"{1}\" r=\"5\"><title>{3}</title></circle>\n"
      "<text class=\"label\" x=\"{4}\" y=\"{5}\" text-anchor=\"{6}\">peak {7}</text>\n",
      num(f.x(px)), num(py), num(Frame::kTop + Frame::kPlotH), escaped(c.peak_title),
      num(f.x(px) + (right ? -9 : 9)), num(std::max(py - 6, 12.0)), right ? "end" : "start",
      format_bytes(c.peak_bytes));
}

}  // namespace

std::string_view bytes_chart_style() { return kStyle; }

std::size_t write_bytes_chart(std::string& out, const BytesChart& c) {
  std::size_t n = 0;
  std::int64_t most = c.peak_bytes;
  for (const BytesSeries& s : c.series) {
    n = std::max(n, s.steps.size());
    most = std::max(most, s.start);
    for (const std::int64_t b : s.steps) most = std::max(most, b);
  }
  const std::size_t limit = std::max<std::size_t>(1, c.max_points);
  const std::size_t bucket = std::max<std::size_t>(1, (n + limit - 1) / limit);
  const ByteAxis axis = byte_axis(most);
  Frame f;
  f.steps = std::max(1.0, static_cast<double>(n));
  f.top = axis.top();
  out += fmt::format("<svg class=\"timeline\" viewBox=\"0 0 {} {}\" width=\"100%\" role=\"img\" "
                     "aria-label=\"{}\">\n",
                     Frame::kW, Frame::kH, escaped(c.aria_label));
  write_bands(out, c.bands, f);
  write_axes(out, f, axis, n);
  for (const BytesSeries& s : c.series) {
    out += fmt::format("<polyline class=\"{}\" points=\"", escaped(s.css_class));
    for (const Point& p : points_of(s, bucket)) {
      out += fmt::format("{},{} ", num(f.x(p.x)), num(f.y(static_cast<double>(p.bytes))));
    }
    out += "\"/>\n";  // named by the page's legend
  }
  write_peak(out, c, f, n);
  out += "</svg>\n";
  if (bucket > 1) {
    out += fmt::format("<figcaption>Each point is the most any of {} consecutive steps holds."
                       "</figcaption>\n",
                       bucket);
  }
  return bucket;
}

void write_live_table(std::string& out, const std::vector<std::string>& headers,
                      const std::vector<bool>& mono, const std::vector<LiveRow>& rows,
                      std::int64_t peak, std::string_view bytes_header, std::size_t max_rows) {
  out += "<table class=\"live\">\n<tr><th>#</th>";
  for (const std::string& h : headers) out += fmt::format("<th>{}</th>", escaped(h));
  out += fmt::format("<th>{}</th><th>of the peak</th></tr>\n", escaped(bytes_header));
  const auto share = [peak](std::int64_t b) {
    return peak > 0 ? 100.0 * static_cast<double>(b) / static_cast<double>(peak) : 0.0;
  };
  std::int64_t shown = 0;
  for (std::size_t i = 0; i < rows.size() && i < max_rows; ++i) {
    const LiveRow& r = rows[i];
    if (!checked_add(shown, r.bytes, &shown)) shown = INT64_MAX;  // more than any peak
    out += fmt::format("<tr><td class=\"n\">{}</td>", i + 1);
    for (std::size_t k = 0; k < r.cells.size(); ++k) {
      out += k < mono.size() && mono[k] ? "<td class=\"mono\">" : "<td>";
      escape_to(out, r.cells[k]);
      out += "</td>";
    }
    out += fmt::format("<td class=\"n\">{}</td><td class=\"n\">{:.1f}%</td></tr>\n",
                       format_bytes(r.bytes), share(r.bytes));
  }
  if (peak > shown) {
    out += "<tr><td></td><td>every other value live at the peak</td>";
    for (std::size_t k = 1; k < headers.size(); ++k) out += "<td></td>";
    out += fmt::format("<td class=\"n\">{}</td><td class=\"n\">{:.1f}%</td></tr>\n",
                       format_bytes(peak - shown), share(peak - shown));
  }
  out += "</table>\n";
}

}  // namespace shardplan::detail
