// float8_linear: torchao's Float8Linear with tensorwise dynamic scaling, written with the public
// ops (so it is traced, sharded and costed like any code) and differentiated by custom_vjp.
// Forward: x and w are each cast to f8_e4m3 after multiplying by 448 / amax of the whole tensor
// (clamped to +-448 first, so nothing overflows), and multiplied by scaled_dot with the inverse
// scales. Backward: the output's cotangent is cast the same way to f8_e5m2 (57344 / amax), and
// both gradients are scaled_dots of it with the 8-bit x and w the forward pass kept.
#include <fmt/format.h>

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
  Array inverse;  // 1 / scale, f32 [] (scaled_dot's scale)
};

// v * scale, clamped to the format's range and cast, with scale = max / amax(|v|) in f32.
Cast cast_to_f8(const Array& v, DType f8) {
  const double fmax = detail::f8_max(*detail::f8_format(f8));
  const Array amax = astype(max(abs(v), detail::int_range(0, v.shape().rank())), DType::kF32);
  const Array scale = fmax / maximum(amax, full_like(amax, kMinAmax));
  const Array scaled = astype(v, DType::kF32) * scale;
  const Array clamped = minimum(maximum(scaled, full_like(scaled, -fmax)), full_like(scaled, fmax));
  return {astype(clamped, f8), 1.0 / scale};
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

Array float8_linear(const Array& x, const Array& w) {
  check_operands(x, w);
  const int r = x.shape().rank();
  const DType x_dtype = x.dtype(), w_dtype = w.dtype();
  // A weight pinned in its tensor-parallel split (pin_sharding: a column- or row-parallel
  // module's weight) is cast as it is held and its 8 bits pinned in that split instead, with the
  // pinned weight's names: as torchao's Float8ColwiseParallel / Float8RowwiseParallel use each
  // device's tp shard of a weight cast on its FSDP shard (the scale from the amax over all) and
  // all-gathered in 8 bits. The cast and its pinned copy both carry the names, so that a policy
  // that saves neither (reshard after forward) casts and gathers again in the backward pass.
  const std::optional<detail::Pinned> pin = detail::pinned(w);
  const auto fwd = [r, x_dtype, &pin](const std::vector<Array>& in) {
    const Cast x8 = cast_to_f8(in[0], DType::kF8E4M3);
    Cast w8 = cast_to_f8(in[1], DType::kF8E4M3);
    if (pin) {
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
    const Cast g8 = cast_to_f8(cts[0], DType::kF8E5M2);
    // dx [..., in] = g [..., out] . w [out, in]; dw [out, in] = g [..., out] . x [..., in] over
    // every dimension but the last.
    const Array dx =
        scaled_dot(g8.bits, res[1], g8.inverse, res[3], DotDims{{}, {}, {r - 1}, {0}}, x_dtype);
    const std::vector<int> batch = detail::int_range(0, r - 1);
    const Array dw =
        scaled_dot(g8.bits, res[0], g8.inverse, res[2], DotDims{{}, {}, batch, batch}, w_dtype);
    return std::vector<Array>{dx, dw};
  };
  return custom_vjp(fwd, bwd, {x, pin ? pin->value : w}).at(0);
}

}  // namespace shardplan
