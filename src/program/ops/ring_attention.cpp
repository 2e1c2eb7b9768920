// Ring attention (shard_map.hpp, context parallelism): each device holds a block of the sequence;
// the key/value blocks travel round the ring (ppermute), each meeting the device's queries in
// the fused attention kernel, the partial results merged by their log-sum-exp. Causal, the
// sequence is in the load-balanced order (device d holds chunks d and 2n-1-d of 2n), so that
// every step gives every device the same work: two chunk pairs without a mask, chosen by
// whether the visiting block comes from an earlier device. The backward pass (custom_vjp) sends
// the key/value blocks round again with their gradients, so no device keeps the blocks it saw.
#include <fmt/format.h>

#include <cmath>

#include "../ir/primitives.hpp"
#include "ring_attention.hpp"
#include "primitives/attention.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sjit.hpp"
#include "../frontend/trace.hpp"

namespace shardplan {
namespace {

using detail::AttentionAttrs;

// Rows [from, to) of dimension `dim` of x.
Array part(const Array& x, int dim, std::int64_t from, std::int64_t to) {
  std::vector<std::int64_t> starts(static_cast<std::size_t>(x.shape().rank()), 0);
  std::vector<std::int64_t> limits = x.shape().dims();
  starts[static_cast<std::size_t>(dim)] = from;
  limits[static_cast<std::size_t>(dim)] = to;
  return slice(x, starts, limits);
}

// Two results of the attention kernel for the same queries, packed [..., H + 1] (output, then
// log-sum-exp), merged into the result over both key sets.
Array merge(const Array& a, const Array& b) {
  const std::int64_t h = a.shape()[4] - 1;
  const Array oa = part(a, 4, 0, h), la = part(a, 4, h, h + 1);
  const Array ob = part(b, 4, 0, h), lb = part(b, 4, h, h + 1);
  const Array m = maximum(la, lb);
  const Array wa = exp(la - m), wb = exp(lb - m);
  const Array total = wa + wb;
  return concatenate({(oa * wa + ob * wb) / total, m + log(total)}, 4);
}

struct Ring {
  std::string axis;
  std::int64_t n = 1;
  double scale = 1;
  bool causal = false;
  bool communicate = true;  // false: each block stays where it is (the compute alone, to measure)
  RingRotate rotate = RingRotate::kPermute;

  Array pass(const Array& x) const {
    return communicate ? lax::ppermute(x, axis, shift()) : x;
  }
  // Every device's key/value block, gathered once (RingRotate::kAllGather), or none: each step's
  // block then comes from the device before (pass).
  Array gathered(const Array& kv) const {
    return communicate && rotate == RingRotate::kAllGather && n > 1 ? lax::all_gather(kv, axis)
                                                                     : Array();
  }
  // The block a device meets at step s of the ring: that of device i - s (mod n), passed on from
  // the device before or read from the gathered blocks (the same values either way).
  Array next(const Array& blk, const Array& all, const Array& i, std::int64_t s) const {
    if (!all.valid()) return pass(blk);
    const Array j = where(greater_equal(i, full_like(i, static_cast<double>(s))),
                          i - full_like(i, static_cast<double>(s)),
                          i + full_like(i, static_cast<double>(n - s)));
    return reshape(take(all, reshape(j, Shape{1}), 0), blk.shape());
  }

  std::vector<std::pair<int, int>> shift() const {  // device d sends to d + 1
    std::vector<std::pair<int, int>> pairs;
    for (int d = 0; d < n; ++d) pairs.emplace_back(d, static_cast<int>((d + 1) % n));
    return pairs;
  }
  Array attend(const Array& q, const Array& k, const Array& v, bool diagonal) const {
    return detail::apply(detail::prim::attention,
                         AttentionAttrs{.scale = scale, .causal = diagonal}, {q, k, v});
  }
  // dq and packed dk, dv [B, S, K, 2, H] of one block pair, given the whole result and its
  // cotangent rows for these queries (FlashAttention-2's backward reads the final log-sum-exp).
  std::pair<Array, Array> grads(const Array& q, const Array& k, const Array& v, const Array& y,
                                const Array& g, bool diagonal) const {
    const AttentionAttrs a{.scale = scale, .causal = diagonal};
    const std::vector<Array> ops = {q, k, v, y, g};
    return {detail::apply(detail::prim::attention_grad_q, a, ops),
            detail::apply(detail::prim::attention_grad_kv, a, ops)};
  }
};

// kv [B, t, K, 2, H] as k and v [B, t, K, H].
std::pair<Array, Array> split_kv(const Array& x) {
  const Shape& s = x.shape();
  const Shape ks{s[0], s[1], s[2], s[4]};
  return {reshape(part(x, 3, 0, 1), ks), reshape(part(x, 3, 1, 2), ks)};
}

// q [B, t, K, G, H], kv [B, t, K, 2, H] (k, v): the packed result [B, t, K, G, H + 1].
Array ring_forward(const Ring& r, const Array& q, const Array& kv, const Array& i) {
  const std::int64_t t = q.shape()[1], c = t / 2;
  auto [k0, v0] = split_kv(kv);
  Array acc = r.attend(q, k0, v0, r.causal);
  Array blk = kv;
  const Array all = r.gathered(kv);
  for (std::int64_t s = 1; s < r.n; ++s) {
    blk = r.next(blk, all, i, s);
    auto [k, v] = split_kv(blk);
    if (!r.causal) {
      acc = merge(acc, r.attend(q, k, v, false));
      continue;
    }
    // The block of device j = i - s: earlier than i when s <= i (every query meets its first
    // chunk), later otherwise (the second query chunk meets both of its chunks).
    const Array earlier = greater_equal(i, full_like(i, static_cast<double>(s)));
    const Array q1 = part(q, 1, 0, c), q2 = part(q, 1, c, t);
    const Array k1 = part(k, 1, 0, c), k2 = part(k, 1, c, t);
    const Array v1 = part(v, 1, 0, c), v2 = part(v, 1, c, t);
    const Array p1 = r.attend(where(earlier, q1, q2), k1, v1, false);
    const Array p2 = r.attend(q2, where(earlier, k1, k2), where(earlier, v1, v2), false);
    const Array a1 = part(acc, 1, 0, c), a2 = merge(part(acc, 1, c, t), p2);
    acc = concatenate({where(earlier, merge(a1, p1), a1), where(earlier, a2, merge(a2, p1))}, 1);
  }
  return acc;
}

// The gradients of q [B, t, K, G, H] and kv [B, t, K, 2, H] given the packed result y and its
// packed cotangent g: the blocks go round again, each block's gradient travelling with it and
// sent home at the end.
std::pair<Array, Array> ring_backward(const Ring& r, const Array& q, const Array& kv,
                                      const Array& y, const Array& g, const Array& i) {
  const std::int64_t t = q.shape()[1], c = t / 2;
  auto [k0, v0] = split_kv(kv);
  auto [dq, dblk] = r.grads(q, k0, v0, y, g, r.causal);
  Array blk = kv;
  // Gathered again (PyTorch's all-gather rotation gathers in the backward pass as well); the
  // blocks' gradients still travel round the ring, each summed on its way home.
  const Array all = r.gathered(kv);
  for (std::int64_t s = 1; s < r.n; ++s) {
    blk = r.next(blk, all, i, s);
    dblk = r.pass(dblk);
    auto [k, v] = split_kv(blk);
    if (!r.causal) {
      auto [dq_s, dkv_s] = r.grads(q, k, v, y, g, false);
      dq = dq + dq_s;
      dblk = dblk + dkv_s;
      continue;
    }
    const Array earlier = greater_equal(i, full_like(i, static_cast<double>(s)));
    const auto first = [&](const Array& x) { return part(x, 1, 0, c); };
    const auto second = [&](const Array& x) { return part(x, 1, c, t); };
    const auto pick = [&](const Array& x) { return where(earlier, first(x), second(x)); };
    auto [dq_a, dkv_a] = r.grads(pick(q), first(k), first(v), pick(y), pick(g), false);
    auto [dq_b, dkv_b] = r.grads(second(q), pick(k), pick(v), second(y), second(g), false);
    // Where the block is earlier, pair a's dq is the first chunk's and pair b's dk, dv the block's
    // first chunk's; else both go to the second chunks. Selected, not scaled by a 0/1 factor:
    // 0 times a NaN gradient would put NaN where the pair does not belong.
    const Array dq1 = first(dq), dq2 = second(dq) + dq_b;
    const Array dkv1 = first(dblk) + dkv_a, dkv2 = second(dblk);
    dq = concatenate({where(earlier, dq1 + dq_a, dq1), where(earlier, dq2, dq2 + dq_a)}, 1);
    dblk = concatenate({where(earlier, dkv1 + dkv_b, dkv1), where(earlier, dkv2, dkv2 + dkv_b)}, 1);
  }
  if (r.n > 1) dblk = r.pass(dblk);
  return {dq, dblk};
}

}  // namespace

Array ring_attention(const Array& q, const Array& k, const Array& v, const std::string& axis,
                     bool is_causal, std::optional<double> scale, RingRotate rotate) {
  return detail::ring_attention_impl(q, k, v, axis, is_causal, scale, true, rotate);
}

namespace detail {
namespace {
[[noreturn]] void context_error(const char* op, const std::string& why, const Array& q,
                                const Array& k, const Array& v) {
  throw SpecError(fmt::format("[{}] {}: q {}, k {}, v {}", op, why, detail::type_str(q),
                              detail::type_str(k), detail::type_str(v)));
}
}  // namespace

void check_context_operands(const char* op, const Array& q, const Array& k, const Array& v,
                            bool is_causal) {
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  if (qs.rank() != 4 || ks.rank() != 4 || !(ks == v.shape())) {
    context_error(op, "needs q [B, t, N, H] and k, v [B, t, K, H]", q, k, v);
  }
  if (qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3]) {
    context_error(op, "q and k differ in batch, block length or head size", q, k, v);
  }
  if (ks[2] == 0 || qs[2] % ks[2] != 0) {
    context_error(op, "query heads are not a multiple of kv heads", q, k, v);
  }
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype() || !is_floating(q.dtype())) {
    context_error(op, "q, k and v must be float of one dtype", q, k, v);
  }
  if (is_causal && qs[1] % 2 != 0) {
    context_error(op,
                  "causal: the block holds two chunks (the load-balanced order), so its length "
                  "must be even",
                  q, k, v);
  }
}

Array ring_attention_impl(const Array& q, const Array& k, const Array& v, const std::string& axis,
                          bool is_causal, std::optional<double> scale, bool communicate,
                          RingRotate rotate) {
  check_context_operands("ring_attention", q, k, v, is_causal);
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  // Its ops, forward and backward, are the composite's (Lowered::ops says a program holds it).
  const CompositeScope in_ring(composite::kRingAttention);
  const std::int64_t B = qs[0], t = qs[1], N = qs[2], H = qs[3], K = ks[2];
  const Ring r{axis, lax::axis_size(axis), attention_scale("ring_attention", scale, H), is_causal,
               communicate, rotate};
  const Array i = lax::axis_index(axis);
  const Array qg = reshape(q, Shape{B, t, K, N / K, H});
  const Array kv =
      concatenate({reshape(k, Shape{B, t, K, 1, H}), reshape(v, Shape{B, t, K, 1, H})}, 3);
  // The backward pass keeps what the fused kernel's does (Primitive::kept: the output in q's
  // dtype and the f32 log-sum-exp, FlashAttention-2's), not the merged packed f32 result.
  const detail::KeptResult& keeps = *detail::prim::attention.kept;
  const detail::Node probe{.op = &detail::prim::attention};
  const auto fwd = [r, i, qs, &keeps, probe](const std::vector<Array>& in) {
    const std::vector<Array> kept = keeps.keep(probe, in, ring_forward(r, in[0], in[1], i));
    return CustomVjpForward{{reshape(kept[0], qs)}, {in[0], in[1], kept[0], kept[1], i}};
  };
  const auto bwd = [r, H, &keeps, probe](const std::vector<Array>& res,
                                         const std::vector<Array>& cts) {
    const CompositeScope in_ring_backward(composite::kRingAttention);
    const Array y = keeps.restore(probe, {res[2], res[3]});
    const Shape& ys = y.shape();
    const Shape os{ys[0], ys[1], ys[2], ys[3], H};
    const Array g = concatenate(
        {astype(reshape(cts[0], os), y.dtype()), full_like(part(y, 4, H, H + 1), 0)}, 4);
    auto [dq, dkv] = ring_backward(r, res[0], res[1], y, g, res[4]);
    return std::vector<Array>{dq, dkv};
  };
  return custom_vjp(fwd, bwd, {qg, kv}).at(0);
}
}  // namespace detail

std::vector<std::int64_t> load_balanced_positions(std::int64_t t, std::int64_t n) {
  if (n < 1 || t % (2 * n) != 0) {
    throw SpecError(fmt::format(
        "[load_balanced_positions] {} tokens do not split into 2 x {} chunks of equal length", t, n));
  }
  const std::int64_t c = t / (2 * n);
  std::vector<std::int64_t> pos(static_cast<std::size_t>(t));
  for (std::int64_t p = 0; p < t; ++p) {
    const std::int64_t d = p / (2 * c), within = p % (2 * c);
    const std::int64_t chunk = within < c ? d : 2 * n - 1 - d;
    pos[static_cast<std::size_t>(p)] = chunk * c + within % c;
  }
  return pos;
}

Array context_parallel_attention(const Array& q, const Array& k, const Array& v, const Mesh& mesh,
                                 const PartitionSpec& spec, const std::string& axis, bool is_causal,
                                 std::optional<double> scale, RingRotate rotate,
                                 ContextKernel kernel) {
  if (q.shape().rank() == 4) {
    detail::attention_scale("context_parallel_attention", scale, q.shape()[3]);
  }
  const auto& dims = spec.dims();
  if (dims.size() < 2 || dims[1].size() != 1 || dims[1][0] != axis) {
    throw SpecError(fmt::format("[context_parallel_attention] the spec {} must split the sequence "
                                "(dimension 1) over '{}' alone",
                                spec.to_string(), axis));
  }
  return shard_map(
      [axis, is_causal, scale, rotate, kernel](const Array& qb, const Array& kb, const Array& vb) {
        switch (kernel) {
          case ContextKernel::kAllGatherKv:
            return allgather_kv_attention(qb, kb, vb, axis, is_causal, scale);
          case ContextKernel::kUlysses:
            return ulysses_attention(qb, kb, vb, axis, is_causal, scale);
          case ContextKernel::kRing:
            break;
        }
        return ring_attention(qb, kb, vb, axis, is_causal, scale, rotate);
      },
      mesh, {spec, spec, spec}, {spec})(q, k, v);
}

}  // namespace shardplan
