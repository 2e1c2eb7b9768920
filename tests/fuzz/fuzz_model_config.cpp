// Any bytes as a Hugging Face config.json: ModelConfig::parse must accept or throw
// shardplan::Error, never crash or hang (deep nesting, huge or negative numbers, wrong types,
// bytes that are not UTF-8).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "shardplan/error.hpp"
#include "shardplan/train_plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)shardplan::ModelConfig::parse(text, "fuzz/config.json");
  } catch (const shardplan::Error&) {
  }
  return 0;
}
