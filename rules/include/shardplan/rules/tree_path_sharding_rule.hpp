#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/sharding_rule.hpp"

namespace shardplan {

/// Regex rules over tree paths, as scalax's TreePathShardingRule: (regex, spec) pairs tried in
/// order with an unanchored search over the leaf's path, meaning what Python's
/// `re.search(pattern, path)` means on the path decoded from UTF-8 (docs/rule-files.md, "Pattern
/// dialect"); the first match wins. Scalars and one-element tensors are replicated before any rule
/// is tried. No match is a RuleError naming the path when `strict`, else replicated (reported as
/// fell through). An entry whose pattern matches the empty path (".*") is a catch-all: leaves it
/// decides are reported as fell through. Thread-safe.
class TreePathShardingRule : public ShardingRule {
 public:
  struct Entry {
    std::string pattern;
    PartitionSpec spec;
  };

  /// Throws RuleError naming the entry index, the pattern and the error position (in code points,
  /// as Python's re.error.pos) for a pattern Python rejects or shardplan does not support.
  explicit TreePathShardingRule(std::vector<Entry> entries, bool strict = true);
  ~TreePathShardingRule() override;

  /// Throws RuleError when strict and nothing matches, or when a lookaround/backreference entry
  /// goes past the backtracking bound on this path.
  RuleDecision apply(const RuleInput& in) const override;
  std::string name() const override;
  std::vector<std::string> entry_labels() const override;
  std::vector<RuleStep> explain(const RuleInput& in) const override;
  /// The DFA of the whole table, or nullptr when an entry needs the backtracker (lookaround,
  /// backreferences, conditionals, atomic groups, possessive repeats).
  const PathAutomaton* path_automaton() const override;

  /// The decision of the first matching entry (or the scalar pre-check), or nullopt when no
  /// entry matches. Lets other rules (rule files) chain a fallback after this one.
  std::optional<RuleDecision> try_match(const RuleInput& in) const;

  const std::vector<Entry>& entries() const { return entries_; }
  bool strict() const { return strict_; }

 private:
  struct Impl;
  std::vector<Entry> entries_;
  bool strict_;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace shardplan
