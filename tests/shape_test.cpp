// Shape and TensorSpec.

#include "shardplan/shape.hpp"

#include <set>

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

}  // namespace
}  // namespace shardplan
