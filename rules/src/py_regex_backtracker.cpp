// The backtracking matcher of Python `re` patterns (py_regex.hpp): the parsed pattern compiled to
// a program of instructions, run with an explicit backtrack stack and a step budget.
#include <algorithm>
#include <iterator>

#include "py_regex.hpp"

namespace shardplan::detail {

// ---- the backtracker: a program of instructions run with an explicit backtrack stack ----

struct Backtracker::Program {
  enum Op {
    kChar,
    kAssert,
    kSplit,
    kJmp,
    kSave,
    kMark,
    kProgress,
    kBackref,
    kLook,
    kAtomic,
    kCond,
    kMatch
  };
  struct Inst {
    Op op;
    int a = 0, b = 0;  // kChar: set; kSplit: targets; kJmp: a; kSave/kMark/kProgress: slot;
                       // kBackref/kCond: group (kCond b: else); kLook/kAtomic: sub entry
    Assertion assertion{};
    bool behind = false, negate = false;
    int width = 0;
  };
  std::vector<Inst> code;
  std::vector<CharSet> sets;
  int slots = 0;  // 2 per group, then loop marks
  int entry = 0;
  CharSet word, ascii_word;

  int emit(Inst i) {
    code.push_back(i);
    if (code.size() > 200000) throw PatternSyntaxError{"the pattern is too large for shardplan", 0};
    return static_cast<int>(code.size()) - 1;
  }

  // Appends `n` at the end of the code (fall-through continuation).
  void compile(const RegexNode& n) {
    switch (n.kind) {
      case RegexNode::kEmpty:
        return;
      case RegexNode::kSet:
        sets.push_back(n.set);
        emit({kChar, static_cast<int>(sets.size()) - 1});
        return;
      case RegexNode::kAssert: {
        Inst i{kAssert};
        i.assertion = n.assertion;
        emit(i);
        return;
      }
      case RegexNode::kConcat:
        for (const auto& k : n.kids) compile(*k);
        return;
      case RegexNode::kAlt: {
        std::vector<int> jumps;
        for (std::size_t k = 0; k < n.kids.size(); ++k) {
          if (k + 1 < n.kids.size()) {
            const int split = emit({kSplit});
            code[static_cast<std::size_t>(split)].a = split + 1;
            compile(*n.kids[k]);
            jumps.push_back(emit({kJmp}));
            code[static_cast<std::size_t>(split)].b = static_cast<int>(code.size());
          } else {
            compile(*n.kids[k]);
          }
        }
        for (int j : jumps) code[static_cast<std::size_t>(j)].a = static_cast<int>(code.size());
        return;
      }
      case RegexNode::kGroup:
        if (n.group > 0) emit({kSave, 2 * n.group});
        compile(*n.kids[0]);
        if (n.group > 0) emit({kSave, 2 * n.group + 1});
        return;
      case RegexNode::kRepeat: {
        if (n.possessive) {
          // An atomic group around the greedy repeat.
          const int jmp = emit({kJmp});
          const int sub = static_cast<int>(code.size());
          repeat(n);
          emit({kMatch});
          code[static_cast<std::size_t>(jmp)].a = static_cast<int>(code.size());
          emit({kAtomic, sub});
          return;
        }
        repeat(n);
        return;
      }
      case RegexNode::kBackref:
        emit({kBackref, n.group});
        return;
      case RegexNode::kLook:
      case RegexNode::kAtomic: {
        const int jmp = emit({kJmp});
        const int sub = static_cast<int>(code.size());
        compile(*n.kids[0]);
        emit({kMatch});
        code[static_cast<std::size_t>(jmp)].a = static_cast<int>(code.size());
        Inst i{n.kind == RegexNode::kLook ? kLook : kAtomic, sub};
        i.behind = n.behind, i.negate = n.negate, i.width = n.width;
        emit(i);
        return;
      }
      case RegexNode::kCond: {
        const int cond = emit({kCond, n.group});
        compile(*n.kids[0]);
        const int jmp = emit({kJmp});
        code[static_cast<std::size_t>(cond)].b = static_cast<int>(code.size());
        compile(*n.kids[1]);
        code[static_cast<std::size_t>(jmp)].a = static_cast<int>(code.size());
        return;
      }
    }
  }

  void repeat(const RegexNode& n) {
    const RegexNode& body = *n.kids[0];
    for (int k = 0; k < n.min; ++k) compile(body);
    if (n.max < 0) {
      // L: split(B, exit); B: mark; body; progress; jmp L. An iteration that consumes nothing
      // ends the loop (as Python does), so the loop cannot spin.
      const int slot = slots++;
      const int split = emit({kSplit});
      code[static_cast<std::size_t>(split)].a = split + 1;
      emit({kMark, slot});
      compile(body);
      emit({kProgress, slot});
      emit({kJmp, split});
      code[static_cast<std::size_t>(split)].b = static_cast<int>(code.size());
      return;
    }
    std::vector<int> splits;
    for (int k = n.min; k < n.max; ++k) {
      const int split = emit({kSplit});
      code[static_cast<std::size_t>(split)].a = split + 1;
      splits.push_back(split);
      compile(body);
    }
    for (int s : splits) code[static_cast<std::size_t>(s)].b = static_cast<int>(code.size());
  }

  bool is_word(char32_t c, bool ascii) const {
    return ascii ? ascii_word.contains(c) : word.contains(c);
  }

  bool check(Assertion a, const std::u32string& t, std::size_t pos) const {
    const std::size_t n = t.size();
    switch (a) {
      case Assertion::kBegin:
        return pos == 0;
      case Assertion::kLineBegin:
        return pos == 0 || t[pos - 1] == '\n';
      case Assertion::kDollar:
        return pos == n || (pos + 1 == n && t[pos] == '\n');
      case Assertion::kLineEnd:
        return pos == n || t[pos] == '\n';
      case Assertion::kEnd:
        return pos == n;
      case Assertion::kWord:
      case Assertion::kAsciiWord:
      case Assertion::kNotWord:
      case Assertion::kAsciiNotWord: {
        const bool ascii = a == Assertion::kAsciiWord || a == Assertion::kAsciiNotWord;
        const bool before = pos > 0 && is_word(t[pos - 1], ascii);
        const bool after = pos < n && is_word(t[pos], ascii);
        if (a == Assertion::kWord || a == Assertion::kAsciiWord) return before != after;
        return n > 0 && before == after;
      }
    }
    return false;
  }

  struct Frame {
    int pc;
    std::size_t pos;
    int slot;  // >= 0: restore slots[slot] = old (pc unused)
    std::int64_t old;
  };

  // Runs the code from `pc` at `pos` anchored; on kMatch returns true with `end` and `caps`.
  // Whether group `g` took part in the match so far (both its slots set in `caps`).
  static bool group_matched(int g, const std::vector<std::int64_t>& caps) {
    return caps[static_cast<std::size_t>(2 * g)] >= 0 &&
           caps[static_cast<std::size_t>(2 * g + 1)] >= 0;
  }

  // Whether what group `g` matched (in `caps`) comes next in `t` at `pos`; if so `pos` moves past
  // it.
  static bool match_backref(int g, const std::u32string& t, const std::vector<std::int64_t>& caps,
                            std::size_t& pos) {
    const std::int64_t b = caps[static_cast<std::size_t>(2 * g)];
    const std::int64_t e = caps[static_cast<std::size_t>(2 * g + 1)];
    if (b < 0 || e < b) return false;
    const auto len = static_cast<std::size_t>(e - b);
    if (pos + len > t.size() ||
        !std::equal(t.begin() + b, t.begin() + e, t.begin() + static_cast<std::ptrdiff_t>(pos)))
      return false;
    pos += len;
    return true;
  }

  bool run(int pc, std::size_t pos, const std::u32string& t, std::vector<std::int64_t>& caps,
           std::size_t& end, std::uint64_t& steps, std::uint64_t budget) const {
    std::vector<Frame> stack;
    auto set_slot = [&](int slot, std::int64_t v) {
      stack.push_back({-1, 0, slot, caps[static_cast<std::size_t>(slot)]});
      caps[static_cast<std::size_t>(slot)] = v;
    };
    while (true) {
      if (++steps > budget) throw BacktrackBudgetExceeded{};
      const Inst& in = code[static_cast<std::size_t>(pc)];
      bool ok = true;
      switch (in.op) {
        case kChar:
          ok = pos < t.size() && sets[static_cast<std::size_t>(in.a)].contains(t[pos]);
          if (ok) ++pos, ++pc;
          break;
        case kAssert:
          ok = check(in.assertion, t, pos);
          ++pc;
          break;
        case kSplit:
          stack.push_back({in.b, pos, -1, 0});
          pc = in.a;
          break;
        case kJmp:
          pc = in.a;
          break;
        case kSave:
        case kMark:
          set_slot(in.a, static_cast<std::int64_t>(pos));
          ++pc;
          break;
        case kProgress:
          ok = caps[static_cast<std::size_t>(in.a)] != static_cast<std::int64_t>(pos);
          ++pc;
          break;
        case kBackref:
          ok = match_backref(in.a, t, caps, pos);
          ++pc;
          break;
        case kCond:
          pc = group_matched(in.a, caps) ? pc + 1 : in.b;
          break;
        case kLook:
        case kAtomic: {
          std::vector<std::int64_t> sub_caps = caps;
          std::size_t sub_end = 0;
          bool found = false;
          if (in.op == kLook && in.behind) {
            const auto w = static_cast<std::size_t>(in.width);
            found = pos >= w && run(in.a, pos - w, t, sub_caps, sub_end, steps, budget);
          } else {
            found = run(in.a, pos, t, sub_caps, sub_end, steps, budget);
          }
          if (in.op == kLook && in.negate) {
            ok = !found;
          } else {
            ok = found;
            if (found) {
              for (std::size_t k = 0; k < caps.size(); ++k) {
                if (sub_caps[k] != caps[k]) set_slot(static_cast<int>(k), sub_caps[k]);
              }
              if (in.op == kAtomic) pos = sub_end;
            }
          }
          ++pc;
          break;
        }
        case kMatch:
          end = pos;
          return true;
      }
      if (ok) continue;
      // Backtrack: undo slot writes down to the last choice point.
      while (true) {
        if (stack.empty()) return false;
        Frame f = stack.back();
        stack.pop_back();
        if (f.slot >= 0) {
          caps[static_cast<std::size_t>(f.slot)] = f.old;
          continue;
        }
        pc = f.pc;
        pos = f.pos;
        break;
      }
    }
  }
};

Backtracker::Backtracker(const ParsedPattern& p) : prog_(std::make_unique<Program>()) {
  prog_->slots = 2 * p.groups;
  prog_->word = word_chars(false);
  prog_->ascii_word = word_chars(true);
  prog_->compile(*p.root);
  prog_->emit({Program::kMatch});
}
Backtracker::~Backtracker() = default;
Backtracker::Backtracker(Backtracker&&) noexcept = default;
Backtracker& Backtracker::operator=(Backtracker&&) noexcept = default;

bool Backtracker::search(const std::u32string& text, std::uint64_t budget) const {
  std::uint64_t steps = 0;
  std::vector<std::int64_t> caps(static_cast<std::size_t>(prog_->slots), -1);
  for (std::size_t start = 0; start <= text.size(); ++start) {
    std::fill(caps.begin(), caps.end(), -1);
    std::size_t end = 0;
    if (prog_->run(prog_->entry, start, text, caps, end, steps, budget)) return true;
  }
  return false;
}

}  // namespace shardplan::detail
