// The Qwen3 family (src/train/families/qwen3.cpp): its config.json fields, its parameter tree
// against a count by hand, its per-head q/k norms in the step, and a plan of its training.
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

namespace shardplan {
namespace {

// Qwen/Qwen3-0.6B's config.json as published on the Hugging Face Hub.
constexpr const char* kQwen3_06b = R"({"architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
  "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16,
  "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

constexpr const char* kTinyQwen3 = R"({"model_type": "qwen3", "vocab_size": 40,
  "hidden_size": 16, "head_dim": 6, "intermediate_size": 24, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2})";

TEST(Qwen3, TheHubConfigIsReadWhole) {
  const ModelConfig c = ModelConfig::parse(kQwen3_06b);
  EXPECT_EQ(c.family_name(), "qwen3");
  EXPECT_EQ(c.layers_path(), "model/layers");
  EXPECT_EQ(c.head_dim, 128);  // not hidden / heads = 64
  EXPECT_EQ(c.kv_heads, 8);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.window_layers.empty());  // use_sliding_window false
  EXPECT_TRUE(c.not_modelled.empty()) << c.not_modelled.front();
}

// transformers' Qwen3Config: head_dim 128 when the file has none; attention_bias puts biases on
// q, k, v and o.
TEST(Qwen3, HeadDimDefaultsTo128AndAttentionBiasCoversTheOutput) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "qwen3", "vocab_size": 40,
    "hidden_size": 30, "intermediate_size": 24, "num_hidden_layers": 1,
    "num_attention_heads": 4, "attention_bias": true})");
  EXPECT_EQ(c.head_dim, 128);
  const auto flat = c.parameters(DType::kF32).flatten();
  const auto shape = [&](const std::string& path) {
    for (const auto& [p, t] : flat) {
      if (p == path) return t.shape;
    }
    ADD_FAILURE() << "no " << path;
    return Shape{};
  };
  EXPECT_EQ(shape("model/layers/0/self_attn/o_proj/bias"), (Shape{30}));
  EXPECT_EQ(shape("model/layers/0/self_attn/q_proj/bias"), (Shape{4 * 128}));
}

// By hand, from Qwen3-0.6B's sizes: embeddings 151936 x 1024 (tied: no lm_head); per layer
// q 2048 x 1024, k and v 1024 x 1024 each, o 1024 x 2048, q_norm and k_norm 128 each, two
// norms 1024 each, the MLP 3 x 1024 x 3072; the final norm 1024. Qwen's model card: 0.6B
// parameters, 0.44B of them not embeddings.
TEST(Qwen3, ParameterCountIsTheModelCards) {
  const ModelConfig c = ModelConfig::parse(kQwen3_06b);
  const std::int64_t embed = 151936LL * 1024;
  const std::int64_t per_layer = 2048LL * 1024 + 2 * 1024LL * 1024 + 1024LL * 2048 + 2 * 128 +
                                 2 * 1024 + 3 * 1024LL * 3072;
  EXPECT_EQ(per_layer, 15'730'944);
  EXPECT_EQ(c.parameter_count(), embed + 28 * per_layer + 1024);
  EXPECT_EQ(c.parameter_count(), 596'049'920);
  EXPECT_NEAR(static_cast<double>(c.parameter_count() - embed), 0.44e9, 0.005e9);
  EXPECT_EQ(c.active_parameter_count(), c.parameter_count());  // dense
  const auto flat = c.parameters(DType::kBF16).flatten();
  bool q_norm = false;
  for (const auto& [p, t] : flat) {
    if (p == "model/layers/27/self_attn/q_norm/weight") q_norm = t.shape == Shape{128};
  }
  EXPECT_TRUE(q_norm);
}

Tree<Array> parameters(const ModelConfig& c, double qk_scale, const Mesh& mesh,
                       const Executor& exec) {
  std::uint64_t seed = 5;
  return c.parameters(DType::kF32).map_with_path([&](const std::string& path, const TensorSpec& s) {
    const bool qk = path.find("q_proj") != std::string::npos ||
                    path.find("k_proj") != std::string::npos;
    const double r = 0.3 * (qk ? qk_scale : 1.0);
    return device_put(Tensor::uniform(s.shape, DType::kF32, seed++, -r, r),
                      NamedSharding(mesh, PartitionSpec()), exec);
  });
}

double step_loss(const ModelConfig& c, double qk_scale, bool fused) {
  const Executor exec(1);
  const Mesh mesh = Mesh::parse("fsdp:1", 1);
  std::vector<std::int32_t> ids(16);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7) % 40);
  const Array x = device_put(Tensor::from(Shape{2, 8}, ids), NamedSharding(mesh, {}), exec);
  std::rotate(ids.begin(), ids.begin() + 1, ids.end());
  const Array y = device_put(Tensor::from(Shape{2, 8}, ids), NamedSharding(mesh, {}), exec);
  const train::ModelStep model{.config = c, .layout = {}, .fused_attention = fused};
  return sjit(mesh, [&](const Tree<Array>& p, const Array& a, const Array& b) {
           return train::loss_and_grads(model, p, a, b).first;
         })(parameters(c, qk_scale, mesh, exec), x, y)
      .to_host()
      .get(0);
}

// The per-head RMSNorm of queries and keys makes the attention blind to the scale of q_proj and
// k_proj (RMSNorm(a x) = RMSNorm(x) for a > 0, its epsilon aside); without the norms the same
// scale changes the scores and so the loss. Fused and decomposed attention norm alike.
TEST(Qwen3, QueryAndKeyNormsMakeTheLossBlindToTheirProjectionsScale) {
  const ModelConfig c = ModelConfig::parse(kTinyQwen3);
  const double loss = step_loss(c, 1.0, true);
  EXPECT_NEAR(loss, std::log(40.0), 1.0);
  EXPECT_NEAR(step_loss(c, 8.0, true), loss, 1e-6);
  EXPECT_NEAR(step_loss(c, 8.0, false), loss, 1e-6);
  ModelConfig plain = c;
  plain.qk_norm = false;
  EXPECT_GT(std::abs(step_loss(plain, 8.0, true) - step_loss(plain, 1.0, true)), 1e-4);  // 2.7e-4
}

// train-plan's library call plans Qwen3 with the LLaMA preset (its q/k norms replicated as every
// norm): the held parameters are the planner's, the step gathers them over fsdp.
TEST(Qwen3, TrainingIsPlanned) {
  const ModelConfig c = ModelConfig::parse(kTinyQwen3);
  const Mesh mesh = Mesh::parse("fsdp:2,tp:2", 4);
  const RulePtr rules = load_preset("llama_fsdp_tp").make_rule();
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  const TrainPlan p = plan_training(c, mesh, rules, o);
  const PlanReport bf16 = MeshShardingHelper(mesh).plan(RuleTree(rules), c.parameters(DType::kBF16));
  EXPECT_EQ(p.parameter_count, c.parameter_count());
  EXPECT_EQ(p.parameter_bytes, bf16.max_device_bytes());
  EXPECT_GT(p.flops, 0);
  EXPECT_GT(p.bytes_by_collective.at(CollectiveKind::kAllGather), 0);
}

}  // namespace
}  // namespace shardplan
