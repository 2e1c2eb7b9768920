// DType: sizes, names and parsing.

#include "shardplan/dtype.hpp"

#include <set>
#include <sstream>

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

// Sizes from the formats' definitions (bits / 8), listed independently of the library's table.
TEST(DType, EveryDTypeHasItsSizeAndRoundTripsThroughBothNames) {
  const std::vector<std::pair<DType, std::size_t>> expect{
      {DType::kBool, 1}, {DType::kI8, 1},     {DType::kI16, 2},    {DType::kI32, 4},
      {DType::kI64, 8},  {DType::kU8, 1},     {DType::kU16, 2},    {DType::kU32, 4},
      {DType::kU64, 8},  {DType::kF8E4M3, 1}, {DType::kF8E5M2, 1}, {DType::kF16, 2},
      {DType::kBF16, 2}, {DType::kF32, 4},    {DType::kF64, 8}};
  std::set<std::string> names;
  for (const auto& [d, size] : expect) {
    EXPECT_EQ(size_of(d), size) << name(d);
    EXPECT_EQ(parse_dtype(name(d)), d);
    EXPECT_EQ(parse_dtype(safetensors_name(d)), d);
    names.insert(std::string(name(d)));
  }
  EXPECT_EQ(names.size(), expect.size());
}

TEST(DType, ParsesNumpyStyleAliases) {
  EXPECT_EQ(parse_dtype("float32"), DType::kF32);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::kF8E4M3);
  EXPECT_EQ(parse_dtype("Int64"), DType::kI64);
}

TEST(DType, RejectsEmptyAndNearMissNames) {
  EXPECT_THROW_WITH(parse_dtype(""), SpecError, "''", "F32");
  EXPECT_THROW_WITH(parse_dtype("bf16 "), SpecError, "'bf16 '");
}

TEST(DType, FloatingTypesAndPrinting) {
  EXPECT_TRUE(is_floating(DType::kBF16));
  EXPECT_TRUE(is_floating(DType::kF8E5M2));
  EXPECT_FALSE(is_floating(DType::kI32));
  EXPECT_FALSE(is_floating(DType::kBool));
  std::ostringstream os;
  os << DType::kF8E4M3 << " " << DType::kU32;
  EXPECT_EQ(os.str(), "f8_e4m3 u32");
}

TEST(DType, GetFloatDtypeByNameTakesScalaxNames) {
  // scalax's table: bf16/bfloat16, fp16/float16, fp32/float32, fp64/float64.
  const std::vector<std::pair<const char*, DType>> scalax{
      {"bf16", DType::kBF16},   {"bfloat16", DType::kBF16}, {"fp16", DType::kF16},
      {"float16", DType::kF16}, {"fp32", DType::kF32},      {"float32", DType::kF32},
      {"fp64", DType::kF64},    {"float64", DType::kF64}};
  for (const auto& [text, d] : scalax) {
    EXPECT_EQ(get_float_dtype_by_name(text), d) << text;
    EXPECT_EQ(parse_dtype(text), d) << text;
  }
  // C and PyTorch spellings; float is f32 (C++, torch.float), not NumPy's float64.
  EXPECT_EQ(get_float_dtype_by_name("half"), DType::kF16);
  EXPECT_EQ(get_float_dtype_by_name("float"), DType::kF32);
  EXPECT_EQ(get_float_dtype_by_name("double"), DType::kF64);
  // Case does not matter, and the safetensors and short names work too.
  EXPECT_EQ(get_float_dtype_by_name("BF16"), DType::kBF16);
  EXPECT_EQ(get_float_dtype_by_name("FP32"), DType::kF32);
  EXPECT_EQ(get_float_dtype_by_name("Float64"), DType::kF64);
  EXPECT_EQ(get_float_dtype_by_name("f16"), DType::kF16);
  EXPECT_EQ(parse_dtype("HALF"), DType::kF16);
  EXPECT_EQ(parse_dtype("Double"), DType::kF64);
}

TEST(DType, GetFloatDtypeByNameRejectsUnknownAndNonFloatNamesListingTheAccepted) {
  EXPECT_THROW_WITH(get_float_dtype_by_name("fp8"), SpecError, "unknown dtype 'fp8'", "bf16",
                    "bfloat16", "fp16", "float16", "fp32", "float32", "fp64", "float64");
  EXPECT_THROW_WITH(get_float_dtype_by_name("int32"), SpecError,
                    "i32 is not one of the float dtypes", "'int32'", "fp32");
  EXPECT_THROW_WITH(get_float_dtype_by_name("F8_E4M3"), SpecError, "f8_e4m3 is not one of", "bf16");
  EXPECT_THROW_WITH(get_float_dtype_by_name(""), SpecError, "unknown dtype ''");
  EXPECT_THROW_WITH(parse_dtype("fp12"), SpecError, "'fp12'", "BF16", "half");
}

}  // namespace
}  // namespace shardplan
