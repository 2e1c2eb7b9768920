#pragma once
// Per-device compute kernels of the primitive ops (graph.hpp): what one device runs on its blocks
// once the partitioner has made every attribute local.

#include <cstdint>
#include <vector>

#include "shardplan/graph.hpp"

namespace shardplan::detail {

/// One device's block of a value: row-major, `shape` is the local (block) shape.
struct ConstBlock {
  const std::byte* data;
  Shape shape;
  DType dtype;
};
struct MutBlock {
  std::byte* data;
  Shape shape;
  DType dtype;
};

/// Computes `node` on one device's blocks. in[i] is operand i's block; `out` is the result block
/// (preallocated with out.shape = local result shape, contents undefined). `out_offset` is the
/// global index of out's first element along each result dimension (iota and constant depend on
/// where the block sits). Node attributes are already local (see below). Throws SpecError naming
/// the op, the dtype and the shapes for a dtype an op does not support.
void run_kernel(const Node& node, const std::vector<ConstBlock>& in, const MutBlock& out,
                const std::vector<std::int64_t>& out_offset);

/// Floating-point operations the kernel performs for these local shapes: dot 2*batch*m*n*k;
/// elementwise and select: numel of the result (gelu/sigmoid etc. count 1 per element too);
/// reductions: numel of the operand; data movement (reshape, transpose, broadcast, slice, concat,
/// take, iota, constant, convert, constraint, annotation, input): 0.
double kernel_flops(const Node& node, const std::vector<Shape>& in_shapes, const Shape& out_shape);

}  // namespace shardplan::detail
