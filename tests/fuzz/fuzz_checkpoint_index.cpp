// Any bytes as a checkpoint's model.safetensors.index.json: the reader must accept or throw
// IoError, never crash or hang (deep nesting, repeated keys, bytes that are not UTF-8, file names
// that leave the directory, a malformed shardplan record).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <unordered_set>

#include "checkpoint/checkpoint_index.hpp"
#include "shardplan/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto index = shardplan::detail::parse_checkpoint_index(text, "fuzz.index.json");
    std::unordered_set<std::string_view> names;
    for (const auto& [name, file] : index.weight_map) {
      if (!names.insert(name).second) __builtin_trap();  // every tensor once
      // Accepted file names stay inside the directory.
      const std::filesystem::path p(file);
      if (file.empty() || p.has_root_path()) __builtin_trap();
      for (const auto& part : p) {
        if (part == "..") __builtin_trap();
      }
    }
    if (index.record && index.record->name_separator != '/' &&
        index.record->name_separator != '.') {
      __builtin_trap();
    }
  } catch (const shardplan::IoError&) {
  }
  return 0;
}
