#include "shardplan/rules/tree_path_sharding_rule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <utility>

#include "path_matcher.hpp"
#include "shardplan/error.hpp"

namespace shardplan {

namespace {

/// The table's DFA seen as the planner's PathAutomaton. Decisions depend on the path only through
/// the DFA's first match, and on the tensor through the one-element check, so equal states and
/// equal specs give equal decisions.
class DfaAutomaton : public PathAutomaton {
 public:
  explicit DfaAutomaton(const detail::PathMatcher& m) : m_(m) {}
  State start() const override { return m_.start(); }
  State advance(State s, std::string_view bytes) const override {
    if (s == kUnknown) return kUnknown;
    // A chunk that ends inside a character (invalid UTF-8 in a key) is left to the rule.
    const auto next = m_.scan(s, bytes, /*partial=*/true);
    return next == detail::PathMatcher::kIncomplete ? kUnknown : next;
  }

 private:
  const detail::PathMatcher& m_;
};

/// Ids of rule tables, never reused in a process (2^64 constructions will not happen).
std::atomic<std::uint64_t> next_table_id{1};

}  // namespace

struct TreePathShardingRule::Impl {
  /// Keys the per-thread memo below. Not the address: a rule built after another was destroyed
  /// may get the same address, and would resume from the dead rule's DFA states.
  const std::uint64_t id = next_table_id.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::string> patterns;
  std::optional<detail::PatternTable> table;
  /// Entries whose pattern matches the empty string (catch-alls, reported as fell through).
  std::vector<bool> catch_all;
  std::optional<DfaAutomaton> automaton;  // over table->dfa(), when it decides every entry

  /// Index of the first entry whose pattern is found in `path` (re.search), or -1.
  int first_match(std::string_view path) const {
    if (const detail::PathMatcher* dfa = table->dfa()) return dfa_first_match(*dfa, path);
    try {
      return table->first_match(path);
    } catch (const detail::TableBudgetError& e) {
      throw RuleError(fmt::format(
          "[rule] TreePathShardingRule: rule {} ('{}') gave up on '{}' after {} backtracking "
          "steps (lookaround or backreferences over a long path); simplify the pattern",
          e.index, patterns[e.index], path, detail::Backtracker::kDefaultBudget));
    }
  }

  // Callers visit leaves in flatten order, so consecutive paths share long prefixes
  // ("model/layers/17/mlp/experts/201/..."). Each thread remembers its last path and the DFA state
  // after each of its bytes, and resumes from the longest common prefix. Inside a character (or
  // after an invalid byte, whose decoding looked at the byte after it) there is no state.
  int dfa_first_match(const detail::PathMatcher& dfa, std::string_view path) const {
    using State = detail::PathMatcher::State;
    constexpr State kNone = detail::PathMatcher::kIncomplete;
    struct Memo {
      std::uint64_t owner = 0;  // Impl::id
      std::string last;
      std::vector<State> states;  // states[i]: after i bytes of `last`, or kNone
    };
    thread_local Memo memo;
    if (memo.owner != id || memo.states.empty()) {
      memo.owner = id;
      memo.last.clear();
      memo.states.assign(1, dfa.start());
    }
    const std::size_t n = std::min(path.size(), memo.last.size());
    std::size_t common = static_cast<std::size_t>(
        std::mismatch(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(n),
                      memo.last.begin())
            .first -
        path.begin());
    while (memo.states[common] == kNone) --common;  // states[0] is the start
    memo.last.resize(common);
    memo.last.append(path.substr(common));
    if (memo.states.size() < path.size() + 1) memo.states.resize(path.size() + 1);
    State s = memo.states[common];
    const auto* p = reinterpret_cast<const unsigned char*>(path.data());
    for (std::size_t i = common; i < path.size();) {
      if (p[i] < 0x80) {
        s = dfa.step(s, p[i]);
        memo.states[++i] = s;
        continue;
      }
      char32_t cp = 0;
      const std::size_t len = detail::PathMatcher::decode(p + i, path.size() - i, cp);
      s = dfa.step(s, cp);
      for (std::size_t k = 1; k < len; ++k) memo.states[i + k] = kNone;
      i += len;
      memo.states[i] = len == 1 ? kNone : s;
    }
    return dfa.first_match(s);
  }
};

TreePathShardingRule::TreePathShardingRule(std::vector<Entry> entries, bool strict)
    : entries_(std::move(entries)), strict_(strict) {
  auto impl = std::make_shared<Impl>();
  for (const Entry& e : entries_) impl->patterns.push_back(e.pattern);
  const std::vector<std::string>& patterns = impl->patterns;
  try {
    impl->table.emplace(patterns);
  } catch (const detail::TablePatternError& e) {
    throw RuleError(
        fmt::format("[rule] TreePathShardingRule: rule {} has a bad regex '{}' at "
                    "position {}: {}",
                    e.index, patterns[e.index], e.error.position, e.error.message));
  } catch (const detail::TableBudgetError& e) {
    throw RuleError(
        fmt::format("[rule] TreePathShardingRule: rule {} ('{}') gave up on the empty "
                    "path after {} backtracking steps",
                    e.index, patterns[e.index], detail::Backtracker::kDefaultBudget));
  }
  for (std::size_t i = 0; i < patterns.size(); ++i)
    impl->catch_all.push_back(impl->table->matches_empty(i));
  if (const detail::PathMatcher* dfa = impl->table->dfa()) impl->automaton.emplace(*dfa);
  impl_ = std::move(impl);
}

TreePathShardingRule::~TreePathShardingRule() = default;

namespace {

bool is_trivial(const TensorSpec& t) { return t.shape.rank() == 0 || t.shape.numel() == 1; }

}  // namespace

std::optional<RuleDecision> TreePathShardingRule::try_match(const RuleInput& in) const {
  RuleDecision d;
  if (is_trivial(in.tensor)) {
    d.reason = "one element";
    return d;
  }
  const int index = impl_->first_match(in.path);
  if (index < 0) return std::nullopt;
  const auto i = static_cast<std::size_t>(index);
  d.spec = entries_[i].spec;
  d.entry = index;
  d.fell_through = impl_->catch_all[i];
  // No reason text: the entry's label (its pattern) says it, and formatting one per leaf would
  // cost more than the match (PlanReport::reason_of renders it).
  return d;
}

RuleDecision TreePathShardingRule::apply(const RuleInput& in) const {
  if (auto d = try_match(in)) return std::move(*d);
  if (strict_) {
    std::string tried;
    const std::size_t shown = std::min<std::size_t>(entries_.size(), 5);
    for (std::size_t i = 0; i < shown; ++i) {
      tried += fmt::format("{}'{}'", i ? ", " : "", entries_[i].pattern);
    }
    if (shown < entries_.size()) tried += fmt::format(", ... ({} in all)", entries_.size());
    if (entries_.empty()) tried = "none";
    throw RuleError(fmt::format(
        "[rule] no rule of TreePathShardingRule matches '{}' (shape {}); rules tried: {}", in.path,
        in.tensor.shape.to_string(), tried));
  }
  RuleDecision d;
  d.reason = "no rule matched (not strict: replicated)";
  d.fell_through = true;
  return d;
}

std::string TreePathShardingRule::name() const {
  return fmt::format("TreePathShardingRule({} rules, {})", entries_.size(),
                     strict_ ? "strict" : "not strict");
}

const PathAutomaton* TreePathShardingRule::path_automaton() const {
  return impl_->automaton ? &*impl_->automaton : nullptr;
}

std::vector<std::string> TreePathShardingRule::entry_labels() const {
  std::vector<std::string> labels;
  labels.reserve(entries_.size());
  for (const Entry& e : entries_) labels.push_back(e.pattern);
  return labels;
}

std::vector<RuleStep> TreePathShardingRule::explain(const RuleInput& in) const {
  std::vector<RuleStep> steps;
  if (is_trivial(in.tensor)) {
    steps.push_back({-1,
                     fmt::format("shape {} is a scalar or has one element: replicated",
                                 in.tensor.shape.to_string()),
                     true});
    return steps;
  }
  // The same decision as apply(), entry by entry: entry i "matches" when the first match of
  // entries i.. is i (the DFA and Boost agree; this keeps explain on the code path apply uses).
  const int winner = impl_->first_match(in.path);
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const int index = static_cast<int>(i);
    if (index == winner) {
      steps.push_back(
          {index,
           fmt::format("rule {} '{}': matched -> {}{}", i, entries_[i].pattern,
                       entries_[i].spec.to_string(), impl_->catch_all[i] ? " (catch-all)" : ""),
           true});
      return steps;
    }
    steps.push_back({index, fmt::format("rule {} '{}': no match", i, entries_[i].pattern), false});
  }
  steps.push_back({-1,
                   strict_ ? std::string("no rule matched: error (strict)")
                           : std::string("no rule matched: replicated (not strict)"),
                   !strict_});
  return steps;
}

}  // namespace shardplan
