#include "shardplan/rules/policy_sharding_rule.hpp"

#include <fmt/format.h>

#include <exception>
#include <utility>

#include "shardplan/error.hpp"

namespace shardplan {

PolicyShardingRule::PolicyShardingRule(Policy policy, std::string label)
    : policy_(std::move(policy)), label_(std::move(label)) {
  if (!policy_) throw RuleError(fmt::format("[rule] PolicyShardingRule '{}': empty callable", label_));
}

RuleDecision PolicyShardingRule::apply(const RuleInput& in) const {
  RuleDecision d;
  try {
    d.spec = policy_(in.path, in.tensor);
  } catch (const std::exception& e) {
    std::throw_with_nested(
        RuleError(fmt::format("[rule] policy '{}' failed on '{}' (shape {}): {}", label_, in.path,
                              in.tensor.shape.to_string(), e.what())));
  } catch (...) {
    // Not a std::exception (an int, a user's type): nested all the same.
    std::throw_with_nested(RuleError(fmt::format(
        "[rule] policy '{}' failed on '{}' (shape {}): it threw an exception that is not a "
        "std::exception",
        label_, in.path, in.tensor.shape.to_string())));
  }
  d.entry = -1;
  d.reason = fmt::format("policy '{}'", label_);
  return d;
}

std::string PolicyShardingRule::name() const { return fmt::format("PolicyShardingRule({})", label_); }

}  // namespace shardplan
