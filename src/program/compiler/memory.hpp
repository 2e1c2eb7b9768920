#pragma once
#include <map>
#include <string>
// Pass 3, liveness and memory. Input: the partitioned steps (partition.hpp) and which inputs are
// donated. Output: the slots to free after each step (a donated input after its last use, never
// a kept one: outputs, undonated inputs, cached constants), and the peak bytes a device holds.
// Bytes are counted per buffer, as the devices hold them: the slots that hold one storage (a
// value and the views of it, see shares_operand_buffers) form a group whose bytes are live once,
// from its first member's step to its last member's death.

#include <vector>

#include "partition.hpp"

namespace shardplan::detail {

/// The most bytes per device a constant step's result may hold and still be kept for the next
/// run. Larger constants (a causal mask of [batch, heads, T, T] is one) are computed again each
/// run and freed after their last use, like any value: kept, every layer's copy would stay
/// resident between steps.
inline constexpr std::int64_t kMaxCachedConstantBytes = std::int64_t{1} << 20;
/// The bound on all of them together: kDefaultKeptConstantBytes (shardplan/detail/sjit_call.hpp).

struct Liveness {
  std::vector<std::vector<SlotId>> free_after;  // per step
  std::vector<SlotId> free_at_start;            // donated inputs no step uses
  std::vector<char> input_donated;              // by input index
  bool any_donated = false;
  std::vector<SlotId> constant_slots;  // results of constant steps, kept for the next run
  std::vector<char> cached_step;       // per step: a constant step whose result is kept
  std::int64_t peak_bytes = 0;  // per device, each buffer once (every device holds one size)
  /// By device id: peak_bytes, or more on a device where a collective over processes stages
  /// what it receives (CollectiveRecord::staging_bytes) beside the bytes live at its step.
  std::vector<std::int64_t> peak_by_device;
  PeakByKind peak_by_kind;             // ProgramCost::peak_by_kind
  std::int64_t memory_traffic = 0;     // ProgramCost::memory_traffic (per device)
  MemoryTimeline timeline;             // ProgramCost::timeline
  /// The bytes per device of each slot as counted above (0: a constant not counted, a slot no
  /// step makes): what allocation_events (src/train/allocation_events.hpp) allocates.
  std::vector<std::int64_t> slot_bytes;
};

/// Whether step `st`'s result is its operand's buffers at run time, allocating nothing
/// (Program::run_kernel_step, run_reshard_step, run_collective_step): a view (Primitive::view,
/// not fused), or a reshard or shard_map collective whose static cost lists no collective (the
/// same blocks under another name, size-1 axes: reshard() gives the operand's buffers back). A
/// permute always has one record, and copies.
bool shares_operand_buffers(const Step& st);

/// Per slot, the slot whose buffers it holds at run time: itself, unless a step that shares its
/// operand's buffers made it (then that operand's, transitively). `num_slots` bounds the slots.
std::vector<SlotId> buffer_roots(const std::vector<Step>& steps, std::size_t num_slots);

/// Throws SpecError when a byte count overflows int64.
Liveness plan_memory(const Graph& g, const Partitioned& p, const CompileSpec& spec);

}  // namespace shardplan::detail
