#pragma once
// shard_map's primitives (include/shardplan/shard_map.hpp), private to the program layer:
//   shard_map_in   a global array's blocks as per-device values (the operand read in `spec`);
//   shard_map_out  per-device values as the blocks of a global array sharded `spec`;
//   pvary          the same values, now said to vary over more axes (no step: an alias);
//   preduce        psum / pmax / pmin over axes (all-reduce);
//   pall_gather    all_gather (tiled, or stacked on a new dimension);
//   psum_scatter   reduce-scatter (tiled, or one row of a dimension of n);
//   ppermute       collective permute along one axis;
//   pall_to_all    rows of dimension 0 exchanged: row j to the j-th device along the axes, the
//                  rows received stacked in device order (lax::all_to_all is built on it).
// A per-device value is a replicated array whose devices hold different values; the boundaries
// and the collectives fix their layouts (Primitive::fixed_layout), so propagation never reaches
// inside, and the collectives run across devices (Primitive::collective).

#include <cstdint>
#include <string>
#include <vector>

#include "../../ir/primitive.hpp"

namespace shardplan::detail {

/// shard_map_in / shard_map_out: the spec, and per dimension the devices it is split over.
/// shard_map_out also: the axes the spec names that the value is the same over (it is tiled
/// there), which its gradient sums over (the transpose of the implicit pvary), and their devices.
struct BlockAttrs {
  PartitionSpec spec;
  std::vector<std::int64_t> split;
  std::vector<std::string> summed = {};
  std::int64_t summed_size = 1;
};
std::string format_attrs(const BlockAttrs& a);

/// The collectives' axes and how many devices they span (their product), fixed when traced.
struct ReduceAxesAttrs {
  std::vector<std::string> axes;
  std::int64_t size = 1;
  ReduceOp op = ReduceOp::kSum;
};
std::string format_attrs(const ReduceAxesAttrs& a);
struct GatherAttrs {  // pall_gather, psum_scatter
  std::vector<std::string> axes;
  std::int64_t size = 1;
  int dim = 0;
  bool tiled = false;
};
std::string format_attrs(const GatherAttrs& a);
struct PermutePair {
  int from = 0;
  int to = 0;
};
struct PermuteAttrs {
  std::string axis;
  std::int64_t size = 1;
  std::vector<PermutePair> pairs;
};
std::string format_attrs(const PermuteAttrs& a);
struct AxesAttrs {  // pvary, pall_to_all
  std::vector<std::string> axes;
  std::int64_t size = 1;
};
std::string format_attrs(const AxesAttrs& a);

/// The bits of `axes` among the mesh's axes (JAX's vma as a mask).
std::int64_t axis_bits(const Mesh& mesh, const std::vector<std::string>& axes);
/// The mesh axes a spec names.
std::vector<std::string> spec_axes(const PartitionSpec& spec);

}  // namespace shardplan::detail
