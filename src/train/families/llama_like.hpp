#pragma once
// The parts the LLaMA-like families share (llama.cpp defines them): the decoder of pre-norm
// layers (RMSNorm, rotary grouped-query attention, an MLP) in Hugging Face's LlamaModel naming.
#include <string>

#include "../model_family.hpp"
#include "../model_step.hpp"
#include "config_parts.hpp"

namespace shardplan::train {

/// The fields every LLaMA-like config has: sizes, heads and their width (head_dim; when absent
/// `head_dim`, or hidden / heads when that is 0), the activation, attention dropout.
void read_llama_like(Fields& f, ModelConfig& c, std::int64_t head_dim = 0);
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
