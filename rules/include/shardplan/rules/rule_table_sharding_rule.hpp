#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardplan/rules/fsdp_sharding_rule.hpp"
#include "shardplan/rules/logical_axis_rule.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "shardplan/sharding_rule.hpp"

namespace shardplan {

/// The rule a rule file describes (RuleFile::make_rule): a leaf with logical axis names uses the
/// logical mapping when one is given; any other leaf tries the regex table (first match wins),
/// then the FSDP fallback, then fails naming the path (strict) or is replicated (not strict).
///
/// Entries, as RuleDecision::entry and entry_labels() number them: the regex patterns first
/// (0..n-1), then "fsdp_fallback" (n) when there is one, then the logical mappings
/// ("batch -> data"). Leaves decided by the fallback or by nothing are reported as fell through.
class RuleTableShardingRule : public ShardingRule {
 public:
  /// `table` must not be strict: this rule applies strictness after the fallback.
  /// `activation_axes`: the logical axes that name activations' dimensions (a rule file's
  /// `activations:`), reported by activation_entries().
  RuleTableShardingRule(std::string source, std::shared_ptr<const TreePathShardingRule> table,
                        std::optional<FSDPShardingRule> fsdp_fallback,
                        std::optional<LogicalAxisRule> logical, bool strict,
                        std::vector<std::string> activation_axes = {});

  RuleDecision apply(const RuleInput& in) const override;
  std::string name() const override;
  std::vector<std::string> entry_labels() const override;
  /// The logical mappings whose name is one of the activation axes given when built.
  std::vector<int> activation_entries() const override;
  std::vector<RuleStep> explain(const RuleInput& in) const override;
  /// The regex table's automaton: the other steps depend only on the tensor spec.
  const PathAutomaton* path_automaton() const override { return table_->path_automaton(); }

 private:
  std::string source_;
  std::shared_ptr<const TreePathShardingRule> table_;
  std::optional<FSDPShardingRule> fsdp_fallback_;
  std::optional<LogicalAxisRule> logical_;
  bool strict_;
  std::vector<std::string> activation_axes_;
  int fallback_entry_;
  int logical_offset_;
};

}  // namespace shardplan
