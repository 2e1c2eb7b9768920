// Any bytes as a trace for `shardplan trace memory`: the reader must accept or throw IoError,
// never crash or hang; the runs it accepts have consistent sizes, and the text, JSON and page
// are made from them without failing.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "profiler/memory_report.hpp"
#include "shardplan/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto runs = shardplan::profiler::detail::read_trace_memory(text, "fuzz.trace.json");
    if (runs.empty()) __builtin_trap();
    for (const auto& r : runs) {
      if (r.live_bytes.size() != r.steps.size() || r.planned_bytes.size() != r.steps.size() ||
          r.start_bytes.size() != r.devices.size() || r.peak_step > r.steps.size()) {
        __builtin_trap();
      }
      for (const auto& row : r.live_bytes) {
        if (row.size() != r.devices.size()) __builtin_trap();
      }
    }
    (void)shardplan::profiler::detail::format_memory_runs(runs, "fuzz.trace.json", 10);
    (void)shardplan::profiler::memory_json(runs);
    (void)shardplan::profiler::memory_html(runs, "fuzz");
  } catch (const shardplan::IoError&) {
  }
  return 0;
}
