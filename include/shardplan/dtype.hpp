#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>

namespace shardplan {

/// Element types. Sizes are in bytes; the f8 formats and bool take one byte each.
enum class DType : std::uint8_t {
  kBool,
  kI8,
  kI16,
  kI32,
  kI64,
  kU8,
  kU16,
  kU32,
  kU64,
  kF8E4M3,
  kF8E5M2,
  kF16,
  kBF16,
  kF32,
  kF64,
};

/// Bytes per element.
std::size_t size_of(DType dtype);
/// The short lower-case name: "f32", "bf16", "f8_e4m3", "i32", "bool".
std::string_view name(DType dtype);
/// The safetensors name: "F32", "BF16", "F8_E4M3", "I32", "BOOL".
std::string_view safetensors_name(DType dtype);
/// Parses any name of a dtype, case-insensitively: the short name ("bf16"), the safetensors name
/// ("BF16"), the NumPy name ("bfloat16", "int32"), and for floats scalax's and C's names ("fp16",
/// "fp32", "fp64", "half", "float" = f32, "double"). Throws SpecError listing the accepted names.
DType parse_dtype(std::string_view text);
/// scalax's get_float_dtype_by_name: "bf16"/"bfloat16", "fp16"/"float16"/"half",
/// "fp32"/"float32"/"float", "fp64"/"float64"/"double" (any case, and every other name
/// parse_dtype takes for these four types). Throws SpecError listing the accepted names for an
/// unknown name or a dtype that is not bf16, f16, f32 or f64 ("int32", "f8_e4m3").
DType get_float_dtype_by_name(std::string_view text);
/// True for the floating-point types.
bool is_floating(DType dtype);

std::ostream& operator<<(std::ostream& os, DType dtype);

}  // namespace shardplan
