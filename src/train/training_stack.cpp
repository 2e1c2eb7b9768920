#include "shardplan/training_stack.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "stacks/stacks.hpp"

namespace shardplan {

const std::vector<TrainingStack>& training_stacks() {
  static const std::vector<TrainingStack> all = {
      train::stacks::torchtitan_2024_07(), train::stacks::torchtitan_2024_12(),
      train::stacks::torchtitan_2025_06(), train::stacks::torchtitan_2025_08(),
      train::stacks::megatron_core(),      train::stacks::llm_foundry(),
      train::stacks::fms_fsdp(),           train::stacks::maxtext()};
  return all;
}

const TrainingStack& find_training_stack(std::string_view name) {
  const auto& all = training_stacks();
  const auto it = std::find_if(all.begin(), all.end(),
                               [&](const TrainingStack& s) { return s.name == name; });
  if (it != all.end()) return *it;
  std::vector<std::string_view> known;
  for (const TrainingStack& s : all) known.push_back(s.name);
  throw SpecError(fmt::format("[train] unknown stack '{}' (known: {})", detail::printable(name),
                              fmt::join(known, ", ")));
}

namespace {

/// The first of `c`'s options that `given` says was given, as spelled; empty: none.
std::string overriding_option(const StackChoice& c, const GivenOption& given) {
  if (!given) return {};
  for (std::string_view option : c.options) {
    if (std::string as_given = given(option); !as_given.empty()) return as_given;
  }
  return {};
}

}  // namespace

void apply_stack(const TrainingStack& stack, TrainPlanOptions& o, const GivenOption& given) {
  StackUse use{.name = std::string(stack.name), .validated = stack.validated()};
  for (const StackChoice& c : stack.choices) {
    if (!c.modelled()) {
      use.not_modelled.emplace_back(c.topic);
    } else if (const std::string by = overriding_option(c, given); !by.empty()) {
      use.overridden.push_back(fmt::format("{} (by {})", c.topic, by));
    } else {
      c.apply(o);
      use.applied.push_back(fmt::format("{}: {}", c.topic, c.setting));
      use.options_set.insert(use.options_set.end(), c.options.begin(), c.options.end());
    }
  }
  o.stack = std::move(use);
}

std::string explain_stack(const TrainingStack& stack, const GivenOption& given) {
  std::string out = fmt::format("stack {}: {}\n", stack.name, stack.summary);
  out += stack.validated()
             ? fmt::format("validated on {} published runs: {}\n", stack.validated_by.size(),
                           fmt::join(stack.validated_by, "; "))
             : fmt::format("unvalidated: {} published run{} planned through it (fewer than 2)\n",
                           stack.validated_by.size(), stack.validated_by.size() == 1 ? "" : "s");
  for (const StackChoice& c : stack.choices) {
    const std::string by = c.modelled() ? overriding_option(c, given) : std::string();
    out += fmt::format("\n{}\n  runs:    {}\n  planned: {}{}\n  source:  {}\n", c.topic, c.what,
                       c.setting, by.empty() ? "" : fmt::format(" (overridden by {})", by),
                       c.source);
  }
  return out;
}

}  // namespace shardplan
