// Any bytes as a trace for `shardplan trace summarize`: the reader must accept or throw IoError,
// never crash or hang; an accepted trace has events, a span and busy times within it.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "profiler/trace_summary.hpp"
#include "shardplan/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto s = shardplan::detail::summarize_trace(text, "fuzz.trace.json");
    if (s.events <= 0 || !(s.span_us >= 0)) __builtin_trap();
    for (const auto& t : s.threads) {
      if (t.exposed_comm_us > t.comm_us + 1e-6 * (1 + t.comm_us)) __builtin_trap();
    }
    (void)shardplan::detail::format_trace_summary(s, "fuzz.trace.json", 10);
  } catch (const shardplan::IoError&) {
  }
  return 0;
}
