// The families' forward passes (Hugging Face layouts) and their differentiation, whole or layer
// by layer. Everything here is written with the public ops, so it traces into the program that
// sjit lowers; nothing here runs on data.
#include "model_step.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "../program/ir/primitives.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/remat.hpp"
#include "shardplan/shard_map.hpp"
#include "model_family.hpp"

namespace shardplan::train {

const Array& at(const Tree<Array>& t, std::string_view path) { return t.at_path(path).leaf(); }

bool pins_some_layer(const std::vector<std::map<std::string, PartitionSpec>>& per_layer) {
  return std::any_of(per_layer.begin(), per_layer.end(), [](const auto& m) { return !m.empty(); });
}

Array linear(const Array& x, const Array& w) {
  return dot_general(x, w, DotDims{{}, {}, {x.shape().rank() - 1}, {1}});
}

Array conv1d(const Array& x, const Array& w) {
  return dot_general(x, w, DotDims{{}, {}, {x.shape().rank() - 1}, {0}});
}

namespace {

// Rotary position embedding (LLaMA's rotate-half form) over the positions of dimension `t_axis`
// and the last dimension (the head's width): [..., t, dh] by default, [b, t, heads, dh] with
// t_axis 1. `shared`: tables made once for the step, or null to make them here.
// `ways` > 1: the positions in the load-balanced order over that many devices (context
// parallelism: row p of x is the token at load_balanced_positions(t, ways)[p]).
Array rotary(const Array& x, SharedTables* shared, int t_axis = -2, std::int64_t ways = 1) {
  const int r = x.shape().rank();
  if (t_axis < 0) t_axis += r;
  const std::int64_t t = x.shape()[t_axis], dh = x.shape()[r - 1], half = dh / 2;
  const auto make = [&] {
    const Shape table{t, half};
    Array pos = iota_like(full(table, DType::kF32, 0, x), 0, DType::kF32);
    if (ways > 1) {
      const std::vector<std::int64_t> order = load_balanced_positions(t, ways);
      Tensor p(Shape{t}, DType::kF32);
      for (std::int64_t i = 0; i < t; ++i) p.set(i, static_cast<double>(order[static_cast<std::size_t>(i)]));
      pos = broadcast_in_dim(constant(p, x), table, {0});
    }
    const Array i = iota_like(full(table, DType::kF32, 0, x), 1, DType::kF32);
    const Array angle = pos * exp(i * (-2.0 * std::log(10000.0) / static_cast<double>(dh)));
    return std::pair{astype(cos(angle), x.dtype()), astype(sin(angle), x.dtype())};
  };
  std::pair<Array, Array> tables;
  if (shared == nullptr) {
    tables = make();
  } else {
    const auto key = std::tuple{t, half, x.dtype(), ways};
    auto it = shared->rotary.find(key);
    if (it == shared->rotary.end()) it = shared->rotary.emplace(key, make()).first;
    tables = it->second;
  }
  std::vector<std::int64_t> half_dims = x.shape().dims();
  half_dims[static_cast<std::size_t>(r - 1)] = half;
  const Array c = broadcast_in_dim(tables.first, Shape(half_dims), {t_axis, r - 1});
  const Array s = broadcast_in_dim(tables.second, Shape(half_dims), {t_axis, r - 1});
  std::vector<std::int64_t> zero(static_cast<std::size_t>(r), 0), mid_start = zero;
  mid_start[static_cast<std::size_t>(r - 1)] = half;
  const Array x1 = slice(x, zero, half_dims);
  const Array x2 = slice(x, mid_start, x.shape().dims());
  return concatenate({x1 * c - x2 * s, x2 * c + x1 * s}, r - 1);
}

}  // namespace

Array constrain(const Array& x, const std::vector<std::pair<int, const AxisNames*>>& dims,
                const Layout& layout) {
  std::vector<AxisNames> spec(static_cast<std::size_t>(x.shape().rank()));
  for (const auto& [dim, axes] : dims) {
    if (axes->empty()) continue;
    const std::int64_t ways = axes == &layout.batch     ? layout.batch_ways
                              : axes == &layout.context ? layout.context_ways
                                                        : layout.model_ways;
    if (x.shape()[dim] % ways != 0) continue;
    spec[static_cast<std::size_t>(dim)] = *axes;
  }
  return with_sharding_constraint(x, PartitionSpec(spec));
}

Array region(const Array& x, const char* name, const Layout& layout, bool batch) {
  if (layout.annotate) return with_sharding_annotation(x, name);
  return batch ? constrain(x, {{0, &layout.batch}, {1, &layout.context}}, layout) : x;
}

namespace {

// x cast to `wide` as PyTorch's `.float()` runs eagerly: in the backward pass the cotangent in
// `wide` is written whole (by the kernel before, log_softmax's backward) and then cast back by a
// kernel of its own (ToCopyBackward), read through an optimization barrier so that fusion does
// not fold the cast into the kernel before it. The naive loss runs outside the compiled blocks
// (torchtitan compiles each block, not the loss), so its arrays are eager PyTorch's.
Array eager_cast(const Array& x, DType wide) {
  const DType narrow = x.dtype();
  if (narrow == wide) return x;
  const auto fwd = [wide](const std::vector<Array>& in) {
    return CustomVjpForward{{astype(in[0], wide)}, {}};
  };
  const auto bwd = [narrow](const std::vector<Array>&, const std::vector<Array>& cts) {
    return std::vector<Array>{astype(optimization_barrier(cts[0]), narrow)};
  };
  return custom_vjp(fwd, bwd, {x}).at(0);
}

// nll_loss per token: minus the log-probabilities lp [..., vocab] at the targets [...], read by
// take_along_axis (from a vocabulary split over devices, each reads its own slice). The targets
// pass the losses' label rule first (check_labels: a view, no bytes or FLOPs in the plan); an
// ignored target (kIgnoreIndex) is outside the vocabulary and reads 0, with no gradient, as
// nll_loss's ignore_index.
Array nll_at_targets(const Array& lp, const Array& targets) {
  std::vector<std::int64_t> column = targets.shape().dims();
  column.push_back(1);
  const int last = lp.shape().rank() - 1;
  const Array checked = check_labels(targets, lp.shape()[last], kIgnoreIndex, "cross_entropy");
  return -reshape(take_along_axis(lp, reshape(checked, Shape(column)), last, OutOfBounds::kZero),
                  targets.shape());
}

// Cross-entropy as eager PyTorch runs F.cross_entropy on whole rows: log_softmax as one kernel
// writing its result (the one array kept for the backward pass), nll_loss reading each row at its
// target (take_along_axis). Its backward pass writes the cotangent at the targets (nll_loss's:
// one array), then log_softmax's (another). cross_entropy's ops would write x - max, exp, a
// one-hot array (kept) and its product with the log-probabilities in the forward pass: the same
// live peak, but arrays that change where the caching allocator places the backward pass's.
Array eager_cross_entropy(const Array& logits, const Array& targets) {
  return nll_at_targets(fused_log_softmax(logits, -1), targets);
}

// Cross-entropy on logits whose vocabulary is split over the tensor-parallel axes, as PyTorch's
// DTensor runs it under loss_parallel (torchtitan's loss with tensor parallelism): the forward
// pass as cross_entropy, keeping the log-probabilities x (nll_loss a masked gather from each
// rank's slice: take_along_axis, no array of the logits' size); the backward pass of nll_loss and
// log_softmax fused, eagerly (torch/distributed/tensor/parallel/loss.py): grad_input, zeros with
// -1 at the target, then exp(x), their sum, and the sum times the cotangent, each written
// whole, with x (saved by both autograd nodes) and grad_input held until the product is made:
// four arrays of the logits' size at once, where the unsplit loss holds three. Each written
// array is read through an optimization barrier, so that fusion does not fold it into its
// reader (the loss runs outside the compiled blocks).
Array loss_parallel_cross_entropy(const Array& logits, const Array& targets) {
  const auto fwd = [](const std::vector<Array>& in) {
    const Array lp = log_softmax(in[0], -1);
    // nll_loss as DTensor's _nll_loss_forward: each rank reads its own slice of the vocabulary at
    // the targets (a masked gather, then a sum over the ranks of [tokens] values).
    return CustomVjpForward{{nll_at_targets(lp, in[1])}, {lp, in[1]}};
  };
  const auto bwd = [](const std::vector<Array>& res, const std::vector<Array>& cts) {
    const Array& x = res[0];
    const int r = x.shape().rank();
    std::vector<int> rows(static_cast<std::size_t>(r - 1));
    for (int d = 0; d < r - 1; ++d) rows[static_cast<std::size_t>(d)] = d;
    const Array target = one_hot(res[1], x.shape()[r - 1], DType::kBool);
    const Array grad_input =
        optimization_barrier(where(target, full_like(x, -1), full_like(x, 0)));
    const Array e = optimization_barrier(exp(x));
    const Array summed = optimization_barrier(grad_input + e);
    // An ignored target's row gets no gradient (nll_loss's ignore_index): its cotangent is 0.
    const Array& labels = res[1];
    const Array kept = not_equal(
        labels, full(labels.shape(), DType::kI32, static_cast<double>(kIgnoreIndex), labels));
    const Array g = where(kept, cts[0], full_like(cts[0], 0));
    const Array product = summed * broadcast_in_dim(g, x.shape(), rows);
    return std::vector<Array>{keep_alive(product, {x, grad_input}), Array()};
  };
  return custom_vjp(fwd, bwd, {logits, targets}).at(0);
}

// FSDP2's root module (torchtitan's until mid-2025 holds the embedding, the final norm and the
// head): unsharded at its pre-forward and resharded at its post-backward
// (torch/distributed/fsdp: the root's post_forward_mesh_info is None), so its parameters are
// gathered over the data axes (`in_use`: what stays split is tensor parallelism's) at the
// forward pass's start and stay so until the backward pass's end, where
// their gradients are reduced. One custom VJP over all of them: its backward pass runs when the
// last of their cotangents is made (the embedding's, the backward pass's last) and reads each
// gathered copy there (keep_alive), each cotangent held until then as FSDP2 holds the root's
// unsharded gradients.
Tree<Array> held_by_root(const Tree<Array>& rest,
                         const std::map<std::string, PartitionSpec>& in_use) {
  std::vector<Array> leaves;
  std::vector<PartitionSpec> specs;
  for (auto& [path, a] : rest.flatten()) {
    leaves.push_back(std::move(a));
    const auto it = in_use.find(path);
    specs.push_back(it == in_use.end() ? PartitionSpec() : it->second);
  }
  if (leaves.empty()) return rest;
  const auto fwd = [specs](const std::vector<Array>& in) {
    std::vector<Array> gathered;
    for (std::size_t i = 0; i < in.size(); ++i) {
      gathered.push_back(with_sharding_constraint(in[i], specs[i]));
    }
    return CustomVjpForward{gathered, gathered};
  };
  const auto bwd = [](const std::vector<Array>& res, const std::vector<Array>& cts) {
    std::vector<Array> out;
    for (std::size_t i = 0; i < cts.size(); ++i) out.push_back(keep_alive(cts[i], {res[i]}));
    return out;
  };
  return rest.unflatten(custom_vjp(fwd, bwd, leaves));
}

}  // namespace

Array normed(const Array& x, const char* reader, const Layout& layout) {
  return region(region(x, "norm", layout), reader, layout);
}


Array ModelStep::lookup(const Array& table, std::string_view path, const Array& tokens) const {
  const Layout& L = layout;
  const auto it = outside_in_use.find(std::string(path));
  const std::int64_t vocab = table.shape()[0], b = tokens.shape()[0], t = tokens.shape()[1];
  if (it == outside_in_use.end() || !L.context.empty() || !L.mesh || table.shape().rank() != 2 ||
      vocab % L.model_ways != 0 || it->second.dims() != std::vector<AxisNames>{L.model, {}}) {
    return take(table, tokens, 0);
  }
  const std::int64_t rows = vocab / L.model_ways;
  const AxisNames model = L.model;
  const AxisNames batch = b % L.batch_ways == 0 ? L.batch : AxisNames{};
  const bool scatter = L.sequence_parallel && t % L.model_ways == 0;
  const auto body = [model, rows, scatter](const Array& w, const Array& ids) {
    // This device's rows are [first, first + rows): the tokens outside read row 0, then 0.
    const Array local = ids - lax::axis_index(model) * static_cast<double>(rows);
    const Array zero = full_like(local, 0);
    const Array at_or_after = greater_equal(local, zero);
    const Array mine = where(at_or_after, less(local, full_like(local, static_cast<double>(rows))),
                             at_or_after);
    const Array e = take(w, where(mine, local, zero), 0);  // [b, t, d]
    const Shape column{ids.shape()[0], ids.shape()[1], 1};
    const Array part = where(reshape(mine, column), e, full_like(e, 0));
    return scatter ? lax::psum_scatter(part, model, 1, /*tiled=*/true) : lax::psum(part, model);
  };
  return shard_map(body, *L.mesh, {PartitionSpec(std::vector<AxisNames>{model, {}}),
                                   PartitionSpec(std::vector<AxisNames>{batch, {}})},
                   {PartitionSpec(std::vector<AxisNames>{batch, scatter ? model : AxisNames{},
                                                         {}})})(table, tokens);
}

Array ModelStep::embed(const Tree<Array>& rest, const Array& tokens) const {
  const Layout& L = layout;
  // The residual stream from its start: with sequence parallelism the embedding's output is
  // split along the sequence at once (torchtitan's tok_embeddings: output_layouts=Shard(1)), so
  // the first layer keeps 1/tp of it for the backward pass, not the whole.
  const char* path = "model/embed_tokens/weight";
  return region(lookup(at(rest, path), path, tokens), "residual", L, true);
}

Array soft_cap(const Array& x, double cap) {
  return cap > 0 ? tanh(x / cap) * cap : x;
}

namespace {

// The scores' scale: the config's (Gemma 2's query_pre_attn_scalar), else 1 / sqrt(head_dim).
double scores_scale(const ModelConfig& c) {
  return c.attention_scale > 0 ? c.attention_scale
                               : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
}

}  // namespace

Array attention_mask(const Array& scores, std::int64_t window) {
  const int r = scores.shape().rank();
  if (window <= 0 || window >= scores.shape()[r - 2]) return causal_mask(scores);
  // Query i sees keys i - window + 1 .. i (transformers' sliding window: kv > q - window).
  const Array i = iota_like(scores, r - 2);
  const Array j = iota_like(scores, r - 1);
  const Array masked = full_like(scores, -1e30);
  const Array near = less(i, j + static_cast<double>(window));
  return where(less_equal(j, i), where(near, scores, masked), masked);
}


// LLaMA's self-attention on the normed input x [b, t, d]: the heads' outputs merged [b, t,
// heads * dh], before o_proj. Fused (dot_product_attention: no [t, t] scores held) or decomposed
// (the scores, mask and softmax as ops), with the same projections, rotary positions and layout.
Array ModelStep::attention(const Tree<Array>& p, const Array& x, std::int64_t window) const {
  const Layout& L = layout;
  const ModelConfig& c = config;
  const std::int64_t b = x.shape()[0], t = x.shape()[1];
  const std::int64_t dh = c.head_dim, kv = c.kv_heads, g = c.heads / c.kv_heads;
  const double scale = scores_scale(c);
  const auto proj = [&](const char* name) {
    Array y = block_linear(x, at(p, fmt::format("self_attn/{}_proj/weight", name)));
    if (c.attention_bias) y = y + at(p, fmt::format("self_attn/{}_proj/bias", name));
    if (c.qk_norm && name[0] != 'v') {
      // Qwen3: each query and key head RMS-normed over its head_dim (one [head_dim] scale for
      // every head) before the rotary positions.
      const Shape flat = y.shape();
      const std::int64_t n = flat[2] / c.head_dim;
      y = reshape(rms_norm(reshape(y, Shape{flat[0], flat[1], n, c.head_dim}),
                           at(p, fmt::format("self_attn/{}_norm/weight", name))),
                  flat);
    }
    return checkpoint_name(y, fmt::format("{}", name[0] == 'q'   ? "query_proj"
                                                 : name[0] == 'k' ? "key_proj"
                                                                  : "value_proj"));
  };
  const std::int64_t heads = c.heads;
  // More model-parallel ranks than key/value heads: see repeat below.
  const bool repeat_kv = L.model_ways > 1 && kv % L.model_ways != 0 && heads % L.model_ways == 0;
  if (fused_attention) {
    return fused_rotary_attention(proj("q"), proj("k"), proj("v"), window, repeat_kv);
  }
  if (!L.context.empty()) {
    throw SpecError("[train] context parallelism runs ring attention on the fused kernel: plan it "
                    "with --attention fused");
  }
  Array merged;
  if (repeat_kv) {
    // More model-parallel ranks than key/value heads: the query heads are split over the ranks
    // and each key/value head is repeated for the ranks whose query heads share it (as
    // Megatron and vLLM replicate KV heads), so every rank does 1/ways of the attention.
    // Without it the head dimension would not split and the attention ran on every rank whole.
    const auto repeat = [&](const Array& y) {  // [b, kv, t, dh] -> [b, heads, t, dh]
      // Copies side by side, not a broadcast merged by a reshape: the partitioner splits a
      // merged dimension over an axis only as far as its major part (kv) divides.
      std::vector<Array> copies;
      copies.reserve(static_cast<std::size_t>(heads));
      for (std::int64_t i = 0; i < kv; ++i) {
        const Array one = slice(y, {0, i, 0, 0}, {b, i + 1, t, dh});
        for (std::int64_t j = 0; j < g; ++j) copies.push_back(one);
      }
      return concatenate(copies, 1);
    };
    const Array q = constrain(
        rotary(transpose(reshape(proj("q"), Shape{b, t, heads, dh}), {0, 2, 1, 3}), tables),
        {{0, &L.batch}, {1, &L.model}}, L);
    const Array k = constrain(
        repeat(rotary(transpose(reshape(proj("k"), Shape{b, t, kv, dh}), {0, 2, 1, 3}), tables)),
        {{0, &L.batch}, {1, &L.model}}, L);
    const Array v =
        constrain(repeat(transpose(reshape(proj("v"), Shape{b, t, kv, dh}), {0, 2, 1, 3})),
                  {{0, &L.batch}, {1, &L.model}}, L);
    const Array scores =
        soft_cap(dot_general(q, k, DotDims{{0, 1}, {0, 1}, {3}, {3}}) * scale, c.attention_softcap);
    const Array probs = softmax(attention_mask(scores, window), -1);             // [b, h, t, t]
    const Array out = dot_general(probs, v, DotDims{{0, 1}, {0, 1}, {3}, {2}});  // [b, h, t, dh]
    merged = reshape(transpose(out, {0, 2, 1, 3}), Shape{b, t, heads * dh});
  } else {
    const Array q = constrain(
        rotary(transpose(reshape(proj("q"), Shape{b, t, kv, g, dh}), {0, 2, 3, 1, 4}), tables),
        {{0, &L.batch}, {1, &L.model}}, L);
    const Array k =
        constrain(rotary(transpose(reshape(proj("k"), Shape{b, t, kv, dh}), {0, 2, 1, 3}), tables),
                  {{0, &L.batch}, {1, &L.model}}, L);
    const Array v = constrain(transpose(reshape(proj("v"), Shape{b, t, kv, dh}), {0, 2, 1, 3}),
                              {{0, &L.batch}, {1, &L.model}}, L);
    // Soft-capped after the scale, before the mask (transformers' eager_attention_forward).
    const Array scores =
        soft_cap(dot_general(q, k, DotDims{{0, 1}, {0, 1}, {4}, {3}}) * scale, c.attention_softcap);
    const Array probs = softmax(attention_mask(scores, window), -1);  // [b, kv, g, t, t]
    const Array out =
        dot_general(probs, v, DotDims{{0, 1}, {0, 1}, {4}, {2}});  // [b, kv, g, t, dh]
    merged = reshape(transpose(out, {0, 3, 1, 2, 4}), Shape{b, t, heads * dh});
  }
  return merged;
}

// The fused form of attention(): q [b, t, heads, dh] and k, v [b, t, kv, dh] (grouped-query; with
// `repeat_kv` each key/value head repeated for the query heads that share it, so that the heads
// split over more model ranks than there are key/value heads), causal, a sliding window as a
// [t, t] mask.
Array ModelStep::fused_rotary_attention(const Array& q_proj, const Array& k_proj,
                                       const Array& v_proj, std::int64_t window,
                                       bool repeat_kv) const {
  const Layout& L = layout;
  const ModelConfig& c = config;
  const std::int64_t b = q_proj.shape()[0], t = q_proj.shape()[1];
  const std::int64_t dh = c.head_dim, kv = c.kv_heads, g = c.heads / c.kv_heads;
  const auto heads_of = [&](const Array& y, std::int64_t n) { return reshape(y, Shape{b, t, n, dh}); };
  const auto repeat = [&](const Array& y) {  // [b, t, kv, dh] -> [b, t, heads, dh]
    std::vector<Array> copies;
    copies.reserve(static_cast<std::size_t>(c.heads));
    for (std::int64_t i = 0; i < kv; ++i) {
      const Array one = slice(y, {0, 0, i, 0}, {b, t, i + 1, dh});
      for (std::int64_t j = 0; j < g; ++j) copies.push_back(one);
    }
    return concatenate(copies, 2);
  };
  const auto place = [&](const Array& y) { return constrain(y, {{0, &L.batch}, {2, &L.model}}, L); };
  if (c.attention_softcap > 0) {
    // train-plan refuses the fused kernel for such a model (resolve_options).
    throw SpecError(fmt::format("[train] dot_product_attention has no soft-capping of the scores "
                                "(attn_logit_softcapping {}): run the attention as ops",
                                c.attention_softcap));
  }
  Array k = rotary(heads_of(k_proj, kv), tables, 1, L.context_ways);
  Array v = heads_of(v_proj, kv);
  if (repeat_kv) {
    k = repeat(k);
    v = repeat(v);
  }
  if (!L.context.empty()) {
    if (window > 0 && window < t) {
      throw SpecError(fmt::format(
          "[train] sliding-window attention (window {}) with context parallelism over {} is not "
          "supported: plan it without the context axis",
          window, fmt::join(L.context, ", ")));
    }
    return reshape(ring(rotary(heads_of(q_proj, c.heads), tables, 1, L.context_ways), k, v),
                   Shape{b, t, c.heads * dh});
  }
  const Array q = place(rotary(heads_of(q_proj, c.heads), tables, 1));
  AttentionOptions o{.scale = scores_scale(c), .is_causal = true};
  if (window > 0 && window < t) {
    // Query i sees keys i - window + 1 .. i (with the causal mask: kv > q - window).
    const Array zeros = full(Shape{t, t}, DType::kF32, 0, q);
    o.mask = less(iota_like(zeros, 0, DType::kF32), iota_like(zeros, 1, DType::kF32) +
                                                         static_cast<double>(window));
  }
  // The output placed like q, so that its cotangent (in the backward pass) is split over the
  // heads too rather than along the sequence as sequence parallelism leaves it: the gradient
  // kernels then run on the heads' blocks without moving q, k, v and the output to another split.
  const Array out = place(dot_product_attention(q, place(k), place(v), o));  // [b, t, heads, dh]
  return reshape(out, Shape{b, t, c.heads * dh});
}

// Context parallelism: q [b, t, heads, dh], k and v [b, t, kv or heads, dh], the sequence in the
// load-balanced order, split over the context axis in a shard_map (batch and heads as the layout
// splits them, where they divide), attention by ring.
Array ModelStep::ring(const Array& q, const Array& k, const Array& v) const {
  const Layout& L = layout;
  const std::int64_t t = q.shape()[1];
  if (t % (2 * L.context_ways) != 0) {
    throw SpecError(fmt::format("[train] a sequence of {} tokens does not split into 2 x {} "
                                "chunks over the context axis {} (ring attention's load-balanced "
                                "order)",
                                t, L.context_ways, fmt::join(L.context, ", ")));
  }
  const auto spec = [&](const Array& y) {
    std::vector<AxisNames> dims(4);
    if (y.shape()[0] % L.batch_ways == 0) dims[0] = L.batch;
    dims[1] = L.context;
    if (y.shape()[2] % L.model_ways == 0) dims[2] = L.model;
    return PartitionSpec(dims);
  };
  const std::string axis = L.context.at(0);
  const double scale = scores_scale(config);
  const RingRotate rotate = ring_rotate;
  const ContextKernel kernel = context_kernel;
  return shard_map(
      [axis, scale, rotate, kernel](const Array& qb, const Array& kb, const Array& vb) {
        switch (kernel) {
          case ContextKernel::kAllGatherKv:
            return allgather_kv_attention(qb, kb, vb, axis, true, scale);
          case ContextKernel::kUlysses:
            return ulysses_attention(qb, kb, vb, axis, true, scale);
          case ContextKernel::kRing:
            break;
        }
        return ring_attention(qb, kb, vb, axis, true, scale, rotate);
      },
      *L.mesh, {spec(q), spec(k), spec(v)}, {spec(q)})(q, k, v);
}

Array ModelStep::layer(const Tree<Array>& p, const Array& h_in, std::int64_t window) const {
  return config.family->step.layer(*this, p, region(h_in, "residual", layout, true), window);
}

Array ModelStep::rms_norm_layer(const Tree<Array>& p, const Array& h, std::int64_t window) const {
  const Layout& L = layout;
  const ModelConfig& c = config;
  const Array x = normed(rms_norm(h, at(p, "input_layernorm/weight")), "attention_in", L);
  const Array h2 = region(h + attention_out(p, x, window), "residual", L);
  const Array x2 = normed(rms_norm(h2, at(p, "post_attention_layernorm/weight")), "mlp_in", L);
  return region(h2 + c.family->step.mlp(*this, p, x2), "residual", L, true);
}


Array ModelStep::attention_out(const Tree<Array>& p, const Array& x, std::int64_t window) const {
  const Array merged = attention(p, x, window);
  Array attended = region(
      checkpoint_name(
          block_linear(checkpoint_name(merged, "context"), at(p, "self_attn/o_proj/weight")),
          "out_proj"),
      "attention_out", layout);
  if (config.output_bias) attended = attended + at(p, "self_attn/o_proj/bias");
  return attended;
}

Array ModelStep::gated_mlp(const Tree<Array>& p, const Array& x2, Array (*act)(const Array&)) const {
  const Layout& L = layout;
  const ModelConfig& c = config;
  const auto mlp = [&](const Array& in, const char* name) {
    Array y = block_linear(in, at(p, fmt::format("mlp/{}_proj/weight", name)));
    if (c.mlp_bias) y = y + at(p, fmt::format("mlp/{}_proj/bias", name));
    const std::string_view n = name;
    return checkpoint_name(y, n == "gate" ? "mlpwi_0" : n == "up" ? "mlpwi_1" : "mlpwo");
  };
  const Array gate = mlp(x2, "gate");
  const Array up = mlp(x2, "up");
  const Array inner = constrain((act != nullptr ? act(gate) : silu(gate)) * up,
                                {{0, &L.batch}, {1, &L.context}, {2, &L.model}}, L);
  return region(mlp(inner, "down"), "mlp_out", L);
}


Array ModelStep::loss(const Tree<Array>& rest, const Array& h, const Array& targets) const {
  const Layout& L = layout;
  const StepParts& step = config.family->step;
  const Array x = normed(step.final_norm(*this, rest, h), "head_in", L);
  const std::string head_path =
      config.tie_embeddings ? std::string(step.embedding) : std::string("lm_head/weight");
  Array head = at(rest, head_path);
  if (const auto it = outside_in_use.find(head_path); it != outside_in_use.end() && !fused_loss) {
    // torchtitan's ColwiseParallel output (Megatron's output layer): the head used in its split
    // of the vocabulary, so the logits come out split along it (Shard(-1)) for loss_parallel.
    head = detail::pin_sharding(head, it->second);
  }
  if (fused_loss && config.logit_softcap > 0) {
    // train-plan refuses the fused loss for such a model (resolve_options).
    throw SpecError(fmt::format("[train] linear_cross_entropy has no soft-capping of the logits "
                                "(final_logit_softcapping {}): compute the logits whole",
                                config.logit_softcap));
  }
  if (fused_loss) return mean(linear_cross_entropy(x, head, targets));
  // The logits whole (soft-capped in their dtype, as transformers' Gemma2ForCausalLM), taken to
  // f32 for the softmax (as PyTorch training code does: cross_entropy(logits.float(), labels)),
  // as linear_cross_entropy does group by group; or read as they are (loss_dtype their dtype:
  // F.cross_entropy on the bf16 logits, whose log_softmax writes and keeps bf16).
  const Array logits = soft_cap(linear(x, head), config.logit_softcap);
  const DType wide =
      loss_dtype.value_or(logits.dtype() == DType::kF64 ? DType::kF64 : DType::kF32);
  const Array wide_logits = eager_cast(logits, wide);
  // With tensor parallelism the head's output is split along the vocabulary and the loss runs as
  // DTensor's loss_parallel (torchtitan's default), which holds one more copy of the logits.
  return mean(L.model_ways > 1 ? loss_parallel_cross_entropy(wide_logits, targets)
                               : eager_cross_entropy(wide_logits, targets));
}



Array ModelStep::rms_final_norm(const Tree<Array>& rest, const Array& h) const {
  return rms_norm(h, at(rest, "model/norm/weight"));
}


Array ModelStep::block_linear(const Array& x, const Array& w) const {
  return float8 ? float8_linear(x, w, float8_options) : linear(x, w);
}

Tree<Array> ModelStep::for_use(const Tree<Array>& weights) const {
  if (!compute_dtype) return weights;
  return weights.map([&](const Array& a) {
    if (!is_floating(a.dtype())) return a;
    return reduce_in_held ? convert_pending(a, *compute_dtype) : astype(a, *compute_dtype);
  });
}

Tree<Array> ModelStep::module_layouts(std::size_t i, const Tree<Array>& weights) const {
  const auto layer = [i](const std::vector<std::map<std::string, PartitionSpec>>& per_layer) {
    return i < per_layer.size() ? &per_layer[i] : nullptr;
  };
  const auto* modules = layer(layer_in_use);
  const auto* gathered = layer(layer_gathered);
  if ((modules == nullptr || modules->empty()) && (gathered == nullptr || gathered->empty())) {
    return weights;
  }
  std::vector<Array> leaves;
  for (auto& [path, a] : weights.flatten()) {
    const PartitionSpec* spec = nullptr;
    for (const auto* m : {modules, gathered}) {
      if (m == nullptr || spec != nullptr) continue;
      if (const auto it = m->find(path); it != m->end()) spec = &it->second;
    }
    leaves.push_back(spec == nullptr ? a : detail::pin_sharding(a, *spec));
  }
  return weights.unflatten(std::move(leaves));
}

Array ModelStep::forward_loss(const Tree<Array>& params, const Array& tokens,
                              const Array& targets) const {
  if (const auto whole = config.family->step.whole) {
    if (remat) {
      throw SpecError(fmt::format(
          "[train] recomputation is written for decoder-only models ({}); plan {} without --remat",
          titles_with(&FamilySupport::remat), config.family->title));
    }
    if (fsdp_root) {
      throw SpecError(fmt::format(
          "[train] --fsdp-root (torchtitan's FSDP wrapping) is written for decoder-only models "
          "({}); plan {} without it",
          titles_with(&FamilySupport::fsdp_root), config.family->title));
    }
    return whole(*this, for_use(params), tokens, targets);
  }
  // With `regather` the weights are read through optimization_barrier: each micro-batch gathers
  // them again instead of reusing (and so keeping alive) the first one's gathered copies.
  const auto use = [&](const Tree<Array>& t) {
    return regather ? t.map([](const Array& a) { return optimization_barrier(a); }) : t;
  };
  const std::string path = config.layers_path();
  const Tree<Array> outside = for_use(use(replace_at_path(params, path, Tree<Array>::list({}))));
  const Tree<Array> rest = fsdp_root ? held_by_root(outside, root_in_use) : outside;
  Array h = config.family->step.embed(*this, rest, tokens);
  const auto& layers = params.at_path(path).children();
  // Reshard after forward: the weights as used named and not saved, so that the backward pass
  // makes them again: the casts, and the weights laid out as the modules use them (TpPlan::
  // kModules: a pinned layout is a value of the program, which the policy would save otherwise).
  // Neither: the held weights are read again through the checkpoint's barrier, which is all it
  // takes.
  const bool name_in_use = compute_dtype.has_value() || pins_some_layer(layer_in_use) ||
                           pins_some_layer(layer_gathered);
  const RematPolicy reshard = checkpoint_policies::save_anything_except_these_names(
      name_in_use ? std::vector<std::string>{kWeightsInUse} : std::vector<std::string>{});
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Tree<Array> p = use(layers[i]);
    const bool checkpointed = remat && remat_blocks.selects(static_cast<std::int64_t>(i));
    if ((keep_last_gathered && i + 1 == layers.size()) || (checkpointed && keep_gathered) ||
        (!checkpointed && !reshard_after_forward)) {
      // Not resharded after forward (torchtitan's last block before #1094: FSDP would gather it
      // again at once for the backward pass): its weights as used are made once, outside any
      // checkpoint, and its recomputation reads them as they are (no barrier), so their
      // gathered copies are kept from its forward pass to its backward pass.
      const Tree<Array> w = module_layouts(i, for_use(p));
      const auto run_kept = [&](const Array& x) { return layer(w, x, config.window(i)); };
      h = checkpointed ? checkpoint(run_kept, *remat, /*prevent_cse=*/false)(h) : run_kept(h);
      continue;
    }
    const auto run = [&](const Array& x) {
      const auto named = [&](const Tree<Array>& t) {
        if (checkpointed || !name_in_use) return t;
        return t.map([](const Array& a) { return checkpoint_name(a, kWeightsInUse); });
      };
      // A cast that a pinned layout then reads is named too: otherwise the policy saves it
      // (in whatever layout the partitioner makes it, gathered for the pin) and the backward
      // pass reads it instead of gathering again.
      const bool pinned = (i < layer_in_use.size() && !layer_in_use[i].empty()) ||
                          (i < layer_gathered.size() && !layer_gathered[i].empty());
      const Tree<Array> cast = compute_dtype && pinned ? named(for_use(p)) : for_use(p);
      return layer(named(module_layouts(i, cast)), x, config.window(i));
    };
    h = checkpoint(run, checkpointed ? *remat : reshard)(h);
  }
  return loss(rest, h, targets);
}

template <class T>
Tree<T> replace_at_path(const Tree<T>& tree, std::string_view path, const Tree<T>& subtree) {
  if (path.empty()) return subtree;
  const auto slash = path.find('/');
  const std::string_view key = path.substr(0, slash);
  const std::string_view rest = slash == std::string_view::npos ? "" : path.substr(slash + 1);
  if (!tree.is_dict() || tree.find(key) == nullptr) {
    throw TreeError(fmt::format("[train] the parameter tree has no '{}'", key));
  }
  std::vector<typename Tree<T>::DictEntry> entries;
  for (std::size_t i = 0; i < tree.size(); ++i) {
    const std::string& k = tree.keys()[i];
    entries.emplace_back(
        k, k == key ? replace_at_path(tree.children()[i], rest, subtree) : tree.children()[i]);
  }
  return Tree<T>::dict(std::move(entries));
}
template Tree<Array> replace_at_path(const Tree<Array>&, std::string_view, const Tree<Array>&);

std::pair<Array, Tree<Array>> loss_and_grads(const ModelStep& model, const Tree<Array>& params,
                                             const Array& tokens, const Array& targets) {
  return value_and_grad([&](const Tree<Array>& p, const Array& x, const Array& y) {
    // The rotary tables made once for this differentiated step (arrays of its trace).
    SharedTables tables;
    ModelStep m = model;
    m.tables = &tables;
    return m.forward_loss(p, x, y);
  })(params, tokens, targets);
}

}  // namespace shardplan::train
