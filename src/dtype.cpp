#include "shardplan/dtype.hpp"

#include <array>
#include <cctype>
#include <string>

#include "shardplan/error.hpp"

namespace shardplan {
namespace {

struct DTypeInfo {
  DType dtype;
  std::size_t size;
  std::string_view name;
  std::string_view safetensors;
  std::string_view alias;
};

constexpr std::array<DTypeInfo, 15> kInfo{{
    {DType::kBool, 1, "bool", "BOOL", "bool"},
    {DType::kI8, 1, "i8", "I8", "int8"},
    {DType::kI16, 2, "i16", "I16", "int16"},
    {DType::kI32, 4, "i32", "I32", "int32"},
    {DType::kI64, 8, "i64", "I64", "int64"},
    {DType::kU8, 1, "u8", "U8", "uint8"},
    {DType::kU16, 2, "u16", "U16", "uint16"},
    {DType::kU32, 4, "u32", "U32", "uint32"},
    {DType::kU64, 8, "u64", "U64", "uint64"},
    {DType::kF8E4M3, 1, "f8_e4m3", "F8_E4M3", "float8_e4m3fn"},
    {DType::kF8E5M2, 1, "f8_e5m2", "F8_E5M2", "float8_e5m2"},
    {DType::kF16, 2, "f16", "F16", "float16"},
    {DType::kBF16, 2, "bf16", "BF16", "bfloat16"},
    {DType::kF32, 4, "f32", "F32", "float32"},
    {DType::kF64, 8, "f64", "F64", "float64"},
}};

const DTypeInfo& info(DType d) { return kInfo[static_cast<std::size_t>(d)]; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::size_t size_of(DType dtype) { return info(dtype).size; }
std::string_view name(DType dtype) { return info(dtype).name; }
std::string_view safetensors_name(DType dtype) { return info(dtype).safetensors; }

bool is_floating(DType dtype) {
  switch (dtype) {
    case DType::kF8E4M3: case DType::kF8E5M2: case DType::kF16: case DType::kBF16:
    case DType::kF32: case DType::kF64:
      return true;
    default:
      return false;
  }
}

DType parse_dtype(std::string_view text) {
  for (const auto& i : kInfo) {
    if (iequals(text, i.name) || iequals(text, i.safetensors) || iequals(text, i.alias)) {
      return i.dtype;
    }
  }
  std::string known;
  for (const auto& i : kInfo) known += (known.empty() ? "" : ", ") + std::string(i.safetensors);
  throw SpecError("[dtype] unknown dtype '" + std::string(text) + "'; expected one of " + known);
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << name(dtype); }

}  // namespace shardplan
