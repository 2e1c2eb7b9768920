#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardplan/error.hpp"

namespace shardplan {

/// A pattern of a PathPatterns list that Python's `re` rejects or shardplan does not support.
/// Names the pattern's index in the list, the position (in code points, as re.error.pos) and
/// the reason.
class PathPatternError : public RuleError {
 public:
  PathPatternError(std::size_t index, std::size_t position, std::string reason,
                   const std::string& what)
      : RuleError(what), index_(index), position_(position), reason_(std::move(reason)) {}
  std::size_t index() const { return index_; }
  std::size_t position() const { return position_; }
  const std::string& reason() const { return reason_; }

 private:
  std::size_t index_, position_;
  std::string reason_;
};

/// A search by a pattern of a PathPatterns list (lookaround or backreferences) that went past
/// the backtracking budget (PathPatterns::kBacktrackBudget steps). Names the pattern's index.
class PathPatternBudgetError : public RuleError {
 public:
  PathPatternBudgetError(std::size_t index, const std::string& what)
      : RuleError(what), index_(index) {}
  std::size_t index() const { return index_; }

 private:
  std::size_t index_;
};

/// Regex patterns over tree paths in the dialect of rule tables (TreePathShardingRule: Python's
/// `re.search` on the path decoded from UTF-8, docs/rule-files.md "Pattern dialect"), searched
/// in order. For code other than a sharding rule that selects leaves by path (an optimizer's
/// weight-decay mask). Immutable once built; thread-safe.
class PathPatterns {
 public:
  /// Steps a pattern that needs the backtracker may take on one path before giving up.
  static constexpr std::uint64_t kBacktrackBudget = 10'000'000;

  /// Throws PathPatternError for the first bad pattern, PathPatternBudgetError when deciding
  /// whether one matches the empty path goes past the budget.
  explicit PathPatterns(const std::vector<std::string>& patterns);
  ~PathPatterns();
  PathPatterns(const PathPatterns&);
  PathPatterns& operator=(const PathPatterns&);

  /// The index of the first pattern found in `path`, or -1. Throws PathPatternBudgetError.
  int first_match(std::string_view path) const;
  /// The number of patterns.
  std::size_t size() const { return size_; }

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
  std::size_t size_ = 0;
};

}  // namespace shardplan
