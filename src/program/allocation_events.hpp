#pragma once
// The allocations and frees one device makes running the partitioned steps, in the memory pass's
// order (memory.hpp): what the caching allocator model (caching_allocator.hpp) runs over. Every
// device holds blocks of one size, so one device's sequence stands for all.

#include <vector>

#include "caching_allocator.hpp"
#include "memory.hpp"

namespace shardplan::detail {

/// How the steps' buffers are laid out on streams.
enum class StreamModel : std::uint8_t {
  /// Each value allocated on the default stream when its step runs, freed after its last use:
  /// the allocations' live bytes are the memory pass's timeline, step for step.
  kValues,
  /// As FSDP2 runs the step (torch/distributed/_composable/fsdp/_fsdp_collectives.py): a
  /// gathered weight (an argument, cast or not, all-gathered: argument_read) also takes a staging
  /// buffer of its size on the all-gather stream while it is gathered (foreach_all_gather's
  /// all_gather_output; the weight itself is copied out on the default stream); a reduce-scatter
  /// allocates its input, the summed value in the result's dtype, on the reduce-scatter stream,
  /// frees the value it read once copied in, then allocates its result there (the sharded
  /// gradient, held on that stream's pool).
  kFsdp2,
};

/// The events, in order: the arguments first, then per step its buffers and frees.
std::vector<AllocEvent> allocation_events(const Graph& g, const Partitioned& p, const Liveness& l,
                                          StreamModel model);

}  // namespace shardplan::detail
