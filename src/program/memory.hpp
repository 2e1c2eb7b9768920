#pragma once
// Pass 3, liveness and memory. Input: the partitioned steps (partition.hpp) and which inputs are
// donated. Output: the slots to free after each step (a donated input after its last use, never
// a kept one: outputs, undonated inputs, cached constants), and the peak bytes a device holds.

#include <vector>

#include "partition.hpp"

namespace shardplan::detail {

struct Liveness {
  std::vector<std::vector<SlotId>> free_after;  // per step
  std::vector<SlotId> free_at_start;            // donated inputs no step uses
  std::vector<char> input_donated;              // by input index
  bool any_donated = false;
  std::vector<SlotId> constant_slots;  // results of constant steps, kept for the next run
  std::int64_t peak_bytes = 0;         // per device (every device holds blocks of one size)
};

/// Throws SpecError when a byte count overflows int64.
Liveness plan_memory(const Graph& g, const Partitioned& p, const CompileSpec& spec);

}  // namespace shardplan::detail
