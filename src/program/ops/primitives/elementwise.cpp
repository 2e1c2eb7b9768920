// Elementwise primitives: one operand (neg ... abs), two of one shape and dtype (add ... ge; the
// comparisons give bool), select and convert. Each is defined once below: its type rule, its
// kernel (a scalar function applied per element in the element's compute type), its VJP.
#include <cmath>
#include <functional>
#include <numbers>
#include <numeric>

#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "../../frontend/trace.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {
namespace {

bool numeric(DType d) { return is_computable(d); }
bool floating(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16; }

OpFactors pointwise_factors(const Node& n, std::span<const Shape> operands) {
  return same_dims(n.type.shape, operands);
}

// ---- One operand ------------------------------------------------------------------------------

TensorType float_unary(const Node& n, std::span<const TensorType> in) {
  if (!floating(in[0].dtype)) {
    throw SpecError(fmt::format("[{}] needs a float array, got {}", n.op->name, to_string(in[0])));
  }
  return in[0];
}

TensorType numeric_unary(const Node& n, std::span<const TensorType> in) {
  if (!numeric(in[0].dtype)) {
    throw SpecError(fmt::format("[{}] needs a float array, got {}", n.op->name, to_string(in[0])));
  }
  return in[0];
}

// y[i] = Fn::f(x[i]) in the element's compute type, for the dtypes `Allowed` admits.
template <template <class> class Allowed, class Fn>
void unary_kernel(const KernelArgs& k) {
  dispatch_if<Allowed>(k, k.in[0].dtype, [&]<class T>(Tag<T>) {
    const T* x = elems<T>(k.in[0]);
    T* y = elems<T>(k.out);
    const std::int64_t n = k.out.shape.numel();
    for (std::int64_t i = 0; i < n; ++i) y[i] = narrow<T>(Fn::f(widen(x[i])));
  });
}

constexpr Primitive unary(std::string_view name, InferFn* infer, KernelFn* kernel, VjpFn* vjp,
                          const PrimitiveTests* tests) {
  return Primitive{.name = name,
                   .arity = 1,
                   .infer = infer,
                   .factors = pointwise_factors,
                   .kernel = kernel,
                   .flops = flops_per_result,
                   .vjp = vjp,
                   .pointwise = true,
                   .tests = tests};
}

// The scalar functions of the one-operand primitives, in the compute type C of an element.
#define SHARDPLAN_UNARY(Name, ...) \
  struct Name {                    \
    template <class C>             \
    static C f(C x) {              \
      return __VA_ARGS__;          \
    }                              \
  };
SHARDPLAN_UNARY(Neg, negate(x))
struct Abs {
  template <class C>
  static C f(C x) {
    if constexpr (std::is_integral_v<C>) {
      return x < 0 ? negate(x) : x;
    } else {
      return std::abs(x);  // |-0| is +0
    }
  }
};
SHARDPLAN_UNARY(Relu, maximum(x, C(0)))
SHARDPLAN_UNARY(Exp, std::exp(x))
SHARDPLAN_UNARY(Log, std::log(x))
SHARDPLAN_UNARY(Sqrt, std::sqrt(x))
SHARDPLAN_UNARY(Rsqrt, C(1) / std::sqrt(x))
SHARDPLAN_UNARY(Sin, std::sin(x))
SHARDPLAN_UNARY(Cos, std::cos(x))
SHARDPLAN_UNARY(Tanh, std::tanh(x))
struct Gelu {  // the tanh approximation, jax.nn.gelu's default
  template <class C>
  static C f(C x) {
    const C k = std::sqrt(C(2) / std::numbers::pi_v<C>);
    return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
  }
};
SHARDPLAN_UNARY(Erf, std::erf(x))
SHARDPLAN_UNARY(Sigmoid, C(1) / (C(1) + std::exp(-x)))
#undef SHARDPLAN_UNARY

Array sign(const Array& x) {
  const Array zero = full_like(x, 0);
  return where(greater(x, zero), full_like(x, 1), where(less(x, zero), full_like(x, -1), zero));
}

using Arrays = std::vector<Array>;

Arrays neg_vjp(const Node&, const Arrays&, const Array&, const Array& g) { return {-g}; }
Arrays exp_vjp(const Node&, const Arrays&, const Array& y, const Array& g) { return {g * y}; }
Arrays log_vjp(const Node&, const Arrays& in, const Array&, const Array& g) { return {g / in[0]}; }
Arrays sqrt_vjp(const Node&, const Arrays&, const Array& y, const Array& g) {
  return {g * 0.5 / y};
}
Arrays rsqrt_vjp(const Node&, const Arrays& in, const Array& y, const Array& g) {
  return {g * -0.5 * y / in[0]};
}
Arrays sin_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  return {g * cos(in[0])};
}
Arrays cos_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  return {-(g * sin(in[0]))};
}
Arrays tanh_vjp(const Node&, const Arrays&, const Array& y, const Array& g) {
  return {g * (1.0 - y * y)};
}
Arrays relu_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  return {g * astype(greater(in[0], full_like(in[0], 0)), g.dtype())};
}
Arrays sigmoid_vjp(const Node&, const Arrays&, const Array& y, const Array& g) {
  return {g * y * (1.0 - y)};
}
Arrays abs_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  return {g * sign(in[0])};
}
// d/dx erf(x) = 2 / sqrt(pi) * exp(-x^2).
Arrays erf_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  return {g * (exp(-(in[0] * in[0])) * (2.0 / std::sqrt(std::numbers::pi)))};
}
Arrays gelu_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  const Array& x = in[0];
  const double c = std::sqrt(2.0 / std::numbers::pi);
  const Array t = tanh((x + x * x * x * 0.044715) * c);
  const Array dt_dx = (1.0 - t * t) * ((x * x * (3 * 0.044715) + 1.0) * c);
  return {g * ((t + 1.0) * 0.5 + x * 0.5 * dt_dx)};
}

// ---- Two operands -----------------------------------------------------------------------------

// Operands of one shape and dtype (the public functions broadcast first), of a dtype `ok` takes.
TensorType same_type(const Node& n, std::span<const TensorType> in, bool (*ok)(DType),
                     DType result) {
  if (in[0].dtype != in[1].dtype) {
    throw SpecError(fmt::format("[{}] operands have different dtypes: {} and {} (use astype)",
                                n.op->name, to_string(in[0]), to_string(in[1])));
  }
  if (in[0].shape != in[1].shape) reject(n.op->name, in, "shapes differ");
  if (!ok(in[0].dtype)) {
    reject(n.op->name, in, fmt::format("{} does not take {}", n.op->name, name(in[0].dtype)));
  }
  return TensorType{in[0].shape, result};
}
TensorType arithmetic(const Node& n, std::span<const TensorType> in) {
  return same_type(n, in, numeric, in[0].dtype);
}
TensorType float_arithmetic(const Node& n, std::span<const TensorType> in) {
  return same_type(n, in, floating, in[0].dtype);
}
TensorType comparison(const Node& n, std::span<const TensorType> in) {
  return same_type(n, in, numeric, DType::kBool);
}

template <template <class> class Allowed, class Fn>
void binary_kernel(const KernelArgs& k) {
  dispatch_if<Allowed>(k, k.in[0].dtype, [&]<class T>(Tag<T>) {
    using C = Calc<T>;
    const T* a = elems<T>(k.in[0]);
    const T* b = elems<T>(k.in[1]);
    const std::int64_t n = k.out.shape.numel();
    if constexpr (std::is_same_v<decltype(Fn::template f<C>(C(), C())), bool>) {
      std::uint8_t* y = elems<std::uint8_t>(k.out);
      for (std::int64_t i = 0; i < n; ++i)
        y[i] = Fn::template f<C>(widen(a[i]), widen(b[i])) ? 1 : 0;
    } else {
      T* y = elems<T>(k.out);
      for (std::int64_t i = 0; i < n; ++i)
        y[i] = narrow<T>(Fn::template f<C>(widen(a[i]), widen(b[i])));
    }
  });
}

constexpr Primitive binary(std::string_view name, InferFn* infer, KernelFn* kernel, VjpFn* vjp,
                           const PrimitiveTests* tests) {
  return Primitive{.name = name,
                   .arity = 2,
                   .infer = infer,
                   .factors = pointwise_factors,
                   .kernel = kernel,
                   .flops = flops_per_result,
                   .vjp = vjp,
                   .pointwise = true,
                   .tests = tests};
}

// The scalar functions of numeric.hpp (NaN propagation, integer wrap), named for the kernels.
#define SHARDPLAN_SCALAR(Name, expr) \
  struct Name {                      \
    template <class C>               \
    static auto f(C a, C b) {        \
      return expr;                   \
    }                                \
  };
SHARDPLAN_SCALAR(Add, add<C>(a, b))
SHARDPLAN_SCALAR(Sub, sub<C>(a, b))
SHARDPLAN_SCALAR(Mul, mul<C>(a, b))
SHARDPLAN_SCALAR(Div, divide<C>(a, b))
SHARDPLAN_SCALAR(Max, maximum<C>(a, b))
SHARDPLAN_SCALAR(Min, minimum<C>(a, b))
SHARDPLAN_SCALAR(Pow, std::pow(a, b))
SHARDPLAN_SCALAR(Eq, std::equal_to<C>{}(a, b))
SHARDPLAN_SCALAR(Ne, std::not_equal_to<C>{}(a, b))
SHARDPLAN_SCALAR(Lt, std::less<C>{}(a, b))
SHARDPLAN_SCALAR(Le, std::less_equal<C>{}(a, b))
SHARDPLAN_SCALAR(Gt, std::greater<C>{}(a, b))
SHARDPLAN_SCALAR(Ge, std::greater_equal<C>{}(a, b))
#undef SHARDPLAN_SCALAR

Arrays add_vjp(const Node&, const Arrays&, const Array&, const Array& g) { return {g, g}; }
Arrays sub_vjp(const Node&, const Arrays&, const Array&, const Array& g) { return {g, -g}; }
Arrays mul_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  return {g * in[1], g * in[0]};
}
Arrays div_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  return {g / in[1], -(g * in[0] / (in[1] * in[1]))};
}
// Ties split the cotangent evenly, as JAX does.
Arrays max_min_vjp(const Array& a_wins_bool, const Arrays& in, const Array& g) {
  const Array a_wins = astype(a_wins_bool, g.dtype());
  const Array tie = astype(equal(in[0], in[1]), g.dtype());
  const Array wa = a_wins + tie * 0.5;
  return {g * wa, g * (1.0 - wa)};
}
Arrays max_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  return max_min_vjp(greater(in[0], in[1]), in, g);
}
Arrays min_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  return max_min_vjp(less(in[0], in[1]), in, g);
}
Arrays pow_vjp(const Node&, const Arrays& in, const Array& y, const Array& g) {
  const Array& a = in[0];
  const Array& b = in[1];
  return {g * b * power(a, b - 1.0), g * y * log(a)};
}

// ---- select, convert --------------------------------------------------------------------------

TensorType select_type(const Node& n, std::span<const TensorType> in) {
  if (in[0].dtype != DType::kBool) reject(n.op->name, in, "the predicate must be bool");
  if (in[1].dtype != in[2].dtype) reject(n.op->name, in, "the branches' dtypes differ");
  if (in[0].shape != in[1].shape || in[1].shape != in[2].shape) {
    reject(n.op->name, in, "shapes differ");
  }
  return in[1];
}

void select_kernel(const KernelArgs& k) {
  visit_dtype(k.out.dtype, [&]<class T>(Tag<T>) {
    using U = bits_t<T>;
    const std::uint8_t* pred = elems<std::uint8_t>(k.in[0]);
    const U* a = elems<U>(k.in[1]);
    const U* b = elems<U>(k.in[2]);
    U* y = elems<U>(k.out);
    const std::int64_t n = k.out.shape.numel();
    for (std::int64_t i = 0; i < n; ++i) y[i] = pred[i] != 0 ? a[i] : b[i];
  });
}

Arrays select_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  const Array zero = full_like(g, 0);
  return {Array(), where(in[0], g, zero), where(in[0], zero, g)};
}

/// convert: to `dtype`. `sum_after`: a pending sum of the operand is carried through and reduced
/// in `dtype` (convert_pending: mixed precision's reduce dtype).
struct ConvertAttrs {
  DType dtype = DType::kF32;
  bool sum_after = false;
};
std::string format_attrs(const ConvertAttrs& a) {  // the result type says the dtype
  return a.sum_after ? "sum_after" : "";
}

TensorType convert_type(const Node& n, std::span<const TensorType> in) {
  const DType to = n.attr<ConvertAttrs>().dtype;
  const auto ok = [](DType d) {
    return d == DType::kBool || is_computable(d) || f8_format(d) != nullptr;
  };
  if (!ok(in[0].dtype) || !ok(to)) {
    reject(n.op->name, in, fmt::format("cannot convert {} to {}", name(in[0].dtype), name(to)));
  }
  return TensorType{in[0].shape, to};
}

// Every source value fits exactly in a double (floats) or an int64 (integers, bool), and is
// converted from there.
template <class T>
auto exact(T x) {
  if constexpr (IsF8<T>::value) {
    return to_double(x);
  } else if constexpr (std::is_same_v<T, Bool>) {
    return std::int64_t{x.v != 0};
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<std::int64_t>(x);
  } else {
    return static_cast<double>(static_cast<Calc<T>>(x));
  }
}

// The element types convert reads and writes: those kernels compute with, bool, and the float8
// formats (decoded exactly, encoded by numeric.hpp's f8_encode).
template <class F>
void visit_convertible(const KernelArgs& k, DType d, F&& f) {
  if (d == DType::kF8E4M3) return f(Tag<f8_e4m3>{});
  if (d == DType::kF8E5M2) return f(Tag<f8_e5m2>{});
  dispatch_if<IsNumericOrBool>(k, d, std::forward<F>(f));
}

// x, exact in a double or an int64, stored as To (float8: through the double).
template <class To, class W>
To convert_to(W x) {
  if constexpr (IsF8<To>::value) {
    return from_double<To>(static_cast<double>(x));
  } else {
    return convert_one<To>(x);
  }
}

void convert_kernel(const KernelArgs& k) {
  visit_convertible(k, k.in[0].dtype, [&]<class From>(Tag<From>) {
    visit_convertible(k, k.out.dtype, [&]<class To>(Tag<To>) {
      const From* x = elems<From>(k.in[0]);
      To* y = elems<To>(k.out);
      const std::int64_t n = k.out.shape.numel();
      for (std::int64_t i = 0; i < n; ++i) y[i] = convert_to<To>(exact(x[i]));
    });
  });
}

// A conversion between the float types kernels compute with is linear (up to rounding, as any
// sum in another order); one to or from an integer type or bool truncates, and a float8 value
// is never summed (a pending sum is reduced before it is cast to 8 bits).
Linearity convert_linearity(const Node& n, std::span<const TensorType> in) {
  const DType to = n.attr<ConvertAttrs>().dtype;
  if (!floating(to) || !floating(in[0].dtype)) return Linearity{};
  Linearity lin = linear_in_all(n, in);
  lin.carry = n.attr<ConvertAttrs>().sum_after;
  return lin;
}

// convert_pending's transpose is convert_pending: a weight cast for use has its gradient's sum
// reduced in the weight's own dtype, there and then (sharded like the weight: FSDP2
// reduce-scatters each layer's gradients as its backward pass ends), not where the gradients
// are next used (the update, after the whole backward pass: every layer's unreduced sum held
// until then).
// To or from float8 no cotangent flows: no op computes in 8 bits, so none could carry one
// (float8_linear gives its own gradient, custom_vjp).
Arrays convert_vjp(const Node& n, const Arrays& in, const Array&, const Array& g) {
  const DType from = in[0].dtype();
  if (!floating(from) || !floating(g.dtype())) return {Array()};
  if (!n.attr<ConvertAttrs>().sum_after) return {astype(g, from)};
  const Array summed = convert_pending(g, from);
  return {current_trace() != nullptr ? with_sharding_like(summed, in[0]) : summed};
}

// ---- Test declarations (primitive_tests.hpp): references in double, on the host ----------------

using Xs = std::span<const double>;

constexpr PrimitiveTests unary_tests(std::string_view op, DTypeSet dtypes, ElementFn* f,
                                     Domain domain = kAnyReal) {
  return {.public_ops = op,
          .dtypes = dtypes,
          .cases = pointwise_cases,
          .elementwise = f,
          .gradient = true,
          .domains = {domain}};
}
constexpr PrimitiveTests binary_tests(std::string_view op, DTypeSet dtypes, ElementFn* f,
                                      std::array<Domain, 3> domains = {}, bool gradient = true) {
  return {.public_ops = op,
          .dtypes = dtypes,
          .cases = pointwise_cases,
          .elementwise = f,
          .gradient = gradient,
          .domains = domains};
}
// Whole numbers, so that ties occur.
constexpr PrimitiveTests comparison_tests(std::string_view op, ElementFn* f) {
  return binary_tests(op, kNumericTypes, f, {kSmallWhole, kSmallWhole}, false);
}

constexpr double kPi = std::numbers::pi;
constexpr PrimitiveTests kNegTests = unary_tests("neg", kNumericTypes, [](Xs x) { return -x[0]; });
constexpr PrimitiveTests kExpTests =
    unary_tests("exp", kFloatTypes, [](Xs x) { return std::exp(x[0]); });
constexpr PrimitiveTests kLogTests = unary_tests(
    "log", kFloatTypes, [](Xs x) { return std::log(x[0]); }, kPositive);
constexpr PrimitiveTests kSqrtTests = unary_tests(
    "sqrt", kFloatTypes, [](Xs x) { return std::pow(x[0], 0.5); }, kPositive);
constexpr PrimitiveTests kRsqrtTests = unary_tests(
    "rsqrt", kFloatTypes, [](Xs x) { return std::pow(x[0], -0.5); }, kPositive);
constexpr PrimitiveTests kSinTests =
    unary_tests("sin", kFloatTypes, [](Xs x) { return std::sin(x[0]); });
constexpr PrimitiveTests kCosTests =
    unary_tests("cos", kFloatTypes, [](Xs x) { return std::cos(x[0]); });
constexpr PrimitiveTests kTanhTests = unary_tests(
    "tanh", kFloatTypes, [](Xs x) { return (std::exp(2 * x[0]) - 1) / (std::exp(2 * x[0]) + 1); });
constexpr PrimitiveTests kReluTests =
    unary_tests("relu", kNumericTypes, [](Xs x) { return x[0] > 0 ? x[0] : 0.0; });
constexpr PrimitiveTests kGeluTests = unary_tests("gelu", kFloatTypes, [](Xs x) {
  const double v = x[0];  // jax.nn.gelu(approximate=True)
  return 0.5 * v * (1 + std::tanh(std::sqrt(2 / kPi) * (v + 0.044715 * v * v * v)));
});
constexpr PrimitiveTests kSigmoidTests =
    unary_tests("sigmoid", kFloatTypes, [](Xs x) { return std::exp(x[0]) / (std::exp(x[0]) + 1); });
constexpr PrimitiveTests kAbsTests =
    unary_tests("abs", kNumericTypes, [](Xs x) { return x[0] < 0 ? -x[0] : x[0]; });
constexpr PrimitiveTests kErfTests =
    unary_tests("erf", kFloatTypes, [](Xs x) { return std::erf(x[0]); });

constexpr PrimitiveTests kAddTests =
    binary_tests("add", kNumericTypes, [](Xs x) { return x[0] + x[1]; });
constexpr PrimitiveTests kSubTests =
    binary_tests("subtract", kNumericTypes, [](Xs x) { return x[0] - x[1]; });
constexpr PrimitiveTests kMulTests =
    binary_tests("multiply", kNumericTypes, [](Xs x) { return x[0] * x[1]; });
// Integers divide toward zero.
std::vector<double> divide_reference(const Node& n, std::span<const HostValues> in) {
  std::vector<double> y(in[0].v.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double q = in[0].v[i] / in[1].v[i];
    y[i] = is_floating(n.type.dtype) ? q : std::trunc(q);
  }
  return y;
}
constexpr PrimitiveTests kDivTests{.public_ops = "divide",
                                   .dtypes = kNumericTypes,
                                   .cases = pointwise_cases,
                                   .reference = divide_reference,
                                   .gradient = true,
                                   .domains = {kAnyReal, kNonzero}};
// Whole numbers: ties, whose cotangent is split evenly (central differences give 1/2 too).
constexpr PrimitiveTests kMaxTests =
    binary_tests("maximum", kNumericTypes, [](Xs x) { return x[0] > x[1] ? x[0] : x[1]; },
                 {kSmallWhole, kSmallWhole});
constexpr PrimitiveTests kMinTests =
    binary_tests("minimum", kNumericTypes, [](Xs x) { return x[0] < x[1] ? x[0] : x[1]; },
                 {kSmallWhole, kSmallWhole});
constexpr PrimitiveTests kPowTests =
    binary_tests("power", kFloatTypes, [](Xs x) { return std::exp(x[1] * std::log(x[0])); },
                 {kPositive, kAnyReal});
constexpr PrimitiveTests kEqTests =
    comparison_tests("equal", [](Xs x) { return x[0] == x[1] ? 1.0 : 0.0; });
constexpr PrimitiveTests kNeTests =
    comparison_tests("not_equal", [](Xs x) { return x[0] != x[1] ? 1.0 : 0.0; });
constexpr PrimitiveTests kLtTests =
    comparison_tests("less", [](Xs x) { return x[0] < x[1] ? 1.0 : 0.0; });
constexpr PrimitiveTests kLeTests =
    comparison_tests("less_equal", [](Xs x) { return x[0] <= x[1] ? 1.0 : 0.0; });
constexpr PrimitiveTests kGtTests =
    comparison_tests("greater", [](Xs x) { return x[0] > x[1] ? 1.0 : 0.0; });
constexpr PrimitiveTests kGeTests =
    comparison_tests("greater_equal", [](Xs x) { return x[0] >= x[1] ? 1.0 : 0.0; });

// A bool predicate, then two branches of the dtype.
std::vector<TestCase> select_cases(const Primitive& p, DType dtype) {
  std::vector<TestCase> cases = pointwise_cases(p, dtype);
  for (TestCase& c : cases) c.operands[0].type.dtype = DType::kBool;
  return cases;
}
constexpr PrimitiveTests kSelectTests{.public_ops = "where",
                                      .dtypes = kMovedTypes,
                                      .cases = select_cases,
                                      .elementwise = [](Xs x) { return x[0] != 0 ? x[1] : x[2]; },
                                      .gradient = true};

// What convert takes: the moved types and the two float8 formats.
constexpr DTypeSet kConvertTypes{DType::kF32, DType::kF64,  DType::kBF16,   DType::kI32,
                                 DType::kI64, DType::kBool, DType::kF8E4M3, DType::kF8E5M2};

// From `dtype` to each dtype (values of [-3, 3], so that truncation shows).
std::vector<TestCase> convert_cases(const Primitive&, DType dtype) {
  std::vector<TestCase> cases;
  for (const DType to : kConvertTypes.list()) {
    cases.push_back({ConvertAttrs{to}, {{{Shape{8, 6}, dtype}, {.low = -3, .high = 3}}}});
  }
  return cases;
}
// Floats keep the value (rounded to the result's dtype: within the registry test's tolerance of
// it), integers truncate toward zero, bool is "not zero".
std::vector<double> convert_reference(const Node& n, std::span<const HostValues> in) {
  std::vector<double> y = in[0].v;
  for (double& v : y) {
    if (n.type.dtype == DType::kBool) {
      v = v != 0 ? 1 : 0;
    } else if (!is_floating(n.type.dtype)) {
      v = std::trunc(v);
    }
  }
  return y;
}
constexpr PrimitiveTests kConvertTests{.public_ops = "astype",
                                       .dtypes = kConvertTypes,
                                       .cases = convert_cases,
                                       .reference = convert_reference,
                                       .gradient = true};

// ---- The public functions ---------------------------------------------------------------------

// numpy's broadcast of shapes a and b (of the arrays `x()` and `y()` describe: called only to
// name them when they do not broadcast, as an op's every call passes here).
template <class DescribeX, class DescribeY>
Shape broadcast_shape(const Shape& a, const Shape& b, std::string_view op, const DescribeX& x,
                      const DescribeY& y) {
  const int r = std::max(a.rank(), b.rank());
  std::vector<std::int64_t> out(static_cast<std::size_t>(r));
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      throw SpecError(fmt::format("[{}] shapes {} and {} do not broadcast (dimension {}: {} vs {})",
                                  op, x(), y(), i, da, db));
    }
    out[static_cast<std::size_t>(i)] = da == 1 ? db : da;
  }
  return Shape(out);
}

Array broadcast_to_shape(const Array& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  std::vector<int> dims(static_cast<std::size_t>(x.shape().rank()));
  std::iota(dims.begin(), dims.end(), shape.rank() - x.shape().rank());
  return broadcast_in_dim(x, shape, dims);
}

Array binary_op(const Primitive& op, const Array& a, const Array& b) {
  if (a.dtype() != b.dtype()) {
    throw SpecError(fmt::format("[{}] operands have different dtypes: {} and {} (use astype)",
                                op.name, type_str(a), type_str(b)));
  }
  const Shape shape = broadcast_shape(
      a.shape(), b.shape(), op.name, [&] { return type_str(a); }, [&] { return type_str(b); });
  return apply(op, NoAttrs{}, {broadcast_to_shape(a, shape), broadcast_to_shape(b, shape)});
}

}  // namespace

namespace prim {
constinit const Primitive neg = with_linearity(
    unary("neg", numeric_unary, unary_kernel<IsNumeric, Neg>, neg_vjp, &kNegTests), linear_in_all);
constinit const Primitive exp =
    unary("exp", float_unary, unary_kernel<IsFloating, Exp>, exp_vjp, &kExpTests);
constinit const Primitive log =
    unary("log", float_unary, unary_kernel<IsFloating, Log>, log_vjp, &kLogTests);
constinit const Primitive sqrt =
    unary("sqrt", float_unary, unary_kernel<IsFloating, Sqrt>, sqrt_vjp, &kSqrtTests);
constinit const Primitive rsqrt =
    unary("rsqrt", float_unary, unary_kernel<IsFloating, Rsqrt>, rsqrt_vjp, &kRsqrtTests);
constinit const Primitive sin =
    unary("sin", float_unary, unary_kernel<IsFloating, Sin>, sin_vjp, &kSinTests);
constinit const Primitive cos =
    unary("cos", float_unary, unary_kernel<IsFloating, Cos>, cos_vjp, &kCosTests);
constinit const Primitive tanh =
    unary("tanh", float_unary, unary_kernel<IsFloating, Tanh>, tanh_vjp, &kTanhTests);
constinit const Primitive relu =
    unary("relu", numeric_unary, unary_kernel<IsNumeric, Relu>, relu_vjp, &kReluTests);
constinit const Primitive gelu =
    unary("gelu", float_unary, unary_kernel<IsFloating, Gelu>, gelu_vjp, &kGeluTests);
constinit const Primitive sigmoid =
    unary("sigmoid", float_unary, unary_kernel<IsFloating, Sigmoid>, sigmoid_vjp, &kSigmoidTests);
constinit const Primitive erf =
    unary("erf", float_unary, unary_kernel<IsFloating, Erf>, erf_vjp, &kErfTests);
constinit const Primitive abs =
    unary("abs", numeric_unary, unary_kernel<IsNumeric, Abs>, abs_vjp, &kAbsTests);

constinit const Primitive add = with_linearity(
    binary("add", arithmetic, binary_kernel<IsNumeric, Add>, add_vjp, &kAddTests), linear_in_all);
constinit const Primitive sub = with_linearity(
    binary("sub", arithmetic, binary_kernel<IsNumeric, Sub>, sub_vjp, &kSubTests), linear_in_all);
constinit const Primitive mul = with_linearity(
    binary("mul", arithmetic, binary_kernel<IsNumeric, Mul>, mul_vjp, &kMulTests), linear_in_each);
constinit const Primitive div = with_linearity(
    binary("div", arithmetic, binary_kernel<IsNumeric, Div>, div_vjp, &kDivTests), linear_in_first);
constinit const Primitive max =
    binary("max", arithmetic, binary_kernel<IsNumeric, Max>, max_vjp, &kMaxTests);
constinit const Primitive min =
    binary("min", arithmetic, binary_kernel<IsNumeric, Min>, min_vjp, &kMinTests);
constinit const Primitive pow =
    binary("pow", float_arithmetic, binary_kernel<IsFloating, Pow>, pow_vjp, &kPowTests);
constinit const Primitive eq =
    binary("eq", comparison, binary_kernel<IsNumeric, Eq>, no_gradient, &kEqTests);
constinit const Primitive ne =
    binary("ne", comparison, binary_kernel<IsNumeric, Ne>, no_gradient, &kNeTests);
constinit const Primitive lt =
    binary("lt", comparison, binary_kernel<IsNumeric, Lt>, no_gradient, &kLtTests);
constinit const Primitive le =
    binary("le", comparison, binary_kernel<IsNumeric, Le>, no_gradient, &kLeTests);
constinit const Primitive gt =
    binary("gt", comparison, binary_kernel<IsNumeric, Gt>, no_gradient, &kGtTests);
constinit const Primitive ge =
    binary("ge", comparison, binary_kernel<IsNumeric, Ge>, no_gradient, &kGeTests);

constinit const Primitive select{.name = "select",
                                 .arity = 3,
                                 .infer = select_type,
                                 .factors = pointwise_factors,
                                 .kernel = select_kernel,
                                 .flops = flops_per_result,
                                 .vjp = select_vjp,
                                 .pointwise = true,
                                 .linearity = linear_in_branches,
                                 .tests = &kSelectTests};
constinit const Primitive convert{.name = "convert",
                                  .arity = 1,
                                  .infer = convert_type,
                                  .factors = pointwise_factors,
                                  .kernel = convert_kernel,
                                  .flops = no_flops,
                                  .vjp = convert_vjp,
                                  .pointwise = true,
                                  .linearity = convert_linearity,
                                  .tests = &kConvertTests};
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {
using detail::apply;
using detail::NoAttrs;
namespace prim = detail::prim;

Array neg(const Array& x) { return apply(prim::neg, NoAttrs{}, {x}); }
Array exp(const Array& x) { return apply(prim::exp, NoAttrs{}, {x}); }
Array log(const Array& x) { return apply(prim::log, NoAttrs{}, {x}); }
Array sqrt(const Array& x) { return apply(prim::sqrt, NoAttrs{}, {x}); }
Array rsqrt(const Array& x) { return apply(prim::rsqrt, NoAttrs{}, {x}); }
Array sin(const Array& x) { return apply(prim::sin, NoAttrs{}, {x}); }
Array cos(const Array& x) { return apply(prim::cos, NoAttrs{}, {x}); }
Array tanh(const Array& x) { return apply(prim::tanh, NoAttrs{}, {x}); }
Array relu(const Array& x) { return apply(prim::relu, NoAttrs{}, {x}); }
Array gelu(const Array& x) { return apply(prim::gelu, NoAttrs{}, {x}); }
Array sigmoid(const Array& x) { return apply(prim::sigmoid, NoAttrs{}, {x}); }
Array abs(const Array& x) { return apply(prim::abs, NoAttrs{}, {x}); }
Array erf(const Array& x) { return apply(prim::erf, NoAttrs{}, {x}); }
Array gelu(const Array& x, bool approximate) {
  if (approximate) return gelu(x);
  return x * 0.5 * (erf(x * (1.0 / std::numbers::sqrt2)) + 1.0);  // 0.5 x (1 + erf(x / sqrt 2))
}

Array add(const Array& a, const Array& b) { return detail::binary_op(prim::add, a, b); }
Array subtract(const Array& a, const Array& b) { return detail::binary_op(prim::sub, a, b); }
Array multiply(const Array& a, const Array& b) { return detail::binary_op(prim::mul, a, b); }
Array divide(const Array& a, const Array& b) { return detail::binary_op(prim::div, a, b); }
Array maximum(const Array& a, const Array& b) { return detail::binary_op(prim::max, a, b); }
Array minimum(const Array& a, const Array& b) { return detail::binary_op(prim::min, a, b); }
Array power(const Array& a, const Array& b) { return detail::binary_op(prim::pow, a, b); }
Array equal(const Array& a, const Array& b) { return detail::binary_op(prim::eq, a, b); }
Array not_equal(const Array& a, const Array& b) { return detail::binary_op(prim::ne, a, b); }
Array less(const Array& a, const Array& b) { return detail::binary_op(prim::lt, a, b); }
Array less_equal(const Array& a, const Array& b) { return detail::binary_op(prim::le, a, b); }
Array greater(const Array& a, const Array& b) { return detail::binary_op(prim::gt, a, b); }
Array greater_equal(const Array& a, const Array& b) { return detail::binary_op(prim::ge, a, b); }

Array where(const Array& cond, const Array& a, const Array& b) {
  if (cond.dtype() != DType::kBool) {
    throw SpecError(
        fmt::format("[where] the condition must be bool, got {}", detail::type_str(cond)));
  }
  if (a.dtype() != b.dtype()) {
    throw SpecError(fmt::format("[where] branches have different dtypes: {} and {}",
                                detail::type_str(a), detail::type_str(b)));
  }
  const auto describe = [](const Array& x) { return [&x] { return detail::type_str(x); }; };
  const Shape s1 =
      detail::broadcast_shape(a.shape(), b.shape(), "where", describe(a), describe(b));
  const Shape shape =
      detail::broadcast_shape(cond.shape(), s1, "where", describe(cond), describe(a));
  return apply(prim::select, NoAttrs{},
               {detail::broadcast_to_shape(cond, shape), detail::broadcast_to_shape(a, shape),
                detail::broadcast_to_shape(b, shape)});
}

Array astype(const Array& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return apply(prim::convert, detail::ConvertAttrs{dtype}, {x});
}

Array convert_pending(const Array& x, DType dtype) {
  if (!is_floating(x.dtype()) || !is_floating(dtype)) {
    throw SpecError(fmt::format("[convert_pending] converts between float types, not {} to {}",
                                name(x.dtype()), name(dtype)));
  }
  if (x.dtype() == dtype) return x;
  return apply(prim::convert, detail::ConvertAttrs{dtype, true}, {x});
}

}  // namespace shardplan
