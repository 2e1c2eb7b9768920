// Any bytes as shardplan's checkpoint record (the index's metadata.shardplan object): the reader
// must accept or throw IoError, never crash or hang.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "checkpoint/checkpoint_index.hpp"
#include "shardplan/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto record = shardplan::detail::parse_checkpoint_record(text, "fuzz.index.json");
    if (record.name_separator != '/' && record.name_separator != '.') __builtin_trap();
    // The structure is kept as the JSON text it was in the input.
    if (record.structure.size() > size) __builtin_trap();
  } catch (const shardplan::IoError&) {
  }
  return 0;
}
