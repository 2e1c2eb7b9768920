#pragma once
// What the tests of the training planner share (train_plan_test*.cpp): model configs as Hugging
// Face writes them, and the presets.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include "allocation_events.hpp"
#include "model_step.hpp"
#include "nlohmann/json.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/detail/utf8.hpp"
#include "shardplan/error.hpp"
#include "shardplan/executor.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/sjit.hpp"
#include "shardplan/train_plan.hpp"
#include "step_compare.hpp"
#include "step_scaling.hpp"
#include "test_util.hpp"

namespace shardplan::test {

constexpr const char* kGpt2Small = R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768,
  "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_inner": null})";
constexpr const char* kLlama2_7b = R"({"model_type": "llama", "vocab_size": 32000,
  "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 32, "tie_word_embeddings": false})";
constexpr const char* kLlama3_70b = R"({"model_type": "llama", "vocab_size": 128256,
  "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
  "num_attention_heads": 64, "num_key_value_heads": 8, "tie_word_embeddings": false})";
// LLaMA-2-7B's widths with two layers: planned in well under a second.
constexpr const char* kLlama7bTwoLayers = R"({"model_type": "llama", "vocab_size": 32000,
  "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 2,
  "num_attention_heads": 32, "num_key_value_heads": 32})";
// Small enough to run: grouped-query attention (4 heads over 2 key/value heads).
constexpr const char* kTinyLlama = R"({"model_type": "llama", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2})";
// Mistral's sliding window on every layer (4 of the tests' 8 tokens), 22 layers.
constexpr const char* kTinyMistralWindow = R"({"model_type": "mistral", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 22,
  "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 4})";
constexpr const char* kMixtral8x7b = R"({"model_type": "mixtral", "vocab_size": 32000,
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
  "num_experts_per_tok": 2})";
constexpr const char* kTinyMixtral = R"({"model_type": "mixtral", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
  "num_experts_per_tok": 2})";
constexpr const char* kT5Small = R"({"model_type": "t5", "vocab_size": 32128, "d_model": 512,
  "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": 6, "num_heads": 8,
  "relative_attention_num_buckets": 32, "feed_forward_proj": "relu"})";
constexpr const char* kFlanT5Base = R"({"model_type": "t5", "vocab_size": 32128, "d_model": 768,
  "d_kv": 64, "d_ff": 2048, "num_layers": 12, "num_decoder_layers": 12, "num_heads": 12,
  "relative_attention_num_buckets": 32, "feed_forward_proj": "gated-gelu",
  "tie_word_embeddings": false})";
constexpr const char* kTinyT5 = R"({"model_type": "t5", "vocab_size": 40, "d_model": 16,
  "d_kv": 6, "d_ff": 24, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 2,
  "relative_attention_num_buckets": 8, "relative_attention_max_distance": 12,
  "feed_forward_proj": "gated-gelu", "tie_word_embeddings": true})";
constexpr const char* kTinyGpt2 = R"({"model_type": "gpt2", "vocab_size": 40, "n_embd": 16,
  "n_layer": 2, "n_head": 2, "n_positions": 16})";

inline RulePtr preset(const char* name) { return load_preset(name).make_rule(); }

// The parameters of `c` in `dtype`, each uniform in [-0.3, 0.3] (seeds `seed`, `seed` + 1, ...),
// replicated over `mesh`.
inline Tree<Array> uniform_parameters(const ModelConfig& c, DType dtype, std::uint64_t seed,
                                      const Mesh& mesh, const Executor& exec) {
  return c.parameters(dtype).map([&](const TensorSpec& s) {
    return device_put(Tensor::uniform(s.shape, dtype, seed++, -0.3, 0.3),
                      NamedSharding(mesh, PartitionSpec()), exec);
  });
}

// Tokens of `shape` (token i is 7 i mod 40) and their targets (the next token), placed as `spec`.
inline std::pair<Array, Array> tokens_and_targets(const Shape& shape, const Mesh& mesh,
                                                  const PartitionSpec& spec, const Executor& exec) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7) % 40);
  const Array tokens = device_put(Tensor::from(shape, ids), NamedSharding(mesh, spec), exec);
  std::rotate(ids.begin(), ids.begin() + 1, ids.end());
  return {tokens, device_put(Tensor::from(shape, ids), NamedSharding(mesh, spec), exec)};
}

}  // namespace shardplan::test
