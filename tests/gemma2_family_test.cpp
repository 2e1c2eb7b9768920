// The Gemma 2 family (src/train/families/gemma2.cpp): its config.json fields, its parameter tree
// against a count by hand, its step against PyTorch (soft-capping, the sliding window on the
// even layers, the (1 + weight) norms), the fused kernels refused for it, and a plan.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "model_step.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/executor.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/sjit.hpp"
#include "shardplan/train_plan.hpp"
#include "test_util.hpp"
#include "torch_reference.hpp"

namespace shardplan {
namespace {

// google/gemma-2-2b's config.json as published on the Hugging Face Hub.
constexpr const char* kGemma2_2b = R"({"architectures": ["Gemma2ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "attn_logit_softcapping": 50.0,
  "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
  "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
  "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
  "transformers_version": "4.42.4", "use_cache": true, "vocab_size": 256000})";

// scripts/gen_gemma2_reference.py's model: head_dim 8 (not hidden / heads = 4), a scale base of
// 12 (not head_dim), a window of 3 tokens on layer 0 of a sequence of 8, caps that bite.
constexpr const char* kTinyGemma2 = R"({"model_type": "gemma2", "vocab_size": 40,
  "hidden_size": 16, "head_dim": 8, "intermediate_size": 24, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "query_pre_attn_scalar": 12,
  "sliding_window": 3, "attn_logit_softcapping": 1.0, "final_logit_softcapping": 3.0})";

TEST(Gemma2, TheHubConfigIsReadWhole) {
  const ModelConfig c = ModelConfig::parse(kGemma2_2b);
  EXPECT_EQ(c.family_name(), "gemma2");
  EXPECT_EQ(c.layers_path(), "model/layers");
  EXPECT_EQ(c.head_dim, 256);  // not hidden / heads = 288
  EXPECT_EQ(c.kv_heads, 4);
  EXPECT_TRUE(c.tie_embeddings);  // Gemma2Config's default: the file does not say
  EXPECT_DOUBLE_EQ(c.attention_scale, 1.0 / 16);
  EXPECT_DOUBLE_EQ(c.attention_softcap, 50);
  EXPECT_DOUBLE_EQ(c.logit_softcap, 30);
  // transformers: `sliding_window if not bool(layer_idx % 2)`: the even layers are local.
  EXPECT_EQ(c.window(0), 4096);
  EXPECT_EQ(c.window(1), 0);
  EXPECT_EQ(c.window(24), 4096);
  EXPECT_EQ(c.window(25), 0);
  EXPECT_TRUE(c.not_modelled.empty()) << c.not_modelled.front();
}

// By hand, from Gemma-2-2B's sizes: embeddings 256000 x 2304 = 589,824,000 (tied: no lm_head);
// per layer q 2048 x 2304, k and v 1024 x 2304 each, o 2304 x 2048 (14,155,776), the MLP
// 3 x 2304 x 9216 (63,700,992), four norms of 2304: 77,865,984; 26 layers; the final norm 2304.
// Google's model card: 2,614,341,888 parameters.
TEST(Gemma2, ParameterCountIsTheModelCards) {
  const ModelConfig c = ModelConfig::parse(kGemma2_2b);
  const std::int64_t per_layer =
      2048LL * 2304 + 2 * 1024LL * 2304 + 2304LL * 2048 + 3 * 2304LL * 9216 + 4 * 2304;
  EXPECT_EQ(per_layer, 77'865'984);
  EXPECT_EQ(c.parameter_count(), 256000LL * 2304 + 26 * per_layer + 2304);
  EXPECT_EQ(c.parameter_count(), 2'614'341'888);
  EXPECT_EQ(c.active_parameter_count(), c.parameter_count());  // dense
  int norms = 0;
  for (const auto& [p, t] : c.parameters(DType::kBF16).flatten()) {
    if (p.rfind("model/layers/25/", 0) == 0 && p.find("layernorm") != std::string::npos) {
      norms += t.shape == Shape{2304} ? 1 : 100;
    }
  }
  EXPECT_EQ(norms, 4);
}

// Gemma2Config's defaults where the file is silent; null caps and window mean none;
// layer_types decides the windowed layers; what the step does not model is named.
TEST(Gemma2, DefaultsNullsAndLayerTypes) {
  const ModelConfig d = ModelConfig::parse(R"({"model_type": "gemma2", "vocab_size": 40,
    "hidden_size": 30, "intermediate_size": 24, "num_hidden_layers": 3,
    "num_attention_heads": 4})");
  EXPECT_EQ(d.head_dim, 256);
  EXPECT_TRUE(d.tie_embeddings);
  EXPECT_DOUBLE_EQ(d.attention_scale, 1.0 / 16);
  EXPECT_DOUBLE_EQ(d.attention_softcap, 50);
  EXPECT_DOUBLE_EQ(d.logit_softcap, 30);
  EXPECT_EQ(d.window_layers, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(d.sliding_window, 4096);
  const ModelConfig n = ModelConfig::parse(R"({"model_type": "gemma2", "vocab_size": 40,
    "hidden_size": 30, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "attn_logit_softcapping": null, "final_logit_softcapping": null,
    "sliding_window": null, "hidden_activation": "gelu"})");
  EXPECT_EQ(n.attention_softcap, 0);
  EXPECT_EQ(n.logit_softcap, 0);
  EXPECT_TRUE(n.window_layers.empty());
  ASSERT_EQ(n.not_modelled.size(), 1u);
  EXPECT_THAT(n.not_modelled[0], ::testing::HasSubstr("hidden_activation 'gelu'"));
  const ModelConfig t = ModelConfig::parse(R"({"model_type": "gemma2", "vocab_size": 40,
    "hidden_size": 30, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "layer_types": ["full_attention", "sliding_attention"]})");
  EXPECT_EQ(t.window_layers, (std::vector<bool>{false, true}));
}

TEST(Gemma2, BadCapsAndScalesAreErrorsNamingTheField) {
  const auto with = [](const std::string& field) {
    return R"({"model_type": "gemma2", "vocab_size": 40, "hidden_size": 30,
      "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, )" +
           field + "}";
  };
  EXPECT_THROW_WITH(ModelConfig::parse(with(R"("attn_logit_softcapping": -1)"), "g.json"), IoError,
                    "[config] g.json", "'attn_logit_softcapping' is -1",
                    "a positive number (or null: none)");
  EXPECT_THROW_WITH(ModelConfig::parse(with(R"("final_logit_softcapping": "30")"), "g.json"),
                    IoError, "'final_logit_softcapping' is \"30\"");
  EXPECT_THROW_WITH(ModelConfig::parse(with(R"("query_pre_attn_scalar": null)"), "g.json"), IoError,
                    "'query_pre_attn_scalar' is null", "expected a positive number");
  EXPECT_THROW_WITH(ModelConfig::parse(with(R"("layer_types": ["full_attention"])"), "g.json"),
                    IoError, "'layer_types'", "a list of 2 entries");
}

// The parameters of scripts/gen_gemma2_reference.py: parameter k of the paths sorted has element
// i = 0.5 sin((0.37 + 0.07 k) i + 0.3 k).
Tree<Array> reference_parameters(const ModelConfig& c, const Mesh& mesh, const Executor& exec) {
  const Tree<TensorSpec> specs = c.parameters(DType::kF64);
  std::vector<std::string> paths;
  for (const auto& [p, t] : specs.flatten()) paths.push_back(p);
  std::sort(paths.begin(), paths.end());
  return specs.map_with_path([&](const std::string& path, const TensorSpec& s) {
    const auto k = static_cast<double>(std::find(paths.begin(), paths.end(), path) - paths.begin());
    Tensor t(s.shape, DType::kF64);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      t.set(i, 0.5 * std::sin((0.37 + 0.07 * k) * static_cast<double>(i) + 0.3 * k));
    }
    return device_put(t, NamedSharding(mesh, PartitionSpec()), exec);
  });
}

/// The loss and gradients of the step on the script's batch (2 x 8 tokens).
Tree<Array> reference_step(const ModelConfig& c, const std::string& mesh_text, bool fused,
                           bool fused_loss = false) {
  const int devices = mesh_text == "fsdp:1" ? 1 : 4;
  const Executor exec(devices);
  const Mesh mesh = Mesh::parse(mesh_text, devices);
  std::vector<std::int32_t> ids(16), targets(16);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int32_t>((7 * i + 3) % 40);
    targets[i] = static_cast<std::int32_t>((5 * i + 1) % 40);
  }
  const bool split = mesh.size() > 1;
  const train::ModelStep model{
      .config = c,
      .layout = split ? train::Layout{{"fsdp"}, {"tp"}, 2, 2} : train::Layout{},
      .fused_attention = fused,
      .fused_loss = fused_loss};
  const NamedSharding batch(mesh, split ? PartitionSpec({{"fsdp"}, {}}) : PartitionSpec());
  return sjit(mesh,
              [&](const Tree<Array>& p, const Array& x, const Array& y) {
                auto [loss, grads] = train::loss_and_grads(model, p, x, y);
                return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
              })(reference_parameters(c, mesh, exec),
                 device_put(Tensor::from(Shape{2, 8}, ids), batch, exec),
                 device_put(Tensor::from(Shape{2, 8}, targets), batch, exec));
}

void expect_near(const Array& got, const test::RefTensor& want, double tol, const char* what) {
  const Tensor t = got.to_host();
  ASSERT_EQ(t.numel(), static_cast<std::int64_t>(want.v.size())) << what;
  for (std::size_t i = 0; i < want.v.size(); ++i) {
    ASSERT_NEAR(t.get(static_cast<std::int64_t>(i)), want.v[i], tol) << what << " element " << i;
  }
}

// PyTorch's loss and gradients (float64) of the same tiny Gemma 2 and of it without each feature:
// the step matches each, and each feature moves the loss (by 0.03 for the attention cap, 1.1 for
// the final cap, 0.2 for the window), so a step that left one out would match the wrong case.
// The (1 + weight) norms, the embeddings' sqrt(hidden) and the scale base are in every case.
// The tolerances are the rotary tables': their angles are computed in f32 (as transformers'
// rotary embedding computes them), the reference's in f64.
TEST(Gemma2, LossAndGradientsAreTorchs) {
  const auto ref = test::read_torch_reference("gemma2_reference.txt");
  ASSERT_EQ(ref.size(), 4u);
  const double full = ref.at("gemma2").at("loss").v.at(0);
  for (const auto& [name, r] : ref) {
    SCOPED_TRACE(name);
    if (name != "gemma2") {
      EXPECT_GT(std::abs(r.at("loss").v.at(0) - full), 0.02);
    }
    ModelConfig c = ModelConfig::parse(kTinyGemma2);
    if (name == "no_attention_cap") c.attention_softcap = 0;
    if (name == "no_final_cap") c.logit_softcap = 0;
    if (name == "no_window") c.window_layers.clear();
    // Without the attention cap the fused kernel runs it too (the window as its mask, the scale
    // given): the same figures.
    for (const bool fused : {false, c.attention_softcap == 0}) {
      const Tree<Array> out = reference_step(c, "fsdp:1", fused);
      expect_near(out.at("loss").leaf(), r.at("loss"), 1e-7, "loss");
      const Tree<Array>& g = out.at("grads");
      expect_near(g.at_path("model/embed_tokens/weight").leaf(), r.at("d_embed"), 1e-6, "d_embed");
      expect_near(g.at_path("model/layers/0/self_attn/q_proj/weight").leaf(), r.at("d_q0"), 1e-6,
                  "d_q0");
    }
  }
  // Sharded over fsdp x tp (the layers' constraints and regions), the same loss.
  const Tree<Array> split = reference_step(ModelConfig::parse(kTinyGemma2), "fsdp:2,tp:2", false);
  expect_near(split.at("loss").leaf(), ref.at("gemma2").at("loss"), 1e-7, "sharded loss");
}

// The fused attention kernel and the fused loss have no soft-capping: the step refuses them for
// a capped model, and train-plan refuses --attention / --loss fused and a context axis for it,
// naming the family and why, and plans it unfused.
TEST(Gemma2, FusedKernelsAreRefusedForSoftCapping) {
  const ModelConfig c = ModelConfig::parse(kTinyGemma2);
  EXPECT_THROW_WITH(reference_step(c, "fsdp:1", true), SpecError,
                    "dot_product_attention has no soft-capping", "attn_logit_softcapping 1");
  EXPECT_THROW_WITH(reference_step(c, "fsdp:1", false, true), SpecError,
                    "linear_cross_entropy has no soft-capping", "final_logit_softcapping 3");
  const Mesh mesh = Mesh::parse("fsdp:2,tp:2", 4);
  const RulePtr rules = load_preset("llama_fsdp_tp").make_rule();
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  o.fused_attention = true;
  EXPECT_THROW_WITH(plan_training(c, mesh, rules, o), OptionError,
                    "--attention fused is refused: soft-capped attention scores",
                    "the model is gemma2", "soft-capped at 1 before the mask", "--attention naive");
  o.fused_attention = std::nullopt;
  o.fused_loss = true;
  EXPECT_THROW_WITH(plan_training(c, mesh, rules, o), OptionError,
                    "--loss fused is refused: soft-capped logits", "the model is gemma2",
                    "soft-capped at 3 before the loss", "--loss naive");
  o.fused_loss = std::nullopt;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:2,cp:2", 4), rules, o), OptionError,
                    "--mesh with a cp or context axis is refused: soft-capped attention scores",
                    "the model is gemma2", "ring attention", "'cp'");
}

// train-plan's library call plans Gemma 2 with the LLaMA preset (its four norms replicated as
// every norm), unfused; the report names the family.
TEST(Gemma2, TrainingIsPlanned) {
  const ModelConfig c = ModelConfig::parse(kTinyGemma2);
  const Mesh mesh = Mesh::parse("fsdp:2,tp:2", 4);
  const RulePtr rules = load_preset("llama_fsdp_tp").make_rule();
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  const TrainPlan p = plan_training(c, mesh, rules, o);
  const PlanReport bf16 =
      MeshShardingHelper(mesh).plan(RuleTree(rules), c.parameters(DType::kBF16));
  EXPECT_EQ(p.parameter_count, c.parameter_count());
  EXPECT_EQ(p.parameter_bytes, bf16.max_device_bytes());
  EXPECT_FALSE(p.fused_attention);
  EXPECT_FALSE(p.fused_loss);
  EXPECT_GT(p.flops, 0);
  EXPECT_GT(p.bytes_by_collective.at(CollectiveKind::kAllGather), 0);
  EXPECT_THAT(p.table(), ::testing::HasSubstr("gemma2"));
  // Without the caps the fused kernels are the default again.
  ModelConfig uncapped = c;
  uncapped.attention_softcap = uncapped.logit_softcap = 0;
  const TrainPlan q = plan_training(uncapped, mesh, rules, o);
  EXPECT_TRUE(q.fused_attention);
  EXPECT_TRUE(q.fused_loss);
}

// Its layers alternate, so a step whose sequence is longer than the window is traced whole (the
// small steps traced to extrapolate from are the model's first layers); where the sequence fits
// in the window every layer is global, and the step of 22 layers is extrapolated from small
// steps (whose figures against the whole step's: the Extrapolation tests).
TEST(Gemma2, AlternatingLayersAreTracedWholeWhereTheWindowMatters) {
  ModelConfig c = ModelConfig::parse(kTinyGemma2);
  c.layers = 22;
  c.window_layers.assign(22, false);
  for (std::size_t l = 0; l < 22; l += 2) c.window_layers[l] = true;
  c.sliding_window = 8;
  const Mesh mesh = Mesh::parse("fsdp:1", 1);
  const RulePtr rules = load_preset("llama_fsdp").make_rule();
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  EXPECT_EQ(plan_training(c, mesh, rules, o).traced, "the whole step");
  o.seq = 8;
  const TrainPlan p = plan_training(c, mesh, rules, o);
  EXPECT_TRUE(p.extrapolated) << p.traced;
}

}  // namespace
}  // namespace shardplan
