// Any bytes as the start of a .safetensors file: the parser must accept or throw IoError, never crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "shardplan/error.hpp"
#include "shardplan/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The file is as long as the input, or (first byte odd) much longer: headers whose data section
  // lies beyond what was read.
  const std::int64_t file_size =
      size > 0 && (data[0] & 1) ? static_cast<std::int64_t>(size) + (std::int64_t{1} << 32)
                                : static_cast<std::int64_t>(size);
  try {
    const auto h = shardplan::parse_safetensors_header(bytes, file_size, "fuzz.safetensors");
    for (const auto& t : h.tensors) {
      if (t.begin > t.end || t.end > h.data_size) __builtin_trap();  // validated, so never
    }
  } catch (const shardplan::IoError&) {
  }
  return 0;
}
