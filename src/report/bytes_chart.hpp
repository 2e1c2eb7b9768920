#pragma once
// The one SVG chart of bytes over a program's steps, with its peak marked, and the table of what
// is live at the peak: train-plan --html draws the planned timeline with it, the memory report
// (profiler::memory_html) each run's measured and planned bytes. Private to the library.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardplan::detail {

/// One line: the bytes before the first step, then after each step.
struct BytesSeries {
  std::string name;       // for the page's legend
  std::string css_class;  // "live", "planned", "series-0".. (bytes_chart_style defines them)
  std::int64_t start = 0;
  std::vector<std::int64_t> steps;
};

/// A shaded range of steps [from, to) with a label above it (train-plan's passes).
struct StepBand {
  std::size_t from = 0, to = 0;
  std::string css_class;
  std::string label;
};

struct BytesChart {
  std::vector<BytesSeries> series;  // drawn in order, the last on top
  std::vector<StepBand> bands;
  /// The peak marked: its step (the number of steps: the arguments alone) and bytes.
  std::size_t peak_step = 0;
  std::int64_t peak_bytes = 0;
  std::string peak_title;  // its hover text ("peak: 2.1 KiB at step 1 ...")
  /// Past this many steps, each point is the most of a bucket of consecutive steps (the peak
  /// stays on the line).
  std::size_t max_points = 2000;
  std::string aria_label;
};

/// The CSS classes the chart and the table use, to go in the page's head.
std::string_view bytes_chart_style();

/// Appends the chart as an <svg>, then a <figcaption> when points were bucketed. The y axis
/// spans the highest point of every series. Returns the bucket size (1: a point per step).
std::size_t write_bytes_chart(std::string& out, const BytesChart& chart);

/// One row of the table of what is live at the peak: its cells (escaped here) and bytes.
struct LiveRow {
  std::vector<std::string> cells;
  std::int64_t bytes = 0;
};

/// A table: "#", `headers` (a cell's column in `mono` set is set in monospace), the bytes,
/// their share of `peak`; the first `max_rows` rows, then "every other value live at the peak"
/// with the bytes not listed when the rows shown add up to less than the peak.
void write_live_table(std::string& out, const std::vector<std::string>& headers,
                      const std::vector<bool>& mono, const std::vector<LiveRow>& rows,
                      std::int64_t peak, std::string_view bytes_header, std::size_t max_rows);

}  // namespace shardplan::detail
