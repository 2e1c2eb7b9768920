#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "shardplan/mesh.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/tensor_spec.hpp"
#include "shardplan/tree.hpp"

namespace shardplan {

/// What a rule sees of one leaf: its path relative to where the rule is applied, its spec, the
/// mesh.
struct RuleInput {
  std::string_view path;
  const TensorSpec& tensor;
  const Mesh& mesh;
};

/// What a rule decided for one leaf, and why.
struct RuleDecision {
  PartitionSpec spec;
  /// Index of the rule's entry that decided (e.g. the regex), or -1 for a built-in default
  /// (a scalar replicated, a tensor below FSDP's min_size).
  int entry = -1;
  /// A short reason: "regex 'mlp/up_proj' matched", "below min_size 1048576".
  std::string reason;
  /// True when no specific entry matched and a catch-all or default decided.
  bool fell_through = false;
  /// The other entries that decided part of the spec, when several did (a logical-axis mapping
  /// decides each dimension with its own entry, `embed -> null` too), without `entry`. The
  /// planner counts them as matched, like `entry` (PlanReport::unmatched_rules).
  std::vector<int> also_decided;
  friend bool operator==(const RuleDecision&, const RuleDecision&) = default;
};

/// One step of an explanation: an entry tried on a leaf and whether it decided.
struct RuleStep {
  int entry = -1;
  std::string description;
  bool decided = false;
  friend bool operator==(const RuleStep&, const RuleStep&) = default;
};

/// A deterministic automaton over path bytes that a rule's decisions depend on (a regex table's
/// DFA). A rule that exposes one promises: two leaves whose relative paths lead to the same state
/// and whose TensorSpecs are equal get the same decision. The planner uses this to decide
/// identical subtrees reached in the same state once (every expert of a MoE layer, every layer
/// of a model). Thread-safe.
class PathAutomaton {
 public:
  using State = std::uint32_t;
  /// A state from which nothing may be concluded (the rule must see the path).
  static constexpr State kUnknown = 0xffffffffu;
  virtual ~PathAutomaton() = default;
  virtual State start() const = 0;
  /// The state after `bytes` follow a prefix that led to `s` (kUnknown stays kUnknown).
  virtual State advance(State s, std::string_view bytes) const = 0;
};

/// The interface of every sharding rule: maps a leaf to a PartitionSpec. The built-in rules in
/// rules/ use only this interface; a user's rule looks exactly like them. Implementations must be
/// thread-safe for concurrent apply() calls (they are immutable once built).
class ShardingRule {
 public:
  virtual ~ShardingRule() = default;
  /// The spec of one leaf. Throws RuleError naming the path when the rule cannot decide.
  virtual RuleDecision apply(const RuleInput& in) const = 0;
  /// The rule's name for reports: "FSDPShardingRule(axis=fsdp, min_size=1048576)".
  virtual std::string name() const = 0;
  /// Labels of the rule's entries, indexed like RuleDecision::entry (empty when it has none);
  /// the planner reports entries that decided no leaf.
  virtual std::vector<std::string> entry_labels() const { return {}; }
  /// The entries that decide named activations of a traced step (a rule file's logical axes that
  /// its `activations:` name) rather than leaves of a weight tree: a plan of weights reports them
  /// apart from the entries that decided nothing (UnmatchedRule::activation). Default: none.
  virtual std::vector<int> activation_entries() const { return {}; }
  /// Every entry tried on a leaf, in order, and which one decided. The default reports apply().
  virtual std::vector<RuleStep> explain(const RuleInput& in) const;
  /// The automaton the rule's decisions depend on, if it has one (see PathAutomaton); the default
  /// has none, and the planner calls apply() for every leaf.
  virtual const PathAutomaton* path_automaton() const { return nullptr; }
};

using RulePtr = std::shared_ptr<const ShardingRule>;

/// Rule-tree marker: every leaf below is replicated.
struct Replicated {
  friend bool operator==(Replicated, Replicated) { return true; }
};
/// Rule-tree marker: the sharding is left to propagation (sjit) or reported as unspecified.
struct Unspecified {
  friend bool operator==(Unspecified, Unspecified) { return true; }
};

/// A leaf of a rule tree: a rule, a spec for every leaf below, or a marker.
using RuleLeaf = std::variant<RulePtr, PartitionSpec, Replicated, Unspecified>;
/// A rule tree: a prefix of the data tree, each of its leaves covering the subtree below it.
using RuleTree = Tree<RuleLeaf>;

std::ostream& operator<<(std::ostream& os, const RuleLeaf& leaf);
/// "RuleDecision(PartitionSpec('x'), entry 2, regex 'w' matched)", with ", fell through" when set.
std::ostream& operator<<(std::ostream& os, const RuleDecision& decision);
/// "entry 2: regex 'w' (decided)".
std::ostream& operator<<(std::ostream& os, const RuleStep& step);

}  // namespace shardplan
