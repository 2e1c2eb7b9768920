// Sharded initialisation under sjit (each device makes only its shards: the peak memory per
// device stays at the shard size) and eval_shape.
#include "shardplan/optim.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

Tree<Array> init_params(std::uint64_t seed) {
  return Tree<Array>::dict({{"w1", random_normal(Shape{256, 512}, DType::kF32, seed, 0, 0.02)},
                            {"w2", random_normal(Shape{512, 256}, DType::kF32, seed + 1, 0, 0.02)},
                            {"b", random_uniform(Shape{512}, DType::kF32, seed + 2)}});
}

TEST(ShardedInit, EveryDeviceMakesOnlyItsShards) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("fsdp:8", 8);
  SjitOptions o;
  o.out_shardings = RuleTree::dict(
      {{"w1", RuleTree(P("fsdp"))}, {"w2", RuleTree(P(nullptr, "fsdp"))}, {"b", RuleTree(P())}});
  o.executor = exec;
  auto init = sjit(mesh, &init_params, o);
  exec.release_cached();
  exec.reset_peak();
  const Tree<Array> params = init(std::uint64_t{7});
  const std::int64_t shard = 256 * 512 * 4 / 8;
  for (int d = 0; d < 8; ++d) {
    // Two weight shards and the replicated bias, never a whole weight (512 KiB).
    EXPECT_EQ(exec.memory(d).peak, 2 * shard + 512 * 4) << d;
  }
  EXPECT_EQ(params.at("w1").leaf().sharding().spec(), P("fsdp"));
  // The same numbers as an unsharded fill.
  EXPECT_TRUE(params.at("w1").leaf().to_host() ==
              Tensor::normal(Shape{256, 512}, DType::kF32, 7, 0, 0.02));
  EXPECT_TRUE(params.at("w2").leaf().to_host() ==
              Tensor::normal(Shape{512, 256}, DType::kF32, 8, 0, 0.02));
  EXPECT_TRUE(params.at("b").leaf().to_host() == Tensor::uniform(Shape{512}, DType::kF32, 9));
  // And the optimizer state made from them is sharded alike.
  const Tree<Array> st = Optimizer::adam(1e-3).init(params);
  EXPECT_EQ(st.at_path("mu/w2").leaf().sharding().spec(), P(nullptr, "fsdp"));
}

TEST(ShardedInit, RandomArraysNeedSjit) {
  EXPECT_THROW_WITH(random_normal(Shape{4}, DType::kF32, 1), ArrayError, "outside sjit",
                    "Array::normal");
}

TEST(EvalShape, GivesOutputSpecsWithoutRunning) {
  const Mesh mesh = Mesh::parse("fsdp:8", 8);
  const auto specs = eval_shape(mesh, &init_params, std::uint64_t{0});
  EXPECT_EQ(specs.at("w1").leaf(), (TensorSpec{Shape{256, 512}, DType::kF32}));
  EXPECT_EQ(specs.at("b").leaf(), (TensorSpec{Shape{512}, DType::kF32}));
  const auto out = eval_shape(
      mesh, [](const Array& x, const Array& w) { return relu(matmul(x, w)); },
      TensorSpec{Shape{1 << 14, 1 << 12}, DType::kBF16},
      TensorSpec{Shape{1 << 12, 1 << 16}, DType::kBF16});
  EXPECT_EQ(out.leaf(), (TensorSpec{Shape{1 << 14, 1 << 16}, DType::kBF16}));
}

}  // namespace
}  // namespace shardplan
