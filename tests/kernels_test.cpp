// Per-device kernels: every op against a reference computed here with plain loops in double.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <string>

#include "primitives.hpp"
#include "shardplan/ops.hpp"
#include "test_util.hpp"
#include "trace.hpp"

namespace shardplan::detail {
namespace {

const std::vector<DType> kFloatTypes = {DType::kF32, DType::kF64, DType::kBF16};
const std::vector<DType> kNumericTypes = {DType::kF32, DType::kF64, DType::kBF16, DType::kI32};
const std::vector<Shape> kShapes = {Shape{}, Shape{7}, Shape{2, 3, 4}};

Node make_node(const Primitive* op) { return Node{.op = op}; }
Node make_node(const Primitive& op) { return Node{.op = &op}; }

// The node the public op `f` records on tracers of these types: its attributes are what the op
// sets. (The kernels below run it on blocks of any dtype.)
Node recorded(const std::function<Array(const std::vector<Array>&)>& f,
              const std::vector<TensorType>& types) {
  TraceContext ctx(Executor(1), Mesh({{"x", 1}}, 1));
  TraceScope scope(&ctx);
  std::vector<Array> xs;
  for (const TensorType& t : types) xs.push_back(ctx.add_argument(t));
  f(xs);
  EXPECT_GT(ctx.graph.size(), types.size()) << "the op recorded no node";
  return ctx.graph.nodes.back();
}
TensorType f32(const Shape& s) { return TensorType{s, DType::kF32}; }

// Runs the kernel on host tensors into a fresh result of `shape` and `dtype`.
Tensor run(const Node& node, const std::vector<const Tensor*>& in, const Shape& shape, DType dtype,
           std::vector<std::int64_t> offset = {}) {
  std::vector<ConstBlock> blocks;
  for (const Tensor* t : in) blocks.push_back({t->bytes(), t->shape(), t->dtype()});
  Tensor out(shape, dtype);
  if (offset.empty()) offset.assign(static_cast<std::size_t>(shape.rank()), 0);
  const MutBlock out_block{out.bytes(), out.shape(), dtype};
  node.op->kernel(KernelArgs{node, blocks, out_block, offset});
  return out;
}

// A tensor holding `values` (bool: nonzero is 1); ints truncate, bf16 rounds.
Tensor make(const Shape& shape, DType dtype, const std::vector<double>& values) {
  Tensor t(shape, dtype);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kBool) {
      t.bytes()[i] = static_cast<std::byte>(values[i] != 0 ? 1 : 0);
    } else {
      t.set(static_cast<std::int64_t>(i), values[i]);
    }
  }
  return t;
}

// Random values in [lo, hi), as stored in `dtype`.
Tensor random(const Shape& shape, DType dtype, std::uint64_t seed, double lo, double hi) {
  return Tensor::uniform(shape, dtype, seed, lo, hi);
}

// Random multiples of 1/4 in [-4, 4]: exact in every float dtype, and so are their small sums.
Tensor quarters(const Shape& shape, DType dtype, std::uint64_t seed) {
  std::vector<double> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = std::floor(random_uniform(seed, i) * 33) / 4 - 4;
  }
  return make(shape, dtype, v);
}

// The elements as doubles; bool bytes as 0 or 1.
std::vector<double> read(const Tensor& t) {
  if (t.dtype() != DType::kBool) return t.to_doubles();
  std::vector<double> v;
  for (std::int64_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<double>(t.bytes()[i]));
  return v;
}

double tolerance(DType dtype, double want) {
  switch (dtype) {
    case DType::kF64:
      return 1e-12 * (1 + std::abs(want));
    case DType::kF32:
      return 1e-5 * (1 + std::abs(want));
    case DType::kBF16:  // one rounding to 8 significant bits
      return 0x1p-8 * std::abs(want) + 1e-6;
    default:
      return 0;
  }
}

void expect_close(const Tensor& got, const std::vector<double>& want) {
  const std::vector<double> v = read(got);
  ASSERT_EQ(v.size(), want.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(v[i])) << "element " << i;
    } else {
      EXPECT_NEAR(v[i], want[i], tolerance(got.dtype(), want[i])) << "element " << i;
    }
  }
}

std::vector<std::int64_t> unravel(std::int64_t flat, const Shape& s) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[d] = flat % s[d];
    flat /= s[d];
  }
  return idx;
}

std::int64_t ravel(const std::vector<std::int64_t>& idx, const Shape& s) {
  std::int64_t flat = 0;
  for (int d = 0; d < s.rank(); ++d) flat = flat * s[d] + idx[d];
  return flat;
}

std::vector<double> rounded(const Tensor& t) {
  std::vector<double> v = t.to_doubles();
  for (double& e : v) e = std::round(e);
  return v;
}

std::string label(DType dtype, const Shape& shape) {
  return std::string(name(dtype)) + shape.to_string();
}

// ---------------------------------------------------------------------------------------------
// Elementwise

struct UnaryCase {
  const Primitive* op;
  const char* name;
  double (*ref)(double);
  double lo, hi;  // input range
};

const std::vector<UnaryCase> kUnaryCases = {
    {&prim::neg, "neg", [](double x) { return -x; }, -3, 3},
    {&prim::exp, "exp", [](double x) { return std::exp(x); }, -3, 3},
    {&prim::log, "log", [](double x) { return std::log(x); }, 0.1, 5},
    {&prim::sqrt, "sqrt", [](double x) { return std::sqrt(x); }, 0, 5},
    {&prim::rsqrt, "rsqrt", [](double x) { return 1 / std::sqrt(x); }, 0.1, 5},
    {&prim::sin, "sin", [](double x) { return std::sin(x); }, -3, 3},
    {&prim::cos, "cos", [](double x) { return std::cos(x); }, -3, 3},
    {&prim::tanh, "tanh", [](double x) { return std::tanh(x); }, -3, 3},
    {&prim::relu, "relu", [](double x) { return x > 0 ? x : 0; }, -3, 3},
    {&prim::gelu, "gelu",
     [](double x) {
       const double k = std::sqrt(2 / std::numbers::pi);
       return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
     },
     -3, 3},
    {&prim::sigmoid, "sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, -3, 3},
    {&prim::abs, "abs", [](double x) { return std::abs(x); }, -3, 3},
};

TEST(Kernels, UnaryOpsMatchTheReferenceOnFloatTypes) {
  for (const UnaryCase& u : kUnaryCases) {
    for (DType dtype : kFloatTypes) {
      for (const Shape& shape : kShapes) {
        SCOPED_TRACE(std::string(u.name) + " " + label(dtype, shape));
        const Tensor x = random(shape, dtype, 1, u.lo, u.hi);
        std::vector<double> want;
        for (double v : x.to_doubles()) want.push_back(u.ref(v));
        expect_close(run(make_node(u.op), {&x}, shape, dtype), want);
      }
    }
  }
}

TEST(Kernels, NegAbsReluOnIntegers) {
  for (const UnaryCase& u : kUnaryCases) {
    if (u.op != &prim::neg && u.op != &prim::abs && u.op != &prim::relu) continue;
    for (DType dtype : {DType::kI32, DType::kI64}) {
      SCOPED_TRACE(std::string(u.name) + " " + std::string(name(dtype)));
      const Tensor x = random(Shape{3, 5}, dtype, 2, -50, 50);
      std::vector<double> want;
      for (double v : x.to_doubles()) want.push_back(u.ref(v));
      EXPECT_EQ(run(make_node(u.op), {&x}, x.shape(), dtype).to_doubles(), want);
    }
  }
}

TEST(Kernels, FloatOnlyUnaryOpsRejectIntegers) {
  const Tensor x = make(Shape{2, 3}, DType::kI32, {1, 2, 3, 4, 5, 6});
  EXPECT_THROW_WITH(run(make_node(prim::exp), {&x}, x.shape(), DType::kI32), SpecError,
                    "[kernel] exp", "dtype i32", "i32[2, 3]");
  const Tensor y = make(Shape{4}, DType::kI64, {1, 2, 3, 4});
  EXPECT_THROW_WITH(run(make_node(prim::gelu), {&y}, y.shape(), DType::kI64), SpecError, "gelu",
                    "i64", "[4]");
}

struct BinaryCase {
  const Primitive* op;
  const char* name;
  double (*ref)(double, double);
};

const std::vector<BinaryCase> kArithmeticCases = {
    {&prim::add, "add", [](double a, double b) { return a + b; }},
    {&prim::sub, "sub", [](double a, double b) { return a - b; }},
    {&prim::mul, "mul", [](double a, double b) { return a * b; }},
    {&prim::div, "div", [](double a, double b) { return a / b; }},
    {&prim::max, "max", [](double a, double b) { return a > b ? a : b; }},
    {&prim::min, "min", [](double a, double b) { return a < b ? a : b; }},
    {&prim::pow, "pow", [](double a, double b) { return std::pow(a, b); }},
};

TEST(Kernels, BinaryArithmeticOnFloatTypes) {
  for (const BinaryCase& b : kArithmeticCases) {
    for (DType dtype : kFloatTypes) {
      for (const Shape& shape : kShapes) {
        SCOPED_TRACE(std::string(b.name) + " " + label(dtype, shape));
        // Positive operands keep div and pow well away from poles and complex results.
        const Tensor x = random(shape, dtype, 3, 0.5, 2);
        const Tensor y = random(shape, dtype, 4, 0.5, 2);
        std::vector<double> want;
        for (std::int64_t i = 0; i < x.numel(); ++i) want.push_back(b.ref(x.get(i), y.get(i)));
        expect_close(run(make_node(b.op), {&x, &y}, shape, dtype), want);
      }
    }
  }
}

TEST(Kernels, BinaryArithmeticOnIntegersTruncatesDivisionTowardZero) {
  for (DType dtype : {DType::kI32, DType::kI64}) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = make(Shape{2, 3}, dtype, {-7, 7, -7, 9, 0, 100});
    const Tensor y = make(Shape{2, 3}, dtype, {2, -2, -2, 3, 5, -7});
    const auto get = [&](const Primitive* op) {
      return run(make_node(op), {&x, &y}, x.shape(), dtype);
    };
    EXPECT_EQ(get(&prim::add).to_doubles(), (std::vector<double>{-5, 5, -9, 12, 5, 93}));
    EXPECT_EQ(get(&prim::sub).to_doubles(), (std::vector<double>{-9, 9, -5, 6, -5, 107}));
    EXPECT_EQ(get(&prim::mul).to_doubles(), (std::vector<double>{-14, -14, 14, 27, 0, -700}));
    EXPECT_EQ(get(&prim::div).to_doubles(), (std::vector<double>{-3, -3, 3, 3, 0, -14}));
    EXPECT_EQ(get(&prim::max).to_doubles(), (std::vector<double>{2, 7, -2, 9, 5, 100}));
    EXPECT_EQ(get(&prim::min).to_doubles(), (std::vector<double>{-7, -2, -7, 3, 0, -7}));
  }
}

TEST(Kernels, IntegerDivisionByZeroAndOverflowDoNotTrap) {
  constexpr double kMin = std::numeric_limits<std::int32_t>::min();
  const Tensor x = make(Shape{3}, DType::kI32, {5, -5, kMin});
  const Tensor y = make(Shape{3}, DType::kI32, {0, 0, -1});
  EXPECT_EQ(run(make_node(prim::div), {&x, &y}, x.shape(), DType::kI32).to_doubles(),
            (std::vector<double>{-1, -1, kMin}));
}

TEST(Kernels, MaxAndMinPropagateNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = make(Shape{3}, DType::kF32, {nan, 1, 2});
  const Tensor y = make(Shape{3}, DType::kF32, {1, nan, 3});
  expect_close(run(make_node(prim::max), {&x, &y}, x.shape(), DType::kF32), {nan, nan, 3});
  expect_close(run(make_node(prim::min), {&x, &y}, x.shape(), DType::kF32), {nan, nan, 2});
}

TEST(Kernels, PowRejectsIntegers) {
  const Tensor x = make(Shape{3}, DType::kI32, {1, 2, 3});
  EXPECT_THROW_WITH(run(make_node(prim::pow), {&x, &x}, x.shape(), DType::kI32), SpecError,
                    "[kernel] pow", "dtype i32", "operands (i32[3], i32[3])", "result i32[3]");
}

TEST(Kernels, ComparisonsGiveBoolBytes) {
  const std::vector<BinaryCase> cases = {
      {&prim::eq, "eq", [](double a, double b) -> double { return a == b; }},
      {&prim::ne, "ne", [](double a, double b) -> double { return a != b; }},
      {&prim::lt, "lt", [](double a, double b) -> double { return a < b; }},
      {&prim::le, "le", [](double a, double b) -> double { return a <= b; }},
      {&prim::gt, "gt", [](double a, double b) -> double { return a > b; }},
      {&prim::ge, "ge", [](double a, double b) -> double { return a >= b; }},
  };
  for (const BinaryCase& b : cases) {
    for (DType dtype : kNumericTypes) {
      for (const Shape& shape : kShapes) {
        SCOPED_TRACE(std::string(b.name) + " " + label(dtype, shape));
        // Few distinct values, so that equal pairs occur.
        const Tensor xi = make(shape, dtype, rounded(random(shape, DType::kF64, 5, -2, 2)));
        const Tensor yi = make(shape, dtype, rounded(random(shape, DType::kF64, 6, -2, 2)));
        std::vector<double> want;
        for (std::int64_t i = 0; i < xi.numel(); ++i) want.push_back(b.ref(xi.get(i), yi.get(i)));
        EXPECT_EQ(read(run(make_node(b.op), {&xi, &yi}, shape, DType::kBool)), want);
      }
    }
  }
}

TEST(Kernels, SelectPicksByPredicate) {
  for (DType dtype : kNumericTypes) {
    for (const Shape& shape : kShapes) {
      SCOPED_TRACE(label(dtype, shape));
      const Tensor pred = make(shape, DType::kBool, read(random(shape, DType::kI32, 7, 0, 2)));
      const Tensor a = random(shape, dtype, 8, -10, 10);
      const Tensor b = random(shape, dtype, 9, -10, 10);
      std::vector<double> want;
      for (std::int64_t i = 0; i < a.numel(); ++i) {
        want.push_back(pred.bytes()[i] != std::byte{0} ? a.get(i) : b.get(i));
      }
      EXPECT_EQ(run(make_node(prim::select), {&pred, &a, &b}, shape, dtype).to_doubles(), want);
    }
  }
}

TEST(Kernels, ConvertBetweenEveryPairOfTypes) {
  const std::vector<DType> types = {DType::kF32, DType::kF64, DType::kBF16,
                                    DType::kI32, DType::kI64, DType::kBool};
  // Exact in bf16, so that only truncation toward zero and != 0 change values.
  const std::vector<double> values = {-2.75, -0.5, 0, 1.5, 3.875, 100.5};
  for (DType from : types) {
    const Tensor x = make(Shape{2, 3}, from, values);
    for (DType to : types) {
      SCOPED_TRACE(std::string(name(from)) + " -> " + std::string(name(to)));
      std::vector<double> want;
      for (double v : read(x)) {
        if (to == DType::kBool) {
          want.push_back(v != 0 ? 1 : 0);
        } else if (to == DType::kI32 || to == DType::kI64) {
          want.push_back(std::trunc(v));
        } else {
          want.push_back(v);
        }
      }
      EXPECT_EQ(read(run(make_node(prim::convert), {&x}, x.shape(), to)), want);
    }
  }
}

TEST(Kernels, ConvertSaturatesOutOfRangeFloatsAndMapsNaNToZero) {
  const Tensor x =
      make(Shape{4}, DType::kF64, {1e10, -1e10, std::numeric_limits<double>::quiet_NaN(), -3.9});
  EXPECT_EQ(run(make_node(prim::convert), {&x}, x.shape(), DType::kI32).to_doubles(),
            (std::vector<double>{2147483647, -2147483648.0, 0, -3}));
}

TEST(Kernels, ConvertRejectsF16) {
  const Tensor x(Shape{2}, DType::kF16);
  EXPECT_THROW_WITH(run(make_node(prim::convert), {&x}, x.shape(), DType::kF32), SpecError,
                    "[kernel] convert", "dtype f16", "f16[2]");
}

// ---------------------------------------------------------------------------------------------
// dot_general

Node dot_node(const DotDims& d, const Shape& lhs, const Shape& rhs) {
  return recorded([&](const std::vector<Array>& x) { return dot_general(x[0], x[1], d); },
                  {f32(lhs), f32(rhs)});
}

// Dimensions of `s` not in a or b, in order.
std::vector<int> others(const Shape& s, const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> v;
  for (int d = 0; d < s.rank(); ++d) {
    if (std::count(a.begin(), a.end(), d) == 0 && std::count(b.begin(), b.end(), d) == 0) {
      v.push_back(d);
    }
  }
  return v;
}

// The result, element by element: out index = (batch, lhs free, rhs free); sum over every
// contracting index.
std::vector<double> dot_reference(const Tensor& lhs, const Tensor& rhs, const DotDims& d,
                                  const Shape& out) {
  const std::vector<int> lf = others(lhs.shape(), d.lhs_batch, d.lhs_contract);
  const std::vector<int> rf = others(rhs.shape(), d.rhs_batch, d.rhs_contract);
  std::vector<std::int64_t> contract_dims;
  for (int a : d.lhs_contract) contract_dims.push_back(lhs.shape()[a]);
  const Shape contract(contract_dims);
  std::vector<double> want;
  for (std::int64_t o = 0; o < out.numel(); ++o) {
    const std::vector<std::int64_t> oi = unravel(o, out);
    std::vector<std::int64_t> li(static_cast<std::size_t>(lhs.shape().rank()));
    std::vector<std::int64_t> ri(static_cast<std::size_t>(rhs.shape().rank()));
    std::size_t at = 0;
    for (std::size_t i = 0; i < d.lhs_batch.size(); ++i, ++at) {
      li[d.lhs_batch[i]] = oi[at];
      ri[d.rhs_batch[i]] = oi[at];
    }
    for (int a : lf) li[a] = oi[at++];
    for (int a : rf) ri[a] = oi[at++];
    double sum = 0;
    for (std::int64_t k = 0; k < contract.numel(); ++k) {
      const std::vector<std::int64_t> ki = unravel(k, contract);
      for (std::size_t j = 0; j < ki.size(); ++j) {
        li[d.lhs_contract[j]] = ki[j];
        ri[d.rhs_contract[j]] = ki[j];
      }
      sum += lhs.get(ravel(li, lhs.shape())) * rhs.get(ravel(ri, rhs.shape()));
    }
    want.push_back(sum);
  }
  return want;
}

void check_dot(const DotDims& dims, const Shape& lhs_shape, const Shape& rhs_shape,
               const Shape& out_shape) {
  const Node node = dot_node(dims, lhs_shape, rhs_shape);
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(label(dtype, lhs_shape) + " x " + label(dtype, rhs_shape));
    const Tensor lhs = quarters(lhs_shape, dtype, 10);
    const Tensor rhs = quarters(rhs_shape, dtype, 11);
    expect_close(run(node, {&lhs, &rhs}, out_shape, dtype),
                 dot_reference(lhs, rhs, dims, out_shape));
  }
}

TEST(Kernels, DotIsAMatmul) {
  check_dot(DotDims{{}, {}, {1}, {0}}, Shape{3, 4}, Shape{4, 5}, Shape{3, 5});
  check_dot(DotDims{{}, {}, {1}, {1}}, Shape{3, 4}, Shape{5, 4}, Shape{3, 5});  // x @ w.T
  check_dot(DotDims{{}, {}, {0}, {0}}, Shape{4, 3}, Shape{4, 5}, Shape{3, 5});  // x.T @ w
}

TEST(Kernels, DotWithBatchAndContractingDimsAnywhere) {
  // lhs [k=3, b=2, m=4], rhs [n=5, k=3, b=2] -> [b, m, n].
  check_dot(DotDims{{1}, {2}, {0}, {1}}, Shape{3, 2, 4}, Shape{5, 3, 2}, Shape{2, 4, 5});
  // Two batch dims given in the non-sorted order (2, 0): result batch dims follow it.
  check_dot(DotDims{{2, 0}, {0, 1}, {1}, {2}}, Shape{2, 3, 4}, Shape{4, 2, 3}, Shape{4, 2});
}

TEST(Kernels, DotWithSeveralContractingDimsPairsThemInOrder) {
  // lhs [2, 3, 4, 5] contracts (3, 1) with rhs [5, 6, 3] dims (0, 2): sizes 5 and 3.
  check_dot(DotDims{{}, {}, {3, 1}, {0, 2}}, Shape{2, 3, 4, 5}, Shape{5, 6, 3}, Shape{2, 4, 6});
}

TEST(Kernels, DotOfVectorsIsAScalarAndEmptyContractionIsZero) {
  check_dot(DotDims{{}, {}, {0}, {0}}, Shape{6}, Shape{6}, Shape{});
  check_dot(DotDims{{}, {}, {}, {}}, Shape{3}, Shape{2}, Shape{3, 2});  // outer product
  check_dot(DotDims{{}, {}, {1}, {0}}, Shape{3, 0}, Shape{0, 2}, Shape{3, 2});
}

TEST(Kernels, DotIsBitwiseDeterministic) {
  const Tensor lhs = random(Shape{64, 96}, DType::kF32, 12, -1, 1);
  const Tensor rhs = random(Shape{80, 96}, DType::kF32, 13, -1, 1);
  const Node node = dot_node(DotDims{{}, {}, {1}, {1}}, Shape{64, 96}, Shape{80, 96});
  const Tensor first = run(node, {&lhs, &rhs}, Shape{64, 80}, DType::kF32);
  EXPECT_TRUE(first == run(node, {&lhs, &rhs}, Shape{64, 80}, DType::kF32));
}

TEST(Kernels, DotRejectsU8) {
  const Tensor x(Shape{2, 2}, DType::kU8);
  EXPECT_THROW_WITH(run(dot_node(DotDims{{}, {}, {1}, {0}}, Shape{2, 2}, Shape{2, 2}), {&x, &x},
                        Shape{2, 2}, DType::kU8),
                    SpecError, "[kernel] dot_general", "dtype u8", "u8[2, 2]");
}

// ---------------------------------------------------------------------------------------------
// Reductions

TEST(Kernels, ReductionsOverAnySetOfAxes) {
  const Shape shape{2, 3, 4};
  const std::vector<std::vector<int>> axes_sets = {{}, {0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (const Primitive* op : {&prim::reduce_sum, &prim::reduce_max, &prim::reduce_min}) {
    for (DType dtype : kNumericTypes) {
      const Tensor x = quarters(shape, dtype, 14);
      for (const std::vector<int>& axes : axes_sets) {
        std::vector<std::int64_t> kept;
        for (int d = 0; d < 3; ++d) {
          if (std::count(axes.begin(), axes.end(), d) == 0) kept.push_back(shape[d]);
        }
        const Shape out(kept);
        SCOPED_TRACE(label(dtype, shape) + " -> " + out.to_string() + " op " +
                     std::string(op->name));
        std::vector<double> want(static_cast<std::size_t>(out.numel()),
                                 op == &prim::reduce_sum   ? 0.0
                                 : op == &prim::reduce_max ? -HUGE_VAL
                                                           : HUGE_VAL);
        for (std::int64_t i = 0; i < x.numel(); ++i) {
          const std::vector<std::int64_t> xi = unravel(i, shape);
          std::vector<std::int64_t> oi;
          for (int d = 0; d < 3; ++d) {
            if (std::count(axes.begin(), axes.end(), d) == 0) oi.push_back(xi[d]);
          }
          double& w = want[static_cast<std::size_t>(ravel(oi, out))];
          const double v = x.get(i);
          w = op == &prim::reduce_sum   ? w + v
              : op == &prim::reduce_max ? std::max(w, v)
                                        : std::min(w, v);
        }
        Node node =
            recorded([&](const std::vector<Array>& a) { return sum(a[0], axes); }, {f32(shape)});
        node.op = op;
        expect_close(run(node, {&x}, out, dtype), want);
      }
    }
  }
}

// A sum node over `axes` of an f32 operand of `shape` (the kernel runs it on any dtype).
Node sum_node(const Shape& shape, const std::vector<int>& axes) {
  return recorded([&](const std::vector<Array>& a) { return sum(a[0], axes); }, {f32(shape)});
}

// x with its dimensions permuted: result dimension d is x's dimension perm[d].
Tensor permuted(const Tensor& x, const std::vector<int>& perm) {
  std::vector<std::int64_t> dims;
  for (const int p : perm) dims.push_back(x.shape()[p]);
  Tensor y(Shape(dims), x.dtype());
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const std::vector<std::int64_t> yi = unravel(i, y.shape());
    std::vector<std::int64_t> xi(yi.size());
    for (std::size_t d = 0; d < perm.size(); ++d) xi[static_cast<std::size_t>(perm[d])] = yi[d];
    y.set(i, x.get(ravel(xi, x.shape())));
  }
  return y;
}

TEST(Kernels, SumsArePairwiseAndAsAccurateAsTheirFloatsAllow) {
  // 2^22 float32 values in [0, 1): a left-to-right float sum is off by ~1e-5 relative here (each
  // addition rounds at the size of the running total); a pairwise sum by a few roundings.
  const Shape shape{std::int64_t{1} << 22};
  const Tensor x = random(shape, DType::kF32, 21, 0, 1);
  long double exact = 0;
  float naive = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    exact += static_cast<long double>(x.data<float>()[i]);
    naive += x.data<float>()[i];
  }
  const double got = run(sum_node(shape, {0}), {&x}, Shape{}, DType::kF32).get(0);
  const double relative = std::abs(got - static_cast<double>(exact)) / static_cast<double>(exact);
  const double naive_relative = std::abs(static_cast<double>(naive) - static_cast<double>(exact)) /
                                static_cast<double>(exact);
  EXPECT_LT(relative, 2.5e-7) << "pairwise sum " << got << ", exact " << static_cast<double>(exact);
  EXPECT_GT(naive_relative, 10 * relative) << "the data do not tell the two summations apart";
}

TEST(Kernels, EverySumPathAddsInTheSameOrderBitwise) {
  // reduce_sum has three paths: a contiguous run (the last axes), a cache line of adjacent runs
  // at once (leading axes; 16 f32 lanes plus a scalar tail) and a gathered run (axes that are not
  // consecutive). Laying the same runs out for another path must give the same bits.
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF64}) {
    SCOPED_TRACE(std::string(name(dtype)));
    // [300, 37] over axis 0 (lanes and tail) == its transpose [37, 300] over axis 1 (contiguous).
    const Tensor a = random(Shape{300, 37}, dtype, 22, -1, 1);
    const Tensor by_lanes = run(sum_node(a.shape(), {0}), {&a}, Shape{37}, dtype);
    const Tensor at = permuted(a, {1, 0});
    EXPECT_TRUE(by_lanes == run(sum_node(at.shape(), {1}), {&at}, Shape{37}, dtype));
    // [20, 300, 13] over axes {0, 2} (gathered, runs of 260 > one block) == its permutation
    // [300, 20, 13] over axes {1, 2} (contiguous runs in the same order).
    const Tensor b = random(Shape{20, 300, 13}, dtype, 23, -1, 1);
    const Tensor gathered = run(sum_node(b.shape(), {0, 2}), {&b}, Shape{300}, dtype);
    const Tensor bt = permuted(b, {1, 0, 2});
    EXPECT_TRUE(gathered == run(sum_node(bt.shape(), {1, 2}), {&bt}, Shape{300}, dtype));
  }
}

TEST(Kernels, SumsOverLeadingAxesMatchTheReferenceForEveryType) {
  // The lane path for each element size (16 f32, 32 bf16, 8 f64, 16 i32 lanes) with a tail.
  const Shape shape{3, 150, 41};
  for (const DType dtype : kNumericTypes) {
    SCOPED_TRACE(std::string(name(dtype)));
    const Tensor x = quarters(shape, dtype, 24);
    std::vector<double> want(static_cast<std::size_t>(3 * 41), 0.0);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const auto xi = unravel(i, shape);
      want[static_cast<std::size_t>(xi[0] * 41 + xi[2])] += x.get(i);
    }
    expect_close(run(sum_node(shape, {1}), {&x}, Shape{3, 41}, dtype), want);
  }
}

TEST(Kernels, SumOfAScalarIsItself) {
  const Tensor x = make(Shape{}, DType::kF64, {2.5});
  const Node node =
      recorded([](const std::vector<Array>& a) { return sum(a[0], {}); }, {f32(Shape{})});
  EXPECT_EQ(run(node, {&x}, Shape{}, DType::kF64).get(0), 2.5);
}

TEST(Kernels, EmptyReductionsGiveTheIdentity) {
  const Tensor x(Shape{3, 0}, DType::kF32);
  Node node =
      recorded([](const std::vector<Array>& a) { return sum(a[0], {1}); }, {f32(Shape{3, 0})});
  EXPECT_EQ(run(node, {&x}, Shape{3}, DType::kF32).to_doubles(), (std::vector<double>{0, 0, 0}));
  node.op = &prim::reduce_max;
  EXPECT_EQ(run(node, {&x}, Shape{3}, DType::kF32).get(0), -HUGE_VAL);
}

// ---------------------------------------------------------------------------------------------
// Data movement

TEST(Kernels, ReshapeKeepsRowMajorOrder) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = random(Shape{2, 3, 4}, dtype, 15, -9, 9);
    EXPECT_EQ(run(make_node(prim::reshape), {&x}, Shape{6, 4}, dtype).to_doubles(), x.to_doubles());
    const Tensor s = make(Shape{}, dtype, {3});
    EXPECT_EQ(run(make_node(prim::reshape), {&s}, Shape{1, 1}, dtype).to_doubles(),
              (std::vector<double>{3}));
  }
}

TEST(Kernels, TransposeByPermutation) {
  for (DType dtype : kNumericTypes) {
    for (const std::vector<int>& perm : std::vector<std::vector<int>>{{2, 0, 1}, {1, 2, 0}}) {
      SCOPED_TRACE(name(dtype));
      const Shape in_shape{2, 3, 4};
      const Shape out_shape{in_shape[perm[0]], in_shape[perm[1]], in_shape[perm[2]]};
      const Tensor x = random(in_shape, dtype, 16, -9, 9);
      std::vector<double> want;
      for (std::int64_t o = 0; o < out_shape.numel(); ++o) {
        const std::vector<std::int64_t> oi = unravel(o, out_shape);
        std::vector<std::int64_t> xi(3);
        for (int d = 0; d < 3; ++d) xi[perm[d]] = oi[d];
        want.push_back(x.get(ravel(xi, in_shape)));
      }
      const Node node = recorded([&](const std::vector<Array>& a) { return transpose(a[0], perm); },
                                 {f32(in_shape)});
      EXPECT_EQ(run(node, {&x}, out_shape, dtype).to_doubles(), want);
    }
  }
  const Tensor s = make(Shape{}, DType::kF32, {4});
  const Node scalar =
      recorded([](const std::vector<Array>& a) { return transpose(a[0], {}); }, {f32(Shape{})});
  EXPECT_EQ(run(scalar, {&s}, Shape{}, DType::kF32).get(0), 4.0);
}

TEST(Kernels, BroadcastInDim) {
  struct Case {
    Shape in, out;
    std::vector<int> axes;
  };
  const std::vector<Case> cases = {
      {Shape{3}, Shape{2, 3, 4}, {1}},        // new leading and trailing dims
      {Shape{1, 4}, Shape{3, 2, 4}, {0, 2}},  // a size-1 dim repeated, one new dim
      {Shape{}, Shape{2, 3}, {}},             // a scalar
      {Shape{2, 3}, Shape{2, 3}, {0, 1}},     // nothing to do
  };
  for (DType dtype : kNumericTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(label(dtype, c.in) + " -> " + c.out.to_string());
      const Tensor x = random(c.in, dtype, 17, -9, 9);
      std::vector<double> want;
      for (std::int64_t o = 0; o < c.out.numel(); ++o) {
        const std::vector<std::int64_t> oi = unravel(o, c.out);
        std::vector<std::int64_t> xi;
        for (int d = 0; d < c.in.rank(); ++d) xi.push_back(c.in[d] == 1 ? 0 : oi[c.axes[d]]);
        want.push_back(x.get(ravel(xi, c.in)));
      }
      // broadcast_in_dim records nothing when it has nothing to do: the same attributes are
      // recorded from an operand with a size-1 leading dimension.
      std::vector<std::int64_t> recorded_in = c.in.dims();
      if (c.in == c.out) recorded_in[0] = 1;
      const Node node = recorded(
          [&](const std::vector<Array>& a) { return broadcast_in_dim(a[0], c.out, c.axes); },
          {f32(Shape(recorded_in))});
      EXPECT_EQ(run(node, {&x}, c.out, dtype).to_doubles(), want);
    }
  }
}

TEST(Kernels, SliceWithStartsAndLimits) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const Shape in_shape{4, 5, 6};
    const Tensor x = random(in_shape, dtype, 18, -9, 9);
    const std::vector<std::int64_t> starts = {1, 0, 2};
    const Node node = recorded(
        [&](const std::vector<Array>& a) {
          return slice(a[0], starts, {3, 5, 5});
        },
        {f32(in_shape)});
    const Shape out_shape{2, 5, 3};
    std::vector<double> want;
    for (std::int64_t o = 0; o < out_shape.numel(); ++o) {
      std::vector<std::int64_t> xi = unravel(o, out_shape);
      for (int d = 0; d < 3; ++d) xi[d] += starts[d];
      want.push_back(x.get(ravel(xi, in_shape)));
    }
    EXPECT_EQ(run(node, {&x}, out_shape, dtype).to_doubles(), want);
  }
  const Tensor s = make(Shape{}, DType::kI32, {5});
  const Node scalar =
      recorded([](const std::vector<Array>& a) { return slice(a[0], {}, {}); }, {f32(Shape{})});
  EXPECT_EQ(run(scalar, {&s}, Shape{}, DType::kI32).get(0), 5.0);
}

TEST(Kernels, ConcatAlongAnAxis) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const std::vector<Tensor> parts = {random(Shape{2, 1, 3}, dtype, 19, -9, 9),
                                       random(Shape{2, 4, 3}, dtype, 20, -9, 9),
                                       random(Shape{2, 2, 3}, dtype, 21, -9, 9)};
    const Shape out_shape{2, 7, 3};
    std::vector<double> want;
    for (std::int64_t o = 0; o < out_shape.numel(); ++o) {
      std::vector<std::int64_t> oi = unravel(o, out_shape);
      std::size_t p = 0;
      while (oi[1] >= parts[p].shape()[1]) oi[1] -= parts[p++].shape()[1];
      want.push_back(parts[p].get(ravel(oi, parts[p].shape())));
    }
    const Node node = recorded([](const std::vector<Array>& a) { return concatenate(a, 1); },
                               {f32(Shape{2, 1, 3}), f32(Shape{2, 4, 3}), f32(Shape{2, 2, 3})});
    EXPECT_EQ(run(node, {&parts[0], &parts[1], &parts[2]}, out_shape, dtype).to_doubles(), want);
  }
  const Tensor a = make(Shape{2}, DType::kF32, {1, 2});
  const Tensor b = make(Shape{1}, DType::kF32, {3});
  const Node flat = recorded([](const std::vector<Array>& xs) { return concatenate(xs, 0); },
                             {f32(Shape{2}), f32(Shape{1}), f32(Shape{2})});
  EXPECT_EQ(run(flat, {&a, &b, &a}, Shape{5}, DType::kF32).to_doubles(),
            (std::vector<double>{1, 2, 3, 1, 2}));
}

// out[pre, j..., post] = x[pre, clamp(indices[j...]), post].
std::vector<double> take_reference(const Tensor& x, const Tensor& indices, int axis,
                                   const Shape& out) {
  const int ri = indices.shape().rank();
  std::vector<double> want;
  for (std::int64_t o = 0; o < out.numel(); ++o) {
    const std::vector<std::int64_t> oi = unravel(o, out);
    const std::vector<std::int64_t> ji(oi.begin() + axis, oi.begin() + axis + ri);
    const auto k = static_cast<std::int64_t>(indices.get(ravel(ji, indices.shape())));
    std::vector<std::int64_t> xi(oi.begin(), oi.begin() + axis);
    xi.push_back(std::clamp<std::int64_t>(k, 0, x.shape()[axis] - 1));
    xi.insert(xi.end(), oi.begin() + axis + ri, oi.end());
    want.push_back(x.get(ravel(xi, x.shape())));
  }
  return want;
}

TEST(Kernels, TakeAlongAnAxisClampsOutOfRangeIndices) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = random(Shape{4, 5}, dtype, 22, -9, 9);
    const Tensor indices = make(Shape{4}, DType::kI32, {2, -1, 7, 0});
    const Node node = recorded([](const std::vector<Array>& a) { return take(a[0], a[1], 0); },
                               {f32(Shape{4, 5}), TensorType{Shape{4}, DType::kI32}});
    const Tensor out = run(node, {&x, &indices}, Shape{4, 5}, dtype);
    EXPECT_EQ(out.to_doubles(), take_reference(x, indices, 0, Shape{4, 5}));
    EXPECT_EQ(out.get(5), x.get(0));    // -1 -> 0
    EXPECT_EQ(out.get(10), x.get(15));  // 7 -> 3
  }
}

TEST(Kernels, TakeWithTwoDimensionalIndices) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = random(Shape{3, 4, 5}, dtype, 23, -9, 9);
    const Tensor indices = make(Shape{2, 3}, DType::kI32, {3, 0, 1, 1, 2, 3});
    const auto take_node = [](int axis) {
      return recorded([&](const std::vector<Array>& a) { return take(a[0], a[1], axis); },
                      {f32(Shape{3, 4, 5}), TensorType{Shape{2, 3}, DType::kI32}});
    };
    Node node = take_node(1);
    const Shape out_shape{3, 2, 3, 5};
    EXPECT_EQ(run(node, {&x, &indices}, out_shape, dtype).to_doubles(),
              take_reference(x, indices, 1, out_shape));
    node = take_node(2);  // the last axis: single elements
    const Shape last{3, 4, 2, 3};
    EXPECT_EQ(run(node, {&x, &indices}, last, dtype).to_doubles(),
              take_reference(x, indices, 2, last));
  }
}

TEST(Kernels, TakeRejectsFloatIndices) {
  const Tensor x(Shape{3}, DType::kF32);
  const Tensor indices(Shape{2}, DType::kF32);
  EXPECT_THROW_WITH(run(recorded([](const std::vector<Array>& a) { return take(a[0], a[1], 0); },
                                 {f32(Shape{3}), TensorType{Shape{2}, DType::kI32}}),
                        {&x, &indices}, Shape{2}, DType::kF32),
                    SpecError, "[kernel] take", "dtype f32", "f32[3], f32[2]");
}

TEST(Kernels, IotaCountsFromTheBlockOffset) {
  for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64}) {
    for (int axis : {0, 1, 2}) {
      SCOPED_TRACE(std::string(name(dtype)) + " axis " + std::to_string(axis));
      const Shape shape{2, 3, 4};
      const std::vector<std::int64_t> offset = {6, 3, 8};
      std::vector<double> want;
      for (std::int64_t o = 0; o < shape.numel(); ++o) {
        want.push_back(static_cast<double>(offset[axis] + unravel(o, shape)[axis]));
      }
      const Node node =
          recorded([&](const std::vector<Array>& a) { return iota_like(a[0], axis, DType::kF32); },
                   {f32(shape)});
      EXPECT_EQ(run(node, {}, shape, dtype, offset).to_doubles(), want);
    }
  }
}

TEST(Kernels, ConstantCopiesItsBlock) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const Shape global{6, 8};
    const auto value = std::make_shared<const Tensor>(random(global, dtype, 24, -9, 9));
    const Node node{.op = &prim::constant, .attrs = ConstantAttrs{value}};
    const Shape block{3, 4};
    const std::vector<std::int64_t> offset = {3, 4};
    std::vector<double> want;
    for (std::int64_t o = 0; o < block.numel(); ++o) {
      const std::vector<std::int64_t> bi = unravel(o, block);
      want.push_back(value->get(ravel({bi[0] + 3, bi[1] + 4}, global)));
    }
    EXPECT_EQ(run(node, {}, block, dtype, offset).to_doubles(), want);
  }
  const Node scalar{
      .op = &prim::constant,
      .attrs = ConstantAttrs{std::make_shared<const Tensor>(make(Shape{}, DType::kF64, {1.25}))}};
  EXPECT_EQ(run(scalar, {}, Shape{}, DType::kF64).get(0), 1.25);
}

TEST(Kernels, ConstraintAndAnnotationAreIdentities) {
  for (const Primitive* op : {&prim::sharding_constraint, &prim::sharding_annotation}) {
    for (DType dtype : kNumericTypes) {
      const Tensor x = random(Shape{2, 3, 4}, dtype, 25, -9, 9);
      EXPECT_TRUE(run(make_node(op), {&x}, x.shape(), dtype) == x);
    }
  }
}

TEST(Kernels, InputHasNoKernel) {
  EXPECT_THROW_WITH(run(make_node(prim::input), {}, Shape{2}, DType::kF32), Error,
                    "[kernel] input");
}

TEST(Kernels, UnsupportedDtypeNamesOpDtypeAndShapes) {
  const Tensor x(Shape{2, 3}, DType::kF16);
  EXPECT_THROW_WITH(run(make_node(prim::add), {&x, &x}, x.shape(), DType::kF16), SpecError,
                    "[kernel] add", "dtype f16", "operands (f16[2, 3], f16[2, 3])",
                    "result f16[2, 3]");
  const Node node = recorded(
      [](const std::vector<Array>& a) { return iota_like(a[0], 0, DType::kF32); }, {f32(Shape{4})});
  EXPECT_THROW_WITH(run(node, {}, Shape{4}, DType::kBool), SpecError, "[kernel] iota", "dtype bool",
                    "result bool[4]");
}

// ---------------------------------------------------------------------------------------------
// Flops

TEST(Kernels, FlopsCountDotElementwiseAndReductions) {
  const auto flops = [](const Node& n, const std::vector<Shape>& in, const Shape& out) {
    return n.op->flops(n, in, out);
  };
  // [k=3, b=2, m=4] x [n=5, k=3, b=2]: 2 * 2 * 4 * 5 * 3.
  const Shape l{3, 2, 4}, r{5, 3, 2};
  EXPECT_EQ(flops(dot_node(DotDims{{1}, {2}, {0}, {1}}, l, r), {l, r}, Shape{2, 4, 5}), 240.0);
  EXPECT_EQ(flops(make_node(prim::gelu), {Shape{2, 3}}, Shape{2, 3}), 6.0);
  EXPECT_EQ(flops(make_node(prim::lt), {Shape{4}, Shape{4}}, Shape{4}), 4.0);
  EXPECT_EQ(flops(make_node(prim::select), {Shape{4}, Shape{4}, Shape{4}}, Shape{4}), 4.0);
  const Node sum_node =
      recorded([](const std::vector<Array>& a) { return sum(a[0], {1}); }, {f32(Shape{2, 3, 4})});
  EXPECT_EQ(flops(sum_node, {Shape{2, 3, 4}}, Shape{2, 4}), 24.0);
  for (const Primitive* op :
       {&prim::reshape, &prim::transpose, &prim::broadcast_in_dim, &prim::slice, &prim::concatenate,
        &prim::take, &prim::iota, &prim::constant, &prim::convert, &prim::sharding_constraint,
        &prim::sharding_annotation, &prim::input}) {
    EXPECT_EQ(flops(make_node(op), {Shape{2, 3}}, Shape{2, 3}), 0.0);
  }
}

}  // namespace
}  // namespace shardplan::detail
