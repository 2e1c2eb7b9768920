// Per-device kernels: every op against a reference computed here with plain loops in double.
// Elementwise ops, dot and reductions here; data movement, take, iota, constants and flops in
// kernels_test_movement.cpp.
#include "kernels_test.hpp"

namespace shardplan::detail {
namespace {

using namespace test;

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

}  // namespace
}  // namespace shardplan::detail
