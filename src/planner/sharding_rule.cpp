#include "shardplan/sharding_rule.hpp"

namespace shardplan {

std::vector<RuleStep> ShardingRule::explain(const RuleInput& in) const {
  RuleDecision d = apply(in);
  return {RuleStep{d.entry, d.reason + " -> " + d.spec.to_string(), true}};
}

std::ostream& operator<<(std::ostream& os, const RuleLeaf& leaf) {
  if (const auto* r = std::get_if<RulePtr>(&leaf)) return os << (*r ? (*r)->name() : "null rule");
  if (const auto* p = std::get_if<PartitionSpec>(&leaf)) return os << *p;
  if (std::holds_alternative<Replicated>(leaf)) return os << "Replicated";
  return os << "Unspecified";
}

std::ostream& operator<<(std::ostream& os, const RuleDecision& d) {
  os << "RuleDecision(" << d.spec << ", entry " << d.entry;
  if (!d.reason.empty()) os << ", " << d.reason;
  if (d.fell_through) os << ", fell through";
  for (std::size_t i = 0; i < d.also_decided.size(); ++i) {
    os << (i == 0 ? ", also entries " : ", ") << d.also_decided[i];
  }
  return os << ")";
}

std::ostream& operator<<(std::ostream& os, const RuleStep& step) {
  return os << "entry " << step.entry << ": " << step.description
            << (step.decided ? " (decided)" : "");
}

}  // namespace shardplan
