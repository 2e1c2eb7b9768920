// --dp-overlap and --dp-bucket-size (docs/training.md "Step time", issue 41): how the step time
// overlaps the data-parallel collectives, FSDP's pipeline, none, or Megatron's DDP buckets; the
// buckets and the exposed seconds worked out here by hand.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "shardplan/error.hpp"
#include "shardplan/hardware.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/train_plan.hpp"
#include "step_time.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

// Hidden 32, MLP 48, 4 heads of 8 with 2 key/value heads, vocabulary 64, 2 layers, the head not
// tied. Elements: q, o 32 x 32 = 1,024; k, v 16 x 32 = 512; gate, up, down 48 x 32 = 1,536;
// each norm 32; the embedding and the head 64 x 32 = 2,048. A layer 7,744; all 19,616.
constexpr const char* kTiny = R"({"model_type": "llama", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2})";

// Round figures: matrix units 1e12 x 0.5, memory 1e11 x 0.5, node links 1e10 x 0.5 B/s.
Hardware toy() {
  Hardware h;
  h.name = "toy";
  h.bf16_flops = 1e12;
  h.memory_bandwidth = 1e11;
  h.memory_bytes = std::int64_t{1} << 30;
  h.node_size = 8;
  h.intra_node_bandwidth = 1e10;
  h.inter_node_bandwidth = 1e9;
  h.matmul_efficiency = 0.5;
  h.attention_efficiency = 0.25;
  h.memory_efficiency = 0.5;
  h.intra_node_efficiency = 0.5;
  h.inter_node_efficiency = 0.5;
  return h;
}

// Megatron's DDP: every parameter whole on each data-parallel rank.
RulePtr replicated() {
  return parse_rule_file("mesh: \"dp:-1\"\nrules:\n  - {match: \".*\", spec: []}\n").make_rule();
}

TrainPlanOptions step(std::optional<DpOverlap> overlap, std::int64_t bucket_size = 0) {
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  o.extrapolate = false;
  o.hardware = toy();
  o.dp_overlap = overlap;
  o.dp_bucket_size = bucket_size;
  return o;
}

TrainPlan ddp(std::optional<DpOverlap> overlap, std::int64_t bucket_size = 0) {
  return plan_training(ModelConfig::parse(kTiny), Mesh::parse("dp:4", 4), replicated(),
                       step(overlap, bucket_size));
}

// The data-parallel reductions' seconds (all-reduces and reduce-scatters over data axes).
double reductions(const StepTime& t) {
  double s = 0;
  for (const CommTime& c : t.comms) {
    const CollectiveKind k = c.collective.kind;
    if (c.role == CommRole::kData &&
        (k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduceScatter)) {
      s += c.seconds;
    }
  }
  return s;
}

// On dp:4,tp:2, one node of 8 (5e9 B/s): a gradient all-reduce over dp of 5e9 B (1 s), ZeRO-1's
// all-gather over dp of 2.5e9 B (0.5 s), tp's all-reduce of 1e9 B (0.2 s, exposed); 3 s of
// products; buckets of 8,256, 8,256 and 3,104 elements (the last 3,104 / 19,616 of each).
// fsdp: 0.2 + 1.5 / 4 + 3/4 x max(0, 1.5 - 3) = 0.575. off: 0.2 + 1 + 0.5 = 1.7. buckets: the
// backward pass 2 s covers 1 x 16,512 / 19,616, the forward 1 s covers 0.5 x 16,512 / 19,616:
// 0.2 + 1.5 x 3,104 / 19,616. grad-buckets: the gather whole, 0.2 + 3,104 / 19,616 + 0.5.
TEST(DpOverlap, ExposedTimeWorkedByHand) {
  const Mesh mesh = Mesh::parse("dp:4,tp:2", 8);
  TrainPlan p;
  p.devices = 8;
  p.matmul_flops = 1.5e12;
  p.bytes_by_axes = {{CollectiveOn{CollectiveKind::kAllReduce, {"dp"}}, 5'000'000'000},
                     {CollectiveOn{CollectiveKind::kAllGather, {"dp"}}, 2'500'000'000},
                     {CollectiveOn{CollectiveKind::kAllReduce, {"tp"}}, 1'000'000'000}};
  train::TimeInputs in{.model_axes = {"tp"}, .layer_steps = 4, .tokens_per_step = 8};
  in.dp_bucket_elements = {8256, 8256, 3104};
  in.zero1 = true;
  const double last = 3104.0 / 19616.0;
  const auto exposed = [&](DpOverlap d) {
    in.dp_overlap = d;
    const StepTime t = train::step_time(p, mesh, toy(), in);
    EXPECT_EQ(t.dp_overlap, name(d));
    return t;
  };
  EXPECT_NEAR(exposed(DpOverlap::kFsdp).exposed_seconds, 0.575, 1e-12);
  const StepTime off = exposed(DpOverlap::kOff);
  EXPECT_NEAR(off.exposed_seconds, 1.7, 1e-12);
  EXPECT_NEAR(off.step_seconds, 3 + 1.7, 1e-12);
  for (const CommTime& c : off.comms) EXPECT_FALSE(c.overlapped);
  const StepTime b = exposed(DpOverlap::kBuckets);
  EXPECT_NEAR(b.dp_reduce_seconds, 1, 1e-12);
  EXPECT_NEAR(b.dp_reduce_exposed_seconds, last, 1e-12);
  EXPECT_NEAR(b.dp_gather_seconds, 0.5, 1e-12);
  EXPECT_NEAR(b.dp_gather_exposed_seconds, 0.5 * last, 1e-12);
  EXPECT_NEAR(b.exposed_seconds, 0.2 + 1.5 * last, 1e-12);
  EXPECT_NEAR(b.exposed_by_tier.at(LinkTier::kNode), 0.2 + 1.5 * last, 1e-12);
  EXPECT_NEAR(exposed(DpOverlap::kGradBuckets).exposed_seconds, 0.2 + last + 0.5, 1e-12);
  // Compute of 0.3 s: the backward pass (0.2 s) hides 0.2 of the first buckets' 0.84, the
  // forward (0.1 s) 0.1 of the gathers' 0.42: 1 - 0.2 and 0.5 - 0.1 exposed.
  p.matmul_flops = 1.5e11;
  const StepTime short_compute = exposed(DpOverlap::kBuckets);
  EXPECT_NEAR(short_compute.dp_reduce_exposed_seconds, 0.8, 1e-12);
  EXPECT_NEAR(short_compute.dp_gather_exposed_seconds, 0.4, 1e-12);
  // Two micro-batches of 3 s: the reduction under the last one's backward pass (1 s) still
  // covers the first buckets' 0.84 s.
  p.matmul_flops = 1.5e12;
  in.micro_batches = 2;
  EXPECT_NEAR(exposed(DpOverlap::kBuckets).dp_reduce_exposed_seconds, last, 1e-12);
}

// A reduction over the batch and context axes together is data parallelism's (bucketed or
// exposed), though its role is the context's; ring attention's permutes over cp stay in the
// pipeline: 1 x 5e9 B over dp,cp = 1 s exposed when off, the permute's 0.2 s over 4 layer steps
// under 3 s of compute shows 0.05.
TEST(DpOverlap, AReductionOverBatchAndContextAxesIsDataParallel) {
  const Mesh mesh = Mesh::parse("dp:2,cp:2", 4);
  TrainPlan p;
  p.devices = 4;
  p.matmul_flops = 1.5e12;
  p.bytes_by_axes = {{CollectiveOn{CollectiveKind::kReduceScatter, {"dp", "cp"}}, 5'000'000'000},
                     {CollectiveOn{CollectiveKind::kPermute, {"cp"}}, 1'000'000'000}};
  train::TimeInputs in{.context_axes = {"cp"}, .layer_steps = 4, .tokens_per_step = 8};
  in.dp_overlap = DpOverlap::kOff;
  EXPECT_NEAR(train::step_time(p, mesh, toy(), in).exposed_seconds, 1 + 0.05, 1e-12);
  in.dp_overlap = DpOverlap::kBuckets;
  in.dp_bucket_elements = {3, 1};
  EXPECT_NEAR(train::step_time(p, mesh, toy(), in).exposed_seconds, 0.25 + 0.05, 1e-12);
}

// The buckets of the tiny model with --dp-bucket-size 8000, the parameters backwards: the head
// 2,048, the final norm 32, layer 1's down, up, gate (1,536 each), its second norm 32, o 1,024,
// v 512: 8,256 (>= 8,000: closed); k 512, q 1,024, its first norm 32, layer 0's down, up, gate,
// second norm, o, v, k: 8,256; q 1,024, norm 32, the embedding 2,048: 3,104. The step's
// reductions R: R x 3,104 / 19,616 + max(0, R x 16,512 / 19,616 - 2/3 of the compute) exposed.
TEST(DpOverlap, DdpBucketsOfTheTinyModel) {
  const TrainPlan p = ddp(DpOverlap::kBuckets, 8000);
  ASSERT_TRUE(p.time);
  const StepTime& t = *p.time;
  EXPECT_EQ(t.dp_overlap, "buckets");
  EXPECT_EQ(t.dp_bucket_size, 8000);
  EXPECT_EQ(t.dp_bucket_elements, (std::vector<std::int64_t>{8256, 8256, 3104}));
  const double r = reductions(t);
  ASSERT_GT(r, 0);
  EXPECT_NEAR(t.dp_reduce_seconds, r, 1e-15);
  const double want =
      r * 3104 / 19616 + std::max(0.0, r * 16512 / 19616 - t.compute_seconds() * 2 / 3);
  EXPECT_NEAR(t.dp_reduce_exposed_seconds, want, 1e-15);
  // Without ZeRO-1 no parameter is gathered.
  EXPECT_EQ(t.dp_gather_seconds, 0);
  // The report and the JSON say so.
  EXPECT_THAT(p.table(),
              ::testing::HasSubstr("buckets  (3 buckets closing at 8000 elements, the last 3104: "
                                   "gradient reductions"));
  std::ostringstream os;
  p.write_json(os);
  const auto j = nlohmann::json::parse(os.str());
  EXPECT_EQ(j["time"]["dp_overlap"], "buckets");
  EXPECT_EQ(j["time"]["dp_buckets"]["elements"], nlohmann::json({8256, 8256, 3104}));
  EXPECT_EQ(j["time"]["dp_buckets"]["bucket_size"], 8000);
}

// off: every collective of the DDP step (all over dp) exposed, the step compute + their sum;
// fsdp: the plan without the option, figure for figure; Megatron's default size on 4 ranks,
// max(40,000,000, 4,000,000): one bucket of all 19,616 elements, its reduction after the
// backward pass, whole.
TEST(DpOverlap, OffExposesEveryDataParallelCollective) {
  const TrainPlan off = ddp(DpOverlap::kOff);
  const StepTime& t = *off.time;
  double sum = 0;
  for (const CommTime& c : t.comms) {
    EXPECT_EQ(c.role, CommRole::kData);
    EXPECT_FALSE(c.overlapped);
    sum += c.seconds;
  }
  ASSERT_GT(sum, 0);
  EXPECT_NEAR(t.exposed_seconds, sum, 1e-15);
  EXPECT_NEAR(t.step_seconds, t.compute_seconds() + sum, 1e-15);
  EXPECT_THAT(off.table(), ::testing::HasSubstr("(every data-parallel collective exposed)"));
  const StepTime fsdp = *ddp(DpOverlap::kFsdp).time, none = *ddp(std::nullopt).time;
  EXPECT_EQ(fsdp.exposed_seconds, none.exposed_seconds);
  EXPECT_EQ(fsdp.step_seconds, none.step_seconds);
  EXPECT_EQ(none.dp_overlap, "fsdp");
  EXPECT_LT(none.exposed_seconds, sum);  // pipelined under compute
  const StepTime one = *ddp(DpOverlap::kBuckets).time;
  EXPECT_EQ(one.dp_bucket_size, 40'000'000);
  EXPECT_EQ(one.dp_bucket_elements, (std::vector<std::int64_t>{19616}));
  EXPECT_NEAR(one.dp_reduce_exposed_seconds, reductions(one), 1e-15);
}

// ZeRO-1 over fsdp:2 with tp:2 (llama_fsdp_tp): each device holds half of every matrix (split
// over tp), the norms whole: a layer 64 + 7,680 / 2 = 3,904, the embedding and head 1,024 each,
// 9,888 in all. With 4,000: the head 1,024, norm 32, layer 1's down, up, gate (768 each), norm
// 32, o 512, v 256: 4,160; k 256, q 512, norm 32, layer 0's down, up, gate, norm, o, v, k:
// 4,160; q 512, norm 32, the embedding 1,024: 1,568. The updated parameters are all-gathered.
TEST(DpOverlap, Zero1BucketsHoldEachDevicesTensorParallelShards) {
  TrainPlanOptions o = step(DpOverlap::kBuckets, 4000);
  o.optimizer_sharding = OptimizerSharding::kZero1;
  const TrainPlan p = plan_training(ModelConfig::parse(kTiny), Mesh::parse("fsdp:2,tp:2", 4),
                                    load_preset("llama_fsdp_tp").make_rule(), o);
  const StepTime& t = *p.time;
  EXPECT_EQ(t.dp_bucket_elements, (std::vector<std::int64_t>{4160, 4160, 1568}));
  EXPECT_GT(t.dp_gather_seconds, 0);
  EXPECT_NEAR(t.dp_gather_exposed_seconds,
              t.dp_gather_seconds * 1568 / 9888 +
                  std::max(0.0, t.dp_gather_seconds * 8320 / 9888 - t.compute_seconds() / 3),
              1e-15);
  o.dp_overlap = DpOverlap::kGradBuckets;
  const StepTime g = *plan_training(ModelConfig::parse(kTiny), Mesh::parse("fsdp:2,tp:2", 4),
                                    load_preset("llama_fsdp_tp").make_rule(), o)
                          .time;
  EXPECT_EQ(g.dp_overlap, "grad-buckets");
  EXPECT_EQ(g.dp_gather_exposed_seconds, g.dp_gather_seconds);
  EXPECT_THAT(p.table(), ::testing::HasSubstr("; parameter gathers "));
}

TEST(DpOverlap, RefusedWhereItCannotApply) {
  const ModelConfig c = ModelConfig::parse(kTiny);
  const Mesh mesh = Mesh::parse("dp:4", 4);
  TrainPlanOptions o = step(DpOverlap::kOff);
  o.hardware.reset();
  EXPECT_THROW_WITH(plan_training(c, mesh, replicated(), o), OptionError,
                    "[train] --dp-overlap, --dp-bucket-size is refused", "--dp-overlap off",
                    "without --hardware there is no step time");
  EXPECT_THROW_WITH(plan_training(c, mesh, replicated(), step(DpOverlap::kOff, 1000)), OptionError,
                    "[train] --dp-bucket-size is refused",
                    "--dp-bucket-size 1000 with --dp-overlap off");
  EXPECT_THROW_WITH(plan_training(c, mesh, replicated(), step(std::nullopt, 1000)), OptionError,
                    "--dp-bucket-size 1000 with --dp-overlap fsdp");
  EXPECT_THROW_WITH(plan_training(c, mesh, replicated(), step(DpOverlap::kGradBuckets)),
                    OptionError, "[train] --dp-overlap grad-buckets is refused",
                    "give --dp-overlap buckets, or --optimizer-sharding zero1");
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4", 4),
                                  load_preset("llama_fsdp").make_rule(), step(DpOverlap::kBuckets)),
                    OptionError, "[train] --dp-overlap buckets, grad-buckets is refused",
                    "split 'lm_head/weight' over [fsdp]", "--dp-overlap fsdp");
}

}  // namespace
}  // namespace shardplan
