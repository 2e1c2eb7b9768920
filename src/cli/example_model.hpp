#pragma once

#include <string>
#include <utility>
#include <vector>

#include "shardplan/dtype.hpp"
#include "shardplan/tensor_spec.hpp"

namespace shardplan::cli {

/// A LLaMA decoder's sizes; the defaults are LLaMA-2-7B's.
struct LlamaDims {
  std::int64_t vocab = 32000, hidden = 4096, intermediate = 11008, layers = 32;
};

/// The tensors of a LLaMA checkpoint of these sizes in Hugging Face naming.
std::vector<std::pair<std::string, TensorSpec>> llama_tensors(const LlamaDims& dims, DType dtype);

/// The tensors of a LLaMA-2-7B checkpoint in Hugging Face naming (vocab 32000, hidden 4096,
/// intermediate 11008, 32 layers, bf16), the model `shardplan plan` uses without --model.
std::vector<std::pair<std::string, TensorSpec>> llama2_7b_tensors();

}  // namespace shardplan::cli
