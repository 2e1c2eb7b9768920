// Context parallelism's kernels besides the ring (shard_map.hpp): all-gather of K/V (Llama 3's)
// and Ulysses' all-to-all (DeepSpeed-Ulysses). Both are composed from public ops and
// collectives; autodiff gives their backward passes (all_gather's transpose is psum_scatter,
// all_to_all's the reverse all_to_all), so no custom VJP is needed. Causal, the sequence is in
// the load-balanced order (device d holds chunks d and 2n-1-d of 2n): each kernel puts the
// whole sequence it holds back in the natural order by load_balanced_positions' table (a take,
// on the device: nothing moves between devices).
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

// load_balanced_positions(t, n) (element p: the natural position of the token at index p), or
// its inverse (element q: the index of natural position q), as an i32 array on x's devices.
Array order_table(const Array& x, std::int64_t t, std::int64_t n, bool inverse) {
  const std::vector<std::int64_t> pos = load_balanced_positions(t, n);
  std::vector<std::int32_t> table(pos.size());
  for (std::size_t p = 0; p < pos.size(); ++p) {
    const auto q = static_cast<std::size_t>(pos[p]);
    inverse ? table[q] = static_cast<std::int32_t>(p) : table[p] = static_cast<std::int32_t>(q);
  }
  return constant(Tensor::from(Shape{t}, table), x);
}

// x [B, n t, ...]: the n devices' blocks side by side in the load-balanced order, put in the
// natural order; and back.
Array natural_order(const Array& x, std::int64_t n) {
  return take(x, order_table(x, x.shape()[1], n, true), 1);
}
Array load_balanced_order(const Array& x, std::int64_t n) {
  return take(x, order_table(x, x.shape()[1], n, false), 1);
}

// [t, n t] bool: query row r of this device's block (rows i t .. (i+1) t of the load-balanced
// order) sees the keys of the natural order at positions up to its own.
Array causal_positions_mask(const Array& q, const std::string& axis, std::int64_t n) {
  const std::int64_t t = q.shape()[1];
  const Array rows = iota_like(full(Shape{t}, DType::kI32, 0, q), 0, DType::kI32) +
                     lax::axis_index(axis) * static_cast<double>(t);
  // Positions are exact in f32 below 2^24 tokens.
  const Array pos = astype(take(order_table(q, n * t, n, false), rows, 0), DType::kF32);
  const Array keys = iota_like(full(Shape{1, n * t}, DType::kF32, 0, q), 1, DType::kF32);
  return less_equal(keys, reshape(pos, Shape{t, 1}));
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
