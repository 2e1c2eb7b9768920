// Context parallelism in the LLaMA-style training step (train/model_step.cpp, train-plan's cp
// axis): the sequence split over `cp` in the load-balanced order, attention by ring. A real step's
// loss and gradients equal the unsplit step's on one device to float32 rounding (with and
// without recomputation, with a batch axis beside it); a 32k-token step's activation bytes per
// device are 1/8 of the unsplit step's on cp:8; bad settings are named.
#include <cmath>
#include <limits>
#include <tuple>
#include <string>
#include <vector>

#include "model_step.hpp"
#include "shardplan/error.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sjit.hpp"
#include "shardplan/train_plan.hpp"
#include "step_compare.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

constexpr const char* kSmall = R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
  "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2})";
constexpr std::int64_t kBatch = 2, kSeq = 32;

// Token ids, row by row, in the natural order; `order` (load_balanced_positions) reorders each
// row as the data loader does for context parallelism.
Tensor tokens(std::size_t shift, const std::vector<std::int64_t>& order) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(kBatch * kSeq));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(((i + shift) * 11) % 64);
  std::vector<std::int32_t> out(ids.size());
  for (std::int64_t b = 0; b < kBatch; ++b) {
    for (std::int64_t p = 0; p < kSeq; ++p) {
      out[static_cast<std::size_t>(b * kSeq + p)] =
          ids[static_cast<std::size_t>(b * kSeq + order[static_cast<std::size_t>(p)])];
    }
  }
  return Tensor::from(Shape{kBatch, kSeq}, out);
}

// The loss and gradients of one step on `axes` (a cp axis: the sequence split over it);
// `poison`: element 0 of the first layer's query weight is NaN; `jit`: under sjit, else eagerly.
Tree<Tensor> step(const char* axes, int devices, bool remat, bool poison = false, bool jit = true) {
  const ModelConfig c = ModelConfig::parse(kSmall);
  const Executor exec = Executor::process_local(devices);
  const Mesh mesh = Mesh::parse(axes, devices);
  std::uint64_t seed = 5;
  bool poisoned = false;
  const Tree<Array> params =
      c.parameters(DType::kF32).map_with_path([&](const std::string& path, const TensorSpec& s) {
        Tensor t = Tensor::uniform(s.shape, DType::kF32, seed++, -0.3, 0.3);
        if (poison && !poisoned && path.find("q_proj") != std::string::npos) {
          t.set(0, std::numeric_limits<double>::quiet_NaN());
          poisoned = true;
        }
        return device_put(t, NamedSharding(mesh, PartitionSpec()), exec);
      });
  EXPECT_EQ(poisoned, poison);
  train::Layout layout;
  std::vector<std::int64_t> order(static_cast<std::size_t>(kSeq));
  for (std::int64_t p = 0; p < kSeq; ++p) order[static_cast<std::size_t>(p)] = p;
  for (const std::string& a : mesh.axis_names()) {
    if (a == "cp") {
      layout.context = {"cp"};
      layout.context_ways = mesh.axis_size("cp");
      layout.mesh = mesh;
      order = load_balanced_positions(kSeq, layout.context_ways);
    } else if (mesh.axis_size(a) > 1) {
      layout.batch.push_back(a);
      layout.batch_ways *= mesh.axis_size(a);
    }
  }
  const NamedSharding data(mesh, PartitionSpec({layout.batch, layout.context}));
  const Array x = device_put(tokens(0, order), data, exec);
  const Array y = device_put(tokens(1, order), data, exec);
  train::ModelStep model{c, layout};
  if (remat) model.remat = checkpoint_policies::nothing_saveable();
  const auto f = [&](const Tree<Array>& p, const Array& a, const Array& b) {
    auto [loss, grads] = train::loss_and_grads(model, p, a, b);
    return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
  };
  return to_host(jit ? sjit(mesh, f)(params, x, y) : f(params, x, y));
}

TEST(ContextParallel, LossAndGradientsEqualTheUnsplitStep) {
  const Tree<Tensor> one = step("data:1", 1, false);
  EXPECT_NEAR(one.at("loss").leaf().get(0), std::log(64.0), 1.0);  // near uniform
  expect_same_step(step("cp:4", 4, false), one, "cp:4");
  expect_same_step(step("data:2,cp:4", 8, false), one, "data:2,cp:4");
  expect_same_step(step("cp:8", 8, true), one, "cp:8 with recomputation");
}

// Issue 39: a NaN in the query (one element of the first layer's query weight: one query
// element NaN at every token) gave a finite loss, attention dropping the NaN scores as masked, so
// no NaN check could fire. The loss is NaN, eagerly, under sjit and by ring over cp.
TEST(ContextParallel, NanInTheQueryGivesANanLoss) {
  for (const auto& [axes, devices, jit] :
       {std::tuple{"data:1", 1, false}, std::tuple{"data:1", 1, true}, std::tuple{"cp:2", 2, true}}) {
    SCOPED_TRACE(::testing::Message() << axes << (jit ? " sjit" : " eager"));
    const Tree<Tensor> r = step(axes, devices, false, true, jit);
    EXPECT_TRUE(std::isnan(r.at("loss").leaf().get(0))) << r.at("loss").leaf().get(0);
  }
}

// A 32k-token step of a small LLaMA (its parameters negligible beside its activations), planned:
// on cp:8 each device holds 1/8 of the unsplit step's activations, within 10%.
TEST(ContextParallel, ActivationBytesPerDeviceAreAnEighthOnCp8) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 1024,
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2})");
  TrainPlanOptions o;
  o.batch = 1;
  o.seq = 32768;
  const RulePtr rules = load_preset("llama_fsdp").make_rule();
  const TrainPlan whole = plan_training(c, Mesh::parse("fsdp:1", 1), rules, o);
  const TrainPlan split = plan_training(c, Mesh::parse("fsdp:1,cp:8", 8), rules, o);
  const auto activations = [](const TrainPlan& p) {
    return static_cast<double>(p.peak_computed_bytes - p.gradient_bytes);
  };
  const double ratio = activations(split) / activations(whole);
  EXPECT_GT(ratio, 0.125 * 0.9) << ratio;
  EXPECT_LT(ratio, 0.125 * 1.1) << ratio;
  // The ring's traffic: each device receives its key/value blocks from 7 others, forward and
  // backward, and the gradients' blocks; no all-gather of the sequence.
  EXPECT_GT(split.bytes_by_collective.at(CollectiveKind::kPermute), 0);
  EXPECT_EQ(split.bytes_by_collective.count(CollectiveKind::kAllGather), 0u);
}

TEST(ContextParallel, BadSettingsAreNamed) {
  const ModelConfig c = ModelConfig::parse(kSmall);
  const RulePtr rules = load_preset("llama_fsdp").make_rule();
  TrainPlanOptions o;
  o.batch = 2;
  o.seq = 36;  // not 2 x 4 chunks
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:1,cp:4", 4), rules, o), SpecError,
                    "36 tokens", "2 x 4", "'cp'");
  o.seq = 32;
  o.fused_attention = false;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:1,cp:4", 4), rules, o), SpecError,
                    "--attention fused");
  const ModelConfig gpt2 = ModelConfig::parse(R"({"model_type": "gpt2", "vocab_size": 40,
    "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64})");
  o.fused_attention = true;
  EXPECT_THROW_WITH(plan_training(gpt2, Mesh::parse("fsdp:1,tp:1,cp:4", 4), load_preset("gpt2").make_rule(), o),
                    SpecError, "GPT-2");
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:1,cp:2,context:2", 4), rules, o), SpecError,
                    "one axis", "cp and context");
  const ModelConfig windowed = ModelConfig::parse(R"({"model_type": "mistral", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 8})");
  EXPECT_THROW_WITH(plan_training(windowed, Mesh::parse("fsdp:1,cp:4", 4), rules, o), SpecError,
                    "sliding-window", "window 8", "cp");
}

}  // namespace
}  // namespace shardplan
