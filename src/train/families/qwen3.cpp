// The Qwen3 family (model_type qwen3, dense): LLaMA's layout with an RMSNorm over each query and
// key head before the rotary positions (self_attn.q_norm / k_norm, [head_dim] each), head_dim
// given by the config (128 by default, not hidden / heads), attention_bias on q, k, v and o, and
// Qwen2's sliding window (transformers' Qwen3Config).
#include <array>

#include "llama_like.hpp"

namespace shardplan::train {
namespace {

void read_qwen3(Fields& f, ModelConfig& c) {
  read_llama_like(f, c, /*head_dim=*/128);
  c.qk_norm = true;
  c.attention_bias = f.flag("attention_bias", false);
  c.output_bias = c.attention_bias;
  read_window_from_layer(f, c);
}

void add_parameters(const ModelConfig& c, NamedSpecs& n) { add_llama_like(c, n, add_gated_mlp); }

constexpr std::array<std::string_view, 1> kTypes{"qwen3"};

}  // namespace

namespace families_defs {

extern const FamilyDef qwen3;
constexpr FamilyDef qwen3{.name = "qwen3",
                          .title = "Qwen3",
                          .types = kTypes,
                          .layers_path = "model/layers",
                          .default_preset = "llama_fsdp_tp",
                          .preset_without_tp = "llama_fsdp",
                          .support = {},
                          .read = read_qwen3,
                          .add_parameters = add_parameters,
                          .step = kRmsNormDecoder};

}  // namespace families_defs
}  // namespace shardplan::train
