#pragma once
// Async TP's pairs read off a compiled step (docs/training.md "Async TP"): which tensor-parallel
// collectives PyTorch's micro-pipeline pass would run decomposed with their products. Private to
// the library.
#include <cstdint>
#include <map>

#include "../program/compiler/compile.hpp"
#include "shardplan/program_cost.hpp"
#include "shardplan/train_plan.hpp"

namespace shardplan::train {

/// The forward and backward passes' (the steps before `timeline`'s update phase) collectives over
/// `model` axes only that move bytes and pair with products (ops whose time is the matrix units':
/// TimeBound kMatmul or kMatmulFp8), by kind, with how many of each:
/// - an all-gather whose result products read along a dimension it gathered that they do not
///   contract (torch/_inductor/fx_passes/micro_pipeline_tp.py fuse_all_gather_matmul: the
///   matmuls that take the gathered tensor as their left operand, so each rank's chunk gives
///   its own rows of the result); the FLOPs are those products';
/// - a reduce-scatter of the pending result of a product (fuse_matmul_reduce_scatter:
///   _find_producer_matmul, the reduce-scatter's operand an mm); the FLOPs are that product's.
/// A reshard's other collectives (over batch axes) and a reduce-scatter of a sum of products
/// are not paired, as the pass pairs none of them.
std::map<TpOverlapKind, std::int64_t> tp_overlap_pairs(const detail::Program& program,
                                                       const MemoryTimeline& timeline,
                                                       const AxisNames& model);

}  // namespace shardplan::train
