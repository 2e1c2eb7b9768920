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
/// Parses either name form, case-insensitively ("bf16", "BF16", "float32" too).
/// Throws SpecError listing the accepted names.
DType parse_dtype(std::string_view text);
/// True for the floating-point types.
bool is_floating(DType dtype);

std::ostream& operator<<(std::ostream& os, DType dtype);

}  // namespace shardplan
