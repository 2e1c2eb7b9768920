// Ops over rows of one axis, each one kernel as PyTorch's eager kernels are: fused_log_softmax
// (the row's max and log-sum-exp kept in registers, only the result written, where log_softmax's
// ops write x - max and exp(x - max) too; its axis read whole on a device: a split axis is
// gathered first) and take_along_axis (one element of each row, as nll_loss reads the
// log-probabilities at the targets, where a one-hot product writes two arrays of the rows' size;
// from an axis split over devices each takes the indices that fall in its slice and the result
// is a sum pending over them, as DTensor's _MaskPartial does under loss_parallel); and
// check_labels, the losses' label rule (a view whose values are checked on each device).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

/// The axis the rows run along.
struct RowAttrs {
  int axis = 0;
};
std::string format_attrs(const RowAttrs& a) { return fmt::format(" axis={}", a.axis); }
/// take_along_axis: the axis, its global size, and what an index outside it reads (clamped into
/// it, or 0).
struct TakeAlongAttrs {
  int axis = 0;
  std::int64_t size = 0;
  OutOfBounds mode = OutOfBounds::kClip;
};
std::string format_attrs(const TakeAlongAttrs& a) {
  return fmt::format(" axis={}{}", a.axis, a.mode == OutOfBounds::kZero ? " out_of_bounds=zero" : "");
}
/// check_labels: the classes a label may name, the label that marks a token to leave out, and
/// the op named in the error (the loss that reads the labels).
struct LabelCheckAttrs {
  std::int64_t classes = 0;
  std::int64_t ignore_index = kIgnoreIndex;
  std::string op;
};
std::string format_attrs(const LabelCheckAttrs& a) {
  return fmt::format(" classes={} ignore_index={}", a.classes, a.ignore_index);
}

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

int checked_axis(const Node& n, std::span<const TensorType> in, int axis) {
  if (axis < 0 || axis >= in[0].shape.rank()) {
    reject(n.op->name, in, fmt::format("axis {} is out of range", axis));
  }
  return axis;
}

// Every dimension but the axis passes. log_softmax's axis is whole on each device (in the
// result too); take_along_axis's may be split, alike in x and in the positions (a reduce factor:
// the result is then pending), while the indices and the result have 1 along it.
OpFactors row_factors(const Node& n, std::span<const Shape> in, int axis, bool take) {
  OpFactors f;
  std::vector<int> xf(static_cast<std::size_t>(in[0].rank()));
  std::vector<int> rf(xf.size());
  int split = -1;
  for (int d = 0; d < in[0].rank(); ++d) {
    const auto i = static_cast<std::size_t>(d);
    if (d != axis) {
      xf[i] = rf[i] = f.add(in[0][d], FactorKind::kPass);
    } else if (take) {
      xf[i] = split = f.add(in[0][d], FactorKind::kReduce);
      rf[i] = f.add(1, FactorKind::kPass);
    } else {
      xf[i] = f.add(in[0][d], FactorKind::kReplicate);
      rf[i] = f.add(n.type.shape[d], FactorKind::kReplicate);
    }
  }
  f.operands = {xf};
  if (take) f.operands.insert(f.operands.end(), {rf, {split}});
  f.result = rf;
  return f;
}
OpFactors log_softmax_factors(const Node& n, std::span<const Shape> in) {
  return row_factors(n, in, n.attr<RowAttrs>().axis, false);
}
OpFactors take_along_factors(const Node& n, std::span<const Shape> in) {
  return row_factors(n, in, n.attr<TakeAlongAttrs>().axis, true);
}

// ---- fused_log_softmax ------------------------------------------------------------------------

TensorType log_softmax_type(const Node& n, std::span<const TensorType> in) {
  checked_axis(n, in, n.attr<RowAttrs>().axis);
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
        const auto at = [&](std::int64_t j) { return widen(x[base + j * r.inner]); };
        // Four running maxima and sums, so that neither pass waits on its previous element
        // (the maximum is the same in any order; the sum is in double).
        C mk[4] = {max_identity<C>(), max_identity<C>(), max_identity<C>(), max_identity<C>()};
        std::int64_t j = 0;
        for (; j + 4 <= r.n; j += 4) {
          for (int l = 0; l < 4; ++l) mk[l] = maximum<C>(mk[l], at(j + l));
        }
        for (; j < r.n; ++j) mk[0] = maximum<C>(mk[0], at(j));
        const C m = maximum<C>(maximum<C>(mk[0], mk[1]), maximum<C>(mk[2], mk[3]));
        double sk[4] = {0, 0, 0, 0};
        for (j = 0; j + 4 <= r.n; j += 4) {
          for (int l = 0; l < 4; ++l) sk[l] += static_cast<double>(std::exp(at(j + l) - m));
        }
        for (; j < r.n; ++j) sk[0] += static_cast<double>(std::exp(at(j) - m));
        const auto log_s = static_cast<C>(std::log((sk[0] + sk[1]) + (sk[2] + sk[3])));
        for (j = 0; j < r.n; ++j) y[base + j * r.inner] = narrow<T>((at(j) - m) - log_s);
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
  const auto& attrs = n.attr<TakeAlongAttrs>();
  const int axis = checked_axis(n, in, attrs.axis);
  if (!is_computable(in[0].dtype)) reject(n.op->name, in, "cannot take from these values");
  if (in[1].dtype != DType::kI32 || in[2].dtype != DType::kI32) {
    reject(n.op->name, in, "indices and positions must be i32");
  }
  std::vector<std::int64_t> want = in[0].shape.dims();
  want[static_cast<std::size_t>(axis)] = 1;
  if (in[1].shape != Shape(want)) {
    reject(n.op->name, in,
           fmt::format("indices must have the values' shape with 1 along axis {}: {}", axis,
                       Shape(want).to_string()));
  }
  if (in[0].shape[axis] > std::numeric_limits<std::int32_t>::max()) {
    reject(n.op->name, in, fmt::format("axis {} has more elements than i32 indices reach", axis));
  }
  if (in[2].shape != Shape{in[0].shape[axis]}) {
    reject(n.op->name, in, fmt::format("positions must be [{}]", in[0].shape[axis]));
  }
  return TensorType{in[1].shape, in[0].dtype};
}

// Result element (o, i) is the sum of row (o, i)'s elements whose position equals its index,
// clamped into [0, size - 1] as take clamps (kClip), or as it is (kZero: an index outside the
// axis equals no position, and reads 0). The positions
// are an iota over the axis (take_along_axis makes them), so it is the one element at the index,
// on the device whose slice of the axis holds it, and 0 on the others: their sum is the value.
// Positions that run on by one (the iota, or a device's slice of it) are found by subtraction;
// any others (the registry's sampled ones) by a scan of the row. Both add the element to 0.
void take_along_kernel(const KernelArgs& k) {
  const auto& attrs = k.node.attr<TakeAlongAttrs>();
  const RowLayout r = row_layout(k.in[0].shape, attrs.axis);
  const auto* idx = elems<std::int32_t>(k.in[1]);
  const auto* pos = elems<std::int32_t>(k.in[2]);
  bool run = true;
  for (std::int64_t j = 1; j < r.n && run; ++j) run = std::int64_t{pos[j]} == pos[0] + j;
  dispatch_if<IsNumeric>(k, k.in[0].dtype, [&]<class T>(Tag<T>) {
    using A = SumAcc<T>;
    const T* x = elems<T>(k.in[0]);
    T* y = elems<T>(k.out);
    const auto element = [&](std::int64_t o, std::int64_t j, std::int64_t i) {
      return static_cast<A>(widen(x[(o * r.n + j) * r.inner + i]));
    };
    for (std::int64_t o = 0; o < r.outer; ++o) {
      for (std::int64_t i = 0; i < r.inner; ++i) {
        const std::int64_t index = idx[o * r.inner + i];
        const std::int64_t at =
            attrs.mode == OutOfBounds::kZero
                ? index
                : std::clamp<std::int64_t>(index, 0, std::max<std::int64_t>(attrs.size - 1, 0));
        A acc(0);
        if (run) {
          const std::int64_t j = r.n > 0 ? at - pos[0] : -1;
          if (j >= 0 && j < r.n) acc = add<A>(acc, element(o, j, i));
        } else {
          for (std::int64_t j = 0; j < r.n; ++j) {
            if (pos[j] == at) acc = add<A>(acc, element(o, j, i));
          }
        }
        y[o * r.inner + i] = narrow<T>(acc);
      }
    }
  });
}

// d/dx: the cotangent where a position equals the row's index (clamped, for kClip), zero
// elsewhere: one array of x's size, as PyTorch's nll_loss_backward writes (zeros, then the
// scatter). Under kZero an index outside the axis gets nothing.
Arrays take_along_vjp(const Node& n, const Arrays& in, const Array&, const Array& g) {
  const auto& attrs = n.attr<TakeAlongAttrs>();
  const int a = attrs.axis;
  const Array& x = in[0];
  const Array idx =
      attrs.mode == OutOfBounds::kZero ? in[1] : clamped_indices(in[1], attrs.size);
  const Array hit = equal(broadcast_to(idx, x.shape()), broadcast_in_dim(in[2], x.shape(), {a}));
  return {where(hit, broadcast_to(g, x.shape()), full(x.shape(), g.dtype(), 0, g)), Array(),
          Array()};
}

// ---- check_labels -----------------------------------------------------------------------------

TensorType check_labels_type(const Node& n, std::span<const TensorType> in) {
  if (in[0].dtype != DType::kI32) reject(n.op->name, in, "labels must be i32");
  return in[0];
}

OpFactors check_labels_factors(const Node& n, std::span<const Shape> in) {
  return same_dims(n.type.shape, in);
}

// The label rule of every loss (PyTorch's nll_loss: "Target out of bounds"): a label is a class
// in [0, classes) or the ignore_index; the first other one of the block is named, with its
// index in the whole array.
void check_labels_block(const Node& n, const ConstBlock& labels,
                        std::span<const std::int64_t> offset) {
  const auto& a = n.attr<LabelCheckAttrs>();
  const auto* v = elems<std::int32_t>(labels);
  const std::int64_t count = labels.shape.numel();
  for (std::int64_t e = 0; e < count; ++e) {
    const std::int64_t label = v[e];
    if ((label >= 0 && label < a.classes) || label == a.ignore_index) continue;
    std::vector<std::int64_t> at = unravel(e, labels.shape);
    for (std::size_t d = 0; d < at.size() && d < offset.size(); ++d) at[d] += offset[d];
    throw ValueError(fmt::format(
        "[{}] label {} at index [{}] is out of bounds: labels must be in [0, {}) (the "
        "classes of the logits' last dimension), or the ignore_index {}",
        a.op, label, fmt::join(at, ", "), a.classes, a.ignore_index));
  }
}

// Run where the node is computed on its own: the check, then the labels unchanged.
void check_labels_kernel(const KernelArgs& k) {
  check_labels_block(k.node, k.in[0], k.out_offset);
  const auto bytes = static_cast<std::size_t>(k.out.shape.numel()) * size_of(k.out.dtype);
  if (bytes > 0) std::memcpy(k.out.data, k.in[0].data, bytes);
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
      const auto at = [&](std::int64_t j) {
        return static_cast<std::size_t>((o * r.n + j) * r.inner + i);
      };
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

// Indices from 2 below the axis to 1 past its end: the out-of-range ones are clamped (kClip) or
// read 0 (kZero: they equal no position). The
// positions are sampled too (take_along_axis passes an iota): the reference is the sum of the
// row's elements at the positions equal to the index.
std::vector<TestCase> take_along_cases(const Primitive&, DType t) {
  const auto c = [t](Shape x, int axis, OutOfBounds mode = OutOfBounds::kClip) {
    std::vector<std::int64_t> idx = x.dims();
    idx[static_cast<std::size_t>(axis)] = 1;
    const Domain indices{.low = -2, .high = static_cast<double>(x[axis]) + 1, .whole = true};
    const Domain positions{.low = 0, .high = static_cast<double>(x[axis]) - 1, .whole = true};
    const std::int64_t n = x[axis];
    return TestCase{TakeAlongAttrs{axis, n, mode},
                    {{{std::move(x), t}},
                     {{Shape(idx), DType::kI32}, indices},
                     {{Shape{n}, DType::kI32}, positions}}};
  };
  return {c(Shape{8, 6}, 1), c(Shape{8, 6}, 0), c(Shape{2, 5, 4}, 1),
          c(Shape{8, 6}, 1, OutOfBounds::kZero), c(Shape{2, 5, 4}, 1, OutOfBounds::kZero)};
}
std::vector<double> take_along_reference(const Node& n, std::span<const HostValues> in) {
  const auto& attrs = n.attr<TakeAlongAttrs>();
  std::vector<double> y(in[1].v.size(), 0.0);
  for (std::size_t e = 0; e < y.size(); ++e) {
    std::vector<std::int64_t> at = unravel(static_cast<std::int64_t>(e), in[1].shape);
    const double want = attrs.mode == OutOfBounds::kZero
                            ? in[1].v[e]
                            : std::clamp(in[1].v[e], 0.0, static_cast<double>(attrs.size - 1));
    for (std::int64_t j = 0; j < attrs.size; ++j) {
      if (in[2].v[static_cast<std::size_t>(j)] != want) continue;
      at[static_cast<std::size_t>(attrs.axis)] = j;
      y[e] += in[0].v[static_cast<std::size_t>(ravel(at, in[0].shape))];
    }
  }
  return y;
}
// Labels within the classes pass unchanged (the refusals are tested by the losses'
// tests: tests/ops_test.cpp, fused_loss_test.cpp).
std::vector<TestCase> check_labels_cases(const Primitive&, DType) {
  const auto c = [](Shape s, std::int64_t classes) {
    const Domain labels{.low = 0, .high = static_cast<double>(classes) - 1, .whole = true};
    return TestCase{LabelCheckAttrs{classes, kIgnoreIndex, "check_labels"},
                    {{{std::move(s), DType::kI32}, labels}}};
  };
  return {c(Shape{8, 6}, 5), c(Shape{8}, 3)};
}
constexpr PrimitiveTests kCheckLabelsTests{.public_ops = "check_labels",
                                           .dtypes = {DType::kI32},
                                           .cases = check_labels_cases,
                                           .elementwise = [](std::span<const double> x) {
                                             return x[0];
                                           }};

constexpr PrimitiveTests kTakeAlongTests{.public_ops = "take_along_axis",
                                         .dtypes = kNumericTypes,
                                         .cases = take_along_cases,
                                         .reference = take_along_reference,
                                         .gradient = true};

}  // namespace

namespace prim {
constinit const Primitive fused_log_softmax{.name = "fused_log_softmax",
                                            .arity = 1,
                                            .infer = log_softmax_type,
                                            .factors = log_softmax_factors,
                                            .kernel = log_softmax_kernel,
                                            .flops = log_softmax_flops,
                                            .vjp = log_softmax_vjp,
                                            .tests = &kLogSoftmaxTests};
constinit const Primitive take_along_axis{.name = "take_along_axis",
                                          .arity = 3,
                                          .infer = take_along_type,
                                          .factors = take_along_factors,
                                          .kernel = take_along_kernel,
                                          .flops = no_flops,
                                          .vjp = take_along_vjp,
                                          .linearity = linear_in_first,
                                          .tests = &kTakeAlongTests};
// The labels as they are (a view: no bytes, no FLOPs), checked on each device when the step
// runs: a loss reads its labels through it, so that a label outside its classes fails the step
// that sees it (eagerly at once; under sjit when the program runs) instead of giving a 0 loss.
constinit const Primitive check_labels{.name = "check_labels",
                                       .arity = 1,
                                       .infer = check_labels_type,
                                       .factors = check_labels_factors,
                                       .kernel = check_labels_kernel,
                                       .flops = no_flops,
                                       .vjp = no_gradient,
                                       .view = true,
                                       .check = check_labels_block,
                                       .tests = &kCheckLabelsTests};
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {

Array fused_log_softmax(const Array& x, int axis) {
  axis = detail::normalize_axis(axis, x, "fused_log_softmax");
  return detail::apply(detail::prim::fused_log_softmax, detail::RowAttrs{axis}, {x});
}

Array check_labels(const Array& labels, std::int64_t classes, std::int64_t ignore_index,
                   std::string_view op) {
  if (classes < 1) {
    throw SpecError(fmt::format("[{}] needs at least one class, got {}", op, classes));
  }
  return detail::apply(detail::prim::check_labels,
                       detail::LabelCheckAttrs{classes, ignore_index, std::string(op)}, {labels});
}

Array take_along_axis(const Array& x, const Array& indices, int axis, OutOfBounds mode) {
  axis = detail::normalize_axis(axis, x, "take_along_axis");
  const std::int64_t n = x.shape()[axis];
  if (n > std::numeric_limits<std::int32_t>::max()) {
    throw SpecError(
        fmt::format("[take_along_axis] axis {} of {} has more elements than i32 "
                    "indices reach",
                    axis, detail::type_str(x)));
  }
  // The global position of each element along the axis: what lets a device holding a slice of
  // it tell its own indices from the others' (a constant; folded into the kernel on an
  // accelerator).
  const Array positions = iota_like(full(Shape{n}, DType::kI32, 0, x), 0, DType::kI32);
  return detail::apply(detail::prim::take_along_axis, detail::TakeAlongAttrs{axis, n, mode},
                       {x, indices, positions});
}

}  // namespace shardplan
