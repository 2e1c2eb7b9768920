#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "shardplan/sharding_rule.hpp"

namespace shardplan {

/// A rule from a callable, as scalax's PolicyShardingRule: policy(path, tensor) -> spec.
/// An exception thrown by the callable is rethrown as RuleError naming the path and its message.
/// Thread-safe when the callable is.
class PolicyShardingRule : public ShardingRule {
 public:
  using Policy = std::function<PartitionSpec(std::string_view path, const TensorSpec& tensor)>;

  explicit PolicyShardingRule(Policy policy, std::string label = "policy");

  RuleDecision apply(const RuleInput& in) const override;
  std::string name() const override;

 private:
  Policy policy_;
  std::string label_;
};

}  // namespace shardplan
