#pragma once
// Python `re` patterns (str patterns) for rule tables: a parser with Python's syntax and errors,
// and a bounded backtracking matcher over code points for what a DFA cannot decide (lookaround,
// backreferences, atomic groups, possessive repeats, conditionals). The DFA over the same syntax
// tree is path_matcher.{hpp,cpp}. Private to the rules library (and src/program/ops/optim.cpp).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardplan::detail {

/// A set of code points as sorted, disjoint, non-adjacent inclusive ranges.
class CharSet {
 public:
  using Range = std::pair<char32_t, char32_t>;
  static constexpr char32_t kMax = 0x10ffff;

  CharSet() = default;
  static CharSet of(char32_t lo, char32_t hi) {
    CharSet s;
    s.r_.push_back({lo, hi});
    return s;
  }
  void add(char32_t lo, char32_t hi);
  void add(const CharSet& o);
  /// The union of any ranges (unsorted, overlapping allowed).
  static CharSet from_ranges(std::vector<Range> ranges);
  CharSet complement() const;
  bool contains(char32_t c) const;
  bool empty() const { return r_.empty(); }
  const std::vector<Range>& ranges() const { return r_; }

 private:
  std::vector<Range> r_;
};

/// Zero-width assertions, as Python's re means them without/with re.M and re.A.
enum class Assertion {
  kBegin,        // \A, or ^ without re.M: position 0
  kLineBegin,    // ^ with re.M: position 0 or after '\n'
  kDollar,       // $ without re.M: the end, or before a final '\n'
  kLineEnd,      // $ with re.M: the end or before any '\n'
  kEnd,          // \Z: the end
  kWord,         // \b (Unicode \w)
  kNotWord,      // \B (Unicode \w); never true in an empty text, as in Python before 3.14
  kAsciiWord,    // \b with re.A
  kAsciiNotWord  // \B with re.A
};

/// A node of a parsed pattern.
struct RegexNode {
  enum Kind {
    kEmpty,
    kSet,
    kAssert,
    kConcat,
    kAlt,
    kRepeat,
    kGroup,
    kBackref,
    kLook,
    kAtomic,
    kCond
  };
  Kind kind = kEmpty;
  CharSet set;                              // kSet
  Assertion assertion{};                    // kAssert
  std::vector<std::unique_ptr<RegexNode>> kids;  // kCond: yes, no
  int min = 0, max = 0;                     // kRepeat; max < 0: unbounded
  bool possessive = false;                  // kRepeat
  int group = 0;                            // kGroup (capturing: >= 1, else 0), kBackref, kCond
  bool behind = false, negate = false;      // kLook
  int width = 0;                            // kLook behind: the fixed width
};
using NodePtr = std::unique_ptr<RegexNode>;

/// A syntax error, with Python's message (where Python rejects the pattern) and the position
/// in code points, as re.error.pos.
struct PatternSyntaxError {
  std::string message;
  std::size_t position = 0;
};

/// A parsed pattern.
struct ParsedPattern {
  NodePtr root;
  int groups = 1;  // including group 0
  /// Lookaround, backreferences, atomic groups, possessive repeats or conditionals: the
  /// backtracker must decide it.
  bool needs_backtracker = false;
};

/// Parses a Python str pattern (UTF-8). Throws PatternSyntaxError where Python raises re.error
/// and for what shardplan does not support (re.I, \N{...}, repeat counts above kMaxRepeat).
ParsedPattern parse_py_regex(std::string_view pattern);
/// The largest repeat count accepted (Python accepts up to 2^32-2).
constexpr int kMaxRepeat = 1000;

/// Decodes UTF-8 as Python's bytes.decode('utf-8', 'surrogateescape'): a byte that is not part
/// of a valid sequence becomes U+DC80..U+DCFF. Returns the length consumed (1..4) and sets `cp`.
/// When `incomplete` is given, it is set if the bytes end inside a sequence that could still
/// become valid (the text was cut in the middle of a character).
std::size_t decode_utf8(const unsigned char* p, std::size_t n, char32_t& cp,
                        bool* incomplete = nullptr);
std::u32string decode_utf8(std::string_view text);

/// Thrown by Backtracker::search past its step budget.
struct BacktrackBudgetExceeded {};

/// A bounded backtracking matcher for one pattern. Immutable after construction (thread-safe).
class Backtracker {
 public:
  explicit Backtracker(const ParsedPattern& p);
  ~Backtracker();
  Backtracker(Backtracker&&) noexcept;
  Backtracker& operator=(Backtracker&&) noexcept;
  /// Whether the pattern is found in `text` (re.search). Throws BacktrackBudgetExceeded after
  /// `budget` steps.
  bool search(const std::u32string& text, std::uint64_t budget) const;
  /// The default step budget per (pattern, path) search.
  static constexpr std::uint64_t kDefaultBudget = 10'000'000;

 private:
  struct Program;
  std::unique_ptr<Program> prog_;
};

/// The code points of \w \d \s for str patterns (Unicode, or ASCII with re.A).
CharSet word_chars(bool ascii);
CharSet digit_chars(bool ascii);
CharSet space_chars(bool ascii);

}  // namespace shardplan::detail
