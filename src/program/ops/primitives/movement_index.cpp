// The movement ops that cut, join and index: slice, concatenate, take (the others in
// movement.cpp).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "../../../runtime/box_copy.hpp"
#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "movement_tests.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

/// slice: [starts, limits) per dimension, stride 1.
struct SliceAttrs {
  std::vector<std::int64_t> starts, limits;
};
/// concatenate and take: the axis.
struct AxisAttrs {
  int axis = 0;
};
std::string format_attrs(const SliceAttrs& a) {
  if (a.starts.empty()) return {};
  return fmt::format(" starts=[{}] limits=[{}]", fmt::join(a.starts, ","),
                     fmt::join(a.limits, ","));
}
std::string format_attrs(const AxisAttrs& a) { return fmt::format(" axis={}", a.axis); }

namespace {

using Arrays = std::vector<Array>;

// ---- slice ------------------------------------------------------------------------------------

TensorType slice_type(const Node& n, std::span<const TensorType> in) {
  const auto& [starts, limits] = n.attr<SliceAttrs>();
  const Shape& x = in[0].shape;
  const int r = x.rank();
  bool ok = static_cast<int>(starts.size()) == r && static_cast<int>(limits.size()) == r;
  std::vector<std::int64_t> out;
  for (int d = 0; ok && d < r; ++d) {
    const auto i = static_cast<std::size_t>(d);
    ok = starts[i] >= 0 && starts[i] <= limits[i] && limits[i] <= x[d];
    out.push_back(limits[i] - starts[i]);
  }
  if (!ok) {
    throw SpecError(fmt::format("[slice] [{}] to [{}] is not inside {}", fmt::join(starts, ", "),
                                fmt::join(limits, ", "), to_string(in[0])));
  }
  return TensorType{Shape(out), in[0].dtype};
}

bool whole(const SliceAttrs& a, const Shape& in, int d) {
  const auto i = static_cast<std::size_t>(d);
  return a.starts[i] == 0 && a.limits[i] == in[d];
}

// Dimensions taken whole pass (and may stay sharded); cut dimensions must be whole on a device.
OpFactors slice_factors(const Node& n, std::span<const Shape> operands) {
  const auto& a = n.attr<SliceAttrs>();
  const Shape& in = operands[0];
  OpFactors f;
  std::vector<int> inf(static_cast<std::size_t>(in.rank()));
  for (int d = 0; d < in.rank(); ++d) {
    if (whole(a, in, d)) {
      inf[static_cast<std::size_t>(d)] = f.add(in[d], FactorKind::kPass);
      f.result.push_back(inf[static_cast<std::size_t>(d)]);
    } else {
      inf[static_cast<std::size_t>(d)] = f.add(in[d], FactorKind::kReplicate);
      f.result.push_back(f.add(n.type.shape[d], FactorKind::kReplicate));
    }
  }
  f.operands = {inf};
  return f;
}

// A dimension taken whole may be sharded: its limit is the block's size.
void slice_localize(Node& local, std::span<const Shape> global_in,
                    std::span<const Shape> local_in) {
  SliceAttrs a = local.attr<SliceAttrs>();
  for (int d = 0; d < global_in[0].rank(); ++d) {
    if (whole(a, global_in[0], d)) a.limits[static_cast<std::size_t>(d)] = local_in[0][d];
  }
  local.attrs = std::move(a);
}

void slice_kernel(const KernelArgs& k) {
  const Shape& in = k.in[0].shape;
  const std::vector<std::int64_t> zeros(static_cast<std::size_t>(in.rank()), 0);
  copy_box(k.in[0].data, in.begin(), k.node.attr<SliceAttrs>().starts.data(), k.out.data,
           k.out.shape.begin(), zeros.data(), k.out.shape.begin(), in.rank(), size_of(k.out.dtype));
}

// The cotangent padded with zeros back to the operand's shape.
Arrays slice_vjp(const Node& n, const Arrays& in, const Array&, const Array& g) {
  const auto& [starts, limits] = n.attr<SliceAttrs>();
  Array r = g;
  const Shape& s = in[0].shape();
  for (int d = 0; d < s.rank(); ++d) {
    const auto i = static_cast<std::size_t>(d);
    std::vector<Array> parts;
    std::vector<std::int64_t> dims = r.shape().dims();
    if (starts[i] > 0) {
      dims[i] = starts[i];
      parts.push_back(full(Shape(dims), g.dtype(), 0, g));
    }
    parts.push_back(r);
    if (limits[i] < s[d]) {
      dims[i] = s[d] - limits[i];
      parts.push_back(full(Shape(dims), g.dtype(), 0, g));
    }
    if (parts.size() > 1) r = concatenate(parts, d);
  }
  return {r};
}

// ---- concatenate ------------------------------------------------------------------------------

TensorType concat_type(const Node& n, std::span<const TensorType> in) {
  const int axis = n.attr<AxisAttrs>().axis;
  const int r = in[0].shape.rank();
  std::vector<std::int64_t> out = in[0].shape.dims();
  if (axis < 0 || axis >= r) reject(n.op->name, in, fmt::format("axis {} is out of range", axis));
  out[static_cast<std::size_t>(axis)] = 0;
  for (const TensorType& x : in) {
    bool ok = x.shape.rank() == r && x.dtype == in[0].dtype;
    for (int d = 0; ok && d < r; ++d) ok = d == axis || x.shape[d] == in[0].shape[d];
    if (!ok) {
      throw SpecError(fmt::format("[concatenate] {} does not fit {} along axis {}", to_string(x),
                                  to_string(in[0]), axis));
    }
    out[static_cast<std::size_t>(axis)] += x.shape[axis];
  }
  return TensorType{Shape(out), in[0].dtype};
}

// The joined axis must be whole on a device; the others pass.
OpFactors concat_factors(const Node& n, std::span<const Shape> operands) {
  const int axis = n.attr<AxisAttrs>().axis;
  OpFactors f;
  const Shape& out = n.type.shape;
  for (int d = 0; d < out.rank(); ++d) {
    f.result.push_back(f.add(out[d], d == axis ? FactorKind::kReplicate : FactorKind::kPass));
  }
  for (const Shape& s : operands) {
    std::vector<int> dims = f.result;
    dims[static_cast<std::size_t>(axis)] = f.add(s[axis], FactorKind::kReplicate);
    f.operands.push_back(std::move(dims));
  }
  return f;
}

void concat_kernel(const KernelArgs& k) {
  const int axis = k.node.attr<AxisAttrs>().axis;
  const int rank = k.out.shape.rank();
  const std::vector<std::int64_t> zeros(static_cast<std::size_t>(rank), 0);
  std::vector<std::int64_t> at = zeros;
  for (const ConstBlock& b : k.in) {
    copy_box(b.data, b.shape.begin(), zeros.data(), k.out.data, k.out.shape.begin(), at.data(),
             b.shape.begin(), rank, size_of(k.out.dtype));
    at[static_cast<std::size_t>(axis)] += b.shape[axis];
  }
}

Arrays concat_vjp(const Node& n, const Arrays& in, const Array&, const Array& g) {
  const int axis = n.attr<AxisAttrs>().axis;
  Arrays cts;
  std::int64_t at = 0;
  for (const Array& x : in) {
    std::vector<std::int64_t> starts(static_cast<std::size_t>(g.shape().rank()), 0);
    std::vector<std::int64_t> limits = g.shape().dims();
    starts[static_cast<std::size_t>(axis)] = at;
    at += x.shape()[axis];
    limits[static_cast<std::size_t>(axis)] = at;
    cts.push_back(slice(g, starts, limits));
  }
  return cts;
}

// ---- take -------------------------------------------------------------------------------------

TensorType take_type(const Node& n, std::span<const TensorType> in) {
  const int axis = n.attr<AxisAttrs>().axis;
  const Shape& x = in[0].shape;
  if (axis < 0 || axis >= x.rank()) {
    reject(n.op->name, in, fmt::format("axis {} is out of range", axis));
  }
  if (in[1].dtype != DType::kI32) {
    throw SpecError(fmt::format("[take] indices must be i32, got {}", to_string(in[1])));
  }
  std::vector<std::int64_t> out;
  for (int d = 0; d < axis; ++d) out.push_back(x[d]);
  for (int d = 0; d < in[1].shape.rank(); ++d) out.push_back(in[1].shape[d]);
  for (int d = axis + 1; d < x.rank(); ++d) out.push_back(x[d]);
  return TensorType{Shape(out), in[0].dtype};
}

// x's dimensions around the axis pass, the indices' dimensions pass; the axis must be whole.
OpFactors take_factors(const Node& n, std::span<const Shape> in) {
  const int axis = n.attr<AxisAttrs>().axis;
  OpFactors f;
  const Shape& x = in[0];
  const Shape& idx = in[1];
  std::vector<int> xf(static_cast<std::size_t>(x.rank()));
  std::vector<int> idf(static_cast<std::size_t>(idx.rank()));
  for (int d = 0; d < axis; ++d) {
    xf[static_cast<std::size_t>(d)] = f.add(x[d], FactorKind::kPass);
    f.result.push_back(xf[static_cast<std::size_t>(d)]);
  }
  xf[static_cast<std::size_t>(axis)] = f.add(x[axis], FactorKind::kReplicate);
  for (int d = 0; d < idx.rank(); ++d) {
    idf[static_cast<std::size_t>(d)] = f.add(idx[d], FactorKind::kPass);
    f.result.push_back(idf[static_cast<std::size_t>(d)]);
  }
  for (int d = axis + 1; d < x.rank(); ++d) {
    xf[static_cast<std::size_t>(d)] = f.add(x[d], FactorKind::kPass);
    f.result.push_back(xf[static_cast<std::size_t>(d)]);
  }
  f.operands = {xf, idf};
  return f;
}

// Out-of-range indices are clamped into [0, size - 1]: a gather on a device cannot fail. This is
// jnp.take(mode="clip") and what XLA's Gather does with its start indices; jnp.take's default
// mode="fill" would give NaN (or the dtype's fill value) instead.
void take_kernel(const KernelArgs& k) {
  const Shape& x_shape = k.in[0].shape;
  const int axis = k.node.attr<AxisAttrs>().axis;
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x_shape[d];
  for (int d = axis + 1; d < x_shape.rank(); ++d) inner *= x_shape[d];
  const std::int64_t size = x_shape[axis];
  const std::int64_t count = k.in[1].shape.numel();
  if (size == 0 && k.out.shape.numel() > 0) {
    throw SpecError(fmt::format("[kernel] take: axis {} of {} is empty; nothing to take", axis,
                                describe(k.in[0].dtype, x_shape)));
  }
  const std::size_t elem = size_of(k.out.dtype);
  const auto run = static_cast<std::size_t>(inner) * elem;
  dispatch_if<IsNumeric>(k, k.in[1].dtype, [&]<class I>(Tag<I>) {
    if constexpr (!std::is_integral_v<I>) {
      unsupported(k, k.in[1].dtype);
    } else {
      const I* indices = elems<I>(k.in[1]);
      for (std::int64_t o = 0; o < outer; ++o) {
        for (std::int64_t j = 0; j < count; ++j) {
          const std::int64_t at = std::clamp<std::int64_t>(indices[j], 0, size - 1);
          std::memcpy(k.out.data + static_cast<std::size_t>(o * count + j) * run,
                      k.in[0].data + static_cast<std::size_t>(o * size + at) * run, run);
        }
      }
    }
  });
}

// d/dx of take: a scatter-add, written as a contraction of the cotangent with the one-hot
// encoding of the indices, clamped as the kernel clamps them (an index past the end reads, and
// so receives, the last element).
Arrays take_vjp(const Node& n, const Arrays& in, const Array&, const Array& g) {
  const Array& x = in[0];
  const int a = n.attr<AxisAttrs>().axis;
  const Array idx = clamped_indices(in[1], x.shape()[a]);
  const int ni = idx.shape().rank();
  const Array oh = one_hot(idx, x.shape()[a], g.dtype());  // [I..., V]
  // g dims: x[:a], I, x[a+1:]; contract the I dims with oh's first ni dims.
  const Array r = dot_general(oh, g, DotDims{{}, {}, int_range(0, ni), int_range(a, a + ni)});
  // r dims: V, x[:a], x[a+1:] -> back to x's order.
  std::vector<int> order = {a};
  for (int d = 0; d < x.shape().rank(); ++d) {
    if (d != a) order.push_back(d);
  }
  return {maybe_transpose(r, inverse_permutation(order)), Array()};
}

// ---- Test declarations (primitive_tests.hpp) --------------------------------------------------
// Each reference finds, for every result index, the operand element it holds.

std::vector<TestCase> slice_cases(const Primitive&, DType t) {
  return {movement_case(SliceAttrs{{2, 0}, {6, 6}}, {Shape{8, 6}}, t),
          movement_case(SliceAttrs{{0, 1}, {8, 5}}, {Shape{8, 6}}, t),
          movement_case(SliceAttrs{{1, 0, 2}, {2, 4, 6}}, {Shape{2, 4, 6}}, t),
          movement_case(SliceAttrs{{0, 0}, {8, 6}}, {Shape{8, 6}}, t)};
}
std::vector<double> slice_reference(const Node& n, std::span<const HostValues> in) {
  const std::vector<std::int64_t>& starts = n.attr<SliceAttrs>().starts;
  return gather_reference(n, in[0], [&](std::vector<std::int64_t> r) {
    for (std::size_t d = 0; d < r.size(); ++d) r[d] += starts[d];
    return r;
  });
}
constexpr PrimitiveTests kSliceTests{.public_ops = "slice",
                                     .dtypes = kMovedTypes,
                                     .cases = slice_cases,
                                     .reference = slice_reference,
                                     .gradient = true};

std::vector<TestCase> concat_cases(const Primitive&, DType t) {
  return {movement_case(AxisAttrs{1}, {Shape{8, 2}, Shape{8, 4}}, t),
          movement_case(AxisAttrs{0}, {Shape{2, 6}, Shape{4, 6}, Shape{2, 6}}, t)};
}
// Result index r along the axis falls in the operand whose range holds it.
std::vector<double> concat_reference(const Node& n, std::span<const HostValues> in) {
  const auto axis = static_cast<std::size_t>(n.attr<AxisAttrs>().axis);
  std::vector<double> y(static_cast<std::size_t>(n.type.shape.numel()));
  for (std::size_t i = 0; i < y.size(); ++i) {
    auto r = unravel(static_cast<std::int64_t>(i), n.type.shape);
    std::size_t k = 0;
    while (r[axis] >= in[k].shape[static_cast<int>(axis)])
      r[axis] -= in[k++].shape[static_cast<int>(axis)];
    y[i] = in[k].v[static_cast<std::size_t>(ravel(r, in[k].shape))];
  }
  return y;
}
constexpr PrimitiveTests kConcatTests{.public_ops = "concatenate",
                                      .dtypes = kMovedTypes,
                                      .cases = concat_cases,
                                      .reference = concat_reference,
                                      .gradient = true};

// Indices from 2 below the axis to 1 past its end: the out-of-range ones are clamped.
std::vector<TestCase> take_cases(const Primitive&, DType t) {
  const auto c = [t](Shape x, Shape idx, int axis) {
    const Domain indices{.low = -2, .high = static_cast<double>(x[axis]) + 1, .whole = true};
    return TestCase{AxisAttrs{axis}, {{{x, t}}, {{std::move(idx), DType::kI32}, indices}}};
  };
  return {c(Shape{8, 6}, Shape{5}, 0), c(Shape{4, 8, 2}, Shape{2, 3}, 1),
          c(Shape{8, 6}, Shape{}, 1)};
}
std::vector<double> take_reference(const Node& n, std::span<const HostValues> in) {
  const int axis = n.attr<AxisAttrs>().axis;
  const int ni = in[1].shape.rank();
  const std::int64_t size = in[0].shape[axis];
  return gather_reference(n, in[0], [&](const std::vector<std::int64_t>& r) {
    std::vector<std::int64_t> x(r.begin(), r.begin() + axis);
    const std::vector<std::int64_t> i(r.begin() + axis, r.begin() + axis + ni);
    const double at = in[1].v[static_cast<std::size_t>(ravel(i, in[1].shape))];
    x.push_back(
        std::min<std::int64_t>(std::max<std::int64_t>(static_cast<std::int64_t>(at), 0), size - 1));
    x.insert(x.end(), r.begin() + axis + ni, r.end());
    return x;
  });
}
constexpr PrimitiveTests kTakeTests{.public_ops = "take",
                                    .dtypes = kMovedTypes,
                                    .cases = take_cases,
                                    .reference = take_reference,
                                    .gradient = true};

}  // namespace

namespace prim {
constinit const Primitive slice{.name = "slice",
                                .arity = 1,
                                .infer = slice_type,
                                .factors = slice_factors,
                                .kernel = slice_kernel,
                                .flops = no_flops,
                                .vjp = slice_vjp,
                                .localize = slice_localize,
                                .linearity = linear_in_all,
                                .tests = &kSliceTests};
constinit const Primitive concatenate{.name = "concatenate",
                                      .arity = kVariadic,
                                      .infer = concat_type,
                                      .factors = concat_factors,
                                      .kernel = concat_kernel,
                                      .flops = no_flops,
                                      .vjp = concat_vjp,
                                      .linearity = linear_in_all,
                                      .tests = &kConcatTests};
constinit const Primitive take{.name = "take",
                               .arity = 2,
                               .infer = take_type,
                               .factors = take_factors,
                               .kernel = take_kernel,
                               .flops = no_flops,
                               .vjp = take_vjp,
                               .linearity = linear_in_first,
                               .tests = &kTakeTests};
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {
using detail::apply;
namespace prim = detail::prim;

Array slice(const Array& x, std::vector<std::int64_t> starts, std::vector<std::int64_t> limits) {
  return apply(prim::slice, detail::SliceAttrs{std::move(starts), std::move(limits)}, {x});
}

Array concatenate(const std::vector<Array>& xs, int axis) {
  if (xs.empty()) throw SpecError("[concatenate] needs at least one array");
  axis = detail::normalize_axis(axis, xs[0], "concatenate");
  if (xs.size() == 1) {
    detail::infer_type(prim::concatenate, detail::AxisAttrs{axis}, xs);  // the checks only
    return xs[0];
  }
  return apply(prim::concatenate, detail::AxisAttrs{axis}, xs);
}

Array take(const Array& x, const Array& indices, int axis) {
  axis = detail::normalize_axis(axis, x, "take");
  return apply(prim::take, detail::AxisAttrs{axis}, {x, indices});
}

}  // namespace shardplan
