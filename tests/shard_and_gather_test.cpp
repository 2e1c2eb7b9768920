// make_shard_and_gather_fns: shard functions put each leaf with its sharding, gather functions
// bring it back; Unspecified leaves and none nodes are errors naming the path.
#include "shardplan/shard_and_gather.hpp"

#include "shardplan/error.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

TEST(ShardAndGatherFns, PutEachLeafWithItsShardingAndGatherItBack) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("fsdp:4,tp:2", 8);
  const Tree<Tensor> params = Tree<Tensor>::dict(
      {{"w", Tensor::normal(Shape{8, 4}, DType::kF32, 1)},
       {"layers", Tree<Tensor>::list({Tensor::normal(Shape{16}, DType::kF32, 2),
                                      Tensor::normal(Shape{4, 6}, DType::kF32, 3)})}});
  const Tree<NamedSharding> shardings = Tree<NamedSharding>::dict(
      {{"w", NamedSharding(mesh, P("fsdp", "tp"))},
       {"layers",
        Tree<NamedSharding>::list({NamedSharding(mesh, P("fsdp")), NamedSharding(mesh, P())})}});
  const ShardAndGatherFns fns = make_shard_and_gather_fns(shardings, exec);
  ASSERT_TRUE(fns.shard_fns.same_structure(params));
  ASSERT_TRUE(fns.gather_fns.same_structure(params));
  // One leaf by hand.
  const Array w = fns.shard_fns.at("w").leaf()(params.at("w").leaf());
  EXPECT_EQ(w.sharding(), NamedSharding(mesh, P("fsdp", "tp")));
  EXPECT_EQ(w.shard_shape(), Shape({2, 2}));
  EXPECT_EQ(w.executor(), exec);
  EXPECT_TRUE(fns.gather_fns.at("w").leaf()(w) == params.at("w").leaf());
  // The whole tree.
  const Tree<Array> arrays = fns.shard(params);
  EXPECT_EQ(arrays.at_path("layers/0").leaf().shard_shape(), Shape({4}));
  EXPECT_EQ(arrays.at_path("layers/1").leaf().sharding().spec(), P());
  EXPECT_EQ(fns.gather(arrays), params);
  // A shape the sharding does not divide names the leaf.
  EXPECT_THROW_WITH(fns.shard_fns.at("w").leaf()(Tensor::ones(Shape{6, 4}, DType::kF32)), SpecError,
                    "leaf 'w'", "[6, 4]", "fsdp");
}

TEST(ShardAndGatherFns, ComeFromAMatchAndUnspecifiedLeavesCannotBeSharded) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("fsdp:8", 8);
  const Tree<TensorSpec> specs = Tree<TensorSpec>::dict(
      {{"w", TensorSpec{Shape{16, 4}, DType::kF32}}, {"step", TensorSpec{Shape{}, DType::kI32}}});
  const RuleTree rules =
      RuleTree::dict({{"w", RuleTree(P("fsdp"))}, {"step", RuleTree(Unspecified{})}});
  const ShardAndGatherFns fns =
      make_shard_and_gather_fns(MeshShardingHelper(mesh).match(rules, specs), exec);
  const Tensor w = Tensor::normal(Shape{16, 4}, DType::kF32, 4);
  const Array ws = fns.shard_fns.at("w").leaf()(w);
  EXPECT_EQ(ws.shard_shape(), Shape({2, 4}));
  EXPECT_TRUE(fns.gather_fns.at("w").leaf()(ws) == w);
  const Tensor step = Tensor::zeros(Shape{}, DType::kI32);
  EXPECT_THROW_WITH(fns.shard_fns.at("step").leaf()(step), SpecError, "'step'", "Unspecified");
  // The gather function of an Unspecified leaf works on any array.
  const Array s = device_put(step, NamedSharding(mesh, P()), exec);
  EXPECT_TRUE(fns.gather_fns.at("step").leaf()(s) == step);
  // A none node of the sharding tree has no functions.
  const ShardAndGatherFns partial =
      make_shard_and_gather_fns(Tree<NamedSharding>::dict({{"w", NamedSharding(mesh, P("fsdp"))},
                                                           {"step", Tree<NamedSharding>::none()}}),
                                exec);
  EXPECT_TRUE(partial.shard_fns.at("step").is_none());
  const Tree<Tensor> host = Tree<Tensor>::dict({{"w", w}, {"step", step}});
  EXPECT_THROW_WITH(partial.shard(host), TreeError, "'step'", "none");
}

}  // namespace
}  // namespace shardplan
