#pragma once
// Sharding rules of the primitive ops, written once per op as einsum-like factors (the idea of
// OpenXLA Shardy): every dimension of every operand and of the result names a factor; a factor
// shared by tensors is sharded alike on all of them.

#include <cstdint>
#include <vector>

#include "shardplan/graph.hpp"

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

  int add(std::int64_t size, FactorKind kind) {
    sizes.push_back(size);
    kinds.push_back(kind);
    return static_cast<int>(sizes.size()) - 1;
  }
};

/// The factors of `node`, whose operands are nodes of `graph`.
OpFactors factors_of(const Graph& graph, const Node& node);

}  // namespace shardplan::detail
