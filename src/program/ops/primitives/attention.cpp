// Fused attention: the primitives `attention`, `attention_grad_q`, `attention_grad_kv`
// (attention.hpp has their layouts, attention_kernel.cpp the kernels) and the public
// dot_product_attention, which puts a query [B, T, N, H] into the grouped layout [B, T, K, G, H]
// so that the kv-head factor K is shared by q, k and v.
#include "attention.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

std::string format_attrs(const AttentionAttrs& a) {
  return fmt::format(" scale={}{}{}{}", a.scale, a.causal ? " causal" : "",
                     a.has_mask ? " mask" : "", a.has_bias ? " bias" : "");
}

namespace {

DType accumulator(DType d) { return d == DType::kF64 ? DType::kF64 : DType::kF32; }

// The checks all three primitives share: q, k, v and the mask and bias after the `first`
// operands. Throws SpecError naming the op and the operands.
void check_qkv(const Node& n, std::span<const TensorType> in, int first) {
  const auto& a = n.attr<AttentionAttrs>();
  const auto fail = [&](const std::string& why) { reject(n.op->name, in, why); };
  const int want = first + (a.has_mask ? 1 : 0) + (a.has_bias ? 1 : 0);
  if (static_cast<int>(in.size()) != want) {
    fail(fmt::format("takes {} operands, got {}", want, in.size()));
  }
  const Shape& q = in[0].shape;
  const Shape& k = in[1].shape;
  if (q.rank() != 5 || k.rank() != 4) fail("needs q [B, T, K, G, H] and k, v [B, S, K, H]");
  if (!(k == in[2].shape)) fail("k and v differ in shape");
  if (q[0] != k[0] || q[2] != k[2] || q[4] != k[3]) {
    fail("q, k and v disagree in batch, kv heads or head size");
  }
  for (int i = 1; i < 3; ++i) {
    if (in[static_cast<std::size_t>(i)].dtype != in[0].dtype) fail("q, k and v differ in dtype");
  }
  if (!is_floating(in[0].dtype) || !is_computable(in[0].dtype)) {
    fail(fmt::format("dtype {} is not supported", name(in[0].dtype)));
  }
  const std::vector<std::int64_t> full = {q[0], q[2], q[3], q[1], k[1]};
  const auto check_broadcast = [&](int at, DType dtype, const char* what) {
    const TensorType& t = in[static_cast<std::size_t>(at)];
    if (t.dtype != dtype) fail(fmt::format("the {} must be {}", what, name(dtype)));
    bool fits = t.shape.rank() == 5;
    for (int d = 0; fits && d < 5; ++d) fits = t.shape[d] == 1 || t.shape[d] == full[d];
    if (!fits) fail(fmt::format("the {} does not broadcast to {}", what, Shape(full).to_string()));
  };
  if (a.has_mask) check_broadcast(mask_operand(a, first), DType::kBool, "mask");
  if (a.has_bias) check_broadcast(bias_operand(a, first), in[0].dtype, "bias");
}

Shape packed_shape(const Shape& q) { return Shape{q[0], q[1], q[2], q[3], q[4] + 1}; }

TensorType attention_type(const Node& n, std::span<const TensorType> in) {
  check_qkv(n, in, 3);
  return TensorType{packed_shape(in[0].shape), accumulator(in[0].dtype)};
}

void check_packed(const Node& n, std::span<const TensorType> in) {
  check_qkv(n, in, 5);
  const TensorType want{packed_shape(in[0].shape), accumulator(in[0].dtype)};
  if (!(in[3] == want) || !(in[4] == want)) {
    reject(n.op->name, in,
           fmt::format("the packed result and its cotangent must be {}", to_string(want)));
  }
}

TensorType grad_q_type(const Node& n, std::span<const TensorType> in) {
  check_packed(n, in);
  return in[0];
}

TensorType grad_kv_type(const Node& n, std::span<const TensorType> in) {
  check_packed(n, in);
  const Shape& k = in[1].shape;
  return TensorType{Shape{k[0], k[1], k[2], 2, k[3]}, in[0].dtype};
}

// The factors of the three: batch and kv heads pass; the query sequence and the group pass where
// the result has them and are summed in grad_kv (the query sequence is replicated there under a
// causal mask: a summed block does not know its global query index, which the mask needs); the
// key sequence is replicated where the result has none (every query needs every key) and passes
// in grad_kv; the head size is replicated.
enum class Which { kForward, kGradQ, kGradKv };

OpFactors attention_factors_of(const Node& n, std::span<const Shape> in, Which which) {
  const auto& a = n.attr<AttentionAttrs>();
  const Shape& q = in[0];
  const bool kv = which == Which::kGradKv;
  OpFactors f;
  const int b = f.add(q[0], FactorKind::kPass);
  const int t = f.add(
      q[1], kv ? (a.causal ? FactorKind::kReplicate : FactorKind::kReduce) : FactorKind::kPass);
  const int k = f.add(q[2], FactorKind::kPass);
  const int g = f.add(q[3], kv ? FactorKind::kReduce : FactorKind::kPass);
  const int h = f.add(q[4], FactorKind::kReplicate);
  const int s = f.add(in[1][1], kv ? FactorKind::kPass : FactorKind::kReplicate);
  const int h1 = f.add(q[4] + 1, FactorKind::kReplicate);
  f.operands = {{b, t, k, g, h}, {b, s, k, h}, {b, s, k, h}};
  if (which != Which::kForward) {
    f.operands.push_back({b, t, k, g, h1});
    f.operands.push_back({b, t, k, g, h1});
  }
  const int first = which == Which::kForward ? 3 : 5;
  const std::vector<int> broadcast = {b, k, g, t, s};
  for (std::size_t i = static_cast<std::size_t>(first); i < in.size(); ++i) {
    std::vector<int> dims(5, -1);
    for (int d = 0; d < 5; ++d) {
      if (in[i][d] != 1) dims[static_cast<std::size_t>(d)] = broadcast[static_cast<std::size_t>(d)];
    }
    f.operands.push_back(std::move(dims));
  }
  switch (which) {
    case Which::kForward:
      f.result = {b, t, k, g, h1};
      break;
    case Which::kGradQ:
      f.result = {b, t, k, g, h};
      break;
    case Which::kGradKv:
      f.result = {b, s, k, -1, h};
      break;
  }
  return f;
}

OpFactors attention_factors(const Node& n, std::span<const Shape> in) {
  return attention_factors_of(n, in, Which::kForward);
}
OpFactors grad_q_factors(const Node& n, std::span<const Shape> in) {
  return attention_factors_of(n, in, Which::kGradQ);
}
OpFactors grad_kv_factors(const Node& n, std::span<const Shape> in) {
  return attention_factors_of(n, in, Which::kGradKv);
}

// Per (query, key) pair visited: two products of H multiply-adds each in the forward (scores,
// P V) and a few operations of the softmax; three products in grad_q (scores, dP, dS K), four in
// grad_kv (scores, dP, P^T dO, dS^T Q). Causal skipping counted as for a first query at 0.
double pair_flops(const Node& n, std::span<const Shape> in, double per_pair_products,
                  double per_pair_other) {
  const Shape& q = in[0];
  const double heads = static_cast<double>(q[0] * q[2] * q[3]);
  const double pairs = attention_pairs(q[1], in[1][1], n.attr<AttentionAttrs>().causal);
  return heads * pairs * (per_pair_products * 2.0 * static_cast<double>(q[4]) + per_pair_other);
}
double attention_flops(const Node& n, std::span<const Shape> in, const Shape&) {
  return pair_flops(n, in, 2, 5);
}
double grad_q_flops(const Node& n, std::span<const Shape> in, const Shape&) {
  return pair_flops(n, in, 3, 5);
}
double grad_kv_flops(const Node& n, std::span<const Shape> in, const Shape&) {
  return pair_flops(n, in, 4, 5);
}

// The bias's cotangent: dS = P * (dP - D) summed over the dimensions the bias broadcasts along,
// written with the public ops from the saved log-sum-exp (a bias is as large as the scores it is
// added to, so materialising dS costs no more than the bias itself).
Array bias_gradient(const AttentionAttrs& a, const std::vector<Array>& in, const Array& y,
                    const Array& g) {
  const DType acc = y.dtype();
  const Shape& qs = in[0].shape();
  const std::int64_t B = qs[0], T = qs[1], K = qs[2], G = qs[3], H = qs[4];
  const DotDims heads{{0, 2}, {0, 2}, {4}, {3}};  // -> [B, K, T, G, S]
  const std::vector<int> to_bkgts = {0, 1, 3, 2, 4};
  const std::vector<int> to_bkgt = {0, 2, 3, 1};
  const Array bias = in[static_cast<std::size_t>(bias_operand(a, 3))];
  Array s =
      transpose(dot_general(astype(in[0], acc), astype(in[1], acc), heads), to_bkgts) * a.scale +
      astype(bias, acc);
  const double inf = std::numeric_limits<double>::infinity();
  if (a.has_mask)
    s = where(in[static_cast<std::size_t>(mask_operand(a, 3))], s, full_like(s, -inf));
  if (a.causal) s = where(less_equal(iota_like(s, 4), iota_like(s, 3)), s, full_like(s, -inf));
  const Shape rows{B, K, G, T, 1};
  const auto column = [&](const Array& x) {  // [..., H] of a packed value, as [B, K, G, T, 1]
    return reshape(
        transpose(reshape(slice(x, {0, 0, 0, 0, H}, {B, T, K, G, H + 1}), {B, T, K, G}), to_bkgt),
        rows);
  };
  Array lse = column(y);
  lse = where(equal(lse, full_like(lse, -inf)), full_like(lse, inf), lse);  // rows seeing nothing
  const Array p = exp(s - lse);
  const Array d_o = slice(g, {0, 0, 0, 0, 0}, {B, T, K, G, H});
  const Array o = slice(y, {0, 0, 0, 0, 0}, {B, T, K, G, H});
  const Array dp = transpose(dot_general(d_o, astype(in[2], acc), heads), to_bkgts);
  const Array d = reshape(transpose(sum(d_o * o, {4}), to_bkgt), rows) - column(g);
  // A masked pair's (a -inf score's) is 0, even in a NaN row (where p is NaN throughout).
  const Array ds = where(equal(s, full_like(s, -inf)), full_like(s, 0), p * (dp - d));
  std::vector<int> axes;
  for (int i = 0; i < 5; ++i) {
    if (bias.shape()[i] == 1 && ds.shape()[i] != 1) axes.push_back(i);
  }
  return astype(axes.empty() ? ds : sum(ds, axes, true), bias.dtype());
}

// The packed result's cotangent g holds dO and the log-sum-exp's cotangent (zero unless read);
// both enter the gradients (attention_kernel.cpp folds the latter into D).
std::vector<Array> attention_vjp(const Node& n, const std::vector<Array>& in, const Array& y,
                                 const Array& g) {
  const auto& a = n.attr<AttentionAttrs>();
  std::vector<Array> ops = {in[0], in[1], in[2], y, g};
  for (std::size_t i = 3; i < in.size(); ++i) ops.push_back(in[i]);
  const Array dq = apply(prim::attention_grad_q, n.attrs, ops);
  const Array dkv = apply(prim::attention_grad_kv, n.attrs, ops);
  const Shape& ks = in[1].shape();
  const auto part = [&](std::int64_t i) {
    return reshape(slice(dkv, {0, 0, 0, i, 0}, {ks[0], ks[1], ks[2], i + 1, ks[3]}), ks);
  };
  std::vector<Array> out = {dq, part(0), part(1)};
  if (a.has_mask) out.emplace_back();
  if (a.has_bias) out.push_back(bias_gradient(a, in, y, g));
  return out;
}

// What FlashAttention-2 keeps for its backward pass (flash_attn's _flash_attn_forward returns,
// and FlashAttnFunc saves, out in q's dtype and softmax_lse, f32 [b, h, t]): the output in q's
// dtype (the value dot_product_attention returns) and the log-sum-exp column, not the packed
// f32 result. The backward kernels then read the output rounded to q's dtype, as FA2's do.
std::vector<Array> attention_keep(const Node&, const std::vector<Array>& in, const Array& y) {
  const Shape& s = y.shape();
  const std::int64_t H = s[4] - 1;
  return {astype(slice(y, {0, 0, 0, 0, 0}, {s[0], s[1], s[2], s[3], H}), in[0].dtype()),
          slice(y, {0, 0, 0, 0, H}, {s[0], s[1], s[2], s[3], H + 1})};
}

Array attention_restore(const Node&, const std::vector<Array>& kept) {
  return concatenate({astype(kept[0], kept[1].dtype()), kept[1]}, 4);
}

constexpr KeptResult kAttentionKept{.keep = attention_keep, .restore = attention_restore};

}  // namespace

namespace {
// The backward kernels' own VJP: a second derivative through attention is refused by name, not
// given as zero (a cotangent does flow: the gradient depends on q, k and v).
std::vector<Array> second_derivative_refused(const Node& n, const std::vector<Array>&,
                                             const Array&, const Array&) {
  throw SpecError(fmt::format(
      "[{}] differentiating attention's gradient (a second derivative through "
      "dot_product_attention) is not supported",
      n.op->name));
}
}  // namespace

namespace prim {
// A primitive has one result, so the backward is two primitives; their own gradients (second
// derivatives of attention) are not provided: no cotangent flows through them.
constinit const Primitive attention{.name = "attention",
                                    .arity = kVariadic,
                                    .infer = attention_type,
                                    .factors = attention_factors,
                                    .kernel = attention_kernel,
                                    .flops = attention_flops,
                                    .vjp = attention_vjp,
                                    .kept = &kAttentionKept,
                                    .time_bound = TimeBound::kAttention,
                                    .tests = &kAttentionTests};
constinit const Primitive attention_grad_q{.name = "attention_grad_q",
                                           .arity = kVariadic,
                                           .infer = grad_q_type,
                                           .factors = grad_q_factors,
                                           .kernel = attention_grad_q_kernel,
                                           .flops = grad_q_flops,
                                           .vjp = second_derivative_refused,
                                           .time_bound = TimeBound::kAttention,
                                           .tests = &kAttentionGradQTests};
constinit const Primitive attention_grad_kv{.name = "attention_grad_kv",
                                            .arity = kVariadic,
                                            .infer = grad_kv_type,
                                            .factors = grad_kv_factors,
                                            .kernel = attention_grad_kv_kernel,
                                            .flops = grad_kv_flops,
                                            .vjp = second_derivative_refused,
                                            .partial = ReduceOp::kSum,
                                            .time_bound = TimeBound::kAttention,
                                            .tests = &kAttentionGradKvTests};
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {

namespace detail {

double attention_scale(const char* op, std::optional<double> scale, std::int64_t head_size) {
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_size));
  if (!std::isfinite(s) || s <= 0) {
    throw SpecError(fmt::format("[{}] scale {} {}: it must be finite and positive", op, s,
                                scale ? "given" : fmt::format("(1/sqrt of head size {})", head_size)));
  }
  return s;
}

}  // namespace detail

namespace {

[[noreturn]] void attention_error(const std::string& why, const Array& q, const Array& k,
                                  const Array& v) {
  throw SpecError(fmt::format("[dot_product_attention] q {}, k {}, v {}: {}", detail::type_str(q),
                              detail::type_str(k), detail::type_str(v), why));
}

// A mask or bias broadcastable to [B, N, T, S] as the primitive's [B|1, K|1, G|1, T|1, S|1].
Array grouped(const Array& x, const char* what, const std::vector<std::int64_t>& bnts,
              std::int64_t kv_heads, const Array& q, const Array& k, const Array& v) {
  const Shape& s = x.shape();
  if (s.rank() > 4) {
    attention_error(fmt::format("the {} {} has more than 4 dimensions", what, detail::type_str(x)),
                    q, k, v);
  }
  std::vector<std::int64_t> dims(static_cast<std::size_t>(4 - s.rank()), 1);
  for (int d = 0; d < s.rank(); ++d) dims.push_back(s[d]);
  for (std::size_t d = 0; d < 4; ++d) {
    if (dims[d] != 1 && dims[d] != bnts[d]) {
      attention_error(fmt::format("the {} {} does not broadcast to {}", what, detail::type_str(x),
                                  Shape(bnts).to_string()),
                      q, k, v);
    }
  }
  const bool per_head = dims[1] != 1;
  const std::int64_t kh = per_head ? kv_heads : 1, gh = per_head ? bnts[1] / kv_heads : 1;
  return reshape(x, Shape{dims[0], kh, gh, dims[2], dims[3]});
}

}  // namespace

Array dot_product_attention(const Array& q, const Array& k, const Array& v,
                            const AttentionOptions& o) {
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  if (qs.rank() != 4 || ks.rank() != 4 || v.shape().rank() != 4) {
    attention_error("needs q [B, T, N, H] and k, v [B, S, K, H]", q, k, v);
  }
  if (!(ks == v.shape())) attention_error("k and v differ in shape", q, k, v);
  if (qs[0] != ks[0]) attention_error("q and k differ in batch", q, k, v);
  if (qs[3] != ks[3]) attention_error("q and k differ in head size", q, k, v);
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype()) {
    attention_error("q, k and v differ in dtype", q, k, v);
  }
  if (!is_floating(q.dtype())) attention_error("q, k and v must be float", q, k, v);
  if (ks[2] == 0 || qs[2] % ks[2] != 0) {
    attention_error(fmt::format("query heads {} are not a multiple of kv heads {}", qs[2], ks[2]),
                    q, k, v);
  }
  const std::int64_t B = qs[0], T = qs[1], N = qs[2], H = qs[3], K = ks[2], G = N / K;
  const double scale = detail::attention_scale("dot_product_attention", o.scale, H);
  const detail::AttentionAttrs attrs{.scale = scale,
                                     .causal = o.is_causal,
                                     .has_mask = o.mask.has_value(),
                                     .has_bias = o.bias.has_value()};
  const std::vector<std::int64_t> bnts = {B, N, T, ks[1]};
  std::vector<Array> ops = {reshape(q, Shape{B, T, K, G, H}), k, v};
  if (o.mask) {
    if (o.mask->dtype() != DType::kBool) {
      attention_error(fmt::format("the mask {} is not bool", detail::type_str(*o.mask)), q, k, v);
    }
    ops.push_back(grouped(*o.mask, "mask", bnts, K, q, k, v));
  }
  if (o.bias) {
    if (o.bias->dtype() != q.dtype()) {
      attention_error(fmt::format("the bias {} is not of q's dtype", detail::type_str(*o.bias)), q,
                      k, v);
    }
    ops.push_back(grouped(*o.bias, "bias", bnts, K, q, k, v));
  }
  const Array y = detail::apply(detail::prim::attention, attrs, ops);
  // The output is the first value the backward pass keeps (Primitive::kept): one value.
  return reshape(detail::keep_for_backward(detail::prim::attention, attrs, ops, y)[0], qs);
}

}  // namespace shardplan
