#pragma once
// A byte count for people: "1.50 GiB". The base layer (no dependencies), so that the runtime,
// the program layer and the planner print sizes the same way without including each other.
#include <cstdint>
#include <string>

namespace shardplan {

/// "512 B", "1.50 KiB", ... up to PiB, with two decimals above bytes.
std::string format_bytes(std::int64_t bytes);

}  // namespace shardplan
