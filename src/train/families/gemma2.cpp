// The Gemma 2 family (model_type gemma2) as transformers' Gemma2 modeling code runs it: LLaMA's
// layout and rotary grouped-query attention, with
// - head_dim given (256 by default, not hidden / heads), the scores scaled by
//   1 / sqrt(query_pre_attn_scalar) and soft-capped before the mask (attn_logit_softcapping),
//   the final logits soft-capped before the loss (final_logit_softcapping): cap * tanh(x / cap);
// - sliding-window attention on the even layers and global attention on the odd ones
//   (Gemma2Attention: `sliding_window if not bool(layer_idx % 2)`; newer transformers write the
//   same rule as layer_types, which is read when the file has it);
// - four RMSNorms per layer, each scaling by (1 + weight) (Gemma2RMSNorm): before the attention
//   and the MLP, and after each on the sublayer's output, before the residual add;
// - a GeGLU MLP: down(gelu_tanh(gate(x)) * up(x)) (hidden_activation gelu_pytorch_tanh);
// - the embeddings times sqrt(hidden_size) (a constant of their dtype), tied to the head.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "llama_like.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::train {
namespace {

constexpr std::string_view kEmbedding = "model/embed_tokens/weight";

/// Gemma2Config's hidden_activation: gelu with the tanh approximation.
constexpr GateActivation kGeluTanhGate{
    "hidden_activation", {"gelu_pytorch_tanh", "gelu_pytorch_tanh"}, "GeGLU, with the tanh gelu"};

/// A number > 0 at `key`: `fallback` when absent; null is 0 (a cap: none) when `nullable`.
double positive_number(Fields& f, std::string_view key, double fallback, bool nullable) {
  if (!f.present(key)) return fallback;
  const auto v = f.get(key);
  if (!v && nullable) return 0;
  if (v && (v->kind() == json::Kind::kUint || v->kind() == json::Kind::kInt ||
            v->kind() == json::Kind::kNumber)) {
    const double x = v->as_double();
    if (std::isfinite(x) && x > 0) return x;
  }
  throw IoError(fmt::format("[config] {}: the field '{}' is {}, expected a positive number{}",
                            f.source(), key, v ? shown(*v) : std::string("null"),
                            nullable ? " (or null: none)" : ""));
}

void read_gemma2(Fields& f, ModelConfig& c) {
  read_llama_like(f, c, /*head_dim=*/256, kGeluTanhGate);
  // Gemma2Config's defaults: tied embeddings; attention_bias on q, k, v and o.
  c.tie_embeddings = f.flag("tie_word_embeddings", true);
  c.attention_bias = f.flag("attention_bias", false);
  c.output_bias = c.attention_bias;
  c.attention_scale = 1.0 / std::sqrt(positive_number(f, "query_pre_attn_scalar", 256, false));
  c.attention_softcap = positive_number(f, "attn_logit_softcapping", 50, true);
  c.logit_softcap = positive_number(f, "final_logit_softcapping", 30, true);
  // sliding_window: 4096 when absent, null for none.
  const std::int64_t window =
      f.present("sliding_window") ? f.optional_positive("sliding_window").value_or(0) : 4096;
  std::vector<bool> sliding(static_cast<std::size_t>(c.layers));
  for (std::size_t l = 0; l < sliding.size(); ++l) sliding[l] = l % 2 == 0;
  read_layer_types(f, c, sliding);
  if (window > 0 && std::find(sliding.begin(), sliding.end(), true) != sliding.end()) {
    c.sliding_window = window;
    c.window_layers = std::move(sliding);
  }
  // Not read by transformers' Gemma2 (hidden_activation decides; sliding_window_size is an old
  // name the published 9B config keeps) or for generation only (cache_implementation).
  for (const char* unused : {"hidden_act", "sliding_window_size", "cache_implementation"}) {
    f.get(unused);
  }
}

void add_norms_and_mlp(const ModelConfig& c, NamedSpecs& n, const std::string& p) {
  n.add(p + "pre_feedforward_layernorm.weight", {c.hidden});
  n.add(p + "post_feedforward_layernorm.weight", {c.hidden});
  add_gated_mlp(c, n, p);
}

void add_parameters(const ModelConfig& c, NamedSpecs& n) {
  add_llama_like(c, n, add_norms_and_mlp);
}

/// Gemma's RMSNorm: the normed x times (1 + weight).
Array norm(const Array& x, const Tree<Array>& p, std::string_view path) {
  return rms_norm(x, at(p, path) + 1.0);
}

Array gelu_tanh(const Array& x) { return gelu(x, /*approximate=*/true); }

Array embed(const ModelStep& m, const Tree<Array>& rest, const Array& tokens) {
  const Array e = take(at(rest, kEmbedding), tokens, 0);
  return region(e * std::sqrt(static_cast<double>(m.config.hidden)), "residual", m.layout, true);
}

Array layer(const ModelStep& m, const Tree<Array>& p, const Array& h, std::int64_t window) {
  const Layout& L = m.layout;
  const Array x = normed(norm(h, p, "input_layernorm/weight"), "attention_in", L);
  const Array attended =
      region(norm(m.attention_out(p, x, window), p, "post_attention_layernorm/weight"), "norm", L);
  const Array h2 = region(h + attended, "residual", L);
  const Array x2 = normed(norm(h2, p, "pre_feedforward_layernorm/weight"), "mlp_in", L);
  const Array y = region(
      norm(m.gated_mlp(p, x2, gelu_tanh), p, "post_feedforward_layernorm/weight"), "norm", L);
  return region(h2 + y, "residual", L, true);
}

constexpr std::array<std::string_view, 1> kTypes{"gemma2"};

}  // namespace

namespace families_defs {

extern const FamilyDef gemma2;
constexpr FamilyDef gemma2{
    .name = "gemma2",
    .title = "Gemma 2",
    .types = kTypes,
    .layers_path = "model/layers",
    .default_preset = "llama_fsdp_tp",
    .preset_without_tp = "llama_fsdp",
    .support = {},
    .read = read_gemma2,
    .add_parameters = add_parameters,
    .step = {.embed = embed,
             .layer = layer,
             .final_norm = [](const ModelStep&, const Tree<Array>& rest,
                              const Array& h) { return norm(h, rest, "model/norm/weight"); },
             .embedding = kEmbedding}};

}  // namespace families_defs
}  // namespace shardplan::train
