#pragma once
// Pass 2, partitioning. Input: the graph, the propagated shardings and factors (propagate.hpp),
// the compile spec. Output: the program's steps in order, each a kernel run on every device's
// blocks or a reshard of a value to the sharding a user needs, with the slots they read and
// write, the input and output slots, every value's decided layout, and the static FLOPs and
// bytes per collective kind.
//
// In three phases: choose (every node's factor axes, the layout each operand is read in and the
// result's layout, pending sums included, from the primitives' declared factors and linearity
// and the reshard bytes), emit (each decided node's operand reshards and kernel step, once),
// then drop the steps nothing reads. FLOPs and bytes are counted from the steps kept.

#include <map>
#include <string>
#include <vector>

#include "compile.hpp"
#include "../ir/primitive.hpp"
#include "propagate.hpp"

namespace shardplan::detail {

struct Partitioned {
  std::vector<Step> steps;
  int num_slots = 0;
  std::vector<SlotId> input_slots;  // by input index
  std::vector<NamedSharding> input_shardings;
  std::vector<Pending> input_pending;
  std::vector<SlotId> output_slots;
  std::vector<NamedSharding> output_shardings;
  std::vector<double> flops;                             // by device
  std::map<CollectiveKind, std::int64_t> bytes_by_kind;  // most bytes a device receives, per kind
  std::map<CollectiveOn, std::int64_t> bytes_by_axes;    // the same per kind and mesh axes
  std::vector<double> matmul_flops, attention_flops, matmul_fp8_flops;  // by device (ProgramCost's)
  ValueMap<Layout> layouts;  // by value: the layout its step makes (what the program text prints)
};

/// `specs` are the propagated shardings of the values (the outputs are delivered in theirs).
/// Throws SpecError when a byte count overflows int64.
/// Phase 3 of partition(): drops the steps whose results nothing reads (no later step, no
/// output), then counts the FLOPs and the bytes per collective kind of the steps kept.
void keep_read(const Graph& g, Partitioned& p, int devices);

/// What a collective inside shard_map (Primitive::collective) moves, as its step's static cost
/// (with what it stages over processes: CompileSpec::devices_per_process).
std::vector<CollectiveRecord> collective_cost(const CollectivePlan& plan, DType dtype,
                                              const Mesh& mesh, int devices_per_process);

Partitioned partition(const Graph& g, const Propagator& prop, const ValueMap<PartitionSpec>& specs,
                      const CompileSpec& spec);

}  // namespace shardplan::detail
