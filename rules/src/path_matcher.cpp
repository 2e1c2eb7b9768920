#include "path_matcher.hpp"

#include <algorithm>
#include <climits>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace shardplan::detail {
namespace {

/// Thrown (and caught in compile) when the DFA would be too large.
struct TooLarge {};

// ---- Thompson NFA over code-point sets ----

struct NState {
  enum Kind { kChar, kSplit, kAssert, kMatch } kind;
  int set = -1;  // kChar: index into Nfa::sets
  Assertion assertion{};
  std::vector<int> out;
  int pattern = 0;
};

struct Nfa {
  std::vector<NState> states;
  std::vector<CharSet> sets;  // distinct
  std::unordered_map<std::string, int> set_index;
  std::vector<int> starts;  // per pattern

  int intern_set(const CharSet& c) {
    std::string key(reinterpret_cast<const char*>(c.ranges().data()),
                    c.ranges().size() * sizeof(CharSet::Range));
    auto [it, added] = set_index.emplace(std::move(key), static_cast<int>(sets.size()));
    if (added) sets.push_back(c);
    return it->second;
  }

  int add(NState s) {
    states.push_back(std::move(s));
    if (states.size() > 200000) throw TooLarge{};
    return static_cast<int>(states.size()) - 1;
  }

  // Compiles `n` so that it continues at `next`; returns its entry state.
  int build(const RegexNode& n, int next, int pattern) {
    switch (n.kind) {
      case RegexNode::kEmpty:
        return next;
      case RegexNode::kSet:
        return add({NState::kChar, intern_set(n.set), {}, {next}, pattern});
      case RegexNode::kAssert:
        return add({NState::kAssert, -1, n.assertion, {next}, pattern});
      case RegexNode::kGroup:
        return build(*n.kids[0], next, pattern);
      case RegexNode::kConcat:
        for (auto it = n.kids.rbegin(); it != n.kids.rend(); ++it)
          next = build(**it, next, pattern);
        return next;
      case RegexNode::kAlt: {
        std::vector<int> outs;
        for (const auto& k : n.kids) outs.push_back(build(*k, next, pattern));
        return add({NState::kSplit, -1, {}, std::move(outs), pattern});
      }
      case RegexNode::kRepeat: {
        const RegexNode& body = *n.kids[0];
        int tail = next;
        if (n.max < 0) {
          const int loop = add({NState::kSplit, -1, {}, {}, pattern});
          const int entry = build(body, loop, pattern);
          states[static_cast<std::size_t>(loop)].out = {entry, next};
          tail = loop;
        } else {
          for (int k = 0; k < n.max - n.min; ++k) {
            const int body_entry = build(body, tail, pattern);
            tail = add({NState::kSplit, -1, {}, {body_entry, next}, pattern});
          }
        }
        for (int k = 0; k < n.min; ++k) tail = build(body, tail, pattern);
        return tail;
      }
      default:
        throw TooLarge{};  // needs the backtracker: never given to the DFA
    }
  }
};

// ---- the alphabet: classes of code points ----

struct Alphabet {
  std::vector<char32_t> starts;    // elementary intervals, first code point
  std::vector<std::uint16_t> cls;  // their class
  std::size_t num_classes = 0;
  std::vector<std::vector<bool>> set_has;  // set index -> class -> member

  // One sweep over the ranges' ends: the sets a code point belongs to change only there.
  explicit Alphabet(const std::vector<CharSet>& sets) {
    std::vector<std::pair<char32_t, std::uint32_t>> toggles;
    for (std::size_t s = 0; s < sets.size(); ++s) {
      for (const auto& [lo, hi] : sets[s].ranges()) {
        toggles.push_back({lo, static_cast<std::uint32_t>(s)});
        if (hi < CharSet::kMax) toggles.push_back({hi + 1, static_cast<std::uint32_t>(s)});
      }
    }
    std::sort(toggles.begin(), toggles.end());
    std::string sig(sets.size(), '0');
    std::unordered_map<std::string, std::uint16_t> by_signature;
    std::vector<std::string> signatures;
    std::size_t t = 0;
    char32_t point = 0;
    while (true) {
      while (t < toggles.size() && toggles[t].first == point) {
        char& b = sig[toggles[t].second];
        b = b == '0' ? '1' : '0';
        ++t;
      }
      auto [it, added] = by_signature.emplace(sig, static_cast<std::uint16_t>(signatures.size()));
      if (added) {
        if (signatures.size() >= 65000) throw TooLarge{};
        signatures.push_back(sig);
      }
      if (cls.empty() || cls.back() != it->second) {
        starts.push_back(point);
        cls.push_back(it->second);
      }
      if (t == toggles.size()) break;
      point = toggles[t].first;
    }
    num_classes = signatures.size();
    set_has.assign(sets.size(), std::vector<bool>(num_classes, false));
    for (std::size_t c = 0; c < num_classes; ++c) {
      for (std::size_t s = 0; s < sets.size(); ++s) set_has[s][c] = signatures[c][s] == '1';
    }
  }
};

// ---- lookahead constraints: the next character must be in a class set, or the text end ----

struct Look {
  std::vector<bool> next;  // per class
  bool end_ok = false;     // the text may end here
  bool nl_end_ok = false;  // the rest may be exactly "\n"
};

class Looks {
 public:
  explicit Looks(std::size_t num_classes, std::size_t nl_class) : n_(num_classes), nl_(nl_class) {
    intern({std::vector<bool>(n_, true), true, true});  // 0: no constraint
    end_only_ = intern({std::vector<bool>(n_, false), true, false});
  }
  int intern(Look l) {
    if (l.next[nl_]) l.nl_end_ok = false;  // implied
    std::string key(l.next.begin(), l.next.end());
    key.push_back(l.end_ok ? '1' : '0');
    key.push_back(l.nl_end_ok ? '1' : '0');
    auto [it, added] = index_.emplace(key, static_cast<int>(all_.size()));
    if (added) all_.push_back(std::move(l));
    return it->second;
  }
  /// -1 when nothing can satisfy both.
  int meet(int a, int b) {
    if (a == 0) return b;
    if (b == 0) return a;
    const Look& x = all_[static_cast<std::size_t>(a)];
    const Look& y = all_[static_cast<std::size_t>(b)];
    Look l{std::vector<bool>(n_), x.end_ok && y.end_ok,
           (x.nl_end_ok || x.next[nl_]) && (y.nl_end_ok || y.next[nl_])};
    bool any = l.end_ok || l.nl_end_ok;
    for (std::size_t c = 0; c < n_; ++c) any |= l.next[c] = x.next[c] && y.next[c];
    return any ? intern(std::move(l)) : -1;
  }
  const Look& operator[](int i) const { return all_[static_cast<std::size_t>(i)]; }
  int end_only() const { return end_only_; }

 private:
  std::size_t n_, nl_;
  int end_only_ = 0;
  std::vector<Look> all_;
  std::unordered_map<std::string, int> index_;
};

/// What the character before a position was, for assertions that look back.
struct Context {
  bool at_start = false, newline = false, word = false, ascii_word = false;
};

struct DState {
  std::vector<std::pair<int, int>> threads;  // (kChar or pending kMatch state, look), sorted
  int matched = INT_MAX;                     // lowest pattern found so far
};

class Builder {
 public:
  Builder(const Nfa& nfa, const Alphabet& ab, std::size_t word_set, std::size_t ascii_word_set,
          std::size_t nl_class)
      : nfa_(nfa), ab_(ab), looks_(ab.num_classes, nl_class), nl_class_(nl_class) {
    std::vector<bool> w = ab.set_has[word_set], nw(w.size()), aw = ab.set_has[ascii_word_set],
                      naw(aw.size());
    for (std::size_t c = 0; c < w.size(); ++c) nw[c] = !w[c], naw[c] = !aw[c];
    const std::vector<bool> none(w.size(), false);
    std::vector<bool> nl(w.size(), false);
    nl[nl_class] = true;
    dollar_ = looks_.intern({none, true, true});
    line_end_ = looks_.intern({nl, true, false});
    word_next_ = looks_.intern({w, false, false});
    nonword_or_end_ = looks_.intern({nw, true, false});
    nonword_ = looks_.intern({nw, false, false});
    aword_next_ = looks_.intern({aw, false, false});
    anonword_or_end_ = looks_.intern({naw, true, false});
    anonword_ = looks_.intern({naw, false, false});
  }

  std::uint64_t work = 0;
  static constexpr std::uint64_t kWorkBudget = 20'000'000;

  Context context_of(std::size_t cls, std::size_t word_set, std::size_t ascii_word_set) const {
    return Context{false, cls == nl_class_, ab_.set_has[word_set][cls],
                   ab_.set_has[ascii_word_set][cls]};
  }

  // The look an assertion leaves on the next character, -1 when it fails, 0 when it passes.
  int assertion_look(Assertion a, const Context& ctx) const {
    switch (a) {
      case Assertion::kBegin:
        return ctx.at_start ? 0 : -1;
      case Assertion::kLineBegin:
        return ctx.at_start || ctx.newline ? 0 : -1;
      case Assertion::kDollar:
        return dollar_;
      case Assertion::kLineEnd:
        return line_end_;
      case Assertion::kEnd:
        return looks_.end_only();
      case Assertion::kWord:
        return ctx.word ? nonword_or_end_ : word_next_;
      case Assertion::kAsciiWord:
        return ctx.ascii_word ? nonword_or_end_a() : aword_next_;
      case Assertion::kNotWord:
        return ctx.word ? word_next_ : (ctx.at_start ? nonword_ : nonword_or_end_);
      case Assertion::kAsciiNotWord:
        return ctx.ascii_word ? aword_next_ : (ctx.at_start ? anonword_ : anonword_or_end_);
    }
    return -1;
  }
  int nonword_or_end_a() const { return anonword_or_end_; }

  void closure(std::vector<std::pair<int, int>>& stack, const Context& ctx, DState& out) {
    // (state, look) pairs already visited in this closure: look 0 (no pending assertion, nearly
    // every pair) in a per-state generation stamp, other looks in a set cleared only when used
    // (clearing a hash set costs its bucket count, and a closure runs per DFA transition).
    if (++generation_ == 0) {
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      generation_ = 1;
    }
    if (!seen_.empty()) seen_.clear();
    while (!stack.empty()) {
      const auto [s, look] = stack.back();
      stack.pop_back();
      if (look == 0) {
        std::uint32_t& stamp = stamp_[static_cast<std::size_t>(s)];
        if (stamp == generation_) continue;
        stamp = generation_;
      } else if (!seen_.insert((static_cast<std::uint64_t>(s) << 32) |
                               static_cast<std::uint32_t>(look))
                      .second) {
        continue;
      }
      if (++work > kWorkBudget) throw TooLarge{};
      const NState& st = nfa_.states[static_cast<std::size_t>(s)];
      if (st.pattern >= out.matched) continue;
      switch (st.kind) {
        case NState::kChar:
          out.threads.push_back({s, look});
          break;
        case NState::kMatch:
          if (look == 0)
            out.matched = std::min(out.matched, st.pattern);
          else
            out.threads.push_back({s, look});
          break;
        case NState::kSplit:
          for (auto it = st.out.rbegin(); it != st.out.rend(); ++it) stack.push_back({*it, look});
          break;
        case NState::kAssert: {
          const int a = assertion_look(st.assertion, ctx);
          if (a < 0) break;
          const int m = looks_.meet(look, a);
          if (m >= 0) stack.push_back({st.out[0], m});
          break;
        }
      }
    }
    prune(out);
  }

  void prune(DState& d) const {
    auto dead = [&](const std::pair<int, int>& t) {
      return nfa_.states[static_cast<std::size_t>(t.first)].pattern >= d.matched;
    };
    d.threads.erase(std::remove_if(d.threads.begin(), d.threads.end(), dead), d.threads.end());
    std::sort(d.threads.begin(), d.threads.end());
    d.threads.erase(std::unique(d.threads.begin(), d.threads.end()), d.threads.end());
  }

  void add_starts(int matched, std::vector<std::pair<int, int>>& seeds) const {
    const auto limit = static_cast<std::size_t>(
        std::min<std::int64_t>(matched, static_cast<std::int64_t>(nfa_.starts.size())));
    for (std::size_t p = limit; p-- > 0;) seeds.push_back({nfa_.starts[p], 0});
  }

  DState initial() {
    std::vector<std::pair<int, int>> seeds;
    add_starts(INT_MAX, seeds);
    DState d;
    Context ctx;
    ctx.at_start = true;
    closure(seeds, ctx, d);
    return d;
  }

  DState next(const DState& d, std::size_t cls, const Context& ctx) {
    std::vector<std::pair<int, int>> seeds;
    DState out;
    out.matched = d.matched;
    for (const auto& [q, look] : d.threads) {
      int after = 0;
      if (look != 0) {
        const Look& l = looks_[look];
        if (l.next[cls])
          after = 0;
        else if (cls == nl_class_ && l.nl_end_ok)
          after = looks_.end_only();
        else
          continue;
      }
      const NState& st = nfa_.states[static_cast<std::size_t>(q)];
      if (st.kind == NState::kMatch) {
        if (after == 0)
          out.matched = std::min(out.matched, st.pattern);
        else
          seeds.push_back({q, after});
      } else if (ab_.set_has[static_cast<std::size_t>(st.set)][cls]) {
        seeds.push_back({st.out[0], after});
      }
    }
    std::reverse(seeds.begin(), seeds.end());
    add_starts(out.matched, seeds);
    closure(seeds, ctx, out);
    return out;
  }

  int result(const DState& d) const {
    int r = d.matched;
    for (const auto& [q, look] : d.threads) {
      const NState& st = nfa_.states[static_cast<std::size_t>(q)];
      if (st.kind == NState::kMatch && looks_[look].end_ok) r = std::min(r, st.pattern);
    }
    return r == INT_MAX ? -1 : r;
  }

  static std::string key(const DState& d) {
    std::string k(reinterpret_cast<const char*>(&d.matched), sizeof d.matched);
    k.append(reinterpret_cast<const char*>(d.threads.data()),
             d.threads.size() * sizeof(std::pair<int, int>));
    return k;
  }

 private:
  const Nfa& nfa_;
  const Alphabet& ab_;
  Looks looks_;
  std::size_t nl_class_;
  int dollar_ = 0, line_end_ = 0, word_next_ = 0, nonword_or_end_ = 0, nonword_ = 0,
      aword_next_ = 0, anonword_or_end_ = 0, anonword_ = 0;
  std::vector<std::uint32_t> stamp_ = std::vector<std::uint32_t>(nfa_.states.size(), 0u);
  std::uint32_t generation_ = 0;
  std::unordered_set<std::uint64_t> seen_;
};

}  // namespace

std::uint16_t PathMatcher::class_in_mixed_page(char32_t cp) const {
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), cp);
  return class_[static_cast<std::size_t>(it - starts_.begin()) - 1];
}

PathMatcher::State PathMatcher::scan(State s, std::string_view text, bool partial) const {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      s = next_[s * num_classes_ + ascii_class_[p[i]]];
      ++i;
      continue;
    }
    char32_t cp = 0;
    bool incomplete = false;
    i += decode(p + i, n - i, cp, &incomplete);
    if (incomplete && partial) return kIncomplete;
    s = step(s, cp);
  }
  return s;
}

std::optional<PathMatcher> PathMatcher::compile(const std::vector<const RegexNode*>& patterns,
                                                std::size_t max_states) {
  try {
    Nfa nfa;
    for (std::size_t p = 0; p < patterns.size(); ++p) {
      const int match = nfa.add({NState::kMatch, -1, {}, {}, static_cast<int>(p)});
      nfa.starts.push_back(nfa.build(*patterns[p], match, static_cast<int>(p)));
    }
    // The word sets split the alphabet only for tables that use \b or \B (the Unicode one has
    // 700 ranges: every table would pay for it).
    bool word = false, ascii_word = false;
    for (const NState& st : nfa.states) {
      if (st.kind != NState::kAssert) continue;
      word |= st.assertion == Assertion::kWord || st.assertion == Assertion::kNotWord;
      ascii_word |=
          st.assertion == Assertion::kAsciiWord || st.assertion == Assertion::kAsciiNotWord;
    }
    std::vector<CharSet> sets = nfa.sets;
    const std::size_t word_set = sets.size();
    sets.push_back(word ? word_chars(false) : CharSet());
    const std::size_t ascii_word_set = sets.size();
    sets.push_back(ascii_word ? word_chars(true) : CharSet());
    sets.push_back(CharSet::of('\n', '\n'));
    const Alphabet ab(sets);

    PathMatcher m;
    m.num_classes_ = ab.num_classes;
    for (char32_t c = 0; c < 0x80; ++c) {
      const auto it = std::upper_bound(ab.starts.begin(), ab.starts.end(), c);
      m.ascii_class_[c] = ab.cls[static_cast<std::size_t>(it - ab.starts.begin()) - 1];
    }
    m.starts_ = ab.starts;
    m.class_ = ab.cls;
    // Pages of 256 code points that lie in one class (almost all) skip the binary search.
    m.page_class_.assign((CharSet::kMax >> 8) + 1, kMixedPage);
    for (std::size_t k = 0; k < ab.starts.size(); ++k) {
      const char32_t lo = ab.starts[k];
      const char32_t hi = k + 1 < ab.starts.size() ? ab.starts[k + 1] - 1 : CharSet::kMax;
      for (char32_t page = (lo + 255) >> 8; page <= hi >> 8 && (page << 8) + 255 <= hi; ++page)
        m.page_class_[page] = ab.cls[k];
    }
    const std::size_t nl_class = m.ascii_class_[std::size_t{'\n'}];

    Builder b(nfa, ab, word_set, ascii_word_set, nl_class);
    std::vector<DState> states;
    std::unordered_map<std::string, State> index;
    auto intern = [&](DState d) -> State {
      const std::string k = Builder::key(d);
      if (auto it = index.find(k); it != index.end()) return it->second;
      // Bounded in states and in table size (states x classes), so a hostile table cannot make
      // building a rule slow or large: past either, the backtracker decides the table.
      if (states.size() >= max_states || (states.size() + 1) * ab.num_classes > (1u << 22))
        throw TooLarge{};
      const auto id = static_cast<State>(states.size());
      index.emplace(k, id);
      states.push_back(std::move(d));
      return id;
    };
    intern(b.initial());
    std::vector<Context> contexts;
    for (std::size_t c = 0; c < ab.num_classes; ++c)
      contexts.push_back(b.context_of(c, word_set, ascii_word_set));
    for (std::size_t s = 0; s < states.size(); ++s) {
      for (std::size_t c = 0; c < ab.num_classes; ++c) {
        const State id = intern(b.next(states[s], c, contexts[c]));
        m.next_.push_back(id);
      }
    }
    m.result_.reserve(states.size());
    for (const DState& d : states) m.result_.push_back(b.result(d));
    return m;
  } catch (const TooLarge&) {
    return std::nullopt;
  }
}

// ---- PatternTable ----

namespace {
bool dfa_can(const RegexNode& n) {
  switch (n.kind) {
    case RegexNode::kBackref:
    case RegexNode::kLook:
    case RegexNode::kAtomic:
    case RegexNode::kCond:
      return false;
    case RegexNode::kRepeat:
      if (n.possessive) return false;
      break;
    default:
      break;
  }
  for (const auto& k : n.kids) {
    if (!dfa_can(*k)) return false;
  }
  return true;
}
/// Whether `n` matches the empty text, or nullopt when that takes the backtracker. In an empty
/// text every position is the start and the end: ^ \A $ \Z pass, \b and \B (Python before 3.14)
/// fail, and no character can be read.
std::optional<bool> matches_empty_text(const RegexNode& n) {
  switch (n.kind) {
    case RegexNode::kEmpty:
      return true;
    case RegexNode::kSet:
      return false;
    case RegexNode::kAssert:
      return n.assertion != Assertion::kWord && n.assertion != Assertion::kNotWord &&
             n.assertion != Assertion::kAsciiWord && n.assertion != Assertion::kAsciiNotWord;
    case RegexNode::kGroup:
      return matches_empty_text(*n.kids[0]);
    case RegexNode::kRepeat: {
      if (n.possessive) return std::nullopt;
      const auto body = matches_empty_text(*n.kids[0]);
      if (!body) return std::nullopt;
      return n.min == 0 || *body;
    }
    case RegexNode::kConcat:
    case RegexNode::kAlt: {
      bool all = true, any = false;
      for (const auto& k : n.kids) {
        const auto e = matches_empty_text(*k);
        if (!e) return std::nullopt;
        all = all && *e;
        any = any || *e;
      }
      return n.kind == RegexNode::kConcat ? all : any;
    }
    default: return std::nullopt;
  }
}

}  // namespace

PatternTable::PatternTable(const std::vector<std::string>& patterns, std::uint64_t budget)
    : budget_(budget) {
  std::vector<ParsedPattern> parsed;
  parsed.reserve(patterns.size());
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    try {
      parsed.push_back(parse_py_regex(patterns[i]));
    } catch (const PatternSyntaxError& e) {
      throw TablePatternError{i, e};
    }
  }
  std::vector<const RegexNode*> dfa_roots;
  for (std::size_t i = 0; i < parsed.size(); ++i) {
    if (!parsed[i].needs_backtracker && dfa_can(*parsed[i].root)) {
      dfa_roots.push_back(parsed[i].root.get());
      dfa_entries_.push_back(static_cast<int>(i));
    }
  }
  dfa_ = PathMatcher::compile(dfa_roots);
  if (!dfa_) {
    // Too many states: the backtracker decides every entry.
    dfa_entries_.clear();
    dfa_roots.clear();
    dfa_ = PathMatcher::compile(dfa_roots);
  }
  all_in_dfa_ = dfa_entries_.size() == parsed.size();
  std::vector<bool> in_dfa(parsed.size(), false);
  for (int e : dfa_entries_) in_dfa[static_cast<std::size_t>(e)] = true;
  for (std::size_t i = 0; i < parsed.size(); ++i) {
    if (in_dfa[i]) continue;
    try {
      backtracked_.emplace_back(static_cast<int>(i), Backtracker(parsed[i]));
    } catch (const PatternSyntaxError& e) {
      throw TablePatternError{i, e};
    }
  }
  // Which entries match the empty path (catch-alls): read off the syntax tree, or asked of the
  // backtracker for lookaround and backreferences.
  empty_.assign(parsed.size(), false);
  for (std::size_t i = 0; i < parsed.size(); ++i) {
    if (const auto e = matches_empty_text(*parsed[i].root)) {
      empty_[i] = *e;
      continue;
    }
    try {
      empty_[i] = Backtracker(parsed[i]).search(std::u32string(), budget_);
    } catch (const BacktrackBudgetExceeded&) {
      throw TableBudgetError{i};
    } catch (const PatternSyntaxError& e) {
      throw TablePatternError{i, e};
    }
  }
}

PatternTable::~PatternTable() = default;
PatternTable::PatternTable(PatternTable&&) noexcept = default;
PatternTable& PatternTable::operator=(PatternTable&&) noexcept = default;

int PatternTable::first_match(std::string_view path) const {
  int r = -1;
  if (!dfa_entries_.empty()) {
    const int k = dfa_->first_match(path);
    r = k < 0 ? -1 : dfa_entries_[static_cast<std::size_t>(k)];
  }
  if (backtracked_.empty()) return r;
  const std::u32string text = decode_utf8(path);
  for (const auto& [i, bt] : backtracked_) {
    if (r >= 0 && i > r) break;
    try {
      if (bt.search(text, budget_)) return i;
    } catch (const BacktrackBudgetExceeded&) {
      throw TableBudgetError{static_cast<std::size_t>(i)};
    }
  }
  return r;
}

}  // namespace shardplan::detail
