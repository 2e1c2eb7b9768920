// Eigen views of tensors and buffers: no copies, row-major, dtype-checked.
#include "shardplan/eigen.hpp"

#include "shardplan/executor.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

TEST(Eigen, TensorsAreRowMajorMatricesWithoutCopies) {
  Tensor a = Tensor::from<float>(Shape{2, 3}, {1, 2, 3, 4, 5, 6});
  auto m = as_matrix<float>(a);
  EXPECT_EQ(m.rows(), 2);
  EXPECT_EQ(m.cols(), 3);
  EXPECT_EQ(m(1, 0), 4.0f);
  m(0, 2) = 30;  // writes through
  EXPECT_EQ(a.get(2), 30.0);
  const Tensor b = Tensor::from<float>(Shape{3, 2}, {1, 0, 0, 1, 1, 1});
  Tensor c(Shape{2, 2}, DType::kF32);
  as_matrix<float>(c).noalias() = as_matrix<float>(a) * as_matrix<float>(b);
  // By hand: [1 2 30; 4 5 6] x [1 0; 0 1; 1 1] = [31 32; 10 11].
  EXPECT_EQ(c.to_doubles(), (std::vector<double>{31, 32, 10, 11}));
}

TEST(Eigen, LeadingDimensionsFoldIntoRows) {
  Tensor t(Shape{2, 3, 4}, DType::kF64);
  EXPECT_EQ(as_matrix<double>(t).rows(), 6);
  EXPECT_EQ(as_matrix<double>(t).cols(), 4);
  Tensor v(Shape{5}, DType::kF64);
  EXPECT_EQ(as_matrix<double>(v).rows(), 1);
  as_array<double>(v).setConstant(2.5);
  EXPECT_EQ(v.get(4), 2.5);
}

TEST(Eigen, Bf16MapsToEigensBfloat16) {
  Tensor t = Tensor::from<bf16>(Shape{2}, {bf16(1.5f), bf16(-2.0f)});
  auto a = as_array<bf16>(t);
  EXPECT_EQ(static_cast<float>(a(0)), 1.5f);
  a(1) = Eigen::bfloat16(4.0f);
  EXPECT_EQ(t.get(1), 4.0);
}

TEST(Eigen, TheDtypeIsChecked) {
  Tensor t(Shape{2, 2}, DType::kF32);
  EXPECT_THROW_WITH(as_matrix<double>(t), SpecError, "f64", "f32");
}

TEST(Eigen, DeviceBuffersAreMatricesToo) {
  const Executor exec(1);
  Buffer b = exec.allocate(0, 6 * sizeof(float));
  auto m = as_matrix<float>(b.data(), 2, 3);
  m.setZero();
  m(1, 2) = 7;
  EXPECT_EQ(reinterpret_cast<const float*>(b.data())[5], 7.0f);
}

}  // namespace
}  // namespace shardplan
