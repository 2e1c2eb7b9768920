#pragma once
// Training stacks declared as data: what torchtitan (by date), Megatron-Core, llm-foundry,
// fms-fsdp and MaxText run in a training step, one choice at a time, each with the source that
// says so. train-plan's --stack applies a stack's choices to the step's options; an option given
// on the command line overrides the choice it sets; a choice train-plan cannot plan is listed as
// not modelled (never applied as something else). docs/training.md "Training stacks".
//
//   TrainPlanOptions o;
//   apply_stack(find_training_stack("torchtitan-2024-12"), o);  // o.stack names it
//   const TrainPlan p = plan_training(config, mesh, rule, o);    // p.stack: what applied
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/train_plan.hpp"

namespace shardplan {

/// One thing a stack does in a training step.
struct StackChoice {
  std::string_view topic;   // "mixed precision", "activation checkpointing", ...
  std::string_view what;    // what the stack runs, in its own terms
  std::string_view source;  // where that is said: "pytorch/torchtitan@3f20451 path: symbol"
  /// The choice as train-plan's options spell it ("--mixed-precision fsdp2"); for a choice not
  /// modelled, what train-plan plans instead and why.
  std::string_view setting;
  /// The options that set what this choice sets: one of them on the command line overrides it
  /// (the first is the one `setting` names).
  std::vector<std::string_view> options;
  /// Sets the choice in the options; null: not modelled (listed, never applied).
  void (*apply)(TrainPlanOptions&) = nullptr;

  bool modelled() const { return apply != nullptr; }
};

/// A stack: its name, what it is, its choices, and the published runs planned through it.
struct TrainingStack {
  std::string_view name;     // "torchtitan-2024-12"
  std::string_view summary;  // one line: the version and what it is
  std::vector<StackChoice> choices;
  /// The published, measured runs planned through this stack in tests/published_runs_test.cpp
  /// (a test keeps the two lists equal). Fewer than 2: reported as unvalidated.
  std::vector<std::string_view> validated_by;

  bool validated() const { return validated_by.size() >= 2; }
};

/// Every declared stack, in docs/training.md's order.
const std::vector<TrainingStack>& training_stacks();

/// The stack called `name`. Throws SpecError naming it and listing the known ones.
const TrainingStack& find_training_stack(std::string_view name);

/// Whether an option was given, as spelled on the command line ("--compile" for "--eager"'s
/// negation); empty: not given.
using GivenOption = std::function<std::string(std::string_view option)>;

/// Applies `stack`'s modelled choices to `o`, except those one of whose options `given` says was
/// given (the user's flags override the stack), and records in o.stack what applied, what was
/// overridden and what is not modelled.
void apply_stack(const TrainingStack& stack, TrainPlanOptions& o, const GivenOption& given = {});

/// Every choice of `stack` as lines for people (train-plan --stack NAME --explain): topic, what
/// the stack runs, the setting or "not modelled", the source; a choice `given` overrides is
/// marked.
std::string explain_stack(const TrainingStack& stack, const GivenOption& given = {});

}  // namespace shardplan
