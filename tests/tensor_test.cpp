// Tensor: storage, typed access, bf16 rounding, counter-based random fills.
#include "shardplan/tensor.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "test_util.hpp"

namespace shardplan {
namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(Tensor, ZerosByDefaultWithShapeDtypeAndBytes) {
  const Tensor t(Shape{2, 3}, DType::kBF16);
  EXPECT_EQ(t.shape(), Shape({2, 3}));
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 12);
  for (std::int64_t i = 0; i < 6; ++i) EXPECT_EQ(t.get(i), 0.0);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.bytes()) % 64, 0u);
  const Tensor scalar;
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.shape().rank(), 0);
}

TEST(Tensor, FromValuesInRowMajorOrder) {
  const Tensor t = Tensor::from<float>(Shape{2, 2}, {1.5f, -2.f, 3.f, 4.25f});
  EXPECT_EQ(t.dtype(), DType::kF32);
  EXPECT_EQ(t.get(1), -2.0);
  EXPECT_EQ(t.values<float>()[3], 4.25f);
  EXPECT_EQ(t.to_doubles(), (std::vector<double>{1.5, -2, 3, 4.25}));
  EXPECT_THROW_WITH(Tensor::from<float>(Shape{2, 2}, {1.f}), SpecError, "1 values", "[2, 2]",
                    "4 elements");
}

TEST(Tensor, TypedAccessChecksTheDtype) {
  Tensor t = Tensor::from<std::int32_t>(Shape{3}, {7, 8, 9});
  EXPECT_EQ(t.data<std::int32_t>()[2], 9);
  EXPECT_THROW_WITH(t.data<float>(), SpecError, "f32", "i32", "[3]");
  EXPECT_THROW_WITH(t.get(3), SpecError, "index 3", "[3]");
  t.set(0, 41.9);  // truncated toward zero, as a cast
  EXPECT_EQ(t.get(0), 41.0);
}

TEST(Tensor, CopiesAreDeepAndCompareBitwise) {
  Tensor a = Tensor::from<double>(Shape{2}, {1, 2});
  Tensor b = a;
  b.set(1, 5);
  EXPECT_EQ(a.get(1), 2.0);
  EXPECT_FALSE(a == b);
  b.set(1, 2);
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a == Tensor::from<float>(Shape{2}, {1, 2}));  // dtype differs
}

TEST(Tensor, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(bf16(1.0f).bits, 0x3F80);
  EXPECT_EQ(bf16(3.14159f).bits, 0x4049);                // 3.140625
  EXPECT_EQ(bf16(from_bits(0x3F808000u)).bits, 0x3F80);  // halfway: ties to even (down)
  EXPECT_EQ(bf16(from_bits(0x3F818000u)).bits, 0x3F82);  // halfway: ties to even (up)
  EXPECT_EQ(bf16(from_bits(0x3F808001u)).bits, 0x3F81);  // above halfway: up
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(static_cast<float>(bf16::from_bits(0xC000)), -2.0f);
  const Tensor t = Tensor::from<bf16>(Shape{1}, {bf16(0.1f)});
  EXPECT_EQ(t.nbytes(), 2);
  EXPECT_NEAR(t.get(0), 0.1, 1e-3);
}

TEST(Tensor, RandomValuesDependOnlyOnSeedAndIndex) {
  const Tensor t = Tensor::normal(Shape{4, 6}, DType::kF64, 42, 1.0, 2.0);
  for (std::int64_t i = 0; i < 24; ++i) {
    EXPECT_EQ(t.get(i), 1.0 + 2.0 * random_normal(42, static_cast<std::uint64_t>(i)));
  }
  // A different shape with the same number of elements gives the same numbers in order.
  EXPECT_EQ(Tensor::normal(Shape{24}, DType::kF64, 42, 1.0, 2.0).to_doubles(), t.to_doubles());
  EXPECT_NE(Tensor::normal(Shape{24}, DType::kF64, 43).to_doubles(),
            Tensor::normal(Shape{24}, DType::kF64, 42).to_doubles());
  const Tensor u = Tensor::uniform(Shape{1000}, DType::kF32, 7, -3, 5);
  for (std::int64_t i = 0; i < 1000; ++i) {
    EXPECT_GE(u.get(i), -3.0);
    EXPECT_LT(u.get(i), 5.0);
  }
}

TEST(Tensor, RandomNormalHasTheRightMoments) {
  const std::int64_t n = 200000;
  const Tensor t = Tensor::normal(Shape{n}, DType::kF64, 3);
  double sum = 0, sq = 0;
  for (const double v : t.values<double>()) {
    sum += v;
    sq += v * v;
  }
  const double mean = sum / static_cast<double>(n);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sq / static_cast<double>(n) - mean * mean, 1.0, 0.02);
}

TEST(Tensor, GeneratorsFillIotaAndFull) {
  EXPECT_EQ(Tensor::generate(Shape{4}, DType::kI32, Generator::iota(10, 2)).to_doubles(),
            (std::vector<double>{10, 12, 14, 16}));
  EXPECT_EQ(Tensor::ones(Shape{2}, DType::kBF16).to_doubles(), (std::vector<double>{1, 1}));
  EXPECT_THROW_WITH(Tensor::ones(Shape{2}, DType::kF8E4M3), SpecError, "f8_e4m3");
}

TEST(Tensor, Prints) {
  std::ostringstream os;
  os << Tensor::from<float>(Shape{2}, {1, 2});
  EXPECT_EQ(os.str(), "f32[2]{1, 2}");
}

TEST(Tensor, ShapesWhoseSizeOverflowsThrowBeforeAllocating) {
  // A SpecError, not std::bad_alloc: nothing was asked of the host.
  EXPECT_THROW_WITH(Tensor(Shape{2305843009213693952}, DType::kF32), SpecError,
                    "byte size of f32[2305843009213693952]", "overflows int64");
  EXPECT_THROW_WITH(Tensor::zeros(Shape{1152921504606846976}, DType::kF64), SpecError,
                    "f64[1152921504606846976]");
  EXPECT_THROW_WITH(Tensor::from(Shape{4294967296, 4294967296}, std::vector<float>{}), SpecError,
                    "element count of [4294967296, 4294967296]");
}

}  // namespace
}  // namespace shardplan
