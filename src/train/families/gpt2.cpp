// The GPT-2 family (model_type gpt2): learned positions, LayerNorm, GELU, Conv1D weights.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>

#include "../model_family.hpp"
#include "../model_step.hpp"
#include "config_parts.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/remat.hpp"

namespace shardplan::train {
namespace {

/// GPT-2's fields.
void read_gpt2(Fields& f, ModelConfig& c) {
  c.vocab = f.positive("vocab_size");
  c.hidden = f.positive("n_embd");
  c.layers = f.positive("n_layer");
  c.heads = f.positive("n_head");
  c.kv_heads = c.heads;
  c.intermediate = f.positive("n_inner", mul(4, c.hidden, "n_inner"));
  c.positions = f.positive("n_positions");
  c.tie_embeddings = f.flag("tie_word_embeddings", true);
  c.attention_bias = true;
  if (c.hidden % c.heads != 0) {
    throw IoError(fmt::format("[config] {}: hidden size {} does not divide into {} heads",
                              f.source(), c.hidden, c.heads));
  }
  c.head_dim = c.hidden / c.heads;
  check_heads(c, f.source());
  // The step's GELU is the tanh approximation ("gelu_new", GPT-2's own).
  const std::string act = f.string("activation_function").value_or("gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    c.not_modelled.push_back(
        fmt::format("activation_function '{}' (the step uses gelu_new)", detail::printable(act)));
  }
  std::vector<std::string> drops;
  for (const char* key : {"attn_pdrop", "embd_pdrop", "resid_pdrop"}) {
    if (const double r = f.rate(key); r > 0) drops.push_back(fmt::format("{} {}", key, r));
  }
  if (!drops.empty()) {
    c.not_modelled.push_back(fmt::format("dropout ({})", fmt::join(drops, ", ")));
  }
}

/// GPT-2's parameters.
void add_gpt2(const ModelConfig& c, NamedSpecs& n) {
  // Conv1D weights are stored [in, out].
  n.add("wte.weight", {c.vocab, c.hidden});
  n.add("wpe.weight", {c.positions, c.hidden});
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("h.{}.", l);
    n.add(p + "ln_1.weight", {c.hidden});
    n.add(p + "ln_1.bias", {c.hidden});
    const std::int64_t qkv = mul(3, c.hidden, "c_attn width 3 x n_embd");
    n.add(p + "attn.c_attn.weight", {c.hidden, qkv});
    n.add(p + "attn.c_attn.bias", {qkv});
    n.add(p + "attn.c_proj.weight", {c.hidden, c.hidden});
    n.add(p + "attn.c_proj.bias", {c.hidden});
    n.add(p + "ln_2.weight", {c.hidden});
    n.add(p + "ln_2.bias", {c.hidden});
    n.add(p + "mlp.c_fc.weight", {c.hidden, c.intermediate});
    n.add(p + "mlp.c_fc.bias", {c.intermediate});
    n.add(p + "mlp.c_proj.weight", {c.intermediate, c.hidden});
    n.add(p + "mlp.c_proj.bias", {c.hidden});
  }
  n.add("ln_f.weight", {c.hidden});
  n.add("ln_f.bias", {c.hidden});
  if (!c.tie_embeddings) n.add("lm_head.weight", {c.vocab, c.hidden});
}

Array learned_position_embed(const ModelStep& m, const Tree<Array>& rest, const Array& tokens) {
  const Layout& L = m.layout;
  const Array pos = iota_like(tokens, 1);
  const Array h = take(at(rest, "wte/weight"), tokens, 0) + take(at(rest, "wpe/weight"), pos, 0);
  return constrain(h, {{0, &L.batch}}, L);
}

// GPT-2's block: layer norms before attention and MLP, one fused q/k/v projection (Conv1D),
// learned positions (no window).
Array layer_norm_layer(const ModelStep& m, const Tree<Array>& p, const Array& h, std::int64_t) {
  const Layout& L = m.layout;
  if (!L.context.empty()) {
    throw SpecError(fmt::format("[train] context parallelism (ring attention) is written for the "
                                "rotary attention of {}, not {}'s",
                                titles_with(&FamilySupport::ring_attention), m.config.family->title));
  }
  const ModelConfig& c = m.config;
  const std::int64_t b = h.shape()[0], t = h.shape()[1], d = c.hidden, dh = c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  const Array x = normed(layer_norm(h, at(p, "ln_1/weight"), at(p, "ln_1/bias")), "attention_in", L);
  const Array qkv = checkpoint_name(
      conv1d(x, at(p, "attn/c_attn/weight")) + at(p, "attn/c_attn/bias"), "qkv_proj");
  const auto part = [&](std::int64_t k) {  // q, k or v as [b, t, heads, dh]
    const Array y = slice(qkv, {0, 0, k * d}, {b, t, (k + 1) * d});
    return reshape(y, Shape{b, t, c.heads, dh});
  };
  Array merged;
  if (m.fused_attention) {
    const auto place = [&](const Array& y) {
      return constrain(y, {{0, &L.batch}, {2, &L.model}}, L);
    };
    merged = reshape(place(dot_product_attention(place(part(0)), place(part(1)), place(part(2)),
                                                 AttentionOptions{.is_causal = true})),
                     Shape{b, t, d});
  } else {
    const auto heads_first = [&](const Array& y) {  // [b, heads, t, dh]
      return constrain(transpose(y, {0, 2, 1, 3}), {{0, &L.batch}, {1, &L.model}}, L);
    };
    const Array q = heads_first(part(0)), k = heads_first(part(1)), v = heads_first(part(2));
    const Array scores = dot_general(q, k, DotDims{{0, 1}, {0, 1}, {3}, {3}}) * scale;
    const Array probs = softmax(causal_mask(scores), -1);
    const Array out = dot_general(probs, v, DotDims{{0, 1}, {0, 1}, {3}, {2}});
    merged = reshape(transpose(out, {0, 2, 1, 3}), Shape{b, t, d});
  }
  const Array a = region(
      checkpoint_name(conv1d(checkpoint_name(merged, "context"), at(p, "attn/c_proj/weight")),
                      "out_proj"),
      "attention_out", L);
  const Array h2 = region(h + a + at(p, "attn/c_proj/bias"), "residual", L);
  const Array x2 = normed(layer_norm(h2, at(p, "ln_2/weight"), at(p, "ln_2/bias")), "mlp_in", L);
  const Array inner = constrain(
      gelu(checkpoint_name(conv1d(x2, at(p, "mlp/c_fc/weight")) + at(p, "mlp/c_fc/bias"),
                           "mlpwi"),
           /*approximate=*/true),
      {{0, &L.batch}, {2, &L.model}}, L);
  const Array out = region(checkpoint_name(conv1d(inner, at(p, "mlp/c_proj/weight")), "mlpwo"),
                         "mlp_out", L);
  return region(h2 + out + at(p, "mlp/c_proj/bias"), "residual", L, true);
}

Array final_layer_norm(const ModelStep&, const Tree<Array>& rest, const Array& h) {
  return layer_norm(h, at(rest, "ln_f/weight"), at(rest, "ln_f/bias"));
}

constexpr std::array<std::string_view, 1> kTypes{"gpt2"};

}  // namespace

namespace families_defs {

extern const FamilyDef gpt2;
constexpr FamilyDef gpt2{.name = "gpt2",
                         .title = "GPT-2",
                         .types = kTypes,
                         .layers_path = "h",
                         .default_preset = "gpt2",
                         .support = {.ring_attention = false, .float8 = false},
                         .read = read_gpt2,
                         .add_parameters = add_gpt2,
                         .step = {.embed = learned_position_embed,
                                  .layer = layer_norm_layer,
                                  .final_norm = final_layer_norm,
                                  .embedding = "wte/weight"}};

}  // namespace families_defs
}  // namespace shardplan::train
