// Context parallelism's kernels besides the ring (shard_map.hpp): all-gather of K/V (Llama 3's)
// and Ulysses' all-to-all (DeepSpeed-Ulysses). Both are composed from public ops and
// collectives; autodiff gives their backward passes (all_gather's transpose is psum_scatter,
// all_to_all's the reverse all_to_all), so no custom VJP is needed. Causal, the sequence is in
// the load-balanced order (device d holds chunks d and 2n-1-d of 2n): each kernel puts the
// whole sequence it holds back in the natural order with slices, which move nothing.
#include <fmt/format.h>

#include "primitives/attention.hpp"
#include "ring_attention.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sjit.hpp"
#include "../frontend/trace.hpp"

namespace shardplan {
namespace {

Array rows(const Array& x, std::int64_t from, std::int64_t to) {
  std::vector<std::int64_t> starts(static_cast<std::size_t>(x.shape().rank()), 0);
  std::vector<std::int64_t> limits = x.shape().dims();
  starts[1] = from;
  limits[1] = to;
  return slice(x, starts, limits);
}

// x [B, n t, ...]: the n devices' blocks in device order (block d: chunks d and 2n-1-d, c = t/2
// rows each) put in the natural order of the 2n chunks.
Array natural_order(const Array& x, std::int64_t n) {
  const std::int64_t t = x.shape()[1] / n, c = t / 2;
  std::vector<Array> chunks;
  for (std::int64_t d = 0; d < n; ++d) chunks.push_back(rows(x, d * t, d * t + c));
  for (std::int64_t d = n - 1; d >= 0; --d) chunks.push_back(rows(x, d * t + c, (d + 1) * t));
  return concatenate(chunks, 1);
}

// The inverse of natural_order: chunks d and 2n-1-d side by side for each device d.
Array load_balanced_order(const Array& x, std::int64_t n) {
  const std::int64_t c = x.shape()[1] / (2 * n);
  std::vector<Array> chunks;
  for (std::int64_t d = 0; d < n; ++d) {
    chunks.push_back(rows(x, d * c, (d + 1) * c));
    chunks.push_back(rows(x, (2 * n - 1 - d) * c, (2 * n - d) * c));
  }
  return concatenate(chunks, 1);
}

// [t, n t] bool: query row r of this device's block (chunk i then chunk 2n-1-i, c = t/2 rows
// each) sees the keys of the natural order at positions up to its own.
Array causal_positions_mask(const Array& q, const std::string& axis, std::int64_t n) {
  const std::int64_t t = q.shape()[1], c = t / 2;
  const Array zeros = full(Shape{t, n * t}, DType::kF32, 0, q);
  const Array r = iota_like(zeros, 0, DType::kF32), key = iota_like(zeros, 1, DType::kF32);
  const Array i = astype(lax::axis_index(axis), DType::kF32);
  // Positions are exact in f32 below 2^24 tokens.
  const Array pos = where(less(r, full_like(r, static_cast<double>(c))), i * static_cast<double>(c) + r,
                          (static_cast<double>(2 * n - 1) - i) * static_cast<double>(c) + r -
                              static_cast<double>(c));
  return less_equal(key, pos);
}

}  // namespace

Array allgather_kv_attention(const Array& q, const Array& k, const Array& v,
                             const std::string& axis, bool is_causal,
                             std::optional<double> scale) {
  constexpr const char* kOp = "allgather_kv_attention";
  detail::check_context_operands(kOp, q, k, v, is_causal);
  AttentionOptions o{.scale = detail::attention_scale(kOp, scale, q.shape()[3])};
  const detail::CompositeScope in_op(composite::kAllGatherKvAttention);
  const std::int64_t n = lax::axis_size(axis);
  // The devices' blocks side by side (device order: the natural order when not causal).
  const Array k_all = lax::all_gather(k, axis, 1, true);
  const Array v_all = lax::all_gather(v, axis, 1, true);
  if (!is_causal) return dot_product_attention(q, k_all, v_all, o);
  o.mask = causal_positions_mask(q, axis, n);
  return dot_product_attention(q, natural_order(k_all, n), natural_order(v_all, n), o);
}

Array ulysses_attention(const Array& q, const Array& k, const Array& v, const std::string& axis,
                        bool is_causal, std::optional<double> scale) {
  constexpr const char* kOp = "ulysses_attention";
  detail::check_context_operands(kOp, q, k, v, is_causal);
  const double s = detail::attention_scale(kOp, scale, q.shape()[3]);
  const std::int64_t n = lax::axis_size(axis);
  if (q.shape()[2] % n != 0 || k.shape()[2] % n != 0) {
    throw SpecError(fmt::format(
        "[{}] the block's {} query heads and {} kv heads must each be a multiple of the {} "
        "devices of axis '{}' (each device attends over whole heads)",
        kOp, q.shape()[2], k.shape()[2], n, detail::printable(axis)));
  }
  const detail::CompositeScope in_op(composite::kUlyssesAttention);
  // [B, t, heads, H] split over the sequence -> [B, n t, heads / n, H] split over the heads (the
  // sequence in device order), and back.
  const auto to_heads = [&](const Array& x) {
    const Array whole = lax::all_to_all(x, axis, 2, 1, true);
    return is_causal ? natural_order(whole, n) : whole;
  };
  const Array out = dot_product_attention(to_heads(q), to_heads(k), to_heads(v),
                                          {.scale = s, .is_causal = is_causal});
  return lax::all_to_all(is_causal ? load_balanced_order(out, n) : out, axis, 1, 2, true);
}

}  // namespace shardplan
