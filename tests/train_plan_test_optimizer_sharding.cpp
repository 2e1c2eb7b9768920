// --optimizer-sharding zero1 (Megatron's --use-distributed-optimizer): bf16 parameters held
// replicated over the data axes, f32 master weights and Adam's moments sharded as the rules say,
// the gradients reduce-scattered to those shards and the new parameters all-gathered.
#include "train_plan_test.hpp"

namespace shardplan::test {
namespace {

// Megatron's --bf16: bf16 parameters and gradients, f32 main parameters and state, reduced in
// bf16.
TrainPlanOptions megatron_bf16(OptimizerSharding sharding, int grad_accum = 1) {
  TrainPlanOptions o;
  o.batch = 4 * grad_accum;
  o.seq = 8;
  o.grad_accum = grad_accum;
  o.param_dtype = o.grad_dtype = DType::kBF16;
  o.master_dtype = o.optimizer_dtype = DType::kF32;
  o.reduce_dtype = DType::kBF16;
  o.optimizer_sharding = sharding;
  o.extrapolate = false;
  return o;
}

TrainPlan plan_on_four(const TrainPlanOptions& o) {
  return plan_training(ModelConfig::parse(kTinyLlama), Mesh::parse("fsdp:4", 4),
                       preset("llama_fsdp"), o);
}

// kTinyLlama (hidden 32, intermediate 48, 2 layers, 4 heads, 2 key/value heads of 8, vocab 64):
// per layer q, o [32, 32], k, v [16, 32], gate, up [48, 32], down [32, 48]: 7,680 elements, and
// two norms of 32; the embedding and the head [64, 32], the final norm 32. llama_fsdp splits the
// 19,456 matrix elements over fsdp (4) and replicates the 160 norm elements.
constexpr std::int64_t kMatrices = 2 * 2048 + 2 * 7680, kNorms = 2 * 64 + 32;

// Per device: the bf16 parameters and gradient buffer whole; the f32 master and both moments a
// quarter of the matrices plus the norms whole, and the step count.
TEST(OptimizerSharding, ZeroOneHoldsParametersWholeAndShardsTheMasterAndMoments) {
  const TrainPlan z = plan_on_four(megatron_bf16(OptimizerSharding::kZero1));
  EXPECT_EQ(z.optimizer_sharding, "zero1");
  EXPECT_EQ(z.parameter_bytes, (kMatrices + kNorms) * 2);
  EXPECT_EQ(z.gradient_bytes, (kMatrices + kNorms) * 2);
  EXPECT_EQ(z.optimizer_bytes, 3 * (kMatrices / 4 + kNorms) * 4 + 4);
  // As the rules say (FSDP): the f32 weights are held sharded, their gradients too.
  const TrainPlan r = plan_on_four(megatron_bf16(OptimizerSharding::kRules));
  EXPECT_EQ(r.optimizer_sharding, "rules");
  EXPECT_EQ(r.parameter_bytes, (kMatrices / 4 + kNorms) * 4);
  EXPECT_EQ(r.gradient_bytes, (kMatrices / 4 + kNorms) * 2);
  EXPECT_EQ(r.optimizer_bytes, 2 * (kMatrices / 4 + kNorms) * 4 + 4);
}

// One reduce-scatter of the bf16 gradients and one all-gather of the new bf16 parameters over
// fsdp per step: each device receives 3/4 of the matrices' bf16 bytes in each (a ring over 4).
// Besides, the norms' bf16 gradients (320 B) and the loss's two f32 scalars (8 B) are
// all-reduced (2 x 3/4 of their bytes). Nothing is gathered for the forward or backward pass
// (the parameters are held whole). With two micro-batches the gradients are summed whole and
// reduced once, as Megatron's buffer: the same bytes (the norms' all-reduce then runs as a
// reduce-scatter and an all-gather).
TEST(OptimizerSharding, ZeroOneReduceScattersGradientsAndAllGathersParametersOncePerStep) {
  const std::int64_t ring = kMatrices * 2 * 3 / 4, reduced = (kNorms * 2 + 8) * 3 / 2;
  for (const int accum : {1, 2}) {
    SCOPED_TRACE(accum);
    const TrainPlan z = plan_on_four(megatron_bf16(OptimizerSharding::kZero1, accum));
    const auto& by = z.bytes_by_collective;
    if (accum == 1) {
      EXPECT_EQ(by.at(CollectiveKind::kReduceScatter), ring);
      EXPECT_EQ(by.at(CollectiveKind::kAllGather), ring);
      EXPECT_EQ(by.at(CollectiveKind::kAllReduce), reduced);
    }
    EXPECT_GE(by.at(CollectiveKind::kReduceScatter), ring);
    EXPECT_GE(by.at(CollectiveKind::kAllGather), ring);
    EXPECT_EQ(by.at(CollectiveKind::kReduceScatter) + by.at(CollectiveKind::kAllGather) +
                  by.at(CollectiveKind::kAllReduce),
              2 * ring + reduced);
    for (const auto& [on, bytes] : z.bytes_by_axes) {
      if (bytes > 0) {
        EXPECT_EQ(on.axes, std::vector<std::string>{"fsdp"});
      }
    }
  }
}

// A step too long to trace whole (40 layers: extrapolated from steps of 2, 3, 4 and 8) holds
// what the traced step holds: its state bytes come from the rules as the step takes them.
TEST(OptimizerSharding, AnExtrapolatedStepHoldsWhatTheTracedOneDoes) {
  std::string deep = kTinyLlama;
  const std::string two = "\"num_hidden_layers\": 2";
  deep.replace(deep.find(two), two.size(), "\"num_hidden_layers\": 40");
  const ModelConfig c = ModelConfig::parse(deep);
  TrainPlanOptions o = megatron_bf16(OptimizerSharding::kZero1);
  o.extrapolate = true;
  const TrainPlan e = plan_training(c, Mesh::parse("fsdp:4", 4), preset("llama_fsdp"), o);
  ASSERT_TRUE(e.extrapolated);
  const std::int64_t whole = 2 * 2048 + 32 + 40 * (7680 + 64), sharded = 2 * 2048 + 40 * 7680;
  EXPECT_EQ(e.parameter_bytes, whole * 2);
  EXPECT_EQ(e.gradient_bytes, whole * 2);
  EXPECT_EQ(e.optimizer_bytes, 3 * (sharded / 4 + (whole - sharded)) * 4 + 4);
  EXPECT_EQ(e.optimizer_sharding, "zero1");
  EXPECT_FALSE(e.reshard_after_forward);  // nothing is gathered for use
}

// It shards nothing without a data axis of more than one device the rules split over, or with
// SGD and no master weights: refused, naming the option and why.
TEST(OptimizerSharding, ZeroOneWithNothingToShardIsRefused) {
  const auto config = ModelConfig::parse(kTinyLlama);
  EXPECT_THROW_WITH(plan_training(config, Mesh::parse("fsdp:1", 1), preset("llama_fsdp"),
                                  megatron_bf16(OptimizerSharding::kZero1)),
                    OptionError, "--optimizer-sharding zero1 is refused",
                    "split no parameter over a data axis of the mesh",
                    "(the batch and context axes are [fsdp])", "llama_fsdp",
                    "--optimizer-sharding rules");
  // A mesh of a tensor-parallel axis only: no data axis to name.
  EXPECT_THROW_WITH(plan_training(config, Mesh::parse("tp:2", 2), preset("llama_fsdp_tp"),
                                  megatron_bf16(OptimizerSharding::kZero1)),
                    OptionError, "--optimizer-sharding zero1 is refused",
                    "(the mesh has no batch or context axis)", "llama_fsdp_tp");
  TrainPlanOptions sgd = megatron_bf16(OptimizerSharding::kZero1);
  sgd.optimizer = OptimizerKind::kSgd;
  sgd.master_dtype.reset();
  EXPECT_THROW_WITH(
      plan_training(config, Mesh::parse("fsdp:4", 4), preset("llama_fsdp"), sgd), OptionError,
      "--optimizer-sharding zero1 is refused", "SGD keeps no optimizer state");
  EXPECT_THROW_WITH(parse_optimizer_sharding("zero2"), SpecError,
                    "unknown optimizer sharding 'zero2' (known: rules, zero1)");
}

}  // namespace
}  // namespace shardplan::test
