#include "shardplan/rules/tree_path_sharding_rule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <boost/regex.hpp>
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
    const auto next = m_.scan(s, bytes);
    return next == detail::PathMatcher::kFallback ? kUnknown : next;
  }

 private:
  const detail::PathMatcher& m_;
};

}  // namespace

namespace {
/// Ids of rule tables, never reused in a process (2^64 constructions will not happen).
std::atomic<std::uint64_t> next_table_id{1};
}  // namespace

struct TreePathShardingRule::Impl {
  /// Keys the per-thread memo below. Not the address: a rule built after another was destroyed
  /// may get the same address, and would resume from the dead rule's DFA states.
  const std::uint64_t id = next_table_id.fetch_add(1, std::memory_order_relaxed);
  std::vector<boost::regex> regexes;
  /// Entries whose pattern matches the empty string: they match every path (catch-alls).
  std::vector<bool> catch_all;
  /// All patterns as one DFA, when they are in its subset (else Boost decides every path).
  std::optional<detail::PathMatcher> dfa;
  std::optional<DfaAutomaton> automaton;  // over `dfa`

  /// Index of the first entry whose regex is found in `path`, or -1.
  int first_match(std::string_view path) const {
    if (dfa) {
      const int r = dfa_first_match(path);
      if (r != -2) return r;
    }
    return boost_first_match(path);
  }

  // Callers visit leaves in flatten order, so consecutive paths share long prefixes
  // ("model/layers/17/mlp/experts/201/..."). Each thread remembers its last path and the DFA state
  // after each of its bytes, and resumes from the longest common prefix.
  int dfa_first_match(std::string_view path) const {
    struct Memo {
      std::uint64_t owner = 0;  // Impl::id
      std::string last;
      std::vector<detail::PathMatcher::State> states;  // states[i]: after i bytes of `last`
    };
    thread_local Memo memo;
    if (memo.owner != id || memo.states.empty()) {
      memo.owner = id;
      memo.last.clear();
      memo.states.assign(1, dfa->start());
    }
    // memo.states[i] is valid for i <= memo.last.size().
    const std::size_t n = std::min(path.size(), memo.last.size());
    const std::size_t common = static_cast<std::size_t>(
        std::mismatch(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(n), memo.last.begin())
            .first -
        path.begin());
    memo.last.resize(common);
    memo.last.append(path.substr(common));
    if (memo.states.size() < path.size() + 1) memo.states.resize(path.size() + 1);
    detail::PathMatcher::State s = memo.states[common];
    for (std::size_t i = common; i < path.size(); ++i) {
      s = dfa->step(s, static_cast<unsigned char>(path[i]));
      if (s == detail::PathMatcher::kFallback) {
        memo.last.clear();
        return -2;
      }
      memo.states[i + 1] = s;
    }
    return dfa->first_match(s);
  }

  int boost_first_match(std::string_view path) const {
    const char* begin = path.data();
    const char* end = begin + path.size();
    for (std::size_t i = 0; i < regexes.size(); ++i) {
      if (catch_all[i]) return static_cast<int>(i);
      try {
        if (boost::regex_search(begin, end, regexes[i], boost::match_default)) {
          return static_cast<int>(i);
        }
      } catch (const std::runtime_error& e) {
        // Boost gives up on pathological patterns (too complex, memory exhausted).
        throw RuleError(fmt::format("[rule] TreePathShardingRule: rule {} ('{}') failed on '{}': {}",
                                    i, regexes[i].str(), path, e.what()));
      }
    }
    return -1;
  }
};

TreePathShardingRule::TreePathShardingRule(std::vector<Entry> entries, bool strict)
    : entries_(std::move(entries)), strict_(strict) {
  auto impl = std::make_shared<Impl>();
  impl->regexes.reserve(entries_.size());
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const std::string& pattern = entries_[i].pattern;
    try {
      impl->regexes.emplace_back(pattern, boost::regex::perl);
    } catch (const boost::regex_error& e) {
      throw RuleError(fmt::format("[rule] TreePathShardingRule: rule {} has a bad regex '{}' at "
                                  "position {}: {}",
                                  i, pattern, e.position(), e.what()));
    }
    const std::string empty;
    try {
      impl->catch_all.push_back(boost::regex_search(empty, impl->regexes.back()));
    } catch (const std::runtime_error& e) {
      throw RuleError(fmt::format("[rule] TreePathShardingRule: rule {} ('{}') cannot be used: {}",
                                  i, pattern, e.what()));
    }
  }
  std::vector<std::string> patterns;
  for (const Entry& e : entries_) patterns.push_back(e.pattern);
  impl->dfa = detail::PathMatcher::compile(patterns);
  if (impl->dfa) impl->automaton.emplace(*impl->dfa);
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
        "[rule] no rule of TreePathShardingRule matches '{}' (shape {}); rules tried: {}",
        in.path, in.tensor.shape.to_string(), tried));
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
    steps.push_back({-1, fmt::format("shape {} is a scalar or has one element: replicated",
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
      steps.push_back({index,
                       fmt::format("rule {} '{}': matched -> {}{}", i, entries_[i].pattern,
                                   entries_[i].spec.to_string(),
                                   impl_->catch_all[i] ? " (catch-all)" : ""),
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
