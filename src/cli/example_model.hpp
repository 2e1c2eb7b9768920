#pragma once

#include <string>
#include <utility>
#include <vector>

#include "shardplan/tensor_spec.hpp"

namespace shardplan::cli {

/// The tensors of a LLaMA-2-7B checkpoint in Hugging Face naming (vocab 32000, hidden 4096,
/// intermediate 11008, 32 layers, bf16), the model `shardplan plan` uses without --model.
std::vector<std::pair<std::string, TensorSpec>> llama2_7b_tensors();

}  // namespace shardplan::cli
