// --tp-plan: where a tensor-parallel step's layer weights are laid out as used. `modules` plans
// each block as Megatron's column/row-parallel modules (and torchtitan's ColwiseParallel /
// RowwiseParallel with SequenceParallel) run it.
#include "train_plan_test.hpp"

namespace shardplan::test {
namespace {

constexpr const char* kSmallLlama = R"({{"model_type": "llama", "vocab_size": 4096,
  "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": {},
  "num_attention_heads": 8, "num_key_value_heads": 8}})";

// Bytes a device receives per step by kind over the axes `axes` (any argument flag).
std::int64_t over(const TrainPlan& p, CollectiveKind kind, std::vector<std::string> axes) {
  std::int64_t b = 0;
  for (const auto& [on, bytes] : p.bytes_by_axes) {
    if (on.kind == kind && on.axes == axes) b += bytes;
  }
  return b;
}

TrainPlan plan_layers(int layers, TpPlan tp_plan, bool reshard_after_forward = true) {
  const ModelConfig config = ModelConfig::parse(fmt::format(kSmallLlama, layers));
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 256;
  o.extrapolate = false;
  o.tp_plan = tp_plan;
  o.reshard_after_forward = reshard_after_forward;
  o.activations = load_preset("llama_fsdp_tp");  // its activations: sequence parallelism
  return plan_training(config, Mesh::parse("fsdp:2,tp:4", 8), preset("llama_fsdp_tp"), o);
}

// Per layer, by hand: the forward pass all-gathers the attention's and the MLP's input (the
// norm's output, its sequence split over tp) and reduce-scatters the output projections'
// partial sums back to the sequence split; the backward pass runs the transposes (a
// reduce-scatter for each all-gather and the reverse). Each moves [4 / 2 sequences, 256, 512]
// bf16 = 512 KiB, of which a device receives 3/4: 393,216 B, 4 times per kind. No all-to-all.
// The weights are used in their tp split: never gathered over tp. Two layers more add exactly
// that; the partitioner's own plan moves the attention's activations by all-to-all instead.
TEST(TensorParallelPlan, ModulesMoveEachBlocksActivationsAsMegatronDoes) {
  const TrainPlan two = plan_layers(2, TpPlan::kModules), four = plan_layers(4, TpPlan::kModules);
  EXPECT_TRUE(two.tp_modules);
  const std::int64_t per_layer = 4 * 393'216;
  EXPECT_EQ(over(four, CollectiveKind::kAllGather, {"tp"}) -
                over(two, CollectiveKind::kAllGather, {"tp"}),
            2 * per_layer);
  EXPECT_EQ(over(four, CollectiveKind::kReduceScatter, {"tp"}) -
                over(two, CollectiveKind::kReduceScatter, {"tp"}),
            2 * per_layer);
  EXPECT_EQ(over(four, CollectiveKind::kAllToAll, {"tp"}),
            over(two, CollectiveKind::kAllToAll, {"tp"}));

  const TrainPlan p2 = plan_layers(2, TpPlan::kPartitioner),
                  p4 = plan_layers(4, TpPlan::kPartitioner);
  EXPECT_FALSE(p2.tp_modules);
  EXPECT_GT(over(p4, CollectiveKind::kAllToAll, {"tp"}), over(p2, CollectiveKind::kAllToAll, {"tp"}));
}

// FSDP's reshard after forward holds for weights laid out as the modules use them: the backward
// pass gathers each layer's weights over fsdp again. By hand, a layer's matrices (q, k, v, o
// 512 x 512, the MLP's three 512 x 1024) are 2,621,440 bf16 values, split 4 ways over tp and
// gathered over fsdp:2, of which a device receives half: 655,360 B a layer. (Without mixed
// precision the weights as used were a value of the program that the reshard policy saved:
// both settings planned one program.)
TEST(TensorParallelPlan, ModulesGatherTheLayersWeightsAgainWhenReshardedAfterForward) {
  const TrainPlan kept = plan_layers(2, TpPlan::kModules, false),
                  resharded = plan_layers(2, TpPlan::kModules, true);
  EXPECT_TRUE(resharded.reshard_after_forward);
  EXPECT_EQ(over(resharded, CollectiveKind::kAllGather, {"fsdp"}) -
                over(kept, CollectiveKind::kAllGather, {"fsdp"}),
            2 * 655'360);
  EXPECT_LT(resharded.peak_bytes, kept.peak_bytes);
}

// Without a model axis there is nothing to lay out: the same program either way, and the plan
// says the partitioner's (what ran).
TEST(TensorParallelPlan, WithoutAModelAxisModulesChangeNothing) {
  const ModelConfig config = ModelConfig::parse(fmt::format(kSmallLlama, 2));
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 256;
  o.extrapolate = false;
  const TrainPlan a = plan_training(config, Mesh::parse("fsdp:4", 4), preset("llama_fsdp"), o);
  o.tp_plan = TpPlan::kModules;
  const TrainPlan b = plan_training(config, Mesh::parse("fsdp:4", 4), preset("llama_fsdp"), o);
  EXPECT_FALSE(b.tp_modules);
  EXPECT_EQ(a.bytes_by_axes, b.bytes_by_axes);
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
}

TEST(TensorParallelPlan, ModulesWithFloat8OnAModelAxisAreRefused) {
  const ModelConfig config = ModelConfig::parse(fmt::format(kSmallLlama, 2));
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 256;
  o.float8 = true;
  o.tp_plan = TpPlan::kModules;
  EXPECT_THROW_WITH(
      plan_training(config, Mesh::parse("fsdp:2,tp:4", 8), preset("llama_fsdp_tp"), o),
      OptionError, "--tp-plan modules is refused", "--float8", "--tp-plan partitioner");
  EXPECT_THROW_WITH(parse_tp_plan("megatron"), SpecError,
                    "unknown tensor-parallel plan 'megatron' (known: partitioner, modules)");
}

}  // namespace
}  // namespace shardplan::test
