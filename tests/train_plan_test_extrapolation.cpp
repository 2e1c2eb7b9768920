// Plans of many layers or micro-batches extrapolated from small traced steps, against the whole
// step traced; FSDP's root; steps too large to plan.
#include "train_plan_test.hpp"

namespace shardplan {
namespace {

using namespace test;

// FSDP2's MixedPrecisionPolicy as torchtitan sets it (--mixed-precision fsdp2): weights held in
// f32, used in bf16, gradients reduced and the optimizer state in f32.
void fsdp2_mixed_precision(TrainPlanOptions& o) {
  o.param_dtype = DType::kBF16;
  o.master_dtype = o.reduce_dtype = DType::kF32;
  o.grad_dtype = o.optimizer_dtype = DType::kF32;
}

// "fsdp:4,tp:2": a mesh of as many devices as its axes make.
Mesh mesh_of(const std::string& text) {
  std::int64_t devices = 1;
  for (std::size_t at = text.find(':'); at != std::string::npos; at = text.find(':', at + 1)) {
    devices *= std::stoll(text.substr(at + 1));
  }
  return Mesh::parse(text, devices);
}

// Every figure of two plans of the same step, for a plan extrapolated from small steps against
// the whole step traced.
void expect_same_plan(const TrainPlan& a, const TrainPlan& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.parameter_count, b.parameter_count);
  EXPECT_EQ(a.parameter_bytes, b.parameter_bytes);
  EXPECT_EQ(a.gradient_bytes, b.gradient_bytes);
  EXPECT_EQ(a.optimizer_bytes, b.optimizer_bytes);
  EXPECT_EQ(a.batch_bytes, b.batch_bytes);
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.transient_bytes, b.transient_bytes);
  EXPECT_EQ(a.peak_held_bytes, b.peak_held_bytes);
  EXPECT_EQ(a.peak_gathered_bytes, b.peak_gathered_bytes);
  EXPECT_EQ(a.peak_computed_bytes, b.peak_computed_bytes);
  // The caching allocator model's reserved bytes: an extrapolated plan gives none unless asked
  // to trace the whole step for them (TrainPlanOptions::reserved_whole).
  if (a.extrapolated && a.reserved_bytes == 0) {
    EXPECT_EQ(a.reserved_bytes_expandable, 0);
  } else {
    EXPECT_EQ(a.reserved_bytes, b.reserved_bytes);
    EXPECT_EQ(a.reserved_bytes_expandable, b.reserved_bytes_expandable);
  }
  EXPECT_EQ(a.bytes_by_collective, b.bytes_by_collective);
  EXPECT_DOUBLE_EQ(a.flops, b.flops);
  EXPECT_DOUBLE_EQ(a.total_flops, b.total_flops);
}

// Many layers or micro-batches are planned from a few small traced steps: field for field the
// plan of the whole step traced, for each family, with and without recomputation, accumulation
// over few and over many micro-batches, on meshes with and without tensor parallelism. (One
// test per case: each traces a step of some twenty layers whole, a few seconds.)
struct ExtrapolationCase {
  const char* name;
  const char* config;
  const char* mesh;
  const char* rules;
  std::int64_t layers;
  int accum;
  bool recompute;
  bool fsdp_root = false;
  const char* remat_blocks = "all";  // with recompute: the layers that are checkpoints
};
class Extrapolation : public ::testing::TestWithParam<ExtrapolationCase> {};

TEST_P(Extrapolation, PlanIsTheWholeTracedStep) {
  const ExtrapolationCase& k = GetParam();
  ModelConfig c = ModelConfig::parse(k.config);
  c.layers = k.layers;
  const Mesh mesh = mesh_of(k.mesh);
  TrainPlanOptions o;
  o.batch = 8 * k.accum;
  o.seq = 8;
  o.grad_accum = k.accum;
  o.recompute = k.recompute;
  o.fsdp_root = k.fsdp_root;
  o.remat_blocks = parse_remat_blocks(k.remat_blocks);
  const TrainPlan extrapolated = plan_training(c, mesh, preset(k.rules), o);
  EXPECT_TRUE(extrapolated.extrapolated) << extrapolated.traced;
  o.extrapolate = false;
  const TrainPlan whole = plan_training(c, mesh, preset(k.rules), o);
  EXPECT_FALSE(whole.extrapolated);
  EXPECT_EQ(whole.traced, "the whole step");
  expect_same_plan(extrapolated, whole, extrapolated.traced);
}

// The caching allocator model's reserved bytes are not affine in the layers (its fragmentation
// repeats every few layers, docs/training.md): an extrapolated plan gives them from the whole step
// traced when asked, else none. A Llama-2-7B-shaped step of 22 layers.
TEST(PlanTraining, ReservedBytesOfAnExtrapolatedStepAreTheWholeStepsOrNone) {
  ModelConfig c = ModelConfig::parse(kLlama2_7b);
  c.layers = 22;
  const Mesh mesh = mesh_of("fsdp:8");
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 2048;
  fsdp2_mixed_precision(o);
  const TrainPlan none = plan_training(c, mesh, preset("llama_fsdp"), o);
  EXPECT_TRUE(none.extrapolated);
  EXPECT_EQ(none.reserved_bytes, 0);
  EXPECT_EQ(none.reserved_bytes_expandable, 0);
  EXPECT_EQ(none.table().find("reserved"), std::string::npos);
  {  // not computed is null in the JSON, not a figure of 0 bytes
    std::ostringstream js;
    none.write_json(js);
    const auto j = nlohmann::json::parse(js.str());
    EXPECT_TRUE(j["per_device"]["reserved_bytes"].is_null()) << j["per_device"];
    EXPECT_TRUE(j["per_device"]["reserved_bytes_expandable"].is_null());
  }
  o.reserved_whole = true;
  const TrainPlan asked = plan_training(c, mesh, preset("llama_fsdp"), o);
  EXPECT_TRUE(asked.extrapolated);
  o.extrapolate = false;
  const TrainPlan whole = plan_training(c, mesh, preset("llama_fsdp"), o);
  expect_same_plan(asked, whole, "reserved_whole");
  // The allocator holds at least what is live; rounding and caching make it more.
  EXPECT_GT(whole.reserved_bytes, whole.peak_bytes);
  EXPECT_GT(whole.reserved_bytes_expandable, whole.peak_bytes);
  std::ostringstream js;
  whole.write_json(js);
  EXPECT_EQ(nlohmann::json::parse(js.str())["per_device"]["reserved_bytes"], whole.reserved_bytes);
  EXPECT_NE(asked.table().find("reserved (caching allocator model)"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    PlanTraining, Extrapolation,
    ::testing::Values(
        ExtrapolationCase{"llama_tp", kTinyLlama, "fsdp:4,tp:2", "llama_fsdp_tp", 22, 1, false},
        ExtrapolationCase{"llama_tp_remat", kTinyLlama, "fsdp:4,tp:2", "llama_fsdp_tp", 22, 1,
                          true},
        ExtrapolationCase{"llama_accum2_remat", kTinyLlama, "fsdp:8", "llama_fsdp", 22, 2, true},
        ExtrapolationCase{"llama_accum3", kTinyLlama, "fsdp:8", "llama_fsdp", 22, 3, false},
        ExtrapolationCase{"llama_many_micro_batches_remat", kTinyLlama, "fsdp:2,tp:2",
                          "llama_fsdp_tp", 2, 20, true},
        // 10 x 20 = 220 units: more than the 209 its samples trace (with the four past the
        // smallest counts), so it is extrapolated.
        ExtrapolationCase{"llama_many_of_both_remat", kTinyLlama, "fsdp:2,tp:2", "llama_fsdp_tp", 10,
                          20, true},
        ExtrapolationCase{"mixtral", kTinyMixtral, "ep:2,fsdp:2", "mixtral_ep", 22, 1, false},
        ExtrapolationCase{"mixtral_accum2_remat", kTinyMixtral, "ep:2,fsdp:2", "mixtral_ep", 22, 2,
                          true},
        ExtrapolationCase{"mistral_window", kTinyMistralWindow, "fsdp:4,tp:2", "llama_fsdp_tp",
                          22, 1, false},
        ExtrapolationCase{"gpt2", kTinyGpt2, "fsdp:2,tp:2", "gpt2", 22, 1, false},
        ExtrapolationCase{"gpt2_accum2_remat", kTinyGpt2, "fsdp:2,tp:2", "gpt2", 22, 2, true},
        // The last layer differs (kept gathered): in every sample as in the whole step.
        ExtrapolationCase{"llama_fsdp_root", kTinyLlama, "fsdp:8", "llama_fsdp", 22, 1, false,
                          true},
        ExtrapolationCase{"llama_fsdp_root_remat_tp", kTinyLlama, "fsdp:4,tp:2", "llama_fsdp_tp",
                          22, 1, true, true},
        // Some layers checkpoints (--remat-blocks): sampled in whole runs of the choice's period
        // after the layers it leaves over (45 = 1 + 22 x 2: steps of 5, 7, 9, 17 layers; 64 =
        // 1 + 21 x 3: 7, 10, 13, 25), the last layer kept gathered in each.
        ExtrapolationCase{"llama_remat_every2_fsdp_root", kTinyLlama, "fsdp:8", "llama_fsdp", 45,
                          1, true, true, "every:2"},
        ExtrapolationCase{"llama_remat_fraction_third_tp", kTinyLlama, "fsdp:4,tp:2",
                          "llama_fsdp_tp", 64, 1, true, false, "fraction:1/3"}),
    [](const ::testing::TestParamInfo<ExtrapolationCase>& c) { return c.param.name; });

// --fsdp-root (torchtitan's wrapping before mid-2025): FSDP2 keeps the root module (embedding,
// final norm, head) unsharded from the forward pass's start to the backward pass's end, and the
// last block is not resharded after forward. The tiny LLaMA (vocabulary 64, hidden 32; a
// layer's matrices q 32x32, k and v 16x32, o 32x32, gate and up 48x32, down 32x48: 7,680
// elements) on fsdp:4, weights f32 held and used in bf16, no recomputation. By hand: at the peak
// (the loss's backward pass) the parameters gathered for use are the head alone without it
// (64 x 32 x 2 bytes), and with it the head, the embedding and the last layer's matrices; its
// all-gathers receive the last layer's matrices once less (not gathered again for its backward
// pass: 7,680 x 2 bytes x 3/4); the gradients are reduced as before (the same reduce-scatter
// and all-reduce bytes: the root's in f32, not in bf16). Without batch axes it does not apply.
TEST(PlanTraining, FsdpRootHoldsTheRootsWeightsAndTheLastLayers) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 64;
  fsdp2_mixed_precision(o);
  const TrainPlan units = plan_training(c, mesh_of("fsdp:4"), preset("llama_fsdp"), o);
  o.fsdp_root = true;
  const TrainPlan root = plan_training(c, mesh_of("fsdp:4"), preset("llama_fsdp"), o);
  constexpr std::int64_t kTable = 64 * 32 * 2;
  constexpr std::int64_t kLayer = 7680 * 2;
  EXPECT_FALSE(units.fsdp_root);
  EXPECT_TRUE(root.fsdp_root);
  EXPECT_EQ(units.peak_gathered_bytes, kTable);
  EXPECT_EQ(root.peak_gathered_bytes, 2 * kTable + kLayer);
  EXPECT_EQ(units.bytes_by_collective.at(CollectiveKind::kAllGather) -
                root.bytes_by_collective.at(CollectiveKind::kAllGather),
            kLayer * 3 / 4);
  EXPECT_EQ(root.bytes_by_collective.at(CollectiveKind::kReduceScatter),
            units.bytes_by_collective.at(CollectiveKind::kReduceScatter));
  // The norms' gradients (whole) are all-reduced in f32 as before: keep_alive carries their
  // pending sums to the f32 conversion (reduced before it in bf16, 96 bytes fewer).
  EXPECT_EQ(root.bytes_by_collective.at(CollectiveKind::kAllReduce),
            units.bytes_by_collective.at(CollectiveKind::kAllReduce));
  EXPECT_EQ(root.parameter_bytes, units.parameter_bytes);
  EXPECT_NE(root.table().find(", FSDP root module ("), std::string::npos) << root.table();
  EXPECT_EQ(units.table().find("FSDP root module"), std::string::npos);
  std::ostringstream js;
  root.write_json(js);
  EXPECT_EQ(nlohmann::json::parse(js.str())["fsdp_root"], true);
  // T5's step is not wrapped as torchtitan's: refused, not silently ignored.
  TrainPlanOptions t5 = o;
  t5.seq = 8;
  EXPECT_THROW_WITH(
      plan_training(ModelConfig::parse(kTinyT5), mesh_of("fsdp:2,tp:2"), preset("t5"), t5),
      SpecError, "--fsdp-root", "T5");
  // One device: nothing is sharded, so there is no root module to hold.
  const TrainPlan alone = plan_training(c, mesh_of("fsdp:1"), preset("llama_fsdp"), o);
  EXPECT_FALSE(alone.fsdp_root);
  o.fsdp_root = false;
  const TrainPlan alone_units = plan_training(c, mesh_of("fsdp:1"), preset("llama_fsdp"), o);
  EXPECT_EQ(alone.peak_bytes, alone_units.peak_bytes);
}

// The root module's custom VJP and the last layer's shared weights change where values are held,
// not what is computed: the loss and every gradient are those of the step without them.
TEST(LossAndGrads, FsdpRootGivesTheSameLossAndGradients) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  const Executor exec(4);
  const Mesh mesh = Mesh::parse("fsdp:4,tp:1", 4);
  const Tree<Array> params = uniform_parameters(c, DType::kF32, 21, mesh, exec);
  const auto [tokens, targets] = tokens_and_targets(Shape{4, 8}, mesh, P("fsdp"), exec);
  const auto run = [&](bool root, bool remat) {
    const train::ModelStep model{
        .config = c,
        .layout = train::Layout{{"fsdp"}, {"tp"}, 4, 1},
        .remat = remat ? std::optional(checkpoint_policies::nothing_saveable()) : std::nullopt,
        .compute_dtype = DType::kBF16,
        .reshard_after_forward = !remat,
        .fsdp_root = root,
        .keep_last_gathered = root};
    return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& x, const Array& y) {
      auto [loss, grads] = train::loss_and_grads(model, p, x, y);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, tokens, targets));
  };
  for (const bool remat : {false, true}) {
    SCOPED_TRACE(remat ? "full recomputation" : "reshard after forward");
    const Tree<Tensor> a = run(true, remat), b = run(false, remat);
    EXPECT_EQ(a.at("loss").leaf().get(0), b.at("loss").leaf().get(0));
    const auto ga = a.at("grads").flatten(), gb = b.at("grads").flatten();
    ASSERT_EQ(ga.size(), gb.size());
    for (std::size_t i = 0; i < ga.size(); ++i) {
      EXPECT_TRUE(ga[i].second == gb[i].second) << ga[i].first;
    }
  }
}

// The samples are the model's first layers: a model whose layers differ (Qwen2's window from
// max_window_layers on; 24 layers would otherwise be planned from samples) is not extrapolated from them but traced whole, and its plan is the
// same as with extrapolation turned off.
TEST(PlanTraining, LayersThatDifferAreTracedWhole) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "qwen2", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 24,
    "num_attention_heads": 4, "num_key_value_heads": 2, "use_sliding_window": true,
    "sliding_window": 4, "max_window_layers": 20})");
  ASSERT_EQ(c.window(19), 0);
  ASSERT_EQ(c.window(20), 4);
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 8;
  const TrainPlan p = plan_training(c, mesh_of("fsdp:8"), preset("llama_fsdp"), o);
  EXPECT_FALSE(p.extrapolated);
  EXPECT_EQ(p.traced, "the whole step");
  o.extrapolate = false;
  expect_same_plan(p, plan_training(c, mesh_of("fsdp:8"), preset("llama_fsdp"), o), "qwen2");
}

// The figures of a step made to fool the extrapolation: one that is not affine over the small
// counts, one whose peak moves to another point of the step past the third sample (a line of
// larger slope overtakes), one whose figures differ in kind. None is extrapolated.
TEST(PlanTraining, FiguresNotAffineAreNotExtrapolated) {
  const auto sample = [](std::int64_t l, std::int64_t k, std::int64_t peak, double flops = 0) {
    train::StepSample s{l, k, {}};
    s.figures.bytes[train::ByteFigure::kPeak] = peak;
    s.figures.flops[train::FlopFigure::kBusiest] = flops;
    return s;
  };
  const auto affine = [&](std::int64_t l) { return sample(l, 1, 100 + 7 * l, 3.0 * l); };
  const auto got = train::extrapolate({affine(2), affine(3), affine(4), affine(8)}, 1000, 1);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->bytes.at(train::ByteFigure::kPeak), 7100);
  EXPECT_DOUBLE_EQ(got->flops.at(train::FlopFigure::kBusiest), 3000.0);
  // Bilinear in both counts: a + b l + c k + d l k.
  std::vector<train::StepSample> both;
  for (const auto& [l, k] : std::vector<std::pair<int, int>>{
           {2, 2}, {3, 2}, {2, 3}, {3, 3}, {4, 2}, {8, 2}, {2, 4}, {2, 8}, {4, 4}}) {
    both.push_back(sample(l, k, 5 + 3 * l + 11 * k + 2 * l * k));
  }
  const auto bilinear = train::extrapolate(both, 1000, 8192);
  ASSERT_TRUE(bilinear.has_value());
  EXPECT_EQ(bilinear->bytes.at(train::ByteFigure::kPeak), 5 + 3000 + 11 * 8192 + 2 * 1000 * 8192);
  // With the samples past the smallest counts (plan_training traces them too), a step of 2
  // micro-batches off the surface is passed over: fitted on (3, 3), (4, 3), (3, 4), (4, 4).
  std::vector<train::StepSample> kinked = both;
  for (const auto& [l, k] : std::vector<std::pair<int, int>>{{4, 3}, {3, 4}, {8, 3}, {3, 8}}) {
    kinked.push_back(sample(l, k, 5 + 3 * l + 11 * k + 2 * l * k));
  }
  for (train::StepSample& k : kinked) {
    if (k.micro_batches == 2) k.figures.bytes[train::ByteFigure::kPeak] -= 64;
  }
  const auto passed_over = train::extrapolate(kinked, 1000, 8192);
  ASSERT_TRUE(passed_over.has_value());
  EXPECT_EQ(passed_over->bytes.at(train::ByteFigure::kPeak), 5 + 3000 + 11 * 8192 + 2 * 1000 * 8192);
  // Off the line at the third count.
  EXPECT_FALSE(train::extrapolate({affine(2), affine(3), sample(4, 1, 129), affine(8)}, 1000, 1));
  // Off at the smallest count only (a step of 2 that peaks elsewhere): fitted on 3 and 4 and
  // checked on 8 instead; off at 8 as well, refused.
  const auto past = train::extrapolate({sample(2, 1, 99, 6.0), affine(3), affine(4), affine(8)}, 1000, 1);
  ASSERT_TRUE(past.has_value());
  EXPECT_EQ(past->bytes.at(train::ByteFigure::kPeak), 7100);
  EXPECT_FALSE(
      train::extrapolate({sample(2, 1, 99, 6.0), affine(3), affine(4), sample(8, 1, 157, 24.0)}, 1000, 1));
  // max(100 + l, 70 + 5 l): affine on 2, 3, 4; the steeper line leads from l = 8.
  const auto crossing = [&](std::int64_t l) {
    return sample(l, 1, std::max<std::int64_t>(100 + l, 70 + 5 * l), 0);
  };
  EXPECT_FALSE(train::extrapolate({crossing(2), crossing(3), crossing(4), crossing(8)}, 1000, 1));
  // Not bilinear: one cross term off.
  both[8].figures.bytes[train::ByteFigure::kPeak] += 1;
  EXPECT_FALSE(train::extrapolate(both, 1000, 8192));
  // A collective kind only some samples use.
  train::StepSample extra = affine(8);
  extra.figures.bytes[CollectiveKind::kAllToAll] = 1;
  EXPECT_FALSE(train::extrapolate({affine(2), affine(3), affine(4), extra}, 1000, 1));
  // FLOPs off the line.
  EXPECT_FALSE(
      train::extrapolate({affine(2), affine(3), sample(4, 1, 128, 12.5), affine(8)}, 1000, 1));
  // The memory traffic (a time-model figure) may be off by a relative 1e-3, no more; the peak
  // beside it must still be exact.
  const auto traffic = [&](std::int64_t l, std::int64_t off) {
    train::StepSample t = affine(l);
    t.figures.bytes[train::ByteFigure::kMemoryTraffic] = 1'000'000'000 * l + off;
    return t;
  };
  const auto close = train::extrapolate({traffic(2, 0), traffic(3, 0), traffic(4, 64'000), traffic(8, 0)},
                                        10, 1);
  ASSERT_TRUE(close.has_value());
  EXPECT_EQ(close->bytes.at(train::ByteFigure::kMemoryTraffic), 10'000'000'000);
  EXPECT_FALSE(train::extrapolate(
      {traffic(2, 0), traffic(3, 0), traffic(4, 5'000'000), traffic(8, 0)}, 10, 1));
  // A count that was not sampled and cannot be extrapolated to.
  EXPECT_FALSE(train::extrapolate({affine(2), affine(3)}, 1000, 2));
  // Bytes that pass int64 at the count asked for (2^60 per layer, 16 layers): an error, not a
  // wrapped number.
  const auto huge = [&](std::int64_t l) { return sample(l, 1, l * (std::int64_t{1} << 60)); };
  EXPECT_THROW_WITH(train::extrapolate({huge(2), huge(3), huge(4), huge(5)}, 16, 1), SpecError,
                    "a byte count of the step overflows int64");
}

// Configs the tracer could not hold: ten thousand layers and thousands of micro-batches are
// planned from small steps; what is too large even so is refused before tracing, with the limit.
TEST(PlanTraining, LargeStepsArePlannedOrRefusedUpFront) {
  ModelConfig c = ModelConfig::parse(kTinyLlama);
  c.layers = 10000;
  TrainPlanOptions o;
  o.batch = 8192;
  o.seq = 8;
  o.grad_accum = 1024;
  const TrainPlan p = plan_training(c, mesh_of("fsdp:8"), preset("llama_fsdp"), o);
  EXPECT_TRUE(p.extrapolated);
  EXPECT_EQ(p.parameter_count, c.parameter_count());
  EXPECT_GT(p.peak_bytes, p.parameter_bytes + p.optimizer_bytes);
  // At LLaMA-3-8B's width, where each layer's constants (rotary tables) are large: kept between
  // steps up to a total, they grew with the first layers only and 10,000 layers or 16
  // micro-batches were refused as "not linear" (train-plan now keeps no constants).
  ModelConfig wide = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 10000,
    "num_attention_heads": 32, "num_key_value_heads": 8})");
  TrainPlanOptions w;
  w.batch = 32;
  w.seq = 1024;
  w.recompute = true;
  EXPECT_TRUE(plan_training(wide, mesh_of("fsdp:8"), preset("llama_fsdp"), w).extrapolated);
  wide.layers = 32;
  w.batch = 128;
  w.grad_accum = 16;
  EXPECT_TRUE(plan_training(wide, mesh_of("fsdp:8"), preset("llama_fsdp"), w).extrapolated);
  // Experts: each is traced, so many of them are refused before any tracing.
  ModelConfig m = ModelConfig::parse(kTinyMixtral);
  m.experts = 32768;
  o.grad_accum = 1;
  o.batch = 8;
  EXPECT_THROW_WITH(plan_training(m, mesh_of("ep:2,fsdp:2"), preset("mixtral_ep"), o), SpecError,
                    "too large to plan", "over the limit of 512", "experts");
  // Without extrapolation the whole step counts.
  c.layers = 600;
  o.extrapolate = false;
  EXPECT_THROW_WITH(plan_training(c, mesh_of("fsdp:8"), preset("llama_fsdp"), o), SpecError,
                    "600 layers x 1 micro-batch", "over the limit of 512");
  // T5 is traced whole.
  ModelConfig t = ModelConfig::parse(kTinyT5);
  t.layers = t.decoder_layers = 300;
  o.extrapolate = true;
  EXPECT_THROW_WITH(plan_training(t, mesh_of("fsdp:2"), preset("t5"), o), SpecError, "600 layers",
                    "T5 is traced whole");
}

// With recomputation each micro-batch gathers the weights it uses again (as FSDP does), and its
// reduced gradients are added to the sum when it ends: more micro-batches of the same global
// batch do not raise the peak, but for the sum itself: from one micro-batch (no sum) to two the
// peak may grow by at most the gradient shards the sum holds, and from two on not at all.
// (Before, every micro-batch used the first one's gathered weights,
// so the whole model stayed gathered: LLaMA-3-8B on 8 devices, 32 x 1024 tokens, peaked at
// 20.4, 29.4 and 32.4 GiB with 1, 2 and 4 micro-batches; and the fused chain of sums kept every
// micro-batch's gradients to the end.)
TEST(PlanTraining, MoreMicroBatchesDoNotRaiseThePeakWithRecomputation) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8})");
  TrainPlanOptions o;
  o.seq = 1024;
  o.recompute = true;
  for (const std::int64_t batch : {32, 64}) {
    o.batch = batch;
    std::int64_t previous = std::numeric_limits<std::int64_t>::max();
    std::int64_t gathered_one = 0;
    for (const int k : {1, 2, 4}) {
      o.grad_accum = k;
      const TrainPlan p = plan_training(c, mesh_of("fsdp:8"), preset("llama_fsdp"), o);
      EXPECT_LE(p.peak_bytes, previous + (k == 2 ? p.gradient_bytes : 0))
          << batch << " sequences in " << k << " micro-batches";
      // Gathered at the peak: at most one module's weights (FSDP2 gathers one unit at a time; the
      // largest is the head, 128256 x 4096 bf16), and no more than with one micro-batch (no
      // micro-batch keeps another's gathered copies).
      EXPECT_LE(p.peak_gathered_bytes, std::int64_t{128256} * 4096 * 2)
          << batch << " sequences in " << k << " micro-batches";
      if (k == 1) gathered_one = p.peak_gathered_bytes;
      EXPECT_LE(p.peak_gathered_bytes, gathered_one)
          << batch << " sequences in " << k << " micro-batches";
      previous = p.peak_bytes;
    }
  }
}

}  // namespace
}  // namespace shardplan
