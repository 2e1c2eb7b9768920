#include "example_model.hpp"

#include <fmt/format.h>

namespace shardplan::cli {

std::vector<std::pair<std::string, TensorSpec>> llama2_7b_tensors() {
  return llama_tensors(LlamaDims{}, DType::kBF16);
}

std::vector<std::pair<std::string, TensorSpec>> llama_tensors(const LlamaDims& d, DType dtype) {
  std::vector<std::pair<std::string, TensorSpec>> t;
  t.emplace_back("model.embed_tokens.weight", TensorSpec{Shape{d.vocab, d.hidden}, dtype});
  for (std::int64_t l = 0; l < d.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      t.emplace_back(p + "self_attn." + proj + ".weight",
                     TensorSpec{Shape{d.hidden, d.hidden}, dtype});
    }
    t.emplace_back(p + "mlp.gate_proj.weight", TensorSpec{Shape{d.intermediate, d.hidden}, dtype});
    t.emplace_back(p + "mlp.up_proj.weight", TensorSpec{Shape{d.intermediate, d.hidden}, dtype});
    t.emplace_back(p + "mlp.down_proj.weight", TensorSpec{Shape{d.hidden, d.intermediate}, dtype});
    t.emplace_back(p + "input_layernorm.weight", TensorSpec{Shape{d.hidden}, dtype});
    t.emplace_back(p + "post_attention_layernorm.weight", TensorSpec{Shape{d.hidden}, dtype});
  }
  t.emplace_back("model.norm.weight", TensorSpec{Shape{d.hidden}, dtype});
  t.emplace_back("lm_head.weight", TensorSpec{Shape{d.vocab, d.hidden}, dtype});
  return t;
}

}  // namespace shardplan::cli
