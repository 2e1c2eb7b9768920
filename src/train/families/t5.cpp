// The T5 family (model_type t5: T5, T5 v1.1, Flan-T5): an encoder and a decoder, relative
// position biases, ReLU or gated-GELU feed-forward.
#include <fmt/format.h>

#include <array>

#include "../model_family.hpp"
#include "../model_step.hpp"
#include "config_parts.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::train {

Array relative_bias(const Array& weight, std::int64_t q, std::int64_t k, bool bidirectional,
                    std::int64_t max_distance) {
  const Shape table{q, k};
  const Array zeros = full(table, DType::kI32, 0, weight);
  const Array rel = iota_like(zeros, 1) - iota_like(zeros, 0);  // key - query
  std::int64_t buckets = weight.shape()[0];
  Array base = zeros, n;
  if (bidirectional) {
    buckets /= 2;
    base = where(greater(rel, zeros), full_like(zeros, static_cast<double>(buckets)), zeros);
    n = abs(rel);
  } else {
    n = neg(minimum(rel, zeros));
  }
  const std::int64_t exact = buckets / 2;
  const double e = static_cast<double>(exact);
  const Array far = astype(log(astype(maximum(n, full_like(n, e)), DType::kF32) / e) /
                               std::log(static_cast<double>(max_distance) / e) *
                               static_cast<double>(buckets - exact),
                           DType::kI32) +
                    e;
  const Array bucket = base + where(less(n, full_like(n, e)), n,
                                    minimum(far, full_like(far, static_cast<double>(buckets - 1))));
  return transpose(take(weight, bucket, 0), {2, 0, 1});  // [q, k, heads] -> [heads, q, k]
}

namespace {

/// T5's fields, checked.
void read_t5(Fields& f, ModelConfig& c) {
  const std::string_view source = f.source();
  c.vocab = f.positive("vocab_size");
  c.hidden = f.positive("d_model");
  c.head_dim = f.positive("d_kv");
  c.intermediate = f.positive("d_ff");
  c.layers = f.positive("num_layers");
  c.decoder_layers = f.positive("num_decoder_layers", c.layers);
  c.heads = f.positive("num_heads");
  c.kv_heads = c.heads;
  c.relative_buckets = f.positive("relative_attention_num_buckets", 32);
  c.relative_max_distance = f.positive("relative_attention_max_distance", 128);
  c.tie_embeddings = f.flag("tie_word_embeddings", true);
  // transformers reads "ACT" or "gated-ACT"; the step has ReLU and gated GELU.
  const std::string proj = f.string("feed_forward_proj").value_or("relu");
  const auto dash = proj.find('-');
  const std::string act = dash == std::string::npos ? proj : proj.substr(dash + 1);
  if ((dash != std::string::npos && proj.substr(0, dash) != "gated") || act.empty() ||
      act.find('-') != std::string::npos) {
    throw IoError(
        fmt::format("[config] {}: the field 'feed_forward_proj' is '{}', expected \"ACT\" or "
                    "\"gated-ACT\" (\"relu\", \"gated-gelu\")",
                    source, detail::printable(proj)));
  }
  c.gated_mlp = dash != std::string::npos;
  if (act != (c.gated_mlp ? "gelu" : "relu")) {
    c.not_modelled.push_back(
        fmt::format("feed_forward_proj '{}' (shapes as given; the step's activation is {})",
                    detail::printable(proj), c.gated_mlp ? "gelu" : "relu"));
  }
  if (const double r = f.rate("dropout_rate"); r > 0) {
    c.not_modelled.push_back(fmt::format("dropout (dropout_rate {})", r));
  }
  check_tensor_count(c, source);
  if (c.relative_buckets < 4) {
    throw IoError(fmt::format("[config] {}: relative_attention_num_buckets {} is below 4", source,
                              c.relative_buckets));
  }
}

/// T5's parameters.
void add_t5(const ModelConfig& c, NamedSpecs& n) {
  // Linear weights [out, in]; attention's inner width is heads x d_kv. The relative position
  // bias sits in the first block of each stack and serves every block.
  const std::int64_t inner = mul(c.heads, c.head_dim, "attention width num_heads x d_kv");
  n.add("shared.weight", {c.vocab, c.hidden});
  const auto attention = [&](const std::string& p, bool bias) {
    n.add(p + "q.weight", {inner, c.hidden});
    n.add(p + "k.weight", {inner, c.hidden});
    n.add(p + "v.weight", {inner, c.hidden});
    n.add(p + "o.weight", {c.hidden, inner});
    if (bias) n.add(p + "relative_attention_bias.weight", {c.relative_buckets, c.heads});
  };
  const auto feed_forward = [&](const std::string& p) {
    if (c.gated_mlp) {
      n.add(p + "DenseReluDense.wi_0.weight", {c.intermediate, c.hidden});
      n.add(p + "DenseReluDense.wi_1.weight", {c.intermediate, c.hidden});
    } else {
      n.add(p + "DenseReluDense.wi.weight", {c.intermediate, c.hidden});
    }
    n.add(p + "DenseReluDense.wo.weight", {c.hidden, c.intermediate});
    n.add(p + "layer_norm.weight", {c.hidden});
  };
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("encoder.block.{}.layer.", l);
    attention(p + "0.SelfAttention.", l == 0);
    n.add(p + "0.layer_norm.weight", {c.hidden});
    feed_forward(p + "1.");
  }
  n.add("encoder.final_layer_norm.weight", {c.hidden});
  for (std::int64_t l = 0; l < c.decoder_layers; ++l) {
    const std::string p = fmt::format("decoder.block.{}.layer.", l);
    attention(p + "0.SelfAttention.", l == 0);
    n.add(p + "0.layer_norm.weight", {c.hidden});
    attention(p + "1.EncDecAttention.", false);
    n.add(p + "1.layer_norm.weight", {c.hidden});
    feed_forward(p + "2.");
  }
  n.add("decoder.final_layer_norm.weight", {c.hidden});
  if (!c.tie_embeddings) n.add("lm_head.weight", {c.vocab, c.hidden});
}

// T5's step whole: tokens [b, s_enc + s_dec] (the encoder's input, then the decoder's), targets
// [b, s_dec]; the mean cross-entropy of the decoder's predictions.
Array encoder_decoder_loss(const ModelStep& m, const Tree<Array>& params, const Array& tokens,
                           const Array& targets) {
  const Layout& L = m.layout;
  const ModelConfig& c = m.config;
  const std::int64_t b = tokens.shape()[0], s_dec = targets.shape()[1];
  const std::int64_t s_enc = tokens.shape()[1] - s_dec, dk = c.head_dim, heads = c.heads;
  const Array& shared = at(params, "shared/weight");
  const auto heads_of = [&](const Array& y, std::int64_t t) {  // [b, t, h dk] -> [b, h, t, dk]
    return constrain(transpose(reshape(y, Shape{b, t, heads, dk}), {0, 2, 1, 3}),
                     {{0, &L.batch}, {1, &L.model}}, L);
  };
  const auto attention = [&](const Tree<Array>& p, const Array& x, const Array& kv,
                             const Array* bias, bool causal) {
    const std::int64_t tq = x.shape()[1], tk = kv.shape()[1];
    const Array q = heads_of(linear(x, at(p, "q/weight")), tq);
    const Array k = heads_of(linear(kv, at(p, "k/weight")), tk);
    const Array v = heads_of(linear(kv, at(p, "v/weight")), tk);
    Array scores = dot_general(q, k, DotDims{{0, 1}, {0, 1}, {3}, {3}});  // T5 does not scale
    if (bias != nullptr) scores = scores + broadcast_in_dim(*bias, scores.shape(), {1, 2, 3});
    if (causal) scores = causal_mask(scores);
    const Array out = dot_general(softmax(scores, -1), v, DotDims{{0, 1}, {0, 1}, {3}, {2}});
    return linear(reshape(transpose(out, {0, 2, 1, 3}), Shape{b, tq, heads * dk}),
                  at(p, "o/weight"));
  };
  const auto feed_forward = [&](const Tree<Array>& p, const Array& x) {
    const Tree<Array>& d = p.at("DenseReluDense");
    const Array inner =
        c.gated_mlp ? gelu(linear(x, at(d, "wi_0/weight"))) * linear(x, at(d, "wi_1/weight"))
                    : relu(linear(x, at(d, "wi/weight")));
    return linear(constrain(inner, {{0, &L.batch}, {2, &L.model}}, L), at(d, "wo/weight"));
  };
  const auto hidden = [&](const Array& h) { return constrain(h, {{0, &L.batch}}, L); };

  const Array enc_tokens = slice(tokens, {0, 0}, {b, s_enc});
  const Array dec_tokens = slice(tokens, {0, s_enc}, {b, s_enc + s_dec});
  const auto& enc_blocks = params.at_path("encoder/block").children();
  const auto& dec_blocks = params.at_path("decoder/block").children();
  const Array enc_bias =
      relative_bias(at(enc_blocks[0], "layer/0/SelfAttention/relative_attention_bias/weight"),
                    s_enc, s_enc, true, c.relative_max_distance);
  Array h = hidden(take(shared, enc_tokens, 0));
  for (const Tree<Array>& blk : enc_blocks) {
    const Tree<Array>& ly = blk.at("layer");
    const Array x = rms_norm(h, at(ly.at(0), "layer_norm/weight"));
    h = hidden(h + attention(ly.at(0).at("SelfAttention"), x, x, &enc_bias, false));
    h = hidden(h + feed_forward(ly.at(1), rms_norm(h, at(ly.at(1), "layer_norm/weight"))));
  }
  const Array enc_out = rms_norm(h, at(params, "encoder/final_layer_norm/weight"));
  const Array dec_bias =
      relative_bias(at(dec_blocks[0], "layer/0/SelfAttention/relative_attention_bias/weight"),
                    s_dec, s_dec, false, c.relative_max_distance);
  h = hidden(take(shared, dec_tokens, 0));
  for (const Tree<Array>& blk : dec_blocks) {
    const Tree<Array>& ly = blk.at("layer");
    const Array x = rms_norm(h, at(ly.at(0), "layer_norm/weight"));
    h = hidden(h + attention(ly.at(0).at("SelfAttention"), x, x, &dec_bias, true));
    const Array y = rms_norm(h, at(ly.at(1), "layer_norm/weight"));
    h = hidden(h + attention(ly.at(1).at("EncDecAttention"), y, enc_out, nullptr, false));
    h = hidden(h + feed_forward(ly.at(2), rms_norm(h, at(ly.at(2), "layer_norm/weight"))));
  }
  Array out = rms_norm(h, at(params, "decoder/final_layer_norm/weight"));
  if (c.tie_embeddings) out = out * (1.0 / std::sqrt(static_cast<double>(c.hidden)));
  const Array logits = linear(out, c.tie_embeddings ? shared : at(params, "lm_head/weight"));
  return mean(cross_entropy(logits, targets));
}

constexpr std::array<std::string_view, 1> kTypes{"t5"};

}  // namespace

namespace families_defs {

extern const FamilyDef t5;
constexpr FamilyDef t5{.name = "t5",
                       .title = "T5",
                       .types = kTypes,
                       .layers_path = "decoder/block",
                       .default_preset = "t5",
                       .encoder_decoder = true,
                       .support = {.decoder_only = false,
                                   .ring_attention = false,
                                   .fused_attention = false,
                                   .fused_loss = false,
                                   .annotated_regions = false,
                                   .float8 = false,
                                   .remat = false,
                                   .fsdp_root = false},
                       .read = read_t5,
                       .add_parameters = add_t5,
                       .step = {.whole = encoder_decoder_loss}};

}  // namespace families_defs
}  // namespace shardplan::train
