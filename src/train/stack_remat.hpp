#pragma once
// --remat STACK:NAME: the training stacks' own activation-checkpointing policies, each mapped to a
// RematPolicy by one declared table (stack_remat.cpp) with its source. Private to the library.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/remat.hpp"

namespace shardplan::train {

/// One stack's policy name and what train-plan plans for it.
struct StackRematName {
  std::string_view name;  // as --remat takes it: "maxtext:minimal"
  std::string source;     // the stack's file and symbol at a commit
  /// The policy; name lists ignore the names the model's layer does not give (as JAX does).
  std::optional<RematPolicy> policy;
  std::string_view refusal;  // why it cannot be planned ("" when it can)
};

/// Every STACK:NAME --remat takes, in the order docs/training.md lists them.
const std::vector<StackRematName>& stack_remat_names();

/// The entry named `name`; a SpecError listing the known names when there is none.
const StackRematName& stack_remat_name(std::string_view name);

}  // namespace shardplan::train
