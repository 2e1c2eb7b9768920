// float8_linear: torchao's Float8Linear with dynamic scaling (its three recipes, Float8Scaling),
// written with the public ops (so it is traced, sharded and costed like any code) and
// differentiated by custom_vjp, following torchao's matmul_with_hp_or_float8_args.
// Tensorwise: x and w are each cast to f8_e4m3 after multiplying by 448 / amax of the whole
// tensor (clamped to +-448 first, so nothing overflows), and multiplied by scaled_dot with the
// inverse scales; backward, the output's cotangent is cast the same way to f8_e5m2 (57344 /
// amax), and both gradients are scaled_dots of it with the 8-bit x and w the forward pass kept.
// Rowwise: each operand of each product is cast with a scale per row, its amax over the
// product's contracting dimensions (torchao's AXISWISE granularity), so the backward pass casts
// x and w again along other rows and keeps them in their own dtype.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>

#include "../../runtime/numeric.hpp"
#include "../ir/primitives.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/remat.hpp"

namespace shardplan {
namespace {

// torchao's EPS: an all-zero tensor gets a finite scale.
constexpr double kMinAmax = 1e-12;

struct Cast {
  Array bits;     // the value in 8 bits
  Array inverse;  // 1 / scale, f32: [] (tensorwise) or v's shape without `over` (per row)
};

// v * scale, clamped to the format's range and cast, with scale = max / amax(|v|) in f32, the
// amax over the dimensions `over` (all of them: one scale; otherwise one per row, broadcast back
// over `over`). torchao's rowwise recipe also rounds the scales down to powers of 2; that moves
// no byte and no FLOP, and is not done here. Each value of v's size carries `names`
// (checkpoint_name), so that a policy that recomputes the cast does not save its f32 steps.
Cast cast_to_f8(const Array& v, DType f8, const std::vector<int>& over,
                const std::vector<std::string>& names = {}) {
  const auto named = [&names](Array a) {
    for (const std::string& name : names) a = checkpoint_name(a, name);
    return a;
  };
  const double fmax = detail::f8_max(*detail::f8_format(f8));
  const Array amax = astype(max(abs(v), over), DType::kF32);
  const Array scale = fmax / maximum(amax, full_like(amax, kMinAmax));
  std::vector<int> kept;
  for (int d = 0; d < v.shape().rank(); ++d) {
    if (std::find(over.begin(), over.end(), d) == over.end()) kept.push_back(d);
  }
  // A named cast broadcasts its scale itself, so that the broadcast is named too.
  const Array scale_b = kept.empty() && names.empty()
                            ? scale
                            : named(broadcast_in_dim(scale, v.shape(), kept));
  const Array scaled = named(named(astype(v, DType::kF32)) * scale_b);
  // The bounds as big as v, or (for a named cast, made again in the backward pass) as scalars:
  // a constant is made outside any checkpoint, so one as big as v would be kept from the
  // forward pass for the recomputation.
  const auto bound = [&](double b) {
    return names.empty() ? full_like(scaled, b) : full(Shape{}, DType::kF32, b, scaled);
  };
  const Array above = named(maximum(scaled, bound(-fmax)));
  const Array clamped = named(minimum(above, bound(fmax)));
  return {named(astype(clamped, f8)), 1.0 / scale};
}
Cast cast_whole(const Array& v, DType f8, const std::vector<std::string>& names = {}) {
  return cast_to_f8(v, f8, detail::int_range(0, v.shape().rank()), names);
}

void check_operands(const Array& x, const Array& w) {
  const auto ok = [](DType d) { return d == DType::kBF16 || d == DType::kF32; };
  const int r = x.shape().rank();
  if (!ok(x.dtype()) || !ok(w.dtype()) || r < 1 || w.shape().rank() != 2 ||
      x.shape()[r - 1] != w.shape()[1]) {
    throw SpecError(fmt::format(
        "[float8_linear] needs x [..., in] and a Linear weight w [out, in], each bf16 or f32; got "
        "{} and {}",
        detail::type_str(x), detail::type_str(w)));
  }
}

}  // namespace

namespace {

// Tensorwise: the forward pass keeps x and w in 8 bits; the cotangent is cast to f8_e5m2.
Array tensorwise(const Array& x, const Array& w, const std::optional<detail::Pinned>& pin,
                 bool cast_before_pin) {
  const int r = x.shape().rank();
  const DType x_dtype = x.dtype(), w_dtype = w.dtype();
  const auto fwd = [r, x_dtype, &pin, cast_before_pin](const std::vector<Array>& in) {
    const Cast x8 = cast_whole(in[0], DType::kF8E4M3);
    // Cast after the pin: the pinned weight was gathered as it is held; its cast's steps are
    // named as it is, so that a policy that does not save the weight as used saves none of
    // them either (its backward pass gathers and casts again).
    Cast w8 = cast_whole(in[1], DType::kF8E4M3,
                         pin && !cast_before_pin ? pin->names : std::vector<std::string>{});
    if (pin) {
      // Cast before the pin: the 8 bits pinned, so that they are what is gathered. After: the
      // cast pinned where the weight is (no move), so that no reader gathers the 8 bits.
      for (const std::string& name : pin->names) w8.bits = checkpoint_name(w8.bits, name);
      w8.bits = detail::pin_sharding(w8.bits, pin->spec);
      for (const std::string& name : pin->names) w8.bits = checkpoint_name(w8.bits, name);
    }
    const Array y = scaled_dot(x8.bits, w8.bits, x8.inverse, w8.inverse,
                               DotDims{{}, {}, {r - 1}, {1}}, x_dtype);
    return CustomVjpForward{{y}, {x8.bits, w8.bits, x8.inverse, w8.inverse}};
  };
  const auto bwd = [r, x_dtype, w_dtype](const std::vector<Array>& res,
                                         const std::vector<Array>& cts) {
    const Cast g8 = cast_whole(cts[0], DType::kF8E5M2);
    // dx [..., in] = g [..., out] . w [out, in]; dw [out, in] = g [..., out] . x [..., in] over
    // every dimension but the last.
    const Array dx =
        scaled_dot(g8.bits, res[1], g8.inverse, res[3], DotDims{{}, {}, {r - 1}, {0}}, x_dtype);
    const std::vector<int> batch = detail::int_range(0, r - 1);
    const Array dw =
        scaled_dot(g8.bits, res[0], g8.inverse, res[2], DotDims{{}, {}, batch, batch}, w_dtype);
    return std::vector<Array>{dx, dw};
  };
  return custom_vjp(fwd, bwd, {x, pin && cast_before_pin ? pin->value : w}).at(0);
}

// Rowwise (and rowwise_with_gw_hp): x and w kept as they are; each product casts its operands
// with a scale per row, the amax over the dimensions it contracts.
Array rowwise(const Array& x, const Array& w, const std::optional<detail::Pinned>& pin,
              bool gw_hp) {
  const int r = x.shape().rank();
  const DType x_dtype = x.dtype(), w_dtype = w.dtype();
  // The weight's casts pinned where the pinned weight is (no move), so that no reader gathers
  // its 8 bits: the weight is gathered in its own dtype only.
  const std::optional<PartitionSpec> spec = pin ? std::optional(pin->spec) : std::nullopt;
  const auto keep = [spec](Cast c) {
    if (spec) c.bits = detail::pin_sharding(c.bits, *spec);
    return c;
  };
  const auto fwd = [r, x_dtype, &pin, keep](const std::vector<Array>& in) {
    Array wn = in[1];
    if (pin) {
      for (const std::string& name : pin->names) wn = checkpoint_name(wn, name);
    }
    const Cast x8 = cast_to_f8(in[0], DType::kF8E4M3, {r - 1});  // per token
    const Cast w8 = keep(cast_to_f8(wn, DType::kF8E4M3, {1}));   // per output channel
    const Array y = scaled_dot(x8.bits, w8.bits, x8.inverse, w8.inverse,
                               DotDims{{}, {}, {r - 1}, {1}}, x_dtype);
    return CustomVjpForward{{y}, {in[0], wn}};
  };
  const auto bwd = [r, x_dtype, w_dtype, gw_hp, keep](const std::vector<Array>& res,
                                                      const std::vector<Array>& cts) {
    const Array& g = cts[0];
    const Array &xs = res[0], &ws = res[1];
    // dx [..., in] = g [..., out] . w [out, in]: g per token; w per input channel (rowwise) or
    // whole (rowwise_with_gw_hp: torchao's cast_config_weight_for_grad_input is tensorwise).
    const Cast g_rows = cast_to_f8(g, DType::kF8E4M3, {r - 1});
    const Cast w_in =
        keep(gw_hp ? cast_whole(ws, DType::kF8E4M3) : cast_to_f8(ws, DType::kF8E4M3, {0}));
    const Array dx = scaled_dot(g_rows.bits, w_in.bits, g_rows.inverse, w_in.inverse,
                                DotDims{{}, {}, {r - 1}, {0}}, x_dtype);
    // dw [out, in] = g [..., out] . x [..., in] over the tokens: both per channel, or in high
    // precision (rowwise_with_gw_hp: a dot_general of g and x as they are).
    const std::vector<int> batch = detail::int_range(0, r - 1);
    const DotDims tokens{{}, {}, batch, batch};
    if (gw_hp) {
      const Array dw = dot_general(g, astype(xs, g.dtype()), tokens);
      return std::vector<Array>{dx, dw.dtype() == w_dtype ? dw : astype(dw, w_dtype)};
    }
    const Cast g_cols = cast_to_f8(g, DType::kF8E4M3, batch);
    const Cast x_cols = cast_to_f8(xs, DType::kF8E4M3, batch);
    const Array dw = scaled_dot(g_cols.bits, x_cols.bits, g_cols.inverse, x_cols.inverse, tokens,
                                w_dtype);
    return std::vector<Array>{dx, dw};
  };
  return custom_vjp(fwd, bwd, {x, w}).at(0);
}

}  // namespace

Array float8_linear(const Array& x, const Array& w, const Float8Options& options) {
  check_operands(x, w);
  // A weight pinned in its tensor-parallel split (pin_sharding: a column- or row-parallel
  // module's weight, or a weight gathered whole for use) is, with cast_before_pin (tensorwise),
  // cast as it is held and its 8 bits pinned in that split instead, with the pinned weight's
  // names: as torchao's Float8ColwiseParallel / Float8RowwiseParallel use each device's tp shard
  // of a weight cast on its FSDP shard (the scale from the amax over all) and all-gathered in 8
  // bits. The cast and its pinned copy both carry the names, so that a policy that saves neither
  // (reshard after forward) casts and gathers again in the backward pass. Rowwise casts the
  // pinned weight as pinned (torchao's rowwise communicates in high precision).
  const std::optional<detail::Pinned> pin = detail::pinned(w);
  switch (options.scaling) {
    case Float8Scaling::kTensorwise:
      return tensorwise(x, w, pin, options.cast_before_pin);
    case Float8Scaling::kRowwise:
      return rowwise(x, w, pin, false);
    case Float8Scaling::kRowwiseWithGwHp:
      return rowwise(x, w, pin, true);
  }
  throw SpecError("[float8_linear] unknown scaling");
}

}  // namespace shardplan
