#pragma once
// The allocations and frees one device makes running a compiled program's steps, in the memory
// pass's order (src/program/compiler/memory.hpp): what the caching allocator model (caching_allocator.hpp)
// runs over. Every device holds blocks of one size, so one device's sequence stands for all. A
// training analysis: compile() does not run it; train-plan asks for it (reserved_bytes below).

#include <cstdint>
#include <vector>

#include "../program/compiler/compile.hpp"
#include "caching_allocator.hpp"

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
std::vector<AllocEvent> allocation_events(const Program& p, StreamModel model);

/// What PyTorch's CUDA caching allocator would reserve per device (its reserved_bytes peak)
/// running the program's steps as FSDP2 does: with a cudaMalloc'd segment per request no cached
/// block serves (PyTorch's default), and with expandable segments
/// (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True). docs/training.md, "Reserved bytes".
struct ReservedBytes {
  std::int64_t segments = 0;
  std::int64_t expandable = 0;
  friend bool operator==(const ReservedBytes&, const ReservedBytes&) = default;
};
/// Throws Error when the events, on one stream, do not peak where the memory plan's live bytes do
/// (a bug: the two counts must agree).
ReservedBytes reserved_bytes(const Program& p);

}  // namespace shardplan::detail
