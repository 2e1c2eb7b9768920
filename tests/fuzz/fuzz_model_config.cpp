// Any bytes as a Hugging Face config.json: ModelConfig::parse must accept or throw a
// shardplan::Error naming the file, never crash (deep nesting, huge numbers, duplicate keys,
// bytes that are not UTF-8, sizes whose products overflow).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "shardplan/error.hpp"
#include "shardplan/train_plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const shardplan::ModelConfig c = shardplan::ModelConfig::parse(text, "fuzz.json");
    // The tree too, while it stays small enough to build quickly.
    if (c.layers + c.decoder_layers <= 8 && c.experts <= 8) (void)c.parameter_count();
  } catch (const shardplan::Error&) {
  }
  return 0;
}
