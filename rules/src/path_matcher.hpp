#pragma once
// A multi-pattern matcher for tree paths: which of an ordered list of regexes is the first to be
// found (unanchored search) in a path. Private to the rules library.
//
// Patterns in the common subset (literals, escapes, '.', classes with ranges and negation, \d \w
// \s and their negations, groups and (?:...), alternation, * + ? {m,n} and their lazy forms, ^ and
// $) are compiled into one DFA, built eagerly and immutable afterwards (thread-safe). Anything
// else (backreferences, lookaround, \b, flags...) makes compile() return nullopt, and the caller
// keeps Boost.Regex. Paths with bytes outside printable ASCII are left to Boost as well, where
// line anchors, locales and newlines could differ: scan() reports kFallback.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardplan::detail {

class PathMatcher {
 public:
  using State = std::uint32_t;
  /// Returned by scan() for text that must be matched by Boost instead.
  static constexpr State kFallback = 0xffffffffu;

  /// The matcher for these patterns, or nullopt when a pattern is outside the subset, there are
  /// more than 64 patterns, or the DFA would exceed `max_states`.
  static std::optional<PathMatcher> compile(const std::vector<std::string>& patterns,
                                            std::size_t max_states = 4096);

  /// The state before any text.
  State start() const { return 0; }
  /// The state after one byte following `s`, or kFallback.
  State step(State s, unsigned char c) const {
    if (c < 0x20 || c > 0x7e) return kFallback;
    return next_[s * num_classes_ + class_of_[c]];
  }
  /// The state after `text` following `s`, or kFallback.
  State scan(State s, std::string_view text) const {
    for (const char ch : text) {
      const auto c = static_cast<unsigned char>(ch);
      if (c < 0x20 || c > 0x7e) return kFallback;
      s = next_[s * num_classes_ + class_of_[c]];
    }
    return s;
  }
  /// The index of the first pattern found in a text that ends in state `s`, or -1.
  int first_match(State s) const { return result_[s]; }
  /// The index of the first pattern found in `text`, -1 for none, or -2 when Boost must decide.
  int first_match(std::string_view text) const {
    const State s = scan(start(), text);
    return s == kFallback ? -2 : result_[s];
  }
  std::size_t num_states() const { return result_.size(); }

 private:
  static std::optional<PathMatcher> build(const std::vector<std::string>& patterns,
                                          std::size_t max_states);
  std::size_t num_classes_ = 0;
  std::uint8_t class_of_[256] = {};
  std::vector<State> next_;   // num_states x num_classes
  std::vector<int> result_;   // per state
};

}  // namespace shardplan::detail
