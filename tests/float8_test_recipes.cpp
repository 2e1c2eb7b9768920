// float8's recipes (torchao's Float8LinearConfig.from_recipe_name): scaled_dot with a scale per
// row of each operand (torch._scaled_mm's rowwise scales), float8_linear's rowwise and
// rowwise_with_gw_hp recipes against the plain linear, by hand.
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/executor.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/program_cost.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

// A host tensor on one device.
Array on_one(const Tensor& t) {
  static const Executor exec(1);
  return device_put(t, NamedSharding(Mesh::parse("d:1", 1), P()), exec);
}
Array host(const std::vector<double>& v, Shape s) {
  std::vector<float> f(v.begin(), v.end());
  return on_one(Tensor::from(std::move(s), f));
}

// y[i][j] = (sum over k of a[i][k] b[k][j]) * scale_a[i] * scale_b[j]: all ones, k = 3.
TEST(Float8Recipes, ScaledDotScalesEachRowOfEachOperand) {
  const Array a = astype(host(std::vector<double>(6, 1.0), Shape{2, 3}), DType::kF8E4M3);
  const Array b = astype(host(std::vector<double>(12, 1.0), Shape{3, 4}), DType::kF8E5M2);
  const Array sa = host({1, 2}, Shape{2});
  const Array sb = host({1, 10, 100, 1000}, Shape{4});
  const DotDims mm{{}, {}, {1}, {0}};
  EXPECT_EQ(scaled_dot(a, b, sa, sb, mm, DType::kF32).to_host().to_doubles(),
            (std::vector<double>{3, 30, 300, 3000, 6, 60, 600, 6000}));
  // One operand per row, the other whole (rowwise_with_gw_hp's dx).
  const Array whole = host({0.5}, Shape{});
  EXPECT_EQ(scaled_dot(a, b, sa, whole, mm, DType::kF32).to_host().to_doubles(),
            (std::vector<double>{1.5, 1.5, 1.5, 1.5, 3, 3, 3, 3}));
  // b contracted on its dimension 1: its rows are its dimension 0.
  const Array bt = astype(host(std::vector<double>(12, 1.0), Shape{4, 3}), DType::kF8E4M3);
  EXPECT_EQ(scaled_dot(a, bt, whole, sb, DotDims{{}, {}, {1}, {1}}, DType::kF32)
                .to_host()
                .to_doubles(),
            (std::vector<double>{1.5, 15, 150, 1500, 1.5, 15, 150, 1500}));
  EXPECT_THROW_WITH(scaled_dot(a, b, host({1, 2, 3}, Shape{3}), sb, mm, DType::kF32), SpecError,
                    "[scaled_dot]", "scale_a must be f32 of shape [] (tensorwise) or [2]");
  EXPECT_THROW_WITH(scaled_dot(a, b, sa, host({1, 2, 3}, Shape{3}), mm, DType::kF32), SpecError,
                    "[scaled_dot]", "scale_b must be f32 of shape [] (tensorwise) or [4]");
}

// y, dx, dw of float8_linear(x, w) for the loss sum(y * c), and of the plain linear in f32.
struct Grads {
  std::vector<double> y, dx, dw;
};
Grads run(const Array& x, const Array& w, const Array& c, std::optional<Float8Scaling> scaling) {
  const auto f = [&](const Array& a, const Array& b) {
    return scaling ? float8_linear(a, b, {.scaling = *scaling})
                   : dot_general(a, b, DotDims{{}, {}, {1}, {1}});
  };
  const auto loss = [&](const Tree<Array>& p) {
    return sum(astype(f(p.children()[0].leaf(), p.children()[1].leaf()) * c, DType::kF32));
  };
  const auto [l, g] = value_and_grad(loss)(Tree<Array>::list({x, w}));
  return {f(x, w).to_host().to_doubles(), g.children()[0].leaf().to_host().to_doubles(),
          g.children()[1].leaf().to_host().to_doubles()};
}

// The largest |got - want| over |want|'s largest, elementwise within a row of `n`.
double worst_in_row(const std::vector<double>& got, const std::vector<double>& want,
                    std::size_t row, std::size_t n) {
  double top = 0, err = 0;
  for (std::size_t j = 0; j < n; ++j) top = std::max(top, std::abs(want[row * n + j]));
  for (std::size_t j = 0; j < n; ++j) {
    err = std::max(err, std::abs(got[row * n + j] - want[row * n + j]));
  }
  return err / top;
}

// Row 1 of x is 1e-6 times row 0. One scale for all of x (tensorwise: 448 / amax of x) leaves
// row 1's values below e4m3's smallest subnormal (2^-9) once scaled (at most 4.5e-4): they
// cast to 0, and so does that row of y. A scale per row (rowwise) casts each row at full range:
// its y within e4m3's error (2^-4 of each factor, 2^-3 together) of the plain product.
TEST(Float8Recipes, RowwiseScalingKeepsASmallRowThatTensorwiseLoses) {
  const std::int64_t k = 16, m = 4;
  std::vector<double> xv(2 * k), wv(m * k), cv(2 * m, 1.0);
  for (std::int64_t j = 0; j < k; ++j) {
    xv[j] = 0.5 + 0.03 * static_cast<double>(j);
    xv[k + j] = 1e-6 * xv[j];
  }
  for (std::int64_t i = 0; i < m * k; ++i) wv[i] = 0.25 + 0.01 * static_cast<double>(i % 37);
  const Array x = host(xv, Shape{2, k}), w = host(wv, Shape{m, k}), c = host(cv, Shape{2, m});
  const Grads plain = run(x, w, c, std::nullopt);
  const Grads tensorwise = run(x, w, c, Float8Scaling::kTensorwise);
  const Grads rowwise = run(x, w, c, Float8Scaling::kRowwise);
  for (std::int64_t j = 0; j < m; ++j) EXPECT_EQ(tensorwise.y[m + j], 0.0) << j;
  EXPECT_LE(worst_in_row(rowwise.y, plain.y, 1, m), 0x1p-3);
  EXPECT_LE(worst_in_row(rowwise.y, plain.y, 0, m), 0x1p-3);
  // The gradients: e4m3 throughout (rowwise casts the cotangent to e4m3 too).
  EXPECT_LE(worst_in_row(rowwise.dx, plain.dx, 1, k), 0x1p-3);
  for (std::int64_t r = 0; r < m; ++r) EXPECT_LE(worst_in_row(rowwise.dw, plain.dw, r, k), 0x1p-3);
}

// rowwise_with_gw_hp: dw is the plain product of the cotangent and x in their dtype (f32 here):
// equal to the plain linear's dw up to f32's summation order; dx still float8's.
TEST(Float8Recipes, RowwiseWithGwHpComputesTheWeightGradientInHighPrecision) {
  const Tensor xt = Tensor::normal(Shape{8, 32}, DType::kF32, 21);
  const Tensor wt = Tensor::normal(Shape{4, 32}, DType::kF32, 22, 0, 0.05);
  const Tensor ct = Tensor::normal(Shape{8, 4}, DType::kF32, 23);
  const Array x = on_one(xt), w = on_one(wt), c = on_one(ct);
  const Grads plain = run(x, w, c, std::nullopt);
  const Grads hp = run(x, w, c, Float8Scaling::kRowwiseWithGwHp);
  const Grads rowwise = run(x, w, c, Float8Scaling::kRowwise);
  for (std::size_t r = 0; r < 4; ++r) {
    EXPECT_LE(worst_in_row(hp.dw, plain.dw, r, 32), 1e-6) << r;
  }
  double rowwise_err = 0;
  for (std::size_t r = 0; r < 4; ++r) {
    rowwise_err = std::max(rowwise_err, worst_in_row(rowwise.dw, plain.dw, r, 32));
  }
  EXPECT_GT(rowwise_err, 1e-4);  // float8's dw is not the plain one
  for (std::size_t r = 0; r < 8; ++r) EXPECT_LE(worst_in_row(hp.dx, plain.dx, r, 4 * 8), 0x1p-3);
}

// What the forward pass keeps for the backward pass, beyond the arguments (x and w computed
// inside the loss, as float8_test's KeepsXAndWInEightBitsForTheBackwardPass): rowwise keeps x
// and w in bf16 (the backward pass casts them along other rows): 2 x (64 x 32 + 2 x 32) bytes,
// twice tensorwise's 8 bits.
std::int64_t kept(std::optional<Float8Scaling> scaling) {
  const Executor exec(1);
  const Mesh mesh = Mesh::parse("d:1", 1);
  const auto put = [&](const Tensor& t) { return device_put(t, NamedSharding(mesh, P()), exec); };
  const Array a = put(Tensor::normal(Shape{64, 32}, DType::kBF16, 30));
  const Array b = put(Tensor::normal(Shape{2, 32}, DType::kBF16, 31));
  const Array c = put(Tensor::normal(Shape{64, 2}, DType::kBF16, 32));
  auto grads = sjit(mesh, [scaling](const Tree<Array>& p, const Array& cot) {
    const auto loss = [&](const Tree<Array>& q) {
      const Array x = q.children()[0].leaf() + q.children()[0].leaf();
      const Array w = q.children()[1].leaf() + q.children()[1].leaf();
      return sum(astype(float8_linear(x, w, {.scaling = *scaling}) * cot, DType::kF32));
    };
    return value_and_grad(loss)(p).second;
  });
  const ProgramCost cost = grads.lower(Tree<Array>::list({a, b}), c).cost();
  for (const PhaseStart& ph : cost.timeline.phases) {
    if (ph.phase == StepPhase::kBackward && ph.step > 0) {
      return cost.timeline.live_bytes.at(ph.step - 1) - cost.timeline.start_bytes;
    }
  }
  ADD_FAILURE() << "no backward phase";
  return 0;
}

TEST(Float8Recipes, RowwiseKeepsXAndWInTheirDtypeForTheBackwardPass) {
  const std::int64_t eight_bit = 64 * 32 + 2 * 32;
  const std::int64_t tensorwise = kept(Float8Scaling::kTensorwise);
  const std::int64_t rowwise = kept(Float8Scaling::kRowwise);
  // Besides them: y and y * c (64 x 2 bf16 each) at most, and tensorwise's two f32 scales.
  EXPECT_GE(rowwise, 2 * eight_bit);
  EXPECT_LE(rowwise, 2 * eight_bit + 2 * (64 * 2 * 2));
  EXPECT_GE(tensorwise, eight_bit);
  EXPECT_LE(tensorwise, eight_bit + 8 + 2 * (64 * 2 * 2));
}

}  // namespace
}  // namespace shardplan
