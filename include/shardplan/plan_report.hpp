#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "shardplan/format_bytes.hpp"  // (part of this header's API before it moved)
#include "shardplan/mesh.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/shape.hpp"
#include "shardplan/tensor_spec.hpp"

namespace shardplan {

/// How one leaf is sharded, and what decided it.
struct LeafPlan {
  std::string path;
  TensorSpec tensor;
  /// The spec; nullopt when the rule tree left the leaf Unspecified.
  std::optional<PartitionSpec> spec;
  /// Shape of each device's block (the global shape when unspecified).
  Shape shard_shape;
  /// Bytes each device holds (0 when unspecified).
  std::int64_t bytes_per_device = 0;
  /// The rule-tree leaf that covered this leaf: its index in flatten order (PlanReport::rules
  /// has its path and name), or -1 for a none node of the rule tree.
  int rule_index = -1;
  /// The entry of the rule that decided (-1 for none) and the reason; an empty reason means the
  /// entry's label says it (PlanReport::reason_of gives the text either way).
  int entry = -1;
  std::string reason;
  /// True when a default or catch-all decided.
  bool fell_through = false;

  friend bool operator==(const LeafPlan&, const LeafPlan&) = default;
};

/// A leaf of the rule tree: where it sits, what it is, and its entries' labels.
struct RuleInfo {
  int rule_index = -1;
  std::string rule_path;
  /// The rule's name, or "PartitionSpec", "Replicated", "Unspecified", "None".
  std::string rule;
  std::vector<std::string> labels;
  friend bool operator==(const RuleInfo&, const RuleInfo&) = default;
};

/// A rule entry that decided no leaf.
struct UnmatchedRule {
  int rule_index = -1;
  std::string rule_path;
  std::string rule;
  int entry = -1;  // -1: the whole rule covered no leaf
  std::string label;
  /// The entry decides named activations, not weights (ShardingRule::activation_entries): not a
  /// sign of a typo in a plan of weights, and reported apart.
  bool activation = false;
  friend bool operator==(const UnmatchedRule&, const UnmatchedRule&) = default;
};

/// The result of MeshShardingHelper::plan: every leaf's sharding with its reason, and totals.
/// A plain value type; print it as a table with operator<< or table(), or as JSON with to_json().
struct PlanReport {
  Mesh mesh;
  std::vector<LeafPlan> leaves;
  /// Bytes held by each device, indexed by device id.
  std::vector<std::int64_t> device_bytes;
  /// Bytes of all leaves, unsharded.
  std::int64_t total_bytes = 0;
  std::vector<UnmatchedRule> unmatched_rules;
  /// The leaves of the rule tree, indexed by LeafPlan::rule_index.
  std::vector<RuleInfo> rules;

  std::int64_t min_device_bytes() const;
  std::int64_t max_device_bytes() const;
  /// Indices into `leaves` of the `n` largest tensors, largest first (ties in flatten order).
  std::vector<std::size_t> largest(std::size_t n) const;
  /// Indices into `leaves` of the leaves a default or catch-all decided.
  std::vector<std::size_t> fell_through() const;
  /// The leaf with this path, or nullptr.
  const LeafPlan* find(std::string_view path) const;
  /// The rule-tree leaf that decided `leaf` (a "None" entry for rule_index -1).
  const RuleInfo& rule_of(const LeafPlan& leaf) const;
  /// Why `leaf` has its spec: the rule's reason, or the label of the entry that decided.
  std::string reason_of(const LeafPlan& leaf) const;

  /// An aligned table (path, shape, dtype, spec, shard shape, bytes per device, rule) followed
  /// by the summary: bytes per device (min, max), the largest tensors, unmatched rules, leaves
  /// that fell through.
  std::string table(std::size_t largest_n = 5) const;
  /// The summary alone (what table() prints after the rows): for large models.
  std::string summary(std::size_t largest_n = 5) const;
  /// The JSON form documented in docs/cli.md (mesh, leaves, devices, total_bytes,
  /// unmatched_rules, fell_through). `indent` < 0 gives one line.
  std::string to_json(int indent = 2) const;
  /// to_json written to `os` as it is produced (no copy of the whole text in memory). Names or
  /// patterns that are not UTF-8 have each bad byte written as U+FFFD, so the text is valid JSON.
  void write_json(std::ostream& os, int indent = 2) const;

  friend bool operator==(const PlanReport&, const PlanReport&) = default;
};

std::ostream& operator<<(std::ostream& os, const PlanReport& report);
/// "params/w f32[8, 4] ["x"] -> [4, 4], 64 bytes/device, rule #0 [1]".
std::ostream& operator<<(std::ostream& os, const LeafPlan& leaf);
/// "#0 at 'params': TreePathShardingRule(...)".
std::ostream& operator<<(std::ostream& os, const RuleInfo& rule);
/// "#0 TreePathShardingRule(...) [2]: 'w_out'" (no "[e]" when the whole rule matched nothing).
std::ostream& operator<<(std::ostream& os, const UnmatchedRule& rule);

}  // namespace shardplan
