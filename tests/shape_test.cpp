// Shape and TensorSpec.

#include "shardplan/shape.hpp"

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

}  // namespace
}  // namespace shardplan
