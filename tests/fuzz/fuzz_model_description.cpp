// Any bytes as a JSON model description: parse_model_description and tree_from_names must accept
// or throw IoError, never crash (deep nesting, huge numbers, bytes that are not UTF-8, names that
// conflict or have many parts).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "shardplan/error.hpp"
#include "shardplan/model_loader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto named = shardplan::parse_model_description(text, "fuzz.json");
    const auto tree = shardplan::tree_from_names(named);
    if (tree.num_leaves() != named.size()) __builtin_trap();  // every tensor is one leaf
  } catch (const shardplan::IoError&) {
  }
  return 0;
}
