#pragma once
// A plan as a picture: one self-contained HTML page (inline CSS and SVG, no scripts, nothing
// fetched) to open in a browser or attach to a review.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "shardplan/plan_report.hpp"

namespace shardplan {

/// The most bars plan_html draws for bytes per device: a larger mesh's devices are grouped by
/// consecutive ids, and each bar shows the largest of its group.
inline constexpr std::size_t kPlanHtmlMaxBars = 64;
/// The most cells plan_html draws along one side of a tensor: beyond that, neighbouring blocks
/// share a cell.
inline constexpr std::int64_t kPlanHtmlMaxCellsPerSide = 32;

/// The report as one HTML page: `title` (as <title> and heading), a summary (total bytes,
/// min/max bytes per device, tensor count), bytes per device as an SVG bar chart, and the
/// blocks of the `largest_n` largest tensors over the mesh (PlanReport::largest), each block
/// coloured and labelled with the devices holding it, like NamedSharding::visualize. A tensor
/// of rank > 2 is drawn over two dimensions: its largest sharded ones, else the first.
/// Every text from the report and `title` is HTML-escaped (bytes that are not UTF-8 become
/// U+FFFD). Thread-safe. Throws SpecError when a leaf's spec does not fit the report's mesh
/// (never for a report made by MeshShardingHelper::plan).
///
///   std::ofstream("plan.html") << plan_html(report, "shardplan: LLaMA-2-7B on fsdp:4,tp:2");
std::string plan_html(const PlanReport& report, std::string_view title, std::size_t largest_n = 8);

/// Writes plan_html(report, title, largest_n) to the file `path`: into a new hidden temporary
/// file beside it (a name no other run has, never following a symbolic link), renamed to `path`
/// once complete, replacing a regular file there; so a failure leaves neither a half-written page
/// nor the temporary. Throws IoError naming the path and the system's reason (an empty path, a
/// directory or a symbolic link at `path`, a missing directory, a full disk).
void write_plan_html(const std::string& path, const PlanReport& report, std::string_view title,
                     std::size_t largest_n = 8);

}  // namespace shardplan
