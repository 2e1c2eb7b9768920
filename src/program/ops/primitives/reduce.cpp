// Reductions over a set of axes (removed from the shape): reduce_sum, reduce_max, reduce_min.
// Sharding a reduced dimension leaves a partial result (sum, max or min) for the consumer.
#include <algorithm>
#include <limits>
#include <numeric>

#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

/// The reduced axes, ascending.
struct ReduceAttrs {
  std::vector<int> axes;
};
std::string format_attrs(const ReduceAttrs& a) {
  return a.axes.empty() ? std::string() : fmt::format(" axes=[{}]", fmt::join(a.axes, ","));
}

namespace {

TensorType reduce_type(const Node& n, std::span<const TensorType> in) {
  const std::vector<int>& axes = n.attr<ReduceAttrs>().axes;
  if (!is_computable(in[0].dtype)) {
    reject(n.op->name, in, fmt::format("cannot reduce {} values", name(in[0].dtype)));
  }
  const Shape& s = in[0].shape;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < 0 || axes[i] >= s.rank() || (i > 0 && axes[i] <= axes[i - 1])) {
      reject(n.op->name, in,
             fmt::format("axes [{}] are not ascending axes of the operand", fmt::join(axes, ", ")));
    }
  }
  std::vector<std::int64_t> kept;
  for (int d = 0; d < s.rank(); ++d) {
    if (!std::binary_search(axes.begin(), axes.end(), d)) kept.push_back(s[d]);
  }
  return TensorType{Shape(kept), in[0].dtype};
}

// Reduced dimensions are reduce factors; the others pass to the result.
OpFactors reduce_factors(const Node& n, std::span<const Shape> in) {
  const std::vector<int>& axes = n.attr<ReduceAttrs>().axes;
  OpFactors f;
  std::vector<int> dims(static_cast<std::size_t>(in[0].rank()));
  for (int d = 0; d < in[0].rank(); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    dims[static_cast<std::size_t>(d)] =
        f.add(in[0][d], reduced ? FactorKind::kReduce : FactorKind::kPass);
    if (!reduced) f.result.push_back(dims[static_cast<std::size_t>(d)]);
  }
  f.operands = {dims};
  return f;
}

// Operand offsets of the kept and of the reduced elements, each in row-major order: result
// element o folds operand elements kept[o] + reduced[r] for r = 0, 1, ...
struct ReduceLayout {
  std::vector<std::int64_t> kept, reduced;
};

ReduceLayout reduce_layout(const Shape& s, const std::vector<int>& axes) {
  const std::vector<std::int64_t> strides = row_major_strides(s);
  std::vector<std::int64_t> kept_dims, kept_strides, reduced_dims, reduced_strides;
  for (int d = 0; d < s.rank(); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    (reduced ? reduced_dims : kept_dims).push_back(s[d]);
    (reduced ? reduced_strides : kept_strides).push_back(strides[d]);
  }
  ReduceLayout l;
  for_each_offset(kept_dims, kept_strides, [&](std::int64_t off) { l.kept.push_back(off); });
  for_each_offset(reduced_dims, reduced_strides,
                  [&](std::int64_t off) { l.reduced.push_back(off); });
  return l;
}

// Folds each kept element's reduced elements, in row-major order, starting from Fold::init in
// the accumulator type Fold::Acc. Exact for max and min, so the order does not matter there.
template <template <class> class Fold>
void reduce_kernel(const KernelArgs& k) {
  dispatch_if<IsNumeric>(k, k.in[0].dtype, [&]<class T>(Tag<T>) {
    using F = Fold<T>;
    using A = typename F::Acc;
    const ReduceLayout l = reduce_layout(k.in[0].shape, k.node.attr<ReduceAttrs>().axes);
    const T* x = elems<T>(k.in[0]);
    T* y = elems<T>(k.out);
    for (std::size_t o = 0; o < l.kept.size(); ++o) {
      A acc = F::init();
      for (const std::int64_t r : l.reduced) {
        acc = F::f(acc, static_cast<A>(widen(x[l.kept[o] + r])));
      }
      y[o] = narrow<T>(acc);
    }
  });
}

// ---- Sums: pairwise, so that rounding error grows with log n rather than n -------------------
// Every sum, whatever the layout, adds its reduced elements (taken in row-major order) the same
// way: a run of at most kSumBlock elements goes into 8 interleaved accumulators (element i into
// accumulator i mod 8) combined as ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)); a longer run is split at
// a block boundary (half the blocks, rounded down, on the left) and the halves' sums added. So a
// float32 sum of n elements is off by O(log n) roundings, not O(n), and the result of each output
// element does not depend on which path below computed it.
constexpr std::int64_t kSumBlock = 128;

// W adjacent output elements at once (lanes): lane j sums x[j + i * step] for i in [0, n). Each
// lane does the scalar operations in the scalar order, so W changes the speed, never the result.
template <int W, class A, class T>
void pairwise_sum(const T* x, std::int64_t step, std::int64_t n, A* out) {
  if (n > kSumBlock) {
    const std::int64_t mid = (n + kSumBlock - 1) / kSumBlock / 2 * kSumBlock;
    A left[W], right[W];
    pairwise_sum<W>(x, step, mid, left);
    pairwise_sum<W>(x + mid * step, step, n - mid, right);
    for (int j = 0; j < W; ++j) out[j] = add<A>(left[j], right[j]);
    return;
  }
  A acc[8][W];
  for (auto& a : acc) std::fill(a, a + W, A(0));
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int a = 0; a < 8; ++a) {
      const T* row = x + (i + a) * step;
      for (int j = 0; j < W; ++j) acc[a][j] = add<A>(acc[a][j], static_cast<A>(widen(row[j])));
    }
  }
  for (; i < n; ++i) {
    const T* row = x + i * step;
    A* a = acc[i % 8];
    for (int j = 0; j < W; ++j) a[j] = add<A>(a[j], static_cast<A>(widen(row[j])));
  }
  for (int j = 0; j < W; ++j) {
    out[j] = add<A>(add<A>(add<A>(acc[0][j], acc[1][j]), add<A>(acc[2][j], acc[3][j])),
                    add<A>(add<A>(acc[4][j], acc[5][j]), add<A>(acc[6][j], acc[7][j])));
  }
}

// reduce_sum. Axes that are consecutive (the common case: the last axis, the batch axes, all)
// make the operand [outer, reduced, inner]: each output element's run has stride `inner`, and
// adjacent output elements are summed together a cache line at a time. Other axes gather each
// output element's run into a buffer first. Both paths call pairwise_sum on the same run.
void sum_kernel(const KernelArgs& k) {
  dispatch_if<IsNumeric>(k, k.in[0].dtype, [&]<class T>(Tag<T>) {
    using A = SumAcc<T>;
    const std::vector<int>& axes = k.node.attr<ReduceAttrs>().axes;
    const Shape& s = k.in[0].shape;
    const T* x = elems<T>(k.in[0]);
    T* y = elems<T>(k.out);
    const bool consecutive =
        axes.empty() || axes.back() - axes.front() + 1 == static_cast<int>(axes.size());
    if (!consecutive) {
      const ReduceLayout l = reduce_layout(s, axes);
      std::vector<T> run(l.reduced.size());
      for (std::size_t o = 0; o < l.kept.size(); ++o) {
        for (std::size_t r = 0; r < run.size(); ++r) run[r] = x[l.kept[o] + l.reduced[r]];
        A acc;
        pairwise_sum<1>(run.data(), 1, static_cast<std::int64_t>(run.size()), &acc);
        y[o] = narrow<T>(acc);
      }
      return;
    }
    const int first = axes.empty() ? s.rank() : axes.front();
    const int last = axes.empty() ? s.rank() : axes.back() + 1;
    std::int64_t outer = 1, reduced = 1, inner = 1;
    for (int d = 0; d < s.rank(); ++d) (d < first ? outer : d < last ? reduced : inner) *= s[d];
    constexpr int kLanes = sizeof(T) >= 64 ? 1 : static_cast<int>(64 / sizeof(T));
    for (std::int64_t o = 0; o < outer; ++o) {
      const T* xo = x + o * reduced * inner;
      T* yo = y + o * inner;
      std::int64_t j = 0;
      A acc[kLanes];
      for (; j + kLanes <= inner; j += kLanes) {
        pairwise_sum<kLanes>(xo + j, inner, reduced, acc);
        for (int l = 0; l < kLanes; ++l) yo[j + l] = narrow<T>(acc[l]);
      }
      for (; j < inner; ++j) {
        pairwise_sum<1>(xo + j, inner, reduced, acc);
        yo[j] = narrow<T>(acc[0]);
      }
    }
  });
}

template <class T>
struct MaxFold {
  using Acc = Calc<T>;
  static Acc init() { return max_identity<Acc>(); }
  static Acc f(Acc a, Acc b) { return maximum<Acc>(a, b); }
};
template <class T>
struct MinFold {
  using Acc = Calc<T>;
  static Acc init() { return min_identity<Acc>(); }
  static Acc f(Acc a, Acc b) { return minimum<Acc>(a, b); }
};

double reduce_flops(const Node&, std::span<const Shape> in, const Shape&) {
  return static_cast<double>(in[0].numel());
}

// The operand's shape with the reduced axes kept as 1.
Shape keep_dims(const Shape& s, const std::vector<int>& axes) {
  std::vector<std::int64_t> keep = s.dims();
  for (const int a : axes) keep[static_cast<std::size_t>(a)] = 1;
  return Shape(keep);
}

std::vector<Array> sum_vjp(const Node& n, const std::vector<Array>& in, const Array&,
                           const Array& g) {
  const Shape& s = in[0].shape();
  return {broadcast_to(reshape(g, keep_dims(s, n.attr<ReduceAttrs>().axes)), s)};
}

// The cotangent goes to the elements equal to the result, split evenly between ties.
std::vector<Array> extremum_vjp(const Node& n, const std::vector<Array>& in, const Array& out,
                                const Array& g) {
  const std::vector<int>& axes = n.attr<ReduceAttrs>().axes;
  const Shape& s = in[0].shape();
  const Shape keep = keep_dims(s, axes);
  const Array y = broadcast_to(reshape(out, keep), s);
  const Array mask = astype(equal(in[0], y), g.dtype());
  const Array count = broadcast_to(sum(mask, axes, true), s);
  return {broadcast_to(reshape(g, keep), s) * mask / count};
}

// ---- Test declarations (primitive_tests.hpp) --------------------------------------------------

// The last axis, the first, all, two apart (not consecutive), none.
std::vector<TestCase> reduce_cases(const Primitive&, DType t) {
  const auto c = [t](Shape s, std::vector<int> axes) {
    return TestCase{ReduceAttrs{std::move(axes)}, {{{std::move(s), t}}}};
  };
  return {c(Shape{8, 6}, {1}), c(Shape{8, 6}, {0}), c(Shape{8, 6}, {0, 1}),
          c(Shape{2, 4, 6}, {0, 2}), c(Shape{8, 6}, {})};
}

// Each operand element folded into the result element of its kept indices.
std::vector<double> fold(const Node& n, const HostValues& x, double init,
                         double (*f)(double, double)) {
  const std::vector<int>& axes = n.attr<ReduceAttrs>().axes;
  std::vector<double> y(static_cast<std::size_t>(n.type.shape.numel()), init);
  for (std::int64_t i = 0; i < x.shape.numel(); ++i) {
    std::vector<std::int64_t> kept;
    const auto index = unravel(i, x.shape);
    for (int d = 0; d < x.shape.rank(); ++d) {
      if (std::find(axes.begin(), axes.end(), d) == axes.end())
        kept.push_back(index[static_cast<std::size_t>(d)]);
    }
    double& out = y[static_cast<std::size_t>(ravel(kept, n.type.shape))];
    out = f(out, x.v[static_cast<std::size_t>(i)]);
  }
  return y;
}

constexpr PrimitiveTests reduce_tests(std::string_view op, ReferenceFn* reference) {
  return {.public_ops = op,
          .dtypes = kNumericTypes,
          .cases = reduce_cases,
          .reference = reference,
          .gradient = true};
}
constexpr PrimitiveTests kSumTests =
    reduce_tests("sum mean", [](const Node& n, std::span<const HostValues> in) {
      return fold(n, in[0], 0, [](double a, double b) { return a + b; });
    });
constexpr PrimitiveTests kMaxTests =
    reduce_tests("max", [](const Node& n, std::span<const HostValues> in) {
      return fold(n, in[0], -std::numeric_limits<double>::infinity(),
                  [](double a, double b) { return a < b ? b : a; });
    });
constexpr PrimitiveTests kMinTests =
    reduce_tests("min", [](const Node& n, std::span<const HostValues> in) {
      return fold(n, in[0], std::numeric_limits<double>::infinity(),
                  [](double a, double b) { return b < a ? b : a; });
    });

constexpr Primitive reduction(std::string_view name, KernelFn* kernel, VjpFn* vjp, ReduceOp partial,
                              const PrimitiveTests* tests) {
  return Primitive{.name = name,
                   .arity = 1,
                   .infer = reduce_type,
                   .factors = reduce_factors,
                   .kernel = kernel,
                   .flops = reduce_flops,
                   .vjp = vjp,
                   .partial = partial,
                   .tests = tests};
}

std::vector<int> all_axes(const Array& x) {
  std::vector<int> a(static_cast<std::size_t>(x.shape().rank()));
  std::iota(a.begin(), a.end(), 0);
  return a;
}

Array reduce(const Primitive& op, const Array& x, std::vector<int> axes, bool keepdims) {
  axes = normalize_axes(std::move(axes), x, op.name);
  Array out = apply(op, ReduceAttrs{axes}, {x});
  return keepdims ? reshape(out, keep_dims(x.shape(), axes)) : out;
}

}  // namespace

namespace prim {
constinit const Primitive reduce_sum = with_linearity(
    reduction("reduce_sum", sum_kernel, sum_vjp, ReduceOp::kSum, &kSumTests), linear_in_all);
constinit const Primitive reduce_max =
    reduction("reduce_max", reduce_kernel<MaxFold>, extremum_vjp, ReduceOp::kMax, &kMaxTests);
constinit const Primitive reduce_min =
    reduction("reduce_min", reduce_kernel<MinFold>, extremum_vjp, ReduceOp::kMin, &kMinTests);
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {
namespace prim = detail::prim;

Array sum(const Array& x, std::vector<int> axes, bool keepdims) {
  return detail::reduce(prim::reduce_sum, x, std::move(axes), keepdims);
}
Array max(const Array& x, std::vector<int> axes, bool keepdims) {
  return detail::reduce(prim::reduce_max, x, std::move(axes), keepdims);
}
Array min(const Array& x, std::vector<int> axes, bool keepdims) {
  return detail::reduce(prim::reduce_min, x, std::move(axes), keepdims);
}
Array mean(const Array& x, std::vector<int> axes, bool keepdims) {
  const auto norm = detail::normalize_axes(axes, x, "mean");
  double count = 1;
  for (const int a : norm) count *= static_cast<double>(x.shape()[a]);
  const Array s = sum(x, norm, keepdims);
  return s * (1.0 / count);
}
Array sum(const Array& x) { return sum(x, detail::all_axes(x)); }
Array mean(const Array& x) { return mean(x, detail::all_axes(x)); }

}  // namespace shardplan
