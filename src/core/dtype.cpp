#include "shardplan/dtype.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <optional>
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

// Further names of the float types: scalax's get_float_dtype_by_name (bf16, fp16, fp32, fp64,
// besides bfloat16, float16, float32, float64 above) and C/PyTorch's half, float, double.
struct Alias {
  std::string_view name;
  DType dtype;
};
constexpr std::array<Alias, 6> kFloatAliases{{
    {"fp16", DType::kF16},
    {"half", DType::kF16},
    {"fp32", DType::kF32},
    {"float", DType::kF32},
    {"fp64", DType::kF64},
    {"double", DType::kF64},
}};

// What get_float_dtype_by_name returns: scalax's four float types.
constexpr std::array<DType, 4> kNamedFloats{DType::kBF16, DType::kF16, DType::kF32, DType::kF64};

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

namespace {

std::optional<DType> find_dtype(std::string_view text) {
  for (const auto& i : kInfo) {
    if (iequals(text, i.name) || iequals(text, i.safetensors) || iequals(text, i.alias)) {
      return i.dtype;
    }
  }
  for (const auto& a : kFloatAliases) {
    if (iequals(text, a.name)) return a.dtype;
  }
  return std::nullopt;
}

}  // namespace

DType parse_dtype(std::string_view text) {
  if (const auto d = find_dtype(text)) return *d;
  std::string known;
  for (const auto& i : kInfo) known += (known.empty() ? "" : ", ") + std::string(i.safetensors);
  throw SpecError("[dtype] unknown dtype '" + std::string(text) + "'; expected one of " + known +
                  " (any case; also i32, int32, fp32, float32, float, half, double, ...)");
}

DType get_float_dtype_by_name(std::string_view text) {
  const auto d = find_dtype(text);
  if (d && std::find(kNamedFloats.begin(), kNamedFloats.end(), *d) != kNamedFloats.end()) {
    return *d;
  }
  throw SpecError(fmt::format(
      "[dtype] {} '{}'; expected a float dtype name: bf16, bfloat16, fp16, float16, half, fp32, "
      "float32, float, fp64, float64, double (any case; also f16, f32, f64 and the safetensors "
      "names BF16, F16, F32, F64)",
      d ? fmt::format("{} is not one of the float dtypes bf16, f16, f32, f64:", name(*d))
        : std::string("unknown dtype"),
      text));
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << name(dtype); }

}  // namespace shardplan
