// DType: sizes, names and parsing.

#include "shardplan/dtype.hpp"

#include <set>

#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/shape.hpp"
#include "shardplan/tensor_spec.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {
TEST(DType, SizesAndNames) {
  EXPECT_EQ(size_of(DType::kF32), 4u);
  EXPECT_EQ(size_of(DType::kBF16), 2u);
  EXPECT_EQ(size_of(DType::kF8E4M3), 1u);
  EXPECT_EQ(size_of(DType::kF64), 8u);
  EXPECT_EQ(size_of(DType::kI64), 8u);
  EXPECT_EQ(size_of(DType::kU16), 2u);
  EXPECT_EQ(size_of(DType::kBool), 1u);
  EXPECT_EQ(safetensors_name(DType::kBF16), "BF16");
  EXPECT_EQ(safetensors_name(DType::kF8E5M2), "F8_E5M2");
}

TEST(DType, ParseAcceptsOwnAndSafetensorsNames) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(parse_dtype("I32"), DType::kI32);
  for (DType d : {DType::kBool, DType::kI8, DType::kU64, DType::kF16, DType::kF64}) {
    EXPECT_EQ(parse_dtype(name(d)), d);
    EXPECT_EQ(parse_dtype(safetensors_name(d)), d);
  }
  EXPECT_THROW_WITH(parse_dtype("F12"), SpecError, "'F12'", "BF16");
}

}  // namespace
}  // namespace shardplan
