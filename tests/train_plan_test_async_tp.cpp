// --async-tp: the tensor-parallel all-gathers that feed products and the reduce-scatters a product
// feeds, read from the planned program, run under those products as PyTorch's micro-pipeline TP
// decomposes them (docs/training.md "Async TP").
#include <algorithm>

#include "train_plan_test.hpp"

namespace shardplan::test {
namespace {

constexpr const char* kSmallLlama = R"({{"model_type": "llama", "vocab_size": 4096,
  "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": {},
  "num_attention_heads": 8, "num_key_value_heads": 8}})";

TrainPlanOptions tp_options(bool async_tp) {
  TrainPlanOptions o;
  o.fused_loss = false;  // the head's products whole, as torchtitan's loss_parallel runs them
  o.batch = 4;
  o.seq = 256;
  o.extrapolate = false;
  o.tp_plan = TpPlan::kModules;
  o.async_tp = async_tp;
  o.hardware = find_hardware("h100-sxm");
  o.activations = load_preset("llama_fsdp_tp");
  return o;
}

TrainPlan plan_tp(int layers, bool async_tp) {
  const ModelConfig config = ModelConfig::parse(fmt::format(kSmallLlama, layers));
  return plan_training(config, Mesh::parse("fsdp:2,tp:4", 8), preset("llama_fsdp_tp"),
                       tp_options(async_tp));
}

// How many pairs of `kind` over tp with products of `flops` per device.
std::int64_t pairs(const TrainPlan& p, CollectiveKind kind, std::int64_t flops) {
  std::int64_t n = 0;
  for (const TpOverlap& o : p.tp_overlaps) {
    if (o.kind.collective.kind == kind && o.kind.flops == flops) {
      EXPECT_EQ(o.kind.collective.axes, std::vector<std::string>{"tp"});
      EXPECT_EQ(o.kind.bytes, 393'216);  // [2, 256, 512] bf16, 3/4 of it received
      EXPECT_FALSE(o.kind.float8);
      n += o.count;
    }
  }
  return n;
}

// By hand, per device on fsdp:2 x tp:4 (512 tokens of [2 sequences, 256]; hidden 512, the MLP
// 1024 wide, the vocabulary 4096, each split 4 ways): the forward pass all-gathers the norm's
// output for q, k and v (3 x 2 x 512 x 512 x 128 FLOPs) and for gate and up (2 x 2 x 512 x 512
// x 256), the o and down products (2 x 512 x 128 x 512, 2 x 512 x 256 x 512) are
// reduce-scattered; the backward pass all-gathers their outputs' cotangents for the products
// giving their inputs' (the same FLOPs; the weight gradients contract the gathered tokens, so
// they are not split by chunk), and reduce-scatters the sums of q, k, v's and gate, up's (a
// sum, not a product: not paired, as PyTorch's pass pairs a reduce-scatter with an mm only).
// The head: its input all-gathered for [512, 512] x [512, 1024] and its input's cotangent, that
// product's, reduce-scattered. So 4 all-gathers and 2 reduce-scatters per layer, 1 and 1 more.
TEST(AsyncTensorParallel, PairsEachBlocksCollectivesWithTheirProducts) {
  const TrainPlan p = plan_tp(2, true);
  const std::int64_t qkv = 3 * 2 * 512 * 512 * 128, gate_up = 2 * 2 * 512 * 512 * 256;
  const std::int64_t o = 2 * 512 * 128 * 512, down = 2 * 512 * 256 * 512;
  const std::int64_t head = 2 * 512 * 512 * 1024;
  EXPECT_EQ(pairs(p, CollectiveKind::kAllGather, qkv), 2);
  EXPECT_EQ(pairs(p, CollectiveKind::kAllGather, gate_up), 2);
  EXPECT_EQ(pairs(p, CollectiveKind::kAllGather, o), 2);
  EXPECT_EQ(pairs(p, CollectiveKind::kAllGather, down), 2);
  EXPECT_EQ(pairs(p, CollectiveKind::kAllGather, head), 1);
  EXPECT_EQ(pairs(p, CollectiveKind::kReduceScatter, o), 2);
  EXPECT_EQ(pairs(p, CollectiveKind::kReduceScatter, down), 2);
  EXPECT_EQ(pairs(p, CollectiveKind::kReduceScatter, head), 1);
  std::int64_t all = 0;
  for (const TpOverlap& x : p.tp_overlaps) all += x.count;
  EXPECT_EQ(all, 2 * 6 + 2);
  EXPECT_THAT(p.table(), ::testing::HasSubstr(
                             "async TP (9 all-gathers and 5 reduce-scatters run under their "
                             "products)"));
  // Two layers more: 4 all-gathers and 2 reduce-scatters each.
  const TrainPlan four = plan_tp(4, true);
  std::int64_t more = 0;
  for (const TpOverlap& x : four.tp_overlaps) more += x.count;
  EXPECT_EQ(more - all, 2 * 6);
}

// The exposed time by hand from the hardware's figures: a pair's collective over tp:4 moves
// 393,216 B at the node's links (450 GB/s x its efficiency), its products run at 989.4 TFLOP/s x
// 0.80; pipelined in 4 chunks, max(0, transfer - 3/4 products) of it stays exposed. The step
// differs from the one without async TP by exactly what the pairs hide.
TEST(AsyncTensorParallel, ExposesOnlyWhatThePipelineCannotHide) {
  const TrainPlan async = plan_tp(2, true), plain = plan_tp(2, false);
  ASSERT_TRUE(async.time && plain.time);
  const Hardware hw = find_hardware("h100-sxm");
  const double transfer = 393'216 / (hw.intra_node_bandwidth * hw.intra_node_efficiency);
  double hidden = 0;
  ASSERT_EQ(async.time->tp_overlaps.size(), async.tp_overlaps.size());
  for (const TpOverlapTime& t : async.time->tp_overlaps) {
    SCOPED_TRACE(t.pair.kind.flops);
    const double products =
        static_cast<double>(t.pair.kind.flops) / (hw.bf16_flops * hw.matmul_efficiency);
    EXPECT_EQ(t.group, 4);
    EXPECT_EQ(t.tier, LinkTier::kNode);
    EXPECT_NEAR(t.comm_seconds, transfer, 1e-12 * transfer);
    EXPECT_NEAR(t.matmul_seconds, products, 1e-12 * products);
    const double exposed = std::max(0.0, transfer - 0.75 * products);
    EXPECT_NEAR(t.exposed_seconds, exposed, 1e-15);
    hidden += static_cast<double>(t.pair.count) * (transfer - exposed);
  }
  EXPECT_GT(hidden, 0);
  EXPECT_NEAR(async.time->tp_overlap_hidden_seconds, hidden, 1e-15);
  EXPECT_NEAR(plain.time->exposed_tensor_seconds - async.time->exposed_tensor_seconds, hidden,
              1e-15);
  EXPECT_NEAR(plain.time->step_seconds - async.time->step_seconds, hidden, 1e-15);
  // The same program: only the time differs.
  EXPECT_EQ(async.bytes_by_axes, plain.bytes_by_axes);
  EXPECT_EQ(async.peak_bytes, plain.peak_bytes);
  EXPECT_DOUBLE_EQ(async.matmul_flops, plain.matmul_flops);
}

// Without --async-tp nothing is paired, and the report and its JSON hold nothing of it.
TEST(AsyncTensorParallel, WithoutTheOptionNothingChanges) {
  const TrainPlan plain = plan_tp(2, false);
  EXPECT_TRUE(plain.tp_overlaps.empty());
  EXPECT_TRUE(plain.time->tp_overlaps.empty());
  EXPECT_EQ(plain.time->tp_overlap_hidden_seconds, 0);
  std::ostringstream os;
  plain.write_json(os);
  const nlohmann::json j = nlohmann::json::parse(os.str());
  EXPECT_FALSE(j.contains("tp_overlaps"));
  EXPECT_FALSE(j["time"].contains("tp_overlap"));
  EXPECT_THAT(plain.table(), ::testing::Not(::testing::HasSubstr("async TP")));
}

// Refused: without a tensor-parallel axis, with the partitioner's plan, and eager.
TEST(AsyncTensorParallel, IsRefusedWhereItCannotApply) {
  const ModelConfig config = ModelConfig::parse(fmt::format(kSmallLlama, 2));
  TrainPlanOptions o = tp_options(true);
  TrainPlanOptions fsdp = o;
  fsdp.activations.reset();
  EXPECT_THROW_WITH(plan_training(config, Mesh::parse("fsdp:4", 4), preset("llama_fsdp"), fsdp),
                    OptionError, "--async-tp is refused",
                    "no tensor-parallel axis of more than one device", "Mesh('fsdp': 4)");
  EXPECT_THROW_WITH(
      plan_training(config, Mesh::parse("fsdp:2,tp:1", 2), preset("llama_fsdp_tp"), o),
      OptionError, "--async-tp is refused", "no tensor-parallel axis");
  o.tp_plan = TpPlan::kPartitioner;
  EXPECT_THROW_WITH(
      plan_training(config, Mesh::parse("fsdp:2,tp:4", 8), preset("llama_fsdp_tp"), o),
      OptionError, "--async-tp is refused", "--tp-plan partitioner", "--tp-plan modules");
  o.tp_plan = TpPlan::kModules;
  o.eager = true;
  EXPECT_THROW_WITH(
      plan_training(config, Mesh::parse("fsdp:2,tp:4", 8), preset("llama_fsdp_tp"), o),
      OptionError, "--async-tp is refused", "--eager", "torch.compile");
}

}  // namespace
}  // namespace shardplan::test
