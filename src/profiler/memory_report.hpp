#pragma once
// The memory report's private side: one run as a JSON object (memory_json writes a list of them;
// the trace writer puts each in its run's "memory peak" instant event), and the reader that
// takes them back out of a trace (`shardplan trace memory`, tests/fuzz/fuzz_trace_memory.cpp).
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/profiler.hpp"

namespace shardplan::profiler::detail {

/// The name of the instant event the profiler writes at each run's peak.
inline constexpr std::string_view kMemoryPeakEvent = "memory peak";

/// `run` as the report's JSON object: "devices", "steps" ({"op", "value", "scope"} each),
/// "start_bytes" (per device), "live_bytes" (per step, per device), "value_start_bytes",
/// "value_bytes", "planned_start_bytes", "planned_bytes" (per step), "peak" ({"step": a step, or
/// null for the arguments alone; "bytes"; "device"; "live": [{"what", "scope", "bytes"}]}),
/// "took_constants".
nlohmann::json memory_run_json(const MemoryRun& run);

/// The most bytes a run's own samples show (start_bytes, then each step's live_bytes; devices in
/// order; the first of equals), as the profiler finds a run's peak.
struct SampledPeak {
  std::int64_t bytes = -1;  // -1: no samples
  std::size_t step = 0;     // a step, or the number of steps for the start
  int device = -1;
};
SampledPeak sampled_peak(const MemoryRun& run);

/// Whether the run's peak (peak_bytes after peak_step on peak_device) is a largest of its own
/// samples. A run read from a trace may claim another (a trace edited, or written by another
/// tool): its peak is then shown as claimed, beside the sampled one (docs/profiling.md).
bool peak_agrees_with_samples(const MemoryRun& run);

/// The runs of a trace: its "memory peak" instant events' args, in file order. `text` is the
/// content of `file` (named in messages). Throws IoError "[trace] FILE: ..." when it is not a
/// trace (as summarize_trace), a memory peak event's args are not a run (a field missing, of the
/// wrong type, sizes that disagree, no devices or one listed twice, a null peak device, values
/// live at the peak whose bytes add up past int64: each named), or it has no memory peak event.
std::vector<MemoryRun> read_trace_memory(std::string_view text, std::string_view file);

/// The runs as text: per run its steps and devices, the measured and planned peaks (a peak its
/// samples contradict as "claimed", beside the sampled one), and the `top` largest values live
/// at the peak. Names escaped for a terminal.
std::string format_memory_runs(const std::vector<MemoryRun>& runs, std::string_view file,
                               std::size_t top);

}  // namespace shardplan::profiler::detail
