// Ops over whole rows of one axis, each one kernel as PyTorch's eager kernels are:
// fused_log_softmax (the row's max and log-sum-exp kept in registers, only the result written,
// where log_softmax's ops write x - max and exp(x - max) too) and take_along_axis (one element of
// each row, as nll_loss reads the log-probabilities at the targets, where a one-hot product writes
// two arrays of the rows' size). Each reads its axis whole on a device (a replicated factor): a
// split axis is gathered first.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "../kernel_util.hpp"
#include "../primitive_tests.hpp"
#include "../primitives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

/// The axis the rows run along.
struct RowAttrs {
  int axis = 0;
};
std::string format_attrs(const RowAttrs& a) { return fmt::format(" axis={}", a.axis); }

namespace {

using Arrays = std::vector<Array>;

// A shape as [outer, n, inner] around `axis`: row (o, i) is elements o * n * inner + j * inner + i.
struct RowLayout {
  std::int64_t outer = 1, n = 1, inner = 1;
};
RowLayout row_layout(const Shape& s, int axis) {
  RowLayout r;
  for (int d = 0; d < s.rank(); ++d) (d < axis ? r.outer : d == axis ? r.n : r.inner) *= s[d];
  return r;
}

int checked_axis(const Node& n, std::span<const TensorType> in) {
  const int axis = n.attr<RowAttrs>().axis;
  if (axis < 0 || axis >= in[0].shape.rank()) {
    reject(n.op->name, in, fmt::format("axis {} is out of range", axis));
  }
  return axis;
}

// Every dimension but the axis passes; the axis is whole on each device, in the operands and
// in the result (its own factor there: take_along_axis's result has 1 along it).
OpFactors row_factors(const Node& n, std::span<const Shape> in) {
  const int axis = n.attr<RowAttrs>().axis;
  OpFactors f;
  std::vector<int> xf(static_cast<std::size_t>(in[0].rank()));
  std::vector<int> rf(xf.size());
  for (int d = 0; d < in[0].rank(); ++d) {
    const auto i = static_cast<std::size_t>(d);
    if (d == axis) {
      xf[i] = f.add(in[0][d], FactorKind::kReplicate);
      rf[i] = f.add(n.type.shape[d], FactorKind::kReplicate);
    } else {
      xf[i] = rf[i] = f.add(in[0][d], FactorKind::kPass);
    }
  }
  f.operands.assign(in.size(), rf);  // the indices of take_along_axis: the result's dimensions
  f.operands[0] = xf;
  f.result = rf;
  return f;
}

// ---- fused_log_softmax ------------------------------------------------------------------------

TensorType log_softmax_type(const Node& n, std::span<const TensorType> in) {
  checked_axis(n, in);
  if (!is_floating(in[0].dtype)) reject(n.op->name, in, "needs floating-point values");
  return in[0];
}

// Per row: m = max, s = sum exp(x - m) (accumulated in double), y = (x - m) - log(s), each in
// the element's compute type. A NaN in a row makes the row NaN; a row of -inf gives NaN, as
// x - max(x) does.
void log_softmax_kernel(const KernelArgs& k) {
  dispatch_if<IsFloating>(k, k.in[0].dtype, [&]<class T>(Tag<T>) {
    using C = Calc<T>;
    const RowLayout r = row_layout(k.in[0].shape, k.node.attr<RowAttrs>().axis);
    const T* x = elems<T>(k.in[0]);
    T* y = elems<T>(k.out);
    for (std::int64_t o = 0; o < r.outer; ++o) {
      for (std::int64_t i = 0; i < r.inner; ++i) {
        const std::int64_t base = o * r.n * r.inner + i;
        C m = max_identity<C>();
        for (std::int64_t j = 0; j < r.n; ++j) m = maximum<C>(m, widen(x[base + j * r.inner]));
        double s = 0;
        for (std::int64_t j = 0; j < r.n; ++j) {
          s += std::exp(static_cast<double>(widen(x[base + j * r.inner]) - m));
        }
        const auto log_s = static_cast<C>(std::log(s));
        for (std::int64_t j = 0; j < r.n; ++j) {
          y[base + j * r.inner] = narrow<T>((widen(x[base + j * r.inner]) - m) - log_s);
        }
      }
    }
  });
}

// The max, the subtraction, exp, the sum and the final subtraction: five per element.
double log_softmax_flops(const Node&, std::span<const Shape> in, const Shape&) {
  return 5.0 * static_cast<double>(in[0].numel());
}

// PyTorch's _log_softmax_backward_data: g - exp(y) * sum(g) along the axis, reading the result
// y (what the forward pass keeps), not x.
Arrays log_softmax_vjp(const Node& n, const Arrays&, const Array& y, const Array& g) {
  return {g - exp(y) * sum(g, {n.attr<RowAttrs>().axis}, true)};
}

// ---- take_along_axis --------------------------------------------------------------------------

TensorType take_along_type(const Node& n, std::span<const TensorType> in) {
  const int axis = checked_axis(n, in);
  if (in[1].dtype != DType::kI32) reject(n.op->name, in, "indices must be i32");
  std::vector<std::int64_t> want = in[0].shape.dims();
  want[static_cast<std::size_t>(axis)] = 1;
  if (in[1].shape != Shape(want)) {
    reject(n.op->name, in,
           fmt::format("indices must have the values' shape with 1 along axis {}: {}", axis,
                       Shape(want).to_string()));
  }
  return TensorType{in[1].shape, in[0].dtype};
}

// Result element (o, i) is row (o, i)'s element at its index, clamped into [0, n - 1] as take
// clamps (a kernel on a device cannot fail).
void take_along_kernel(const KernelArgs& k) {
  const RowLayout r = row_layout(k.in[0].shape, k.node.attr<RowAttrs>().axis);
  if (r.n == 0 && k.out.shape.numel() > 0) {
    throw SpecError(fmt::format("[kernel] take_along_axis: the axis of {} is empty; nothing to take",
                                describe(k.in[0].dtype, k.in[0].shape)));
  }
  const auto* idx = elems<std::int32_t>(k.in[1]);
  const std::size_t elem = size_of(k.out.dtype);
  for (std::int64_t o = 0; o < r.outer; ++o) {
    for (std::int64_t i = 0; i < r.inner; ++i) {
      const std::int64_t at = std::clamp<std::int64_t>(idx[o * r.inner + i], 0, r.n - 1);
      std::memcpy(k.out.data + static_cast<std::size_t>(o * r.inner + i) * elem,
                  k.in[0].data + static_cast<std::size_t>((o * r.n + at) * r.inner + i) * elem,
                  elem);
    }
  }
}

// d/dx: the cotangent at each row's (clamped) index, zero elsewhere: one array of x's size, as
// PyTorch's nll_loss_backward writes (zeros, then the scatter).
Arrays take_along_vjp(const Node& n, const Arrays& in, const Array&, const Array& g) {
  const int a = n.attr<RowAttrs>().axis;
  const Array& x = in[0];
  const Array idx = minimum(maximum(in[1], full_like(in[1], 0)),
                            full_like(in[1], static_cast<double>(x.shape()[a] - 1)));
  const Array wide = broadcast_to(idx, x.shape());
  const Array hit = equal(wide, iota_like(wide, a, DType::kI32));
  return {where(hit, broadcast_to(g, x.shape()), full(x.shape(), g.dtype(), 0, g)), Array()};
}

// ---- Test declarations (primitive_tests.hpp) --------------------------------------------------

std::vector<TestCase> log_softmax_cases(const Primitive&, DType t) {
  const auto c = [t](Shape s, int axis) { return TestCase{RowAttrs{axis}, {{{std::move(s), t}}}}; };
  return {c(Shape{8, 6}, 1), c(Shape{8, 6}, 0), c(Shape{2, 5, 4}, 1), c(Shape{6}, 0)};
}
std::vector<double> log_softmax_reference(const Node& n, std::span<const HostValues> in) {
  const RowLayout r = row_layout(in[0].shape, n.attr<RowAttrs>().axis);
  const std::vector<double>& x = in[0].v;
  std::vector<double> y(x.size());
  for (std::int64_t o = 0; o < r.outer; ++o) {
    for (std::int64_t i = 0; i < r.inner; ++i) {
      const auto at = [&](std::int64_t j) { return static_cast<std::size_t>((o * r.n + j) * r.inner + i); };
      double s = 0;
      for (std::int64_t j = 0; j < r.n; ++j) s += std::exp(x[at(j)]);
      for (std::int64_t j = 0; j < r.n; ++j) y[at(j)] = x[at(j)] - std::log(s);
    }
  }
  return y;
}
constexpr PrimitiveTests kLogSoftmaxTests{.public_ops = "fused_log_softmax",
                                          .dtypes = kFloatTypes,
                                          .cases = log_softmax_cases,
                                          .reference = log_softmax_reference,
                                          .gradient = true};

// Indices from 2 below the axis to 1 past its end: the out-of-range ones are clamped.
std::vector<TestCase> take_along_cases(const Primitive&, DType t) {
  const auto c = [t](Shape x, int axis) {
    std::vector<std::int64_t> idx = x.dims();
    idx[static_cast<std::size_t>(axis)] = 1;
    const Domain indices{.low = -2, .high = static_cast<double>(x[axis]) + 1, .whole = true};
    return TestCase{RowAttrs{axis}, {{{std::move(x), t}}, {{Shape(idx), DType::kI32}, indices}}};
  };
  return {c(Shape{8, 6}, 1), c(Shape{8, 6}, 0), c(Shape{2, 5, 4}, 1)};
}
std::vector<double> take_along_reference(const Node& n, std::span<const HostValues> in) {
  const int axis = n.attr<RowAttrs>().axis;
  const std::int64_t size = in[0].shape[axis];
  std::vector<double> y(in[1].v.size());
  for (std::size_t e = 0; e < y.size(); ++e) {
    std::vector<std::int64_t> at = unravel(static_cast<std::int64_t>(e), in[1].shape);
    const auto j = static_cast<std::int64_t>(in[1].v[e]);
    at[static_cast<std::size_t>(axis)] = std::min<std::int64_t>(std::max<std::int64_t>(j, 0), size - 1);
    y[e] = in[0].v[static_cast<std::size_t>(ravel(at, in[0].shape))];
  }
  return y;
}
constexpr PrimitiveTests kTakeAlongTests{.public_ops = "take_along_axis",
                                         .dtypes = kMovedTypes,
                                         .cases = take_along_cases,
                                         .reference = take_along_reference,
                                         .gradient = true};

}  // namespace

namespace prim {
constinit const Primitive fused_log_softmax{.name = "fused_log_softmax",
                                            .arity = 1,
                                            .infer = log_softmax_type,
                                            .factors = row_factors,
                                            .kernel = log_softmax_kernel,
                                            .flops = log_softmax_flops,
                                            .vjp = log_softmax_vjp,
                                            .tests = &kLogSoftmaxTests};
constinit const Primitive take_along_axis{.name = "take_along_axis",
                                          .arity = 2,
                                          .infer = take_along_type,
                                          .factors = row_factors,
                                          .kernel = take_along_kernel,
                                          .flops = no_flops,
                                          .vjp = take_along_vjp,
                                          .linearity = linear_in_first,
                                          .tests = &kTakeAlongTests};
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {

Array fused_log_softmax(const Array& x, int axis) {
  axis = detail::normalize_axis(axis, x, "fused_log_softmax");
  return detail::apply(detail::prim::fused_log_softmax, detail::RowAttrs{axis}, {x});
}

Array take_along_axis(const Array& x, const Array& indices, int axis) {
  axis = detail::normalize_axis(axis, x, "take_along_axis");
  return detail::apply(detail::prim::take_along_axis, detail::RowAttrs{axis}, {x, indices});
}

}  // namespace shardplan
