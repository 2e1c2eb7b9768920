#pragma once
// Sharding rules of the primitive ops, written once per op as einsum-like factors (the idea of
// OpenXLA Shardy): every dimension of every operand and of the result names a factor; a factor
// shared by tensors is sharded alike on all of them.

#include <cstdint>
#include <span>
#include <vector>

#include "shardplan/shape.hpp"

namespace shardplan::detail {

enum class FactorKind {
  kPass,       // appears in the result: operands and result sharded alike
  kReduce,     // contracted or reduced: only in operands; sharding it leaves a pending result
  kReplicate,  // must not be sharded (a sliced or concatenated dimension, a gathered axis)
};

struct OpFactors {
  std::vector<std::int64_t> sizes;         // per factor
  std::vector<FactorKind> kinds;           // per factor
  std::vector<std::vector<int>> operands;  // per operand, per dimension: factor or -1
  std::vector<int> result;                 // per result dimension: factor or -1

  FactorKind kind(int factor) const { return kinds[static_cast<std::size_t>(factor)]; }
  std::int64_t size(int factor) const { return sizes[static_cast<std::size_t>(factor)]; }
  int count() const { return static_cast<int>(sizes.size()); }

  int add(std::int64_t size, FactorKind kind) {
    sizes.push_back(size);
    kinds.push_back(kind);
    return static_cast<int>(sizes.size()) - 1;
  }
};

/// One pass factor per dimension of `result`, shared by every operand (each of the same shape):
/// elementwise ops, select, convert, the sharding identities.
OpFactors same_dims(const Shape& result, std::span<const Shape> operands);
/// Factors for the result only (no operands): any sharding of it can be made locally (iota,
/// constant, random values, inputs).
OpFactors result_only(const Shape& result);

}  // namespace shardplan::detail
