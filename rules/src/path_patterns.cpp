#include "shardplan/rules/path_patterns.hpp"

#include <fmt/format.h>

#include "path_matcher.hpp"

namespace shardplan {

static_assert(PathPatterns::kBacktrackBudget == detail::Backtracker::kDefaultBudget);

struct PathPatterns::Impl {
  explicit Impl(const std::vector<std::string>& p) : patterns(p), table(p) {}
  std::vector<std::string> patterns;
  detail::PatternTable table;
};

namespace {

PathPatternBudgetError budget_error(std::size_t index, const std::string& pattern,
                                    std::string_view path) {
  return PathPatternBudgetError(
      index, fmt::format("[pattern] pattern {} ('{}') gave up on '{}' after {} backtracking steps",
                         index, pattern, path, PathPatterns::kBacktrackBudget));
}

}  // namespace

PathPatterns::PathPatterns(const std::vector<std::string>& patterns) : size_(patterns.size()) {
  try {
    impl_ = std::make_shared<const Impl>(patterns);
  } catch (const detail::TablePatternError& e) {
    throw PathPatternError(
        e.index, e.error.position, e.error.message,
        fmt::format("[pattern] pattern {} '{}' is not a valid regex at "
                    "position {}: {}",
                    e.index, patterns[e.index], e.error.position, e.error.message));
  } catch (const detail::TableBudgetError& e) {
    throw budget_error(e.index, patterns[e.index], "");
  }
}

PathPatterns::~PathPatterns() = default;
PathPatterns::PathPatterns(const PathPatterns&) = default;
PathPatterns& PathPatterns::operator=(const PathPatterns&) = default;

int PathPatterns::first_match(std::string_view path) const {
  try {
    return impl_->table.first_match(path);
  } catch (const detail::TableBudgetError& e) {
    throw budget_error(e.index, impl_->patterns[e.index], path);
  }
}

}  // namespace shardplan
