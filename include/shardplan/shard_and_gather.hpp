#pragma once
// scalax's make_shard_and_gather_fns: from a tree of shardings, a tree of functions that put a
// host tensor on the devices with its leaf's sharding (device_put) and a tree of functions that
// bring an array back to the host (to_host), e.g. to load and save a checkpoint leaf by leaf.
//
//   auto fns = make_shard_and_gather_fns(helper.match(rules, specs), exec);
//   Tree<Array> params = fns.shard(host_params);     // or fns.shard_fns.at("w").leaf()(t)
//   Tree<Tensor> saved = fns.gather(params);

#include <functional>

#include "shardplan/array.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/tensor.hpp"
#include "shardplan/tree.hpp"

namespace shardplan {

/// The two trees of functions, in the shape of the sharding tree (its none nodes stay none).
struct ShardAndGatherFns {
  using ShardFn = std::function<Array(const Tensor&)>;
  using GatherFn = std::function<Tensor(const Array&)>;
  /// Per leaf: the tensor put with that leaf's sharding. Throws SpecError naming the leaf when
  /// the shape does not divide or the leaf's sharding was left Unspecified.
  Tree<ShardFn> shard_fns;
  /// Per leaf: the array gathered to the host (a pending array is reduced first).
  Tree<GatherFn> gather_fns;

  /// Every leaf of `tensors` (the function tree is a prefix of it) put by its shard function.
  /// Throws TreeError where the structures differ.
  Tree<Array> shard(const Tree<Tensor>& tensors) const;
  /// Every leaf of `arrays` gathered by its gather function.
  Tree<Tensor> gather(const Tree<Array>& arrays) const;
};

/// The shard and gather functions of every leaf of `shardings`, on `executor`.
ShardAndGatherFns make_shard_and_gather_fns(const Tree<NamedSharding>& shardings,
                                            const Executor& executor);
/// As above, from what MeshShardingHelper::match returns; an Unspecified leaf's shard function
/// throws SpecError (there is no sharding to put it with), its gather function works.
ShardAndGatherFns make_shard_and_gather_fns(const Tree<MaybeSharding>& shardings,
                                            const Executor& executor);

}  // namespace shardplan
