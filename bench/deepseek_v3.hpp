#pragma once
// A DeepSeek-V3-sized model (config of deepseek-ai/DeepSeek-V3: 61 layers, the first 3 dense, the
// rest MoE with 256 routed experts and 1 shared expert; MLA attention; FP8 weights with 128x128
// block scales `weight_scale_inv`), in Hugging Face naming, and a 20-rule table for it.
#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "shardplan/model_loader.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "shardplan/tensor_spec.hpp"

namespace shardplan::bench {

inline std::vector<std::pair<std::string, TensorSpec>> deepseek_v3_tensors() {
  constexpr std::int64_t kHidden = 7168, kVocab = 129280, kInter = 18432, kMoeInter = 2048;
  constexpr std::int64_t kQLora = 1536, kKvLora = 512, kHeads = 128, kNope = 128, kRope = 64,
                         kV = 128;
  constexpr int kLayers = 61, kDense = 3, kExperts = 256;
  std::vector<std::pair<std::string, TensorSpec>> t;
  t.reserve(92000);
  auto blocks = [](std::int64_t n) { return (n + 127) / 128; };
  // An FP8 Linear weight [out, in] and its block scales.
  auto linear = [&](const std::string& name, std::int64_t out, std::int64_t in) {
    t.emplace_back(name + ".weight", TensorSpec{Shape{out, in}, DType::kF8E4M3});
    t.emplace_back(name + ".weight_scale_inv",
                   TensorSpec{Shape{blocks(out), blocks(in)}, DType::kF32});
  };
  auto vec = [&](const std::string& name, std::int64_t n, DType d = DType::kBF16) {
    t.emplace_back(name, TensorSpec{Shape{n}, d});
  };
  t.emplace_back("model.embed_tokens.weight", TensorSpec{Shape{kVocab, kHidden}, DType::kBF16});
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    vec(p + "input_layernorm.weight", kHidden);
    vec(p + "post_attention_layernorm.weight", kHidden);
    linear(p + "self_attn.q_a_proj", kQLora, kHidden);
    vec(p + "self_attn.q_a_layernorm.weight", kQLora);
    linear(p + "self_attn.q_b_proj", kHeads * (kNope + kRope), kQLora);
    linear(p + "self_attn.kv_a_proj_with_mqa", kKvLora + kRope, kHidden);
    vec(p + "self_attn.kv_a_layernorm.weight", kKvLora);
    linear(p + "self_attn.kv_b_proj", kHeads * (kNope + kV), kKvLora);
    linear(p + "self_attn.o_proj", kHidden, kHeads * kV);
    if (l < kDense) {
      linear(p + "mlp.gate_proj", kInter, kHidden);
      linear(p + "mlp.up_proj", kInter, kHidden);
      linear(p + "mlp.down_proj", kHidden, kInter);
      continue;
    }
    t.emplace_back(p + "mlp.gate.weight", TensorSpec{Shape{kExperts, kHidden}, DType::kBF16});
    vec(p + "mlp.gate.e_score_correction_bias", kExperts, DType::kF32);
    for (int e = 0; e < kExperts; ++e) {
      const std::string x = fmt::format("{}mlp.experts.{}.", p, e);
      linear(x + "gate_proj", kMoeInter, kHidden);
      linear(x + "up_proj", kMoeInter, kHidden);
      linear(x + "down_proj", kHidden, kMoeInter);
    }
    linear(p + "mlp.shared_experts.gate_proj", kMoeInter, kHidden);
    linear(p + "mlp.shared_experts.up_proj", kMoeInter, kHidden);
    linear(p + "mlp.shared_experts.down_proj", kHidden, kMoeInter);
  }
  vec("model.norm.weight", kHidden);
  t.emplace_back("lm_head.weight", TensorSpec{Shape{kVocab, kHidden}, DType::kBF16});
  return t;
}

/// The mesh the table is written for: 64 devices.
inline constexpr const char* kDeepseekMesh = "ep:8,fsdp:4,tp:2";

/// 20 rules, first match wins, ending in a catch-all.
inline std::vector<TreePathShardingRule::Entry> deepseek_v3_rules() {
  return {
      {"embed_tokens/weight$", P("tp", "fsdp")},
      {"lm_head/weight$", P("tp", "fsdp")},
      {"mlp/experts/[0-9]+/(gate|up)_proj/weight$", P(AxisNames{"ep", "tp"}, "fsdp")},
      {"mlp/experts/[0-9]+/down_proj/weight$", P("fsdp", AxisNames{"ep", "tp"})},
      {"mlp/experts/[0-9]+/(gate|up|down)_proj/weight_scale_inv$", P()},
      {"shared_experts/(gate|up)_proj/weight$", P("tp", "fsdp")},
      {"shared_experts/down_proj/weight$", P("fsdp", "tp")},
      {"mlp/(gate|up)_proj/weight$", P("tp", "fsdp")},
      {"mlp/down_proj/weight$", P("fsdp", "tp")},
      {"mlp/gate/weight$", P()},
      {"mlp/gate/e_score_correction_bias$", P()},
      {"self_attn/q_a_proj/weight$", P(nullptr, "fsdp")},
      {"self_attn/q_b_proj/weight$", P("tp", "fsdp")},
      {"self_attn/kv_a_proj_with_mqa/weight$", P(nullptr, "fsdp")},
      {"self_attn/kv_b_proj/weight$", P("tp", "fsdp")},
      {"self_attn/o_proj/weight$", P("fsdp", "tp")},
      {"(input|post_attention|q_a|kv_a)_layernorm/weight$", P()},
      {"weight_scale_inv$", P()},
      {"^model/norm/weight$", P()},
      {".*", P()},
  };
}

}  // namespace shardplan::bench
