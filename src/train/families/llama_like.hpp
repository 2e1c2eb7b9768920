#pragma once
// The parts the LLaMA-like families share (llama.cpp defines them): the decoder of pre-norm
// layers (RMSNorm, rotary grouped-query attention, an MLP) in Hugging Face's LlamaModel naming.
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "../model_family.hpp"
#include "../model_step.hpp"
#include "config_parts.hpp"

namespace shardplan::train {

/// The gated MLP's activation: the config field naming it, the names that mean it (the first
/// when the field is absent), and the MLP as messages call it.
struct GateActivation {
  std::string_view field;
  std::array<std::string_view, 2> names;
  std::string_view mlp;
};
/// LLaMA's: hidden_act silu (or swish).
inline constexpr GateActivation kSiluGate{"hidden_act", {"silu", "swish"}, "SwiGLU, with silu"};

/// The fields every LLaMA-like config has: sizes, heads and their width (head_dim; when absent
/// `head_dim`, or hidden / heads when that is 0), the activation, attention dropout.
void read_llama_like(Fields& f, ModelConfig& c, std::int64_t head_dim = 0,
                     const GateActivation& act = kSiluGate);
/// Which layers slide, as layer_types says when the file has it (one "full_attention" or
/// "sliding_attention" per layer); else `sliding` is left as it is.
void read_layer_types(Fields& f, const ModelConfig& c, std::vector<bool>& sliding);
/// Mistral's sliding window: every layer when sliding_window is set (null: none).
void read_window_every_layer(Fields& f, ModelConfig& c);
/// Qwen2's sliding window: with use_sliding_window, the layers from max_window_layers on (or as
/// layer_types says); transformers' defaults, a window of 4096 from layer 28.
void read_window_from_layer(Fields& f, ModelConfig& c);

/// One layer's MLP parameters under `prefix` ("model.layers.3.").
using AddMlp = void (*)(const ModelConfig& c, NamedSpecs& n, const std::string& prefix);
/// LLaMA's SwiGLU MLP: gate_proj, up_proj, down_proj (with mlp_bias, their biases).
void add_gated_mlp(const ModelConfig& c, NamedSpecs& n, const std::string& prefix);
/// The parameters: embeddings, each layer's norms and attention (q/k norms with qk_norm) and the
/// MLP `mlp` adds, the final norm, the head unless tied.
void add_llama_like(const ModelConfig& c, NamedSpecs& n, AddMlp mlp);

/// The step of the LLaMA-like families with LLaMA's MLP (ModelStep's own parts).
inline constexpr StepParts kRmsNormDecoder{
    .embed = [](const ModelStep& m, const Tree<Array>& rest,
                const Array& tokens) { return m.embed(rest, tokens); },
    .layer = [](const ModelStep& m, const Tree<Array>& layer, const Array& h,
                std::int64_t window) { return m.rms_norm_layer(layer, h, window); },
    .mlp = [](const ModelStep& m, const Tree<Array>& layer,
              const Array& x) { return m.gated_mlp(layer, x); },
    .final_norm = [](const ModelStep& m, const Tree<Array>& rest,
                     const Array& h) { return m.rms_final_norm(rest, h); },
    .embedding = "model/embed_tokens/weight"};

}  // namespace shardplan::train
