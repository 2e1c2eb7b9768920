// Any text as a pipeline schedule CSV (torch's format): parsing and checking must accept or throw
// shardplan::Error; an accepted schedule simulates, prints and writes back.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "shardplan/error.hpp"
#include "shardplan/pipeline_schedule.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace pp = shardplan::pipeline;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const pp::Schedule s = pp::parse_csv(text, "fuzz.csv");
    const pp::Timeline t = pp::simulate(s, pp::unit_costs());
    (void)pp::timeline_text(s, t, 40);
    (void)pp::to_text(s);
    (void)pp::parse_csv(pp::to_csv(s), "again.csv");
  } catch (const shardplan::Error&) {
  }
  return 0;
}
