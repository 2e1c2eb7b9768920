// Megatron's sequence parallelism in the training step: the layers' norm and residual regions
// annotated by name (with_sharding_annotation), their shardings from a rule file's activations
// in logical axes (rules/presets/llama_fsdp_tp.yaml), train-plan's --sequence-parallel.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "model_step.hpp"
#include "shardplan/error.hpp"
#include "shardplan/executor.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/sjit.hpp"
#include "shardplan/train_plan.hpp"
#include "step_compare.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

// Small enough to run on 8 devices: 4 heads (one per tp rank), hidden 64, the MLP 128 wide.
constexpr const char* kSmallLlama = R"({"model_type": "llama", "vocab_size": 64,
  "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 4})";

/// The layers' layout on fsdp:2,tp:4 with their regions annotated.
train::Layout annotated_layout() {
  train::Layout layout{{"fsdp"}, {"tp"}, 2, 4};
  layout.annotate = true;
  return layout;
}

/// The shardings of the preset's activations on `mesh`, sequence parallelism on or off.
std::map<std::string, RuleTree> preset_activations(const Mesh& mesh, bool sequence_parallel,
                                                   const char* preset = "llama_fsdp_tp") {
  const RuleFile file = load_preset(preset);
  RuleFile::LogicalMapping bind{{"activation_batch", AxisNames{"fsdp"}}};
  if (!sequence_parallel) bind.emplace_back("activation_norm_length", std::nullopt);
  return file.activation_shardings(mesh, bind);
}

Lowered lower_step(const ModelConfig& c, const Mesh& mesh, bool sp, std::int64_t b,
                   std::int64_t t) {
  const train::ModelStep model{c, annotated_layout()};
  SjitOptions o;
  const RulePtr rules = load_preset("llama_fsdp_tp").make_rule();
  o.in_shardings = RuleTree::list({RuleTree(rules), RuleTree(P("fsdp")), RuleTree(P("fsdp"))});
  o.annotation_shardings = preset_activations(mesh, sp);
  return sjit(
             mesh,
             [&](const Tree<Array>& p, const Array& x, const Array& y) {
               auto [loss, grads] = train::loss_and_grads(model, p, x, y);
               return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
             },
             o)
      .lower(c.parameters(DType::kF32), TensorSpec{Shape{b, t}, DType::kI32},
             TensorSpec{Shape{b, t}, DType::kI32});
}

/// The reshard lines of the program text ("reshard %116 -> PartitionSpec('fsdp', 'tp'):
/// reduce_scatter over 'tp': 12.00 KiB max per device, ...") of kind `kind` over exactly `axis`.
std::vector<std::string> reshards(const std::string& text, const std::string& kind,
                                  const std::string& axis) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find("reshard %") == std::string::npos) continue;
    if (line.find(": " + kind + " over '" + axis + "'") == std::string::npos) continue;
    if (line.find(" over '" + axis + "', ") != std::string::npos) continue;  // more axes
    out.push_back(line);
  }
  return out;
}

/// The specs the program gives the values annotated with `name` (the program's own lines).
std::vector<std::string> annotated_specs(const std::string& text, const std::string& name) {
  std::vector<std::string> out;
  std::istringstream in(text);
  const std::string tag = "sharding_annotation(";
  for (std::string line; std::getline(in, line);) {
    if (line.find(tag) == std::string::npos || line.find("'" + name + "'") == std::string::npos)
      continue;
    const auto at = line.find("PartitionSpec(");
    out.push_back(line.substr(at, line.find(')', at) - at + 1));
  }
  return out;
}

// Only the forward pass (the loss): Megatron's exchange, counted by hand. b = 2 sequences of
// t = 16 tokens, hidden d = 256, f32, fsdp:2 splits the batch: each fsdp group holds
// [1, 16, 256] = 16 KiB of every [b, t, d] activation. Off: o_proj's and down_proj's outputs
// are pending sums over tp, all-reduced (a ring all-reduce over 4 receives 2 x 3/4 of the
// array, 24 KiB), twice per layer, 2 layers. On: each is reduce-scattered (3/4 of it, 12 KiB)
// and the next projection's input all-gathered (3/4 of it, 12 KiB): the same bytes, and one
// more all-gather before the LM head.
TEST(SequenceParallel, TensorParallelAllReduceBecomesReduceScatterAndAllGather) {
  const ModelConfig c = ModelConfig::parse(kSmallLlama);
  const Mesh mesh = Mesh::parse("fsdp:2,tp:4", 8);
  const auto lower_loss = [&](bool sp) {
    const train::ModelStep model{c, annotated_layout()};
    SjitOptions o;
    o.in_shardings = RuleTree::list({RuleTree(load_preset("llama_fsdp_tp").make_rule()),
                                     RuleTree(P("fsdp")), RuleTree(P("fsdp"))});
    o.annotation_shardings = preset_activations(mesh, sp);
    return sjit(
               mesh,
               [&](const Tree<Array>& p, const Array& x, const Array& y) {
                 return model.forward_loss(p, x, y);
               },
               o)
        .lower(c.parameters(DType::kF32), TensorSpec{Shape{2, 16}, DType::kI32},
               TensorSpec{Shape{2, 16}, DType::kI32});
  };
  const Lowered off = lower_loss(false), on = lower_loss(true);
  const std::string kib24 = ": 24.00 KiB max per device", kib12 = ": 12.00 KiB max per device";
  // The activations' all-reduces over tp: 2 per layer (o_proj, down_proj), 24 KiB each (the
  // loss's reductions over the vocabulary split over tp, [1, 16] f32 partial sums, 96 B each,
  // are the same in both programs).
  const auto sized = [](const std::vector<std::string>& lines, const std::string& size) {
    return std::count_if(lines.begin(), lines.end(),
                         [&](const std::string& l) { return l.find(size) != std::string::npos; });
  };
  const std::string b96 = ": 96 B max per device";
  EXPECT_EQ(sized(reshards(off.text(), "all_reduce", "tp"), kib24), 4) << off.text();
  EXPECT_EQ(sized(reshards(on.text(), "all_reduce", "tp"), kib24), 0) << on.text();
  EXPECT_EQ(sized(reshards(off.text(), "all_reduce", "tp"), b96),
            sized(reshards(on.text(), "all_reduce", "tp"), b96));
  EXPECT_EQ(sized(reshards(off.text(), "reduce_scatter", "tp"), kib12), 0) << off.text();
  EXPECT_EQ(sized(reshards(on.text(), "reduce_scatter", "tp"), kib12), 4) << on.text();
  // All-gathers over tp of the norms' outputs: before q/k/v and gate/up of each layer, 12 KiB.
  EXPECT_EQ(sized(reshards(off.text(), "all_gather", "tp"), kib12), 0) << off.text();
  // Before q/k/v and gate/up of each layer (4), and before the LM head: the last layer's output
  // is split along the sequence, so the head's input is gathered once more (Megatron's
  // embedding would be reduce-scattered instead of all-reduced; this step's embedding is a
  // lookup in the gathered table, which moves nothing over tp either way).
  EXPECT_EQ(sized(reshards(on.text(), "all_gather", "tp"), kib12), 5) << on.text();
  // Bytes moved: the same, but for the head's gather (12 KiB; 2.7% of this 2-layer step's
  // 440 KiB, 1 / (4 x layers) of the activations' tp traffic).
  const auto total = [](const Lowered& l) {
    std::int64_t t = 0;
    for (const auto& [kind, b] : l.cost().bytes_by_kind) t += b;
    return t;
  };
  EXPECT_EQ(total(on) - total(off), 12 * 1024);
}

// The annotated regions' bytes per device: [2, 16, 256] f32 is 32 KiB; off, split over fsdp:2
// only (16 KiB per device); on, over tp:4 along the sequence too (4 KiB): a quarter. Checked on
// the whole step (forward and backward) from the shardings the program gives each annotated
// value.
TEST(SequenceParallel, NormAndResidualRegionsHoldAQuarterPerDevice) {
  const ModelConfig c = ModelConfig::parse(kSmallLlama);
  const Mesh mesh = Mesh::parse("fsdp:2,tp:4", 8);
  const std::string off = lower_step(c, mesh, false, 2, 16).text();
  const std::string on = lower_step(c, mesh, true, 2, 16).text();
  const Shape shape{2, 16, 256};
  for (const char* name : {"residual", "norm", "attention_out", "mlp_out"}) {
    const auto a = annotated_specs(off, name), b = annotated_specs(on, name);
    ASSERT_FALSE(a.empty()) << name;
    ASSERT_EQ(a.size(), b.size()) << name;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto bytes = [&](const std::string& spec) {
        const PartitionSpec p = spec == "PartitionSpec('fsdp')" ? P("fsdp") : P("fsdp", "tp");
        EXPECT_TRUE(spec == "PartitionSpec('fsdp')" || spec == "PartitionSpec('fsdp', 'tp')")
            << name << " " << spec;
        return byte_size(NamedSharding(mesh, p).shard_shape(shape), DType::kF32);
      };
      EXPECT_EQ(bytes(a[i]), 16 * 1024) << name;
      EXPECT_EQ(bytes(b[i]), 4 * 1024) << name;
    }
  }
  // The projections' inputs keep the whole sequence (they are where it is gathered).
  for (const char* name : {"attention_in", "mlp_in"}) {
    for (const std::string& s : annotated_specs(on, name)) EXPECT_EQ(s, "PartitionSpec('fsdp')");
  }
}

// A sequence that does not divide by tp (10 tokens over 4) is left whole, as the layers'
// batch constraints are: the step lowers, and every region is split over the batch only.
TEST(SequenceParallel, SequenceNotDividingByTpIsLeftWhole) {
  const ModelConfig c = ModelConfig::parse(kSmallLlama);
  const Mesh mesh = Mesh::parse("fsdp:2,tp:4", 8);
  const std::string text = lower_step(c, mesh, true, 2, 10).text();
  for (const char* name : {"residual", "norm", "attention_out", "mlp_out"}) {
    const auto specs = annotated_specs(text, name);
    ASSERT_FALSE(specs.empty()) << name;
    for (const std::string& s : specs) EXPECT_EQ(s, "PartitionSpec('fsdp')") << name;
  }
  // 12 tokens divide: split.
  for (const std::string& s : annotated_specs(lower_step(c, mesh, true, 2, 12).text(), "norm"))
    EXPECT_EQ(s, "PartitionSpec('fsdp', 'tp')");
}

// A real step on arrays, 8 devices: the loss and every gradient with sequence parallelism equal
// those without, and one device's, to float32 rounding (only the order of sums differs).
void expect_same_step(const ModelConfig& c, const char* preset) {
  const auto run = [&](int n, const char* axes, std::optional<bool> sp) {
    const Executor exec(n);
    const Mesh mesh = Mesh::parse(axes, n);
    std::uint64_t seed = 5;
    const Tree<Array> params = c.parameters(DType::kF32).map([&](const TensorSpec& s) {
      return device_put(Tensor::uniform(s.shape, DType::kF32, seed++, -0.3, 0.3),
                        NamedSharding(mesh, PartitionSpec()), exec);
    });
    std::vector<std::int32_t> ids(2 * 8);
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<std::int32_t>((i * 11) % static_cast<std::size_t>(c.vocab));
    const Array x =
        device_put(Tensor::from(Shape{2, 8}, ids), NamedSharding(mesh, PartitionSpec()), exec);
    std::rotate(ids.begin(), ids.begin() + 1, ids.end());
    const Array y =
        device_put(Tensor::from(Shape{2, 8}, ids), NamedSharding(mesh, PartitionSpec()), exec);
    train::Layout layout;
    SjitOptions o;
    if (sp) {
      layout = annotated_layout();
      o.in_shardings = RuleTree::list(
          {RuleTree(load_preset(preset).make_rule()), RuleTree(P("fsdp")), RuleTree(P("fsdp"))});
      o.annotation_shardings = preset_activations(mesh, *sp, preset);
    }
    const train::ModelStep model{c, layout};
    return to_host(sjit(
        mesh,
        [&](const Tree<Array>& p, const Array& a, const Array& b) {
          auto [loss, grads] = train::loss_and_grads(model, p, a, b);
          return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
        },
        o)(params, x, y));
  };
  const Tree<Tensor> one = run(1, "fsdp:1,tp:1", std::nullopt);
  const Tree<Tensor> off = run(8, "fsdp:2,tp:4", false);
  const Tree<Tensor> on = run(8, "fsdp:2,tp:4", true);
  const double loss = one.at("loss").leaf().get(0);
  EXPECT_NEAR(loss, std::log(static_cast<double>(c.vocab)), 1.0);  // near uniform
  expect_same_step(off, one, "sequence parallelism off");
  expect_same_step(on, one, "sequence parallelism on");
}

TEST(SequenceParallel, LossAndGradientsEqualThoseWithout) {
  expect_same_step(ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4})"),
                   "llama_fsdp_tp");
  // GPT-2's layer (layer norms, biases after the annotated projections, the tied head).
  expect_same_step(ModelConfig::parse(R"({"model_type": "gpt2", "vocab_size": 40, "n_embd": 32,
    "n_layer": 2, "n_head": 4, "n_positions": 16})"),
                   "gpt2");
}

TEST(SequenceParallel, BadActivationsNameTheFileTheEntryAndTheAxis) {
  EXPECT_THROW_WITH(parse_rule_file(R"(rules: []
logical_axes: {activation_batch: fsdp}
activations:
  residual: [activation_batch, activation_lenght, null]
)",
                                    "r.yaml"),
                    IoError, "r.yaml:4", "activation 'residual'",
                    "unknown logical axis 'activation_lenght'", "activation_batch");
  EXPECT_THROW_WITH(parse_rule_file("rules: []\nactivations: {residual: tp}\n", "r.yaml"), IoError,
                    "r.yaml:2", "activation 'residual'", "a list of logical axes");
  const RuleFile f = parse_rule_file(R"(rules: []
logical_axes: {activation_batch: data, activation_norm_length: tp}
activations:
  norm: [activation_batch, activation_norm_length, null]
)",
                                     "r.yaml");
  EXPECT_THROW_WITH(f.activation_shardings(Mesh::parse("data:2,model:4", 8)), RuleError, "r.yaml:4",
                    "activation 'norm'", "logical axis 'activation_norm_length'", "mesh axis 'tp'",
                    "does not have");
  // Applied to a value of another rank: the activation, its axes and the shape.
  const Mesh mesh = Mesh::parse("data:2,tp:4", 8);
  SjitOptions o;
  o.annotation_shardings = f.activation_shardings(mesh);
  auto f2 = sjit(
      mesh, [](const Array& x) { return with_sharding_annotation(x, "norm"); }, o);
  EXPECT_THROW_WITH(f2.lower(TensorSpec{Shape{8, 4}, DType::kF32}), RuleError, "r.yaml:4",
                    "activation 'norm'", "[8, 4]", "rank 2");
  // Bound from outside (train-plan binds activation_batch): the binding wins.
  const auto bound = f.activation_shardings(mesh, {{"activation_norm_length", std::nullopt}});
  EXPECT_EQ(bound.size(), 1u);
}

// train-plan: on by default with the preset's tp, off on request, said in the report; asked
// for where nothing maps the sequence, an error.
TEST(SequenceParallel, TrainPlanTurnsItOnWithTheTensorParallelPreset) {
  const ModelConfig c = ModelConfig::parse(kSmallLlama);
  const Mesh mesh = Mesh::parse("fsdp:2,tp:4", 8);
  TrainPlanOptions o;
  o.batch = 2;
  o.seq = 16;
  o.activations = load_preset("llama_fsdp_tp");
  const RulePtr rules = o.activations->make_rule();
  const TrainPlan on = plan_training(c, mesh, rules, o);
  EXPECT_TRUE(on.sequence_parallel);
  EXPECT_EQ(on.sequence_axes, std::vector<std::string>{"tp"});
  EXPECT_THAT(on.table(), ::testing::HasSubstr("sequence parallel on (over tp)"));
  o.sequence_parallel = false;
  const TrainPlan off = plan_training(c, mesh, rules, o);
  EXPECT_FALSE(off.sequence_parallel);
  EXPECT_THAT(off.table(), ::testing::HasSubstr("sequence parallel off"));
  // Megatron's pattern does not change the state held.
  EXPECT_EQ(on.parameter_bytes, off.parameter_bytes);
  // A file whose activations leave out a name the layers annotate.
  RuleFile partial = *o.activations;
  std::erase_if(partial.activations,
                [](const RuleFile::Activation& a) { return a.name == "head_in"; });
  o.activations = partial;
  o.sequence_parallel = std::nullopt;
  EXPECT_THROW_WITH(plan_training(c, mesh, rules, o), SpecError,
                    "the activations of preset:llama_fsdp_tp.yaml give no 'head_in'",
                    "residual, norm");
  o.activations = load_preset("llama_fsdp");
  o.sequence_parallel = true;
  o.batch = 8;
  EXPECT_THROW_WITH(
      plan_training(c, Mesh::parse("fsdp:8", 8), load_preset("llama_fsdp").make_rule(), o),
      SpecError, "sequence parallelism", "activation_norm_length", "preset:llama_fsdp.yaml");
}

// With sequence parallelism the residual stream is split along the sequence from the embedding
// on (torchtitan's tok_embeddings: output_layouts=Shard(1)): with every layer recomputed, the
// first layer keeps 1/tp of the embedding's output for the backward pass, as it keeps 1/tp of
// every other layer's input. 8 x 2048 tokens of width 2048 in bf16 are 64 MiB; split over fsdp:2
// and tp:4, 8 MiB a device (it was kept whole over tp, 32 MiB).
TEST(SequenceParallel, TheEmbeddingsOutputIsSplitAlongTheSequence) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 512,
    "hidden_size": 2048, "intermediate_size": 2048, "num_hidden_layers": 2,
    "num_attention_heads": 16, "num_key_value_heads": 4})");
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 2048;
  o.recompute = true;
  o.fused_loss = false;
  o.activations = load_preset("llama_fsdp_tp");
  const TrainPlan p =
      plan_training(c, Mesh::parse("fsdp:2,tp:4", 8), o.activations->make_rule(), o);
  ASSERT_TRUE(p.sequence_parallel);
  ASSERT_TRUE(p.timeline.has_value());
  const std::vector<LiveValue>& live = p.timeline->memory.live_at_peak;
  const auto take = std::find_if(live.begin(), live.end(), [](const LiveValue& v) {
    return v.what.starts_with("take");
  });
  ASSERT_NE(take, live.end()) << p.table();
  EXPECT_EQ(take->bytes, std::int64_t{8} << 20) << take->what << " " << take->type;
}

// On the shapes of a published run: LLaMA-3-70B (80 layers, hidden 8192, MLP 28672, 64 heads,
// 8 key/value heads, vocabulary 128256) on fsdp:16,tp:8, 16 x 4096 tokens, bf16, every layer
// recomputed. Megatron's sequence parallelism moves what its tensor parallelism moves (an
// all-reduce is a reduce-scatter plus an all-gather); the partitioner plans the step by its cost,
// so the step with sequence parallelism must move no more than that program does, counted by
// hand, and the peak must be no higher than without it. Per device (each fsdp group holds one
// sequence, 4096 tokens; an exchange over tp of a [4096, 8192] bf16 activation receives 7/8 of
// it):
//   - each layer: 12 such exchanges over tp (all-gather before q/k/v and gate/up, reduce-scatter
//     after o_proj and down_proj: 4 in the forward pass, 4 when it is recomputed, 4 in the
//     backward pass); its weights' tp-shard gathered over fsdp twice (forward, backward) and
//     their gradients reduce-scattered once (15/16 of each); its two norms' gradients
//     all-reduced over all 128 devices;
//   - the head: its tp-shard gathered twice and its gradient reduce-scattered over fsdp; its
//     input gathered over tp, and that gradient reduce-scattered;
//   - the embedding: a lookup reads its table whole (take declares no vocabulary-parallel
//     lookup: docs/design.md), gathered over all 128 devices, and its gradient reduce-scattered
//     over them; its output reduce-scattered over tp along the sequence, and gathered in the
//     backward pass; the final norm's gradient all-reduced.
// That is 109.65 GB; without sequence parallelism the plan may move less (its layouts are less
// constrained), never more than with it.
TEST(SequenceParallel, BytesMovedPerStepAreAtMostMegatronsByHand) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 128256,
    "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8})");
  const Mesh mesh = Mesh::parse("fsdp:16,tp:8", 128);
  const double L = 80, d = 8192, f = 28672, V = 128256, kv = 1024, tp = 8, fsdp = 16, all = 128;
  const double act = 4096 * d * 2 * (tp - 1) / tp;
  const double layer_weights = (2 * d * d + 2 * d * kv + 3 * d * f) * 2 / tp * (fsdp - 1) / fsdp;
  const double norm = d * 2 * 2 * (all - 1) / all;
  const double by_hand = L * (12 * act + 3 * layer_weights + 2 * norm) +
                         (3 * V * d * 2 / tp * (fsdp - 1) / fsdp + 2 * act) +
                         (2 * V * d * 2 * (all - 1) / all + 2 * act) + norm;
  EXPECT_NEAR(by_hand, 109.65e9, 0.01e9);
  TrainPlanOptions o;
  o.batch = 16;
  o.seq = 4096;
  o.recompute = true;
  o.activations = load_preset("llama_fsdp_tp");
  const RulePtr rules = o.activations->make_rule();
  const TrainPlan on = plan_training(c, mesh, rules, o);
  o.sequence_parallel = false;
  const TrainPlan off = plan_training(c, mesh, rules, o);
  ASSERT_TRUE(on.sequence_parallel);
  EXPECT_LE(static_cast<double>(on.bytes_moved()), by_hand) << on.table();
  EXPECT_LE(off.bytes_moved(), on.bytes_moved()) << on.table() << off.table();
  EXPECT_LE(on.peak_bytes, off.peak_bytes);
  // With the decomposed attention too. (Its peak is where the fused attention's is, at the
  // embedding's gather in the forward pass: the softmax keeps only its result, as PyTorch's
  // does, so no layer's activations make it.)
  o.fused_attention = false;
  const TrainPlan naive_off = plan_training(c, mesh, rules, o);
  o.sequence_parallel = std::nullopt;
  const TrainPlan naive_on = plan_training(c, mesh, rules, o);
  EXPECT_LE(static_cast<double>(naive_on.bytes_moved()), by_hand) << naive_on.table();
  EXPECT_LE(naive_off.bytes_moved(), naive_on.bytes_moved());
  EXPECT_LE(naive_on.peak_bytes, naive_off.peak_bytes);
}

}  // namespace
}  // namespace shardplan
