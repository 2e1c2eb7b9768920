#pragma once
// The small LLaMA-style decoder of examples/llama_char.cpp (also benchmarked by
// bench/train_bench.cpp): Hugging Face names and layouts, RMS norm, rotary positions, causal
// attention, SwiGLU MLP.
#include <cmath>

#include <optional>
#include <string>

#include "mlp.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/remat.hpp"
#include "shardplan/sjit.hpp"

namespace llama {

using namespace shardplan;

struct Config {
  std::int64_t vocab = 0, dim = 64, heads = 4, ffn = 128, layers = 2, seq = 32, batch = 16;
  /// The LM head and the loss as linear_cross_entropy (the logits never whole); false: the
  /// logits whole, then cross_entropy.
  bool fused_loss = true;
  /// Attention as dot_product_attention (no [T, T] scores); false: scores, mask and softmax.
  bool fused_attention = true;
  /// Each layer a checkpoint with this policy (recomputed in the backward pass); none: kept.
  std::optional<RematPolicy> remat = std::nullopt;
};

// y = x @ w^T for a Hugging Face Linear weight w [out, in].
inline Array linear(const Array& x, const Array& w) {
  return dot_general(x, w, DotDims{{}, {}, {x.shape().rank() - 1}, {1}});
}

// Rotary position embedding (the rotate-half form of LLaMA) on [B, H, T, Dh], or with t_axis 1
// on [B, T, H, Dh].
inline Array rotary(const Array& x, int t_axis = 2) {
  const std::int64_t t = x.shape()[t_axis], dh = x.shape()[3], half = dh / 2;
  const Shape table{t, half};
  const Array pos = astype(iota_like(full(table, DType::kF32, 0, x), 0, DType::kF32), DType::kF32);
  const Array i = astype(iota_like(full(table, DType::kF32, 0, x), 1, DType::kF32), DType::kF32);
  const Array freq = exp(i * (-2.0 * std::log(10000.0) / static_cast<double>(dh)));
  const Array angle = pos * freq;
  const Shape full_shape = x.shape();
  std::vector<std::int64_t> hs = full_shape.dims();
  hs[3] = half;
  const Array c = broadcast_in_dim(cos(angle), Shape(hs), {t_axis, 3});
  const Array s = broadcast_in_dim(sin(angle), Shape(hs), {t_axis, 3});
  std::vector<std::int64_t> lo(4, 0), mid = full_shape.dims(), hi = full_shape.dims();
  mid[3] = half;
  std::vector<std::int64_t> mid_start(4, 0);
  mid_start[3] = half;
  const Array x1 = slice(x, lo, mid);
  const Array x2 = slice(x, mid_start, hi);
  return concatenate({x1 * c - x2 * s, x2 * c + x1 * s}, 3);
}

inline Array attention(const Tree<Array>& p, const Array& x, const Config& cfg) {
  const std::int64_t b = x.shape()[0], t = x.shape()[1], dh = cfg.dim / cfg.heads;
  const auto proj = [&](const char* name) {  // [B, T, H, Dh]
    return reshape(linear(x, p.at_path(std::string(name) + "/weight").leaf()),
                   Shape{b, t, cfg.heads, dh});
  };
  Array merged;
  if (cfg.fused_attention) {
    // Named (the preset's `heads_bthd`: split over tp), as the norm and residual regions are.
    const auto split = [](const Array& y) { return with_sharding_annotation(y, "heads_bthd"); };
    const Array q = split(rotary(proj("q_proj"), 1));
    const Array k = split(rotary(proj("k_proj"), 1));
    const Array v = split(proj("v_proj"));
    // The output named too: its cotangent then stays split over the heads in the backward pass.
    merged = reshape(split(dot_product_attention(q, k, v, AttentionOptions{.is_causal = true})),
                     Shape{b, t, cfg.dim});
  } else {
    const auto heads = [&](const Array& y) { return transpose(y, {0, 2, 1, 3}); };  // [B,H,T,Dh]
    const auto split = [](const Array& y) { return with_sharding_annotation(y, "heads"); };
    const Array q = split(rotary(heads(proj("q_proj"))));
    const Array k = split(rotary(heads(proj("k_proj"))));
    const Array v = split(heads(proj("v_proj")));
    const Array scores = dot_general(q, k, DotDims{{0, 1}, {0, 1}, {3}, {3}}) *
                         (1.0 / std::sqrt(static_cast<double>(dh)));
    const Array probs = softmax(causal_mask(scores), -1);
    const Array out = dot_general(probs, v, DotDims{{0, 1}, {0, 1}, {3}, {2}});  // [B, H, T, Dh]
    merged = reshape(transpose(out, {0, 2, 1, 3}), Shape{b, t, cfg.dim});
  }
  return linear(merged, p.at_path("o_proj/weight").leaf());
}

inline Array mlp(const Tree<Array>& p, const Array& x) {
  const Array gate = linear(x, p.at_path("gate_proj/weight").leaf());
  const Array up = linear(x, p.at_path("up_proj/weight").leaf());
  const Array inner = with_sharding_annotation(silu(gate) * up, "mlp_hidden");
  return linear(inner, p.at_path("down_proj/weight").leaf());
}

// The norm and residual regions [B, T, D] by name, as the preset's `activations:` name them:
// run under sjit with the preset's activation_shardings they are split along the sequence over
// tp (Megatron's sequence parallelism, docs/training.md); with allow_unknown_annotations and no
// shardings they are left to propagation.
inline Array named(const Array& x, const char* name) { return with_sharding_annotation(x, name); }
// A norm's output, then as the projections named by `reader` read it (the sequence gathered).
inline Array normed(const Array& x, const char* reader) { return named(named(x, "norm"), reader); }

inline Array decoder_layer(const Tree<Array>& layer, const Array& x, const Config& cfg) {
  const Array h0 = named(x, "residual");
  const Array a =
      normed(rms_norm(h0, layer.at_path("input_layernorm/weight").leaf()), "attention_in");
  const Array h =
      named(h0 + named(attention(layer.at("self_attn"), a, cfg), "attention_out"), "residual");
  const Array m =
      normed(rms_norm(h, layer.at_path("post_attention_layernorm/weight").leaf()), "mlp_in");
  return h + named(mlp(layer.at("mlp"), m), "mlp_out");
}

// The final norm's output [B, T, D]: what the LM head reads.
inline Array hidden(const Tree<Array>& params, const Array& tokens, const Config& cfg) {
  const Tree<Array>& m = params.at("model");
  Array h = take(m.at_path("embed_tokens/weight").leaf(), tokens, 0);  // [B, T, D]
  for (const auto& layer : m.at("layers").children()) {
    const auto run = [&](const Array& x) { return decoder_layer(layer, x, cfg); };
    h = cfg.remat ? checkpoint(run, *cfg.remat)(h) : run(h);
  }
  return normed(rms_norm(named(h, "residual"), m.at_path("norm/weight").leaf()), "head_in");
}

// Next-token logits [B, T, vocab].
inline Array forward(const Tree<Array>& params, const Array& tokens, const Config& cfg) {
  return linear(hidden(params, tokens, cfg), params.at_path("lm_head/weight").leaf());
}

inline Array loss_fn(const Tree<Array>& params, const Array& tokens, const Array& targets,
                     const Config& cfg) {
  if (cfg.fused_loss) {
    return mean(linear_cross_entropy(hidden(params, tokens, cfg),
                                     params.at_path("lm_head/weight").leaf(), targets));
  }
  return mean(cross_entropy(forward(params, tokens, cfg), targets));
}

// The loss, and as auxiliary output the fraction of next characters predicted right (from the
// logits made whole for it alone: nothing of them is kept for the backward pass).
inline std::pair<Array, Tree<Array>> loss_and_accuracy(const Tree<Array>& params,
                                                       const Array& tokens, const Array& targets,
                                                       const Config& cfg) {
  const Array h = hidden(params, tokens, cfg);
  const Array head = params.at_path("lm_head/weight").leaf();
  const Array logits = linear(h, head);
  const Array loss = cfg.fused_loss ? mean(linear_cross_entropy(h, head, targets))
                                    : mean(cross_entropy(logits, targets));
  return {loss, Tree<Array>::dict({{"accuracy", mlp::accuracy(logits, targets)}})};
}

// Parameters, each made on its devices by a random fill inside sjit (sharded initialisation).
inline Tree<Array> init(const Config& cfg, std::uint64_t seed) {
  std::uint64_t s = seed;
  const auto w = [&](std::int64_t out, std::int64_t in) {
    return Tree<Array>(random_normal(Shape{out, in}, DType::kF32, s++, 0,
                                     1.0 / std::sqrt(static_cast<double>(in))));
  };
  const auto ones = [&](std::int64_t n) {
    return Tree<Array>(random_uniform(Shape{n}, DType::kF32, s++, 1, 1));
  };
  std::vector<Tree<Array>> layers;
  for (int l = 0; l < cfg.layers; ++l) {
    layers.push_back(Tree<Array>::dict({
        {"input_layernorm", Tree<Array>::dict({{"weight", ones(cfg.dim)}})},
        {"post_attention_layernorm", Tree<Array>::dict({{"weight", ones(cfg.dim)}})},
        {"self_attn",
         Tree<Array>::dict({{"q_proj", Tree<Array>::dict({{"weight", w(cfg.dim, cfg.dim)}})},
                            {"k_proj", Tree<Array>::dict({{"weight", w(cfg.dim, cfg.dim)}})},
                            {"v_proj", Tree<Array>::dict({{"weight", w(cfg.dim, cfg.dim)}})},
                            {"o_proj", Tree<Array>::dict({{"weight", w(cfg.dim, cfg.dim)}})}})},
        {"mlp",
         Tree<Array>::dict({{"gate_proj", Tree<Array>::dict({{"weight", w(cfg.ffn, cfg.dim)}})},
                            {"up_proj", Tree<Array>::dict({{"weight", w(cfg.ffn, cfg.dim)}})},
                            {"down_proj", Tree<Array>::dict({{"weight", w(cfg.dim, cfg.ffn)}})}})},
    }));
  }
  return Tree<Array>::dict({
      {"model",
       Tree<Array>::dict({{"embed_tokens", Tree<Array>::dict({{"weight", w(cfg.vocab, cfg.dim)}})},
                          {"layers", Tree<Array>::list(layers)},
                          {"norm", Tree<Array>::dict({{"weight", ones(cfg.dim)}})}})},
      {"lm_head", Tree<Array>::dict({{"weight", w(cfg.vocab, cfg.dim)}})},
  });
}

}  // namespace llama
