#pragma once
// The declared training stacks (training_stack.hpp), one function each; training_stack.cpp lists
// them. Private to the library.
#include "shardplan/training_stack.hpp"

namespace shardplan::train::stacks {

const TrainingStack& torchtitan_2024_07();
const TrainingStack& torchtitan_2024_12();
const TrainingStack& torchtitan_2025_06();
const TrainingStack& torchtitan_2025_08();
const TrainingStack& megatron_core();
const TrainingStack& llm_foundry();
const TrainingStack& fms_fsdp();
const TrainingStack& maxtext();

}  // namespace shardplan::train::stacks
