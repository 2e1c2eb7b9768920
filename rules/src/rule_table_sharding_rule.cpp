#include "shardplan/rules/rule_table_sharding_rule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "shardplan/error.hpp"

namespace shardplan {

RuleTableShardingRule::RuleTableShardingRule(std::string source,
                                             std::shared_ptr<const TreePathShardingRule> table,
                                             std::optional<FSDPShardingRule> fsdp_fallback,
                                             std::optional<LogicalAxisRule> logical, bool strict,
                                             std::vector<std::string> activation_axes)
    : source_(std::move(source)),
      table_(std::move(table)),
      fsdp_fallback_(std::move(fsdp_fallback)),
      logical_(std::move(logical)),
      strict_(strict),
      activation_axes_(std::move(activation_axes)) {
  if (!table_) throw RuleError("[rule] RuleTableShardingRule: no regex table");
  const int n = static_cast<int>(table_->entries().size());
  fallback_entry_ = fsdp_fallback_ ? n : -1;
  logical_offset_ = n + (fsdp_fallback_ ? 1 : 0);
}

RuleDecision RuleTableShardingRule::apply(const RuleInput& in) const {
  if (logical_ && !in.tensor.logical_axes.empty()) {
    RuleDecision d = logical_->apply(in);
    if (d.entry >= 0) d.entry += logical_offset_;
    for (int& e : d.also_decided) e += logical_offset_;
    return d;
  }
  if (auto d = table_->try_match(in)) return std::move(*d);
  if (fsdp_fallback_) {
    RuleDecision d = fsdp_fallback_->apply(in);
    d.entry = fallback_entry_;
    d.fell_through = true;
    d.reason = "fsdp_fallback: " + d.reason;
    return d;
  }
  if (strict_) {
    throw RuleError(fmt::format("[rule] no rule of {} matches '{}' (shape {}), and it has no "
                                "fsdp_fallback",
                                source_, in.path, in.tensor.shape.to_string()));
  }
  RuleDecision d;
  d.reason = "no rule matched (not strict: replicated)";
  d.fell_through = true;
  return d;
}

std::string RuleTableShardingRule::name() const {
  return fmt::format("rules {} ({} rules{}{}, {})", source_, table_->entries().size(),
                     fsdp_fallback_ ? ", fsdp_fallback" : "",
                     logical_ ? fmt::format(", {} logical axes", logical_->mapping().size()) : "",
                     strict_ ? "strict" : "not strict");
}

std::vector<std::string> RuleTableShardingRule::entry_labels() const {
  std::vector<std::string> labels = table_->entry_labels();
  if (fsdp_fallback_) labels.push_back("fsdp_fallback");
  if (logical_) {
    for (auto& l : logical_->entry_labels()) labels.push_back(std::move(l));
  }
  return labels;
}

std::vector<int> RuleTableShardingRule::activation_entries() const {
  std::vector<int> entries;
  if (!logical_) return entries;
  const auto& mapping = logical_->mapping();
  for (std::size_t i = 0; i < mapping.size(); ++i) {
    if (std::find(activation_axes_.begin(), activation_axes_.end(), mapping[i].first) !=
        activation_axes_.end()) {
      entries.push_back(logical_offset_ + static_cast<int>(i));
    }
  }
  return entries;
}

std::vector<RuleStep> RuleTableShardingRule::explain(const RuleInput& in) const {
  if (logical_ && !in.tensor.logical_axes.empty()) {
    RuleDecision d = apply(in);
    return {{d.entry, fmt::format("logical axes -> {} ({})", d.spec.to_string(), d.reason), true}};
  }
  std::vector<RuleStep> steps = table_->explain(in);
  if (!steps.empty() && steps.back().entry == -1 && !table_->try_match(in)) {
    steps.pop_back();  // the table's own "no rule matched" line; this rule decides what follows
    if (!fsdp_fallback_ && strict_) {
      steps.push_back({-1, "no rule matched and no fsdp_fallback: error (strict)", false});
      return steps;
    }
    RuleDecision d = apply(in);
    steps.push_back({d.entry,
                     fsdp_fallback_ ? fmt::format("fsdp_fallback -> {} ({})", d.spec.to_string(),
                                                  d.reason)
                                    : std::string("no rule matched: replicated (not strict)"),
                     true});
  }
  return steps;
}

}  // namespace shardplan
