#pragma once
// Pass 2b, fusion. Input: the graph and the partitioned steps (partition.hpp). Output: the same
// steps with each group of pointwise kernel steps (elementwise ops, select, convert) whose
// intermediate results are used once, by the group, replaced by one fused step; a broadcast or
// reshape that only repeats its operand (a bias, a scalar, a row's statistic along the row:
// Primitive::repeat) joins the group as a read of that operand. The fused step runs the group's
// own kernels chunk by chunk (a few thousand elements, in cache) on every device: the intermediates
// are never written to memory, so a chain such as bias + activation or the optimizer update reads
// and writes its blocks once instead of once per op, and the memory pass (memory.hpp), which runs
// after it, plans no buffers for them. Results are bitwise those of the unfused steps: each kernel
// computes each element as before and intermediates are stored in their own dtype.

#include "partition.hpp"
#include "../ir/primitive.hpp"

namespace shardplan::detail {

/// Elements per chunk of a fused step (each intermediate takes at most 8 bytes per element).
inline constexpr std::int64_t kFusedChunk = 4096;

/// Fuses in place. A step joins the group of the step that reads its result when the reader is a
/// pointwise kernel (pending sums included: a reader takes a pending operand as it is only where
/// it carries the sum, so the fused chunks are the same summands), the reader is not constant, the
/// result has no other use (not an output, not read twice), the two blocks hold the same number of
/// elements, the reader does not read it through an optimization barrier (XLA fuses nothing
/// across one), and the step is a pointwise kernel that is not constant, or a repetition of its
/// operand (its operand then stays outside the group: a bias, a row's statistic broadcast along
/// the row, a scalar; Primitive::repeat). With `repeats_only`, only such repetitions join (an
/// eager framework's kernels: each op writes its result, a broadcast is a view).
void fuse_pointwise(const Graph& g, Partitioned& p, bool repeats_only = false);

/// Runs a fused step's ops on one device: `in` the step's input blocks, `out` its result block.
void run_fused(const std::vector<FusedOp>& ops, const std::vector<ConstBlock>& in,
               const MutBlock& out);

}  // namespace shardplan::detail
