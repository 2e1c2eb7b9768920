#include "example_model.hpp"

#include <fmt/format.h>

namespace shardplan::cli {

std::vector<std::pair<std::string, TensorSpec>> llama2_7b_tensors() {
  constexpr std::int64_t kVocab = 32000, kHidden = 4096, kInter = 11008, kLayers = 32;
  const DType bf16 = DType::kBF16;
  std::vector<std::pair<std::string, TensorSpec>> t;
  t.emplace_back("model.embed_tokens.weight", TensorSpec{Shape{kVocab, kHidden}, bf16});
  for (std::int64_t l = 0; l < kLayers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      t.emplace_back(p + "self_attn." + proj + ".weight", TensorSpec{Shape{kHidden, kHidden}, bf16});
    }
    t.emplace_back(p + "mlp.gate_proj.weight", TensorSpec{Shape{kInter, kHidden}, bf16});
    t.emplace_back(p + "mlp.up_proj.weight", TensorSpec{Shape{kInter, kHidden}, bf16});
    t.emplace_back(p + "mlp.down_proj.weight", TensorSpec{Shape{kHidden, kInter}, bf16});
    t.emplace_back(p + "input_layernorm.weight", TensorSpec{Shape{kHidden}, bf16});
    t.emplace_back(p + "post_attention_layernorm.weight", TensorSpec{Shape{kHidden}, bf16});
  }
  t.emplace_back("model.norm.weight", TensorSpec{Shape{kHidden}, bf16});
  t.emplace_back("lm_head.weight", TensorSpec{Shape{kVocab, kHidden}, bf16});
  return t;
}

}  // namespace shardplan::cli
