#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/sharding_rule.hpp"

namespace shardplan {

/// Logical axis rules, as Flax's logical_axis_rules: tensors carry a logical name per dimension
/// (TensorSpec::logical_axes: "batch", "embed", "mlp"), and an ordered mapping turns each name
/// into mesh axes: `{"batch", {"data"}}, {"mlp", {"tp"}}, {"embed", std::nullopt}`.
/// For each dimension the first mapping entry for its name whose mesh axes are not already used
/// by an earlier dimension wins (Flax's fallback); a name with no usable entry, or "", is not
/// sharded. A tensor without logical axes is replicated (fell through), or a RuleError when
/// `strict`. Thread-safe.
class LogicalAxisRule : public ShardingRule {
 public:
  using Mapping = std::vector<std::pair<std::string, std::optional<AxisNames>>>;

  explicit LogicalAxisRule(Mapping mapping, bool strict = false);

  RuleDecision apply(const RuleInput& in) const override;
  std::string name() const override;
  std::vector<std::string> entry_labels() const override;

  /// The mesh spec for a list of logical names (the pure mapping, no tensor needed).
  PartitionSpec to_mesh_spec(const std::vector<std::string>& logical_axes) const;
  const Mapping& mapping() const { return mapping_; }

 private:
  Mapping mapping_;
  bool strict_;
};

}  // namespace shardplan
