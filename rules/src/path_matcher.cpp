#include "path_matcher.hpp"

#include <algorithm>
#include <bitset>
#include <memory>
#include <unordered_map>

namespace shardplan::detail {
namespace {

using CharSet = std::bitset<256>;

// ---- parsing: the supported subset into an AST ----

struct Node {
  enum Kind { kEmpty, kSet, kBegin, kEnd, kConcat, kAlt, kRepeat } kind = kEmpty;
  CharSet set;
  std::vector<std::unique_ptr<Node>> kids;
  int min = 0, max = 0;  // kRepeat; max < 0 is unbounded
};
using NodePtr = std::unique_ptr<Node>;

/// Thrown (and caught in compile) when a pattern is outside the subset.
struct Unsupported {};

CharSet range(int lo, int hi) {
  CharSet s;
  for (int c = lo; c <= hi; ++c) s.set(static_cast<std::size_t>(c));
  return s;
}
CharSet digits() { return range('0', '9'); }
CharSet words() { return range('a', 'z') | range('A', 'Z') | digits() | range('_', '_'); }
CharSet spaces() { return range(' ', ' ') | range('\t', '\r'); }

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  NodePtr parse() {
    for (char c : p_) {
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) throw Unsupported{};
    }
    NodePtr n = alt();
    if (i_ != p_.size()) throw Unsupported{};  // a stray ')'
    return n;
  }

 private:
  bool more() const { return i_ < p_.size(); }
  char peek() const { return p_[i_]; }

  NodePtr alt() {
    auto n = std::make_unique<Node>();
    n->kind = Node::kAlt;
    n->kids.push_back(concat());
    while (more() && peek() == '|') {
      ++i_;
      n->kids.push_back(concat());
    }
    if (n->kids.size() == 1) return std::move(n->kids[0]);
    return n;
  }

  NodePtr concat() {
    auto n = std::make_unique<Node>();
    n->kind = Node::kConcat;
    while (more() && peek() != '|' && peek() != ')') n->kids.push_back(repeat());
    return n;
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  int number() {
    if (!more() || !is_digit(peek())) throw Unsupported{};
    int v = 0;
    while (more() && is_digit(peek())) {
      v = v * 10 + (peek() - '0');
      if (v > 1000) throw Unsupported{};
      ++i_;
    }
    return v;
  }

  NodePtr repeat() {
    NodePtr atom_node = atom();
    while (more()) {
      int lo = 0, hi = 0;
      const char c = peek();
      if (c == '*') {
        lo = 0, hi = -1, ++i_;
      } else if (c == '+') {
        lo = 1, hi = -1, ++i_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++i_;
      } else if (c == '{') {
        ++i_;
        lo = number();
        hi = lo;
        if (more() && peek() == ',') {
          ++i_;
          hi = more() && is_digit(peek()) ? number() : -1;
        }
        if (!more() || peek() != '}' || (hi >= 0 && hi < lo) || lo > 100 || hi > 100) throw Unsupported{};
        ++i_;
      } else {
        break;
      }
      if (atom_node->kind == Node::kBegin || atom_node->kind == Node::kEnd) throw Unsupported{};
      if (more() && peek() == '?') ++i_;           // lazy: the same language
      else if (more() && peek() == '+') throw Unsupported{};  // possessive
      auto r = std::make_unique<Node>();
      r->kind = Node::kRepeat;
      r->min = lo;
      r->max = hi;
      r->kids.push_back(std::move(atom_node));
      atom_node = std::move(r);
    }
    return atom_node;
  }

  NodePtr set_node(CharSet s) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kSet;
    n->set = s;
    return n;
  }

  // An escape after '\': a class (\d \w \s, negated) or one character. `in_class` allows \b? No.
  CharSet escape() {
    if (!more()) throw Unsupported{};
    const char c = p_[i_++];
    switch (c) {
      case 'd': return digits();
      case 'D': return ~digits();
      case 'w': return words();
      case 'W': return ~words();
      case 's': return spaces();
      case 'S': return ~spaces();
      case 't': return range('\t', '\t');
      case 'n': return range('\n', '\n');
      case 'r': return range('\r', '\r');
      case 'f': return range('\f', '\f');
      case 'v': return range('\v', '\v');
      case 'e': return range(27, 27);
      case 'a': return range(7, 7);
      case 'x': {
        int v = 0;
        for (int k = 0; k < 2; ++k) {
          if (!more()) throw Unsupported{};
          const char h = p_[i_++];
          int d = 0;
          if (h >= '0' && h <= '9') d = h - '0';
          else if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
          else if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
          else throw Unsupported{};
          v = v * 16 + d;
        }
        return range(v, v);
      }
      default:
        // Escaped punctuation is itself; escaped letters and digits are features we do not model
        // (\b, \A, \z, \1, \p, \Q...).
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) throw Unsupported{};
        return range(static_cast<unsigned char>(c), static_cast<unsigned char>(c));
    }
  }

  CharSet bracket() {
    // After '['.
    bool negate = false;
    if (more() && peek() == '^') negate = true, ++i_;
    CharSet s;
    bool first = true;
    while (true) {
      if (!more()) throw Unsupported{};
      char c = p_[i_];
      if (c == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      if (c == '[') throw Unsupported{};  // POSIX classes [:alpha:], collating elements
      CharSet item;
      int lo = -1;
      ++i_;
      if (c == '\\') {
        item = escape();
        if (item.count() == 1) {
          for (int k = 0; k < 256; ++k) {
            if (item.test(static_cast<std::size_t>(k))) lo = k;
          }
        }
      } else {
        lo = static_cast<unsigned char>(c);
        item = range(lo, lo);
      }
      // A range "a-z" (a '-' before ']' is literal).
      if (lo >= 0 && more() && peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        char h = p_[i_++];
        int hi = static_cast<unsigned char>(h);
        if (h == '\\') {
          const CharSet e = escape();
          if (e.count() != 1) throw Unsupported{};
          for (int k = 0; k < 256; ++k) {
            if (e.test(static_cast<std::size_t>(k))) hi = k;
          }
        } else if (h == '[') {
          throw Unsupported{};
        }
        if (hi < lo) throw Unsupported{};
        item = range(lo, hi);
      }
      s |= item;
    }
    return negate ? ~s : s;
  }

  NodePtr atom() {
    const char c = p_[i_++];
    switch (c) {
      case '(': {
        if (more() && peek() == '?') {
          if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
            i_ += 2;
          } else {
            throw Unsupported{};  // lookaround, flags, named groups, atomic groups
          }
        }
        NodePtr inner = alt();
        if (!more() || peek() != ')') throw Unsupported{};
        ++i_;
        return inner;
      }
      case '[': return set_node(bracket());
      case '.': return set_node(~CharSet());
      case '^': {
        auto n = std::make_unique<Node>();
        n->kind = Node::kBegin;
        return n;
      }
      case '$': {
        auto n = std::make_unique<Node>();
        n->kind = Node::kEnd;
        return n;
      }
      case '\\': return set_node(escape());
      case '*': case '+': case '?': case '{': case ')': throw Unsupported{};
      default: return set_node(range(static_cast<unsigned char>(c), static_cast<unsigned char>(c)));
    }
  }

  std::string_view p_;
  std::size_t i_ = 0;
};

// ---- Thompson NFA ----

struct NState {
  enum Kind { kChar, kSplit, kBegin, kEnd, kMatch } kind;
  int set = -1;            // kChar: index into sets
  std::vector<int> out;    // successors
  int pattern = 0;
};

class Nfa {
 public:
  std::vector<NState> states;
  std::vector<CharSet> sets;
  std::vector<int> starts;  // per pattern

  int add(NState s) {
    states.push_back(std::move(s));
    if (states.size() > 20000) throw Unsupported{};
    return static_cast<int>(states.size()) - 1;
  }

  // Compiles `n` so that it continues at `next`; returns its entry state.
  int build(const Node& n, int next, int pattern) {
    switch (n.kind) {
      case Node::kEmpty: return next;
      case Node::kSet: {
        sets.push_back(n.set);
        return add({NState::kChar, static_cast<int>(sets.size()) - 1, {next}, pattern});
      }
      case Node::kBegin: return add({NState::kBegin, -1, {next}, pattern});
      case Node::kEnd: return add({NState::kEnd, -1, {next}, pattern});
      case Node::kConcat:
        for (auto it = n.kids.rbegin(); it != n.kids.rend(); ++it) next = build(**it, next, pattern);
        return next;
      case Node::kAlt: {
        std::vector<int> outs;
        for (const auto& k : n.kids) outs.push_back(build(*k, next, pattern));
        return add({NState::kSplit, -1, std::move(outs), pattern});
      }
      case Node::kRepeat: {
        const Node& body = *n.kids[0];
        int tail = next;
        if (n.max < 0) {
          const int loop = add({NState::kSplit, -1, {}, pattern});
          const int entry = build(body, loop, pattern);
          states[static_cast<std::size_t>(loop)].out = {entry, next};
          tail = loop;
        } else {
          for (int k = 0; k < n.max - n.min; ++k) {
            const int body_entry = build(body, tail, pattern);
            tail = add({NState::kSplit, -1, {body_entry, next}, pattern});
          }
        }
        for (int k = 0; k < n.min; ++k) tail = build(body, tail, pattern);
        return tail;
      }
    }
    return next;
  }
};

// ---- subset construction ----

struct DState {
  std::vector<int> chars;    // kChar states, sorted
  std::vector<int> ends;     // kEnd states reached, sorted (they pass only at the end)
  std::uint64_t matched = 0; // patterns already found
};

class Builder {
 public:
  Builder(const Nfa& nfa, std::size_t num_patterns) : nfa_(nfa), num_patterns_(num_patterns) {}

  /// NFA states visited so far, over every closure: construction gives up (the caller keeps
  /// Boost) past a budget, so a hostile pattern cannot make building a rule slow.
  std::uint64_t work = 0;
  static constexpr std::uint64_t kWorkBudget = 20'000'000;

  // Follows epsilon edges from `seeds`. `at_begin`/`at_end` say which anchors pass.
  void closure(const std::vector<int>& seeds, bool at_begin, bool at_end, DState& out) {
    stack_ = seeds;
    ++epoch_;
    if (mark_.size() < nfa_.states.size()) mark_.assign(nfa_.states.size(), 0);
    while (!stack_.empty()) {
      const int s = stack_.back();
      stack_.pop_back();
      auto& m = mark_[static_cast<std::size_t>(s)];
      if (m == epoch_) continue;
      m = epoch_;
      if (++work > kWorkBudget) throw Unsupported{};
      const NState& st = nfa_.states[static_cast<std::size_t>(s)];
      switch (st.kind) {
        case NState::kChar: out.chars.push_back(s); break;
        case NState::kMatch: out.matched |= std::uint64_t{1} << st.pattern; break;
        case NState::kSplit:
          for (auto it = st.out.rbegin(); it != st.out.rend(); ++it) stack_.push_back(*it);
          break;
        case NState::kBegin:
          if (at_begin) stack_.push_back(st.out[0]);
          break;
        case NState::kEnd:
          if (at_end) stack_.push_back(st.out[0]);
          else out.ends.push_back(s);
          break;
      }
    }
  }

  // Drops states of patterns that can no longer be the first match.
  void prune(DState& d) const {
    if (d.matched) {
      const int first = __builtin_ctzll(d.matched);
      auto dead = [&](int s) { return nfa_.states[static_cast<std::size_t>(s)].pattern >= first; };
      d.chars.erase(std::remove_if(d.chars.begin(), d.chars.end(), dead), d.chars.end());
      d.ends.erase(std::remove_if(d.ends.begin(), d.ends.end(), dead), d.ends.end());
      d.matched = d.matched & (~d.matched + 1);  // keep only the lowest
    }
    std::sort(d.chars.begin(), d.chars.end());
    d.chars.erase(std::unique(d.chars.begin(), d.chars.end()), d.chars.end());
    std::sort(d.ends.begin(), d.ends.end());
    d.ends.erase(std::unique(d.ends.begin(), d.ends.end()), d.ends.end());
  }

  std::vector<int> live_starts(std::uint64_t matched) const {
    std::vector<int> s;
    const std::size_t limit = matched ? static_cast<std::size_t>(__builtin_ctzll(matched)) : num_patterns_;
    for (std::size_t p = 0; p < limit; ++p) s.push_back(nfa_.starts[p]);
    return s;
  }

  // The first pattern matched if the text ended in `d` (at text position 0 when `at_begin`).
  int result(const DState& d, bool at_begin) {
    DState fin;
    std::vector<int> seeds;
    for (int e : d.ends) seeds.push_back(nfa_.states[static_cast<std::size_t>(e)].out[0]);
    closure(seeds, at_begin, true, fin);
    const std::uint64_t all = d.matched | fin.matched;
    return all ? __builtin_ctzll(all) : -1;
  }

  static std::string key(const DState& d) {
    std::string k(reinterpret_cast<const char*>(&d.matched), sizeof d.matched);
    k.append(reinterpret_cast<const char*>(d.chars.data()), d.chars.size() * sizeof(int));
    k.push_back('|');
    k.append(reinterpret_cast<const char*>(d.ends.data()), d.ends.size() * sizeof(int));
    return k;
  }

 private:
  const Nfa& nfa_;
  std::size_t num_patterns_;
  std::vector<int> stack_;
  std::vector<std::uint32_t> mark_;
  std::uint32_t epoch_ = 0;
};

}  // namespace

std::optional<PathMatcher> PathMatcher::compile(const std::vector<std::string>& patterns,
                                                std::size_t max_states) {
  if (patterns.size() > 64) return std::nullopt;
  try {
    return build(patterns, max_states);
  } catch (const Unsupported&) {
    return std::nullopt;
  }
}

std::optional<PathMatcher> PathMatcher::build(const std::vector<std::string>& patterns,
                                              std::size_t max_states) {
  Nfa nfa;
  for (std::size_t p = 0; p < patterns.size(); ++p) {
    const NodePtr ast = Parser(patterns[p]).parse();
    const int match = nfa.add({NState::kMatch, -1, {}, static_cast<int>(p)});
    nfa.starts.push_back(nfa.build(*ast, match, static_cast<int>(p)));
  }

  PathMatcher m;
  // Byte classes: bytes that every set treats alike share a class (printable ASCII only; the
  // rest never reach the table).
  std::unordered_map<std::string, std::uint8_t> signature_class;
  for (int c = 0x20; c <= 0x7e; ++c) {
    std::string sig;
    for (const CharSet& s : nfa.sets) sig.push_back(s.test(static_cast<std::size_t>(c)) ? '1' : '0');
    auto [it, added] = signature_class.emplace(sig, static_cast<std::uint8_t>(signature_class.size()));
    m.class_of_[c] = it->second;
  }
  m.num_classes_ = signature_class.size();
  std::vector<int> representative(m.num_classes_, 0);
  for (int c = 0x7e; c >= 0x20; --c) representative[m.class_of_[c]] = c;

  Builder b(nfa, patterns.size());
  std::vector<DState> states;
  std::unordered_map<std::string, State> index;
  auto intern = [&](DState d, bool initial = false) -> std::optional<State> {
    b.prune(d);
    // The initial state is never shared: its end result may depend on being at position 0.
    const std::string k = initial ? "initial" : Builder::key(d);
    if (auto it = index.find(k); it != index.end()) return it->second;
    if (states.size() >= max_states) return std::nullopt;
    const auto id = static_cast<State>(states.size());
    index.emplace(k, id);
    states.push_back(std::move(d));
    return id;
  };
  {
    DState init;
    b.closure(b.live_starts(0), /*at_begin=*/true, /*at_end=*/false, init);
    intern(std::move(init), /*initial=*/true);
  }
  for (std::size_t s = 0; s < states.size(); ++s) {
    for (std::size_t cls = 0; cls < m.num_classes_; ++cls) {
      const auto c = static_cast<std::size_t>(representative[cls]);
      std::vector<int> seeds;
      for (int q : states[s].chars) {
        const NState& st = nfa.states[static_cast<std::size_t>(q)];
        if (nfa.sets[static_cast<std::size_t>(st.set)].test(c)) seeds.push_back(st.out[0]);
      }
      const std::uint64_t matched = states[s].matched;
      for (int start : b.live_starts(matched)) seeds.push_back(start);
      DState next;
      next.matched = matched;
      b.closure(seeds, /*at_begin=*/false, /*at_end=*/false, next);
      const auto id = intern(std::move(next));
      if (!id) return std::nullopt;
      m.next_.push_back(*id);
    }
  }
  m.result_.reserve(states.size());
  for (std::size_t s = 0; s < states.size(); ++s) m.result_.push_back(b.result(states[s], s == 0));
  return m;
}

}  // namespace shardplan::detail
