// Planning a training step: state bytes, FLOPs, attention over tensor ranks, MoE, T5, dtypes,
// recomputation and accumulation, bad options, the cheapest plan that fits, its JSON and table.
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "train_plan_test.hpp"

namespace shardplan {
namespace {

using namespace test;

// Per-device parameter and optimizer bytes agree with the planner's own report of the same rules
// over the same tree (another path: rule resolution without tracing).
TEST(PlanTraining, StateBytesAgreeWithThePlanner) {
  const ModelConfig c = ModelConfig::parse(kLlama7bTwoLayers);
  const Mesh mesh = Mesh::parse("fsdp:4,tp:2", 8);
  const RulePtr rules = preset("llama_fsdp_tp");
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 64;
  const TrainPlan p = plan_training(c, mesh, rules, o);
  const MeshShardingHelper helper(mesh);
  const PlanReport bf16 = helper.plan(RuleTree(rules), c.parameters(DType::kBF16));
  const PlanReport f32 = helper.plan(RuleTree(rules), c.parameters(DType::kF32));
  EXPECT_EQ(p.parameter_bytes, bf16.max_device_bytes());
  EXPECT_EQ(p.gradient_bytes, bf16.max_device_bytes());
  EXPECT_EQ(p.optimizer_bytes, 2 * f32.max_device_bytes() + 4);  // mu, nu and the f32 count
  EXPECT_EQ(p.batch_bytes, 2 * (8 / 4) * 64 * 4);                // tokens and targets, i32
  EXPECT_EQ(p.devices, 8);
  EXPECT_EQ(p.batch_axes, (std::vector<std::string>{"fsdp"}));
  EXPECT_GT(p.transient_bytes, 0);
  EXPECT_EQ(p.peak_held_bytes + p.peak_gathered_bytes + p.peak_computed_bytes, p.peak_bytes);
  EXPECT_GT(p.peak_computed_bytes, 0);
  EXPECT_EQ(p.peak_bytes,
            p.parameter_bytes + p.optimizer_bytes + p.batch_bytes + p.transient_bytes);
  EXPECT_GT(p.bytes_by_collective.at(CollectiveKind::kAllGather), 0);  // FSDP gathers its weights
  // SGD keeps only the count; f32 gradients are twice bf16's.
  o.optimizer = OptimizerKind::kSgd;
  o.grad_dtype = DType::kF32;
  const TrainPlan s = plan_training(c, mesh, rules, o);
  EXPECT_EQ(s.optimizer_bytes, 4);
  EXPECT_EQ(s.gradient_bytes, f32.max_device_bytes());
}

// The FLOPs of one device on one device: at least the matrix products worked out by hand
// (forward 2 m n k each, backward twice that), and not much more (the elementwise ops).
TEST(PlanTraining, FlopsAreTheMatrixProductsByHand) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  o.optimizer = OptimizerKind::kSgd;
  const double tokens = 4.0 * 16;
  const double d = 32, f = 48, kv = 16, v = 64, t = 16, layers = 2;
  const double per_token_layer = 2 * (d * d + 2 * kv * d + d * d + 3 * d * f)  // projections
                                 + 2 * 2 * t * d;  // scores and their product with v
  const double forward = tokens * (layers * per_token_layer + 2 * d * v);
  const TrainPlan p = plan_training(c, Mesh::parse("fsdp:1,tp:1", 1), preset("llama_fsdp_tp"), o);
  EXPECT_GE(p.flops, 3 * forward);
  EXPECT_LE(p.flops, 3 * forward * 1.35);
  EXPECT_DOUBLE_EQ(p.total_flops, p.flops);
  EXPECT_TRUE(p.bytes_by_collective.empty() ||
              p.bytes_moved() == 0);  // one device: nothing to move
  // Recomputation runs the layers' forward pass twice: more FLOPs, a lower peak.
  o.recompute = true;
  const TrainPlan r = plan_training(c, Mesh::parse("fsdp:1,tp:1", 1), preset("llama_fsdp_tp"), o);
  EXPECT_GT(r.flops, p.flops);
  // Each layer's forward again, except the down projection's product: the backward pass needs
  // its input, not its result, so no program computes it a second time.
  const double layer_forward = tokens * layers * per_token_layer;
  const double down_projection = tokens * layers * 2 * d * f;
  EXPECT_GE(r.flops - p.flops, layer_forward - down_projection);
  EXPECT_LE(r.flops - p.flops, layer_forward * 1.2);
}

// 32 query heads over 8 key/value heads of width 64 (not hidden / heads), attention dominating
// (1,024 tokens): per device at tp:16 the matrix products by hand / 16, half of tp:8's. The
// step splits the query heads over the 16 ranks and repeats each key/value head for the two
// ranks that share it; otherwise the heads would not split and each rank would do twice its
// share of the attention.
TEST(PlanTraining, AttentionSplitsOverMoreTensorRanksThanKvHeads) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 256,
    "hidden_size": 256, "head_dim": 64, "intermediate_size": 256, "num_hidden_layers": 1,
    "num_attention_heads": 32, "num_key_value_heads": 8})");
  TrainPlanOptions o;
  o.batch = 1;
  o.seq = 1024;
  o.optimizer = OptimizerKind::kSgd;
  o.fused_attention = false;  // the scores and probs @ v as whole products, counted below
  const double t = 1024, d = 256, q = 32 * 64, kv = 8 * 64, f = 256, v = 256;
  const double per_token = 2 * (q * d + 2 * kv * d + d * q + 3 * d * f)  // projections
                           + 2 * 2 * t * q                               // scores, probs @ v
                           + 2 * d * v;                                  // the head
  const double step = 3 * t * per_token;  // forward, and backward twice that
  const TrainPlan p8 = plan_training(c, Mesh::parse("fsdp:1,tp:8", 8), preset("llama_fsdp_tp"), o);
  const TrainPlan p16 =
      plan_training(c, Mesh::parse("fsdp:1,tp:16", 16), preset("llama_fsdp_tp"), o);
  EXPECT_GE(p8.flops, step / 8);
  EXPECT_LE(p8.flops, step / 8 * 1.2);
  EXPECT_GE(p16.flops, step / 16);
  EXPECT_LE(p16.flops, step / 16 * 1.2);
  EXPECT_NEAR(p16.flops, p8.flops / 2, p8.flops * 0.05);
  // Fused attention splits alike (the kernels skip the causal blocks above the diagonal, so
  // the step does less than the decomposed one's whole [t, t] products).
  o.fused_attention = true;
  const TrainPlan f8 = plan_training(c, Mesh::parse("fsdp:1,tp:8", 8), preset("llama_fsdp_tp"), o);
  const TrainPlan f16 =
      plan_training(c, Mesh::parse("fsdp:1,tp:16", 16), preset("llama_fsdp_tp"), o);
  EXPECT_NEAR(f16.flops, f8.flops / 2, f8.flops * 0.05);
  EXPECT_LT(f8.flops, p8.flops);
}

// The heads' width from head_dim, key/value heads repeated over four tensor-parallel ranks
// (2 key/value heads) and a sliding window: the sharded step gives one device's loss and
// gradients (one device runs the grouped layout).
TEST(LossAndGrads, RepeatedKvHeadsAndWindowsGiveOneDevicesGradients) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "mistral", "vocab_size": 40,
    "hidden_size": 16, "head_dim": 6, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 3})");
  ASSERT_EQ(c.window(1), 3);
  const auto run = [&](const char* axes, int n, const train::Layout& layout,
                       const ModelConfig& cfg) {
    const Executor exec(n);
    const Mesh mesh = Mesh::parse(axes, n);
    const Tree<Array> params = uniform_parameters(cfg, DType::kF32, 3, mesh, exec);
    const auto [x, y] = tokens_and_targets(Shape{2, 8}, mesh, PartitionSpec(), exec);
    const train::ModelStep model{cfg, layout};
    return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& a, const Array& b) {
      auto [loss, grads] = train::loss_and_grads(model, p, a, b);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, x, y));
  };
  const Tree<Tensor> one = run("fsdp:1,tp:1", 1, train::Layout{}, c);
  const Tree<Tensor> four = run("fsdp:1,tp:4", 4, train::Layout{{"fsdp"}, {"tp"}, 1, 4}, c);
  const double loss = one.at("loss").leaf().get(0);
  EXPECT_NEAR(loss, std::log(40.0), 1.0);
  expect_same_step(four, one, "fsdp:1,tp:4");
  // The window is applied: the same model without it gives another loss.
  ModelConfig full = c;
  full.window_layers.clear();
  EXPECT_GT(std::abs(run("fsdp:1,tp:1", 1, train::Layout{}, full).at("loss").leaf().get(0) - loss),
            1e-4);
}

// LLaMA's attention_bias and mlp_bias: the default preset places every bias, and the step adds
// them (each bias's gradient has its shape).
TEST(PlanTraining, LlamaBiasesArePlanned) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "attention_bias": true, "mlp_bias": true})");
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 8;
  const TrainPlan with =
      plan_training(c, Mesh::parse("fsdp:2,tp:2", 4), preset("llama_fsdp_tp"), o);
  ModelConfig plain = c;
  plain.attention_bias = plain.output_bias = plain.mlp_bias = false;
  const TrainPlan without =
      plan_training(plain, Mesh::parse("fsdp:2,tp:2", 4), preset("llama_fsdp_tp"), o);
  EXPECT_EQ(with.parameter_count - without.parameter_count, 2 * (32 + 16 + 16 + 32 + 48 + 48 + 32));
  EXPECT_GT(with.flops, without.flops);
}

// Every dtype train-plan offers (bf16, f32, f64) plans, in every role.
TEST(PlanTraining, EveryOfferedDtypePlans) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  for (const DType p : {DType::kBF16, DType::kF32, DType::kF64}) {
    for (const DType g : {DType::kBF16, DType::kF32, DType::kF64}) {
      for (const DType s : {DType::kBF16, DType::kF32, DType::kF64}) {
        SCOPED_TRACE(fmt::format("{} {} {}", name(p), name(g), name(s)));
        TrainPlanOptions o;
        o.batch = 4;
        o.seq = 8;
        o.param_dtype = p;
        o.grad_dtype = g;
        o.optimizer_dtype = s;
        const TrainPlan plan =
            plan_training(c, Mesh::parse("fsdp:2,tp:2", 4), preset("llama_fsdp_tp"), o);
        EXPECT_GT(plan.peak_bytes, 0);
      }
    }
  }
}

// Where activations dominate (long sequences, a narrow model, attention's [t, t] scores kept
// by the decomposed attention), keeping only layer inputs or running a quarter of the batch at
// a time lowers the peak by more than half; with fused attention and the fused loss (which keep
// far less to begin with), both still lower it.
TEST(PlanTraining, RecomputeAndAccumulationLowerThePeak) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 512,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4})");
  const Mesh mesh = Mesh::parse("fsdp:4,tp:2", 8);
  const RulePtr rules = preset("llama_fsdp_tp");
  TrainPlanOptions o;
  o.batch = 16;
  o.seq = 512;
  {
    TrainPlanOptions fused = o;
    const TrainPlan base = plan_training(c, mesh, rules, fused);
    fused.recompute = true;
    EXPECT_LT(plan_training(c, mesh, rules, fused).peak_bytes, base.peak_bytes);
    fused.recompute = false;
    fused.grad_accum = 4;
    EXPECT_LT(plan_training(c, mesh, rules, fused).peak_bytes, base.peak_bytes);
  }
  o.fused_attention = false;
  o.fused_loss = false;
  const TrainPlan base = plan_training(c, mesh, rules, o);
  o.recompute = true;
  const TrainPlan rec = plan_training(c, mesh, rules, o);
  EXPECT_LT(rec.peak_bytes, base.peak_bytes / 2);
  EXPECT_GT(rec.flops, base.flops);
  o.recompute = false;
  o.grad_accum = 4;
  const TrainPlan acc = plan_training(c, mesh, rules, o);
  EXPECT_LT(acc.peak_bytes, base.peak_bytes / 2);
  EXPECT_EQ(acc.parameter_bytes, base.parameter_bytes);
  EXPECT_NEAR(acc.flops, base.flops, base.flops * 0.02);  // the same work in pieces
}

// Mixtral: every token through k of the E experts, so the expert matrix products cost k/E of
// running every expert on every token; the router and attention as for a dense layer.
TEST(PlanTraining, MixtralRunsEachTokenThroughKExperts) {
  const ModelConfig c = ModelConfig::parse(kTinyMixtral);
  EXPECT_EQ(c.family_name(), "mixtral");
  EXPECT_EQ(c.parameters(DType::kF32)
                .at_path("model/layers/1/block_sparse_moe/experts/3/w2/weight")
                .leaf()
                .shape,
            (Shape{32, 24}));
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  o.optimizer = OptimizerKind::kSgd;
  const TrainPlan p = plan_training(c, Mesh::parse("ep:1,fsdp:1", 1), preset("mixtral_ep"), o);
  const double tokens = 4.0 * 16, d = 32, f = 24, kv = 16, v = 64, t = 16, layers = 2, e = 4, k = 2;
  const double per_token_layer = 2 * (d * d + 2 * kv * d + d * d)  // attention projections
                                 + 2 * 2 * t * d                   // scores, their product with v
                                 + 2 * d * e                       // the router
                                 + k * 2 * 3 * d * f;              // k experts' three matrices
  const double forward = tokens * (layers * per_token_layer + 2 * d * v);
  EXPECT_GE(p.flops, 3 * forward);
  EXPECT_LE(p.flops, 3 * forward * 1.35);
  // k x tokens must share evenly over the experts.
  const ModelConfig odd = ModelConfig::parse(R"({"model_type": "mixtral", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_local_experts": 3, "num_experts_per_tok": 1})");
  o.batch = 1;
  o.seq = 16;
  EXPECT_THROW_WITH(plan_training(odd, Mesh::parse("ep:1,fsdp:1", 1), preset("mixtral_ep"), o),
                    SpecError, "16 tokens", "3 experts");
}

// HF's bucketing of relative positions, written here from its definition with plain integers
// and std::log, against the program's (a table whose bucket b holds b reads the bucket back).
int t5_bucket(int rel, bool bidirectional, int buckets, int max_distance) {
  int base = 0, n = 0;
  if (bidirectional) {
    buckets /= 2;
    base = rel > 0 ? buckets : 0;
    n = std::abs(rel);
  } else {
    n = std::max(-rel, 0);
  }
  const int exact = buckets / 2;
  if (n < exact) return base + n;
  const int far = exact + static_cast<int>(std::log(static_cast<float>(n) / exact) /
                                           std::log(static_cast<float>(max_distance) / exact) *
                                           static_cast<float>(buckets - exact));
  return base + std::min(far, buckets - 1);
}

TEST(T5, RelativePositionBucketsAreHuggingFaces) {
  const Executor exec(1);
  const Mesh mesh = Mesh::parse("x:1", 1);
  for (const bool bidirectional : {true, false}) {
    for (const auto& [buckets, distance, len] : {std::tuple{32, 128, 300}, std::tuple{8, 12, 40}}) {
      SCOPED_TRACE(
          fmt::format("bidirectional {} buckets {} distance {}", bidirectional, buckets, distance));
      std::vector<float> table(static_cast<std::size_t>(buckets));
      for (int b = 0; b < buckets; ++b) table[static_cast<std::size_t>(b)] = static_cast<float>(b);
      const Array w = device_put(Tensor::from(Shape{buckets, 1}, table),
                                 NamedSharding(mesh, PartitionSpec()), exec);
      const Array bias = sjit(mesh, [&](const Array& t) {
        return train::relative_bias(t, len, len, bidirectional, distance);
      })(w);
      ASSERT_EQ(bias.shape(), (Shape{1, len, len}));
      const std::vector<double> got = bias.to_host().to_doubles();
      for (int i = 0; i < len; ++i) {
        for (int j = 0; j < len; ++j) {
          ASSERT_EQ(got[static_cast<std::size_t>(i * len + j)],
                    t5_bucket(j - i, bidirectional, buckets, distance))
              << "query " << i << " key " << j;
        }
      }
    }
  }
}

// T5's step sharded over 4 devices (batch and heads split) gives the loss and gradients of one
// device; the loss starts near log(vocab); recomputation is refused with a reason.
TEST(T5, ShardedStepEqualsOneDevice) {
  const ModelConfig c = ModelConfig::parse(kTinyT5);
  EXPECT_EQ(c.parameters(DType::kF32)
                .at_path("decoder/block/0/layer/1/EncDecAttention/q/weight")
                .leaf()
                .shape,
            (Shape{12, 16}));
  const auto run = [&](const char* axes, int n, const train::Layout& layout) {
    const Executor exec(n);
    const Mesh mesh = Mesh::parse(axes, n);
    std::uint64_t seed = 7;
    const Tree<Array> params = c.parameters(DType::kF32).map([&](const TensorSpec& s) {
      return device_put(Tensor::uniform(s.shape, DType::kF32, seed++, -0.3, 0.3),
                        NamedSharding(mesh, PartitionSpec()), exec);
    });
    std::vector<std::int32_t> ids(4 * 14), tgt(4 * 4);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 5) % 40);
    for (std::size_t i = 0; i < tgt.size(); ++i) tgt[i] = static_cast<std::int32_t>((i * 3) % 40);
    const Array x =
        device_put(Tensor::from(Shape{4, 14}, ids), NamedSharding(mesh, PartitionSpec()), exec);
    const Array y =
        device_put(Tensor::from(Shape{4, 4}, tgt), NamedSharding(mesh, PartitionSpec()), exec);
    const train::ModelStep model{c, layout};
    const Tree<Array> out = sjit(mesh, [&](const Tree<Array>& p, const Array& a, const Array& b) {
      auto [loss, grads] = train::loss_and_grads(model, p, a, b);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, x, y);
    return to_host(out);
  };
  const Tree<Tensor> one = run("fsdp:1,tp:1", 1, train::Layout{});
  const Tree<Tensor> four = run("fsdp:2,tp:2", 4, train::Layout{{"fsdp"}, {"tp"}, 2, 2});
  const double loss = one.at("loss").leaf().get(0);
  EXPECT_NEAR(loss, std::log(40.0), 1.0);
  EXPECT_NEAR(four.at("loss").leaf().get(0), loss, 1e-5);
  const auto a = one.at("grads").flatten(), b = four.at("grads").flatten();
  ASSERT_EQ(a.size(), c.parameters(DType::kF32).num_leaves());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].second.to_doubles(), y = b[i].second.to_doubles();
    for (std::size_t k = 0; k < x.size(); ++k) {
      ASSERT_NEAR(x[k], y[k], 1e-5 + 1e-4 * std::abs(x[k])) << a[i].first << " [" << k << "]";
    }
  }
  // Planned: the decoder's tokens are their own length; recomputation is for decoder-only models.
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 32;
  o.target_seq = 8;
  const TrainPlan p = plan_training(c, Mesh::parse("fsdp:2,tp:2", 4), preset("t5"), o);
  EXPECT_EQ(p.batch_bytes, (4 / 2) * (32 + 8 + 8) * 4);  // tokens (both parts) and targets, i32
  EXPECT_NE(p.table().find("32 encoder + 8 decoder tokens"), std::string::npos) << p.table();
  o.recompute = true;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:2,tp:2", 4), preset("t5"), o), SpecError,
                    "decoder-only", "T5");
}

TEST(PlanTraining, BadOptionsNameWhatDoesNotSplit) {
  const ModelConfig c = ModelConfig::parse(kLlama7bTwoLayers);
  const RulePtr rules = preset("llama_fsdp_tp");
  TrainPlanOptions o;
  o.batch = 6;
  o.seq = 16;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError,
                    "batch of 6", "[fsdp]", "multiple of 4");
  o.batch = 0;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError, "batch 0",
                    "must be positive");
  o.batch = 8;
  o.headroom = 1.5;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError,
                    "headroom 1.5");
  o.headroom = std::nan("");
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError,
                    "headroom nan");
  o.headroom = 0.1;
  o.target_seq = -1;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError,
                    "target sequence length -1");
  o.target_seq = 0;
  o.grad_accum = 4;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError,
                    "4 micro-batches");
  o.grad_accum = 1;
  o.batch_axes = {"data"};
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError, "data");
  // A mesh axis the weights do not divide by, under strict mode (--strict-shards; by default it
  // is padded, train_plan_test_padded.cpp): the rule's error names the tensor and the axis.
  o.batch_axes = {};
  o.uneven = Uneven::kRefuse;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:1,tp:3", 3), rules, o), SpecError,
                    "/weight' (shape [", "'tp' (size 3)", "is not a multiple of 3");
  o.uneven = Uneven::kPad;
  const ModelConfig g = ModelConfig::parse(kGpt2Small);
  o.seq = 2048;
  EXPECT_THROW_WITH(plan_training(g, Mesh::parse("fsdp:8", 8), preset("gpt2"), o), SpecError,
                    "2048", "1024 learned positions");
}

TEST(TrainPlan, FitsAndTheCheapestThatFits) {
  TrainPlan a, b, c;
  a.peak_bytes = 70LL << 30;
  a.bytes_by_collective = {{CollectiveKind::kAllGather, 10}, {CollectiveKind::kAllReduce, 5}};
  b.peak_bytes = 60LL << 30;
  b.bytes_by_collective = {{CollectiveKind::kAllGather, 20}};
  c.peak_bytes = 90LL << 30;
  c.bytes_by_collective = {{CollectiveKind::kAllGather, 1}};
  EXPECT_EQ(a.fits(), std::nullopt);  // no memory given
  for (TrainPlan* p : {&a, &b, &c}) {
    p->device_memory = 80LL << 30;
    p->headroom = 0.1;
  }
  EXPECT_EQ(a.usable_bytes(), 72LL << 30);
  EXPECT_EQ(a.fits(), true);
  EXPECT_EQ(c.fits(), false);
  EXPECT_EQ(a.bytes_moved(), 15);
  // c moves least but does not fit; a moves less than b.
  EXPECT_EQ(cheapest_fitting({a, b, c}), 0u);
  EXPECT_EQ(cheapest_fitting({c, b, a}), 2u);
  EXPECT_EQ(cheapest_fitting({c}), std::nullopt);
  // A configuration that could not be planned never counts, whatever its figures say.
  TrainPlan failed = b;
  failed.bytes_by_collective = {};
  failed.error = "[train] a batch of 6 sequences does not split";
  EXPECT_EQ(cheapest_fitting({c, failed, b}), 2u);
  EXPECT_NE(compare_table({failed}).find("cannot be planned: [train] a batch of 6"),
            std::string::npos);
  EXPECT_NE(compare_table({c}).find("none of these fits"), std::string::npos);
  const std::string t = compare_table({a, b, c});
  EXPECT_NE(t.find("cheapest that fits: #0"), std::string::npos) << t;
  std::ostringstream js;
  write_compare_json(js, {c, b, a});
  const auto j = nlohmann::json::parse(js.str());
  EXPECT_EQ(j["cheapest_fitting"], 2);
  EXPECT_EQ(j["plans"].size(), 3u);
  EXPECT_EQ(j["plans"][0]["fits"], false);
}

TEST(PlanTraining, JsonAndTableCarryTheFigures) {
  const ModelConfig c = ModelConfig::parse(kTinyGpt2);
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  o.device_memory = 1 << 20;
  TrainPlan p = plan_training(c, Mesh::parse("fsdp:2,tp:2", 4), preset("gpt2"), o);
  std::ostringstream os;
  p.write_json(os);
  const auto j = nlohmann::json::parse(os.str());
  EXPECT_EQ(j["per_device"]["peak_bytes"], p.peak_bytes);
  EXPECT_EQ(j["per_device"]["parameter_bytes"], p.parameter_bytes);
  EXPECT_EQ(j["bytes_moved_per_device"], p.bytes_moved());
  EXPECT_EQ(j["fits"], *p.fits());
  EXPECT_EQ(j["devices"], 4);
  const std::string t = p.table();
  EXPECT_NE(t.find("Mesh('fsdp': 2, 'tp': 2)"), std::string::npos) << t;
  EXPECT_NE(t.find("optimizer state"), std::string::npos) << t;
}

}  // namespace
}  // namespace shardplan

namespace shardplan::test {
namespace {

// HSDP (FSDP's HYBRID_SHARD): weights sharded over fsdp and replicated over rep, the batch over
// both. Each gradient is reduce-scattered in its fsdp group, then its shard all-reduced across
// the replicas: per device 3 x the gradient shard's bytes (a ring of 4 receives 3 shards) and 1
// x (an all-reduce of 2 receives its peer's half and the gathered half). Summing over both
// axes whole would receive 2 x 7/8 x 4 = 7 shards.
TEST(PlanTraining, HybridShardingReducesInTheShardGroupThenAcrossReplicas) {
  const ModelConfig c = ModelConfig::parse(kLlama7bTwoLayers);
  const Mesh mesh = Mesh::parse("rep:2,fsdp:4", 8);
  const RulePtr every_weight_over_fsdp = std::make_shared<TreePathShardingRule>(
      std::vector<TreePathShardingRule::Entry>{{".*", P("fsdp")}});
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 64;
  o.optimizer = OptimizerKind::kSgd;
  const TrainPlan p = plan_training(c, mesh, every_weight_over_fsdp, o);
  EXPECT_EQ(p.batch_axes, (std::vector<std::string>{"rep", "fsdp"}));
  const auto bytes = [&](CollectiveKind kind, const std::vector<std::string>& axes) {
    std::int64_t sum = 0;
    for (const auto& [on, b] : p.bytes_by_axes) {
      if (on.kind == kind && on.axes == axes) sum += b;
    }
    return sum;
  };
  ASSERT_GT(p.gradient_bytes, 0);
  EXPECT_EQ(bytes(CollectiveKind::kReduceScatter, {"fsdp"}), 3 * p.gradient_bytes);
  EXPECT_EQ(bytes(CollectiveKind::kAllReduce, {"rep"}), p.gradient_bytes);
  // Over both axes only the loss (a scalar) is summed.
  EXPECT_LE(bytes(CollectiveKind::kAllReduce, {"rep", "fsdp"}), 64);
}

}  // namespace
}  // namespace shardplan::test

namespace shardplan::test {
namespace {

// FSDP2's reshard_after_forward=False under activation checkpointing: the forward pass's
// gathered weights are kept for the recomputation, so each block's weights are gathered once a
// step, not twice. By hand (LLaMA-2-7B widths, 2 layers, fsdp:4, bf16): a block's sharded
// weights are 4 x 4096^2 + 3 x 4096 x 11008 = 202,375,168 (its two norms are held whole by
// llama_fsdp), a gather of them receives 3/4 x 2 B each = 303,562,752 B; two blocks gathered
// once less.
TEST(PlanTraining, NoReshardAfterForwardKeepsTheGatheredWeightsForTheRecomputation) {
  const ModelConfig c = ModelConfig::parse(kLlama7bTwoLayers);
  const Mesh mesh = Mesh::parse("fsdp:4", 4);
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 64;
  o.remat = checkpoint_policies::nothing_saveable();
  const TrainPlan again = plan_training(c, mesh, preset("llama_fsdp"), o);
  o.reshard_after_forward = false;
  const TrainPlan kept = plan_training(c, mesh, preset("llama_fsdp"), o);
  const auto weight_gathers = [](const TrainPlan& p) {
    std::int64_t sum = 0;
    for (const auto& [on, b] : p.bytes_by_axes) {
      if (on.kind == CollectiveKind::kAllGather && on.of_argument) sum += b;
    }
    return sum;
  };
  EXPECT_EQ(weight_gathers(again) - weight_gathers(kept), 2 * std::int64_t{303562752});
  EXPECT_FALSE(again.kept_gathered_for_recompute);
  EXPECT_TRUE(kept.kept_gathered_for_recompute);
  EXPECT_FALSE(kept.reshard_after_forward);
  // The kept copies are live from the forward pass on: at the backward pass's start both
  // blocks' gathered weights (404,750,336 B each), where recomputing holds one at a time.
  EXPECT_GE(kept.peak_bytes - again.peak_bytes, std::int64_t{404750336});
  EXPECT_THAT(kept.table(), ::testing::HasSubstr(
                                "remat full (weights kept gathered from the forward pass for the "
                                "recomputation)"));
  EXPECT_EQ(kept.flops, again.flops);
}

}  // namespace
}  // namespace shardplan::test
