// Shape and TensorSpec.

#include "shardplan/shape.hpp"

#include <limits>
#include <set>
#include <sstream>

#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/tensor_spec.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {
TEST(Shape, NumelAndBytes) {
  EXPECT_EQ(Shape({}).numel(), 1);
  EXPECT_EQ(Shape({4096, 11008}).numel(), 4096 * 11008);
  EXPECT_EQ((TensorSpec{Shape{4096, 11008}, DType::kBF16}.bytes()), 4096LL * 11008 * 2);
  EXPECT_EQ(Shape({4096, 11008}).to_string(), "[4096, 11008]");
  EXPECT_THROW_WITH(Shape({4, -1}), SpecError, "negative");
}

TEST(Shape, RanksAboveTheInlineLimitKeepTheirDimensions) {
  const std::vector<std::int64_t> dims{2, 3, 4, 5, 6, 7, 8, 9};
  const Shape s(dims);
  EXPECT_EQ(s.rank(), 8);
  EXPECT_EQ(s.dims(), dims);
  EXPECT_EQ(s.numel(), 2LL * 3 * 4 * 5 * 6 * 7 * 8 * 9);
  Shape copy = s;
  EXPECT_EQ(copy, s);
  copy[7] = 1;
  EXPECT_NE(copy, s);
  EXPECT_EQ(s[7], 9);
}

TEST(Shape, EqualityComparesRankAndDimensions) {
  EXPECT_EQ(Shape({2, 3}), Shape(std::vector<std::int64_t>{2, 3}));
  EXPECT_NE(Shape({2, 3}), Shape({3, 2}));
  EXPECT_NE(Shape({2}), Shape({2, 1}));
  EXPECT_EQ(Shape(), Shape({}));
}

TEST(Shape, ZeroDimensionsAreAllowedAndEmpty) {
  EXPECT_EQ(Shape({0, 5}).numel(), 0);
  EXPECT_EQ(Shape({}).to_string(), "[]");
}

TEST(Shape, NegativeDimensionErrorNamesTheDimensionAndShape) {
  EXPECT_THROW_WITH(Shape(std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, -7}), SpecError,
                    "dimension 6", "[1, 2, 3, 4, 5, 6, -7]");
}

TEST(TensorSpec, BytesEqualityAndPrinting) {
  const TensorSpec a{Shape{8, 4}, DType::kF16, {"embed", "mlp"}};
  EXPECT_EQ(a.bytes(), 8 * 4 * 2);
  EXPECT_EQ((TensorSpec{Shape{}, DType::kF64}.bytes()), 8);
  EXPECT_NE(a, (TensorSpec{Shape{8, 4}, DType::kF16}));
  EXPECT_EQ(a, (TensorSpec{Shape{8, 4}, DType::kF16, {"embed", "mlp"}}));
  std::ostringstream os;
  os << a << " " << TensorSpec{Shape{3}, DType::kBool};
  EXPECT_EQ(os.str(), "f16[8, 4](embed, mlp) bool[3]");
}

// Limits: INT64_MAX = 9223372036854775807; 3037000499^2 = 9223372030926249001 fits,
// 3037000500^2 = 9223372037000250000 does not.
TEST(Shape, ElementCountsUpToInt64MaxAreAcceptedAndBeyondAreErrorsNamingTheShape) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(Shape({kMax}).numel(), kMax);
  EXPECT_EQ(Shape({3037000499, 3037000499}).numel(), 9223372030926249001LL);
  EXPECT_THROW_WITH(Shape({3037000500, 3037000500}), SpecError,
                    "[shape] element count of [3037000500, 3037000500] overflows int64");
  EXPECT_THROW_WITH(Shape({4294967296, 4294967296, 16}), SpecError,
                    "element count of [4294967296, 4294967296, 16] overflows int64");
  EXPECT_THROW_WITH(Shape(std::vector<std::int64_t>{2, 2, 2, 2, 2, 2, 2, 4611686018427387904}),
                    SpecError, "overflows int64");  // heap-stored rank 8: 2^69
}

TEST(Shape, ZeroDimensionsDoNotHideAnOverflowingStride) {
  // As NumPy: the non-zero dimensions must multiply within int64, so every stride fits.
  EXPECT_EQ(Shape({0, 4611686018427387904}).numel(), 0);
  EXPECT_THROW_WITH(Shape({0, 4611686018427387904, 4}), SpecError, "[0, 4611686018427387904, 4]",
                    "overflows int64");
}

TEST(Shape, ACountGrownPastInt64ThroughIndexingThrowsFromNumel) {
  Shape s{4, 4};
  s[0] = 4611686018427387904;  // 2^62 * 4 = 2^64
  EXPECT_THROW_WITH(s.numel(), SpecError, "element count of [4611686018427387904, 4]");
}

TEST(TensorSpec, ByteSizesUpToInt64MaxAreAcceptedAndBeyondAreErrorsNamingDtypeAndShape) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ((TensorSpec{Shape{kMax}, DType::kU8}.bytes()), kMax);
  // f32: 2^61 - 1 elements are 2^63 - 4 bytes; 2^61 elements are 2^63.
  EXPECT_EQ((TensorSpec{Shape{2305843009213693951}, DType::kF32}.bytes()), kMax - 3);
  EXPECT_THROW_WITH((TensorSpec{Shape{2305843009213693952}, DType::kF32}), SpecError,
                    "[shape] byte size of f32[2305843009213693952] (4 bytes per element) "
                    "overflows int64");
  EXPECT_THROW_WITH(byte_size(Shape{1152921504606846976}, DType::kF64), SpecError,
                    "f64[1152921504606846976]");  // 2^60 * 8
  EXPECT_EQ(byte_size(Shape{1152921504606846975}, DType::kF64), kMax - 7);
  EXPECT_THROW_WITH(byte_size(Shape{0, 2305843009213693952}, DType::kF32), SpecError,
                    "f32[0, 2305843009213693952]");  // empty, but its byte stride is 2^63
  EXPECT_EQ(byte_size(Shape{0, 2305843009213693951}, DType::kF32), 0);
}

TEST(TensorSpec, ASpecWhoseFieldsWereAssignedPastInt64ThrowsFromBytes) {
  TensorSpec t;
  t.shape = Shape{2305843009213693952};  // 2^61 elements fit
  t.dtype = DType::kU16;
  EXPECT_EQ(t.bytes(), 4611686018427387904LL);  // 2^62
  t.dtype = DType::kF32;                        // 2^63 does not
  EXPECT_THROW_WITH(t.bytes(), SpecError, "byte size of f32[2305843009213693952]");
}

}  // namespace
}  // namespace shardplan
