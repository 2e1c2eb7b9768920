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

/// The runs of a trace: its "memory peak" instant events' args, in file order. `text` is the
/// content of `file` (named in messages). Throws IoError "[trace] FILE: ..." when it is not a
/// trace (as summarize_trace), a memory peak event's args are not a run (a field missing, of the
/// wrong type, or with sizes that disagree: each named), or it has no memory peak event.
std::vector<MemoryRun> read_trace_memory(std::string_view text, std::string_view file);

/// The runs as text: per run its steps and devices, the measured and planned peaks, and the
/// `top` largest values live at the measured peak. Names escaped for a terminal.
std::string format_memory_runs(const std::vector<MemoryRun>& runs, std::string_view file,
                               std::size_t top);

}  // namespace shardplan::profiler::detail
