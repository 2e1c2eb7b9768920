// Phase 1 of the partitioner: the candidates of every node, one cost, one choice
// (partition_choose.hpp).
#include "partition_choose.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

#include "partition_moves.hpp"
#include "partition_reads.hpp"
#include "partition_space.hpp"
#include "../ir/primitive.hpp"
#include "../ir/primitives.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {

std::string_view to_string(Strategy s) {
  switch (s) {
    case Strategy::kSplitLike:
      return "split like an operand";
    case Strategy::kPassFirst:
      return "pass factors first";
    case Strategy::kReduceFirst:
      return "reduce factors first";
    case Strategy::kCarry:
      return "pending sum carried";
    case Strategy::kMadeForUser:
      return "made in its user's sharding";
    case Strategy::kFixed:
      return "fixed";
  }
  return "?";
}

// The tie order (partition_moves.hpp): less cost, then fewer bytes held (memory is not a cost,
// but of two plans alike the one that keeps less), then less work per device, then fewer
// collectives, then the strategies' order, then the candidate's place (made from the node and
// its operands alone, never from its uses).
bool before(const Cost& cost_a, const Cand& a, int ia, const Cost& cost_b, const Cand& b, int ib) {
  if (!same_cost(cost_a.value, cost_b.value)) return cost_a.value < cost_b.value;
  if (a.held != b.held) return a.held < b.held;
  if (a.work != b.work) return a.work < b.work;
  if (!same_cost(cost_a.collectives, cost_b.collectives)) {
    return cost_a.collectives < cost_b.collectives;
  }
  return std::tie(a.strategy, ia) < std::tie(b.strategy, ib);
}

namespace {

// Every list of `m` emptied, their memory kept (the choice's rounds refill them).
template <class T>
void clear_each(ValueMap<std::vector<T>>& m, std::size_t n) {
  if (m.size() != n) {
    m = ValueMap<std::vector<T>>(n);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) m[value_id(i)].clear();
}



class Chooser {
 public:
  Chooser(const Graph& g, const Propagator& prop, const ValueMap<PartitionSpec>& specs,
          const CompileSpec& spec)
      : g_(g),
        prop_(prop),
        specs_(specs),
        mesh_(spec.mesh),
        model_(spec.mesh, spec.links),
        reads_(g, prop, spec.mesh, model_, spec),
        uses_(g),
        pick_(g.size(), -1),
        state_(g.size(), -1),
        reads_of_(uses_.reads_of) {
  }

  // The steps of partition_choose.hpp.
  Choices run() {
    solve();
    return finish();
  }

  // Steps 1-4; then, where values have several uses, steps 1-4 again with each shared value's
  // reads priced at their marginal cost given the other reads of the last choice (the value in
  // the state it was chosen in costs nothing more to make, and a read of it in a sharding another
  // read already makes costs nothing more to reshard). The cheapest choice of the rounds is kept.
  static constexpr int kRounds = 3;
  void solve() {
    space_ = build_candidates(g_, prop_, specs_, mesh_, model_, uses_, table_);
    for (std::size_t i = 0; i < g_.size(); ++i) {
      Space& sp = space_[value_id(i)];
      for (const Layout& l : sp.states) sp.keys.push_back(reads_.key(l, table_));
    }
    out_specs_ = ValueMap<Spec>(g_.size());
    for (const ValueId o : g_.outputs) out_specs_[o] = table_.intern(specs_[o]);
    if (forced()) return;
    std::vector<int> best_pick;
    double best_cost = kInfinite;
    bool shared = false;
    for (std::size_t i = 0; i < g_.size(); ++i) shared |= reads_of_[value_id(i)] > 1;
    for (int round = 0; round < (shared ? kRounds : 1); ++round) {
      marginal_ = round > 0;
      if (memo_.size() != g_.size()) {
        memo_ = ValueMap<std::vector<MarginalMemo>>(g_.size());
        for (std::size_t i = 0; i < g_.size(); ++i) {
          memo_[value_id(i)].resize(g_.nodes[i].operands.size());
        }
      }
      for (std::size_t i = 0; i < g_.size(); ++i) {
        for (MarginalMemo& m : memo_[value_id(i)]) {
          m.ready = false;
          m.others.clear();
          m.with.clear();
        }
      }
      for (std::size_t i = 0; i < g_.size(); ++i) forward(value_id(i));
      extract();
      realize();
      improve();
      std::vector<int> pick(g_.size());
      for (std::size_t i = 0; i < g_.size(); ++i) pick[i] = pick_[value_id(i)];
      const double cost = shared ? program_cost(pick) : 0;
      if (best_pick.empty() || (cost < best_cost && !same_cost(cost, best_cost))) {
        best_cost = cost;
        best_pick = pick;
      } else {
        break;  // no better than the round before: it will not move further
      }
      remember_choice();
    }
    for (std::size_t i = 0; i < g_.size(); ++i) {
      pick_[value_id(i)] = best_pick[i];
      state_[value_id(i)] = space_[value_id(i)].cands[static_cast<std::size_t>(best_pick[i])].state;
    }
    if (!shared) return;
    // Step 5 (partition_moves.hpp), then step 4 again, while a group moves.
    for (int pass = 0; pass < kGroupPasses; ++pass) {
      if (!improve_groups(g_, out_specs_, uses_, space_, reads_, pick_, state_)) break;
      improve();
    }
  }
  static constexpr int kGroupPasses = 3;  // each lowers the cost: the bound guards compile time

  // Where every node has one candidate (an eager op's program, mostly) and none is a fallback,
  // there is nothing to choose: steps 1-5 would take each node's one (its one state is the one
  // its readers read as it is), so it is taken at once. False, choosing nothing, otherwise.
  bool forced() {
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const Space& sp = space_[value_id(i)];
      if (sp.cands.size() != 1 || sp.cands.front().fallback) return false;
    }
    for (std::size_t i = 0; i < g_.size(); ++i) {
      pick_[value_id(i)] = 0;
      state_[value_id(i)] = space_[value_id(i)].cands.front().state;
    }
    return true;
  }

  // The last round's choice, for the marginal prices of the next.
  void remember_choice() {
    last_state_ = state_;
    last_pick_ = pick_;
    clear_each(last_wants_, g_.size());
    for (const ValueId o : g_.outputs) last_wants_[o].push_back(out_specs_[o]);
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId v = value_id(i);
      const Cand& c = space_[v].cands[static_cast<std::size_t>(pick_[v])];
      for (std::size_t k = 0; k < c.as_is.size(); ++k) {
        if (c.as_is[k] == kRead) last_wants_[g_[v].operands[k]].push_back(c.wants[k]);
      }
    }
  }

  CandidateSpace space() {
    solve();
    CandidateSpace out;
    out.nodes = ValueMap<CandidateSpace::NodeSpace>(g_.size());
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId v = value_id(i);
      auto& ns = out.nodes[v];
      ns.states = space_[v].states;
      ns.op = g_[v].op->name;
      ns.operands = g_[v].operands;
      for (const Cand& c : space_[v].cands) {
        ns.candidates.push_back({c.strategy, decision_of(v, c), c.as_is, c.compute,
                                 std::vector<int>(c.as_is.size(), -1), c.fallback});
        ns.result_state.push_back(c.state);
      }
      out.chosen.push_back(pick_[v]);
    }
    read_pieces(g_, specs_, space_, out,
                [this](ValueId v, const Layout& from, const PartitionSpec& to) {
                  return reads_.reshard(v, reads_.key(from, table_), table_.intern(to));
                });
    out.cost = [this](const std::vector<int>& pick) { return program_cost(pick); };
    return out;
  }

 private:
  const Node& node(ValueId v) const { return g_[v]; }
  const Layout& state(ValueId v, int s) const {
    return space_[v].states[static_cast<std::size_t>(s)];
  }
  StateKey key(ValueId v, int s) const { return space_[v].keys[static_cast<std::size_t>(s)]; }

  // ---- the choice ----------------------------------------------------------------------------

  // marginal_read's, per (node, operand), for one round.
  struct MarginalMemo {
    bool ready = false;
    std::vector<Spec> others;                 // the other reads' shardings
    Cost without;                             // their cost
    std::vector<std::pair<Spec, Cost>> with;  // what a read in a sharding adds
  };

  // The least cost of operand k's read by candidate c (a state of the operand and the reshard
  // from it), and that state. A value read n times is made once: each read bears 1/n of making
  // it and of its reshard (the reads that want the same sharding share one), so the sum over its
  // reads is its cost where they agree; exact where each value is read once.
  std::pair<Cost, int> read(ValueId id, const Cand& c, std::size_t k) {
    const ValueId o = g_[id].operands[k];
    const Space& os = space_[o];
    const double share = 1.0 / static_cast<double>(reads_of_[o]);
    const auto scaled = [&](Cost x) {
      x.value *= share;
      x.collectives *= share;
      return x;
    };
    if (marginal_ && reads_of_[o] > 1) return marginal_read(id, c, k);
    if (c.as_is[k] >= 0) return {scaled(os.best[static_cast<std::size_t>(c.as_is[k])]), c.as_is[k]};
    std::pair<Cost, int> best{kInf, -1};
    for (std::size_t s = 0; s < os.states.size(); ++s) {
      if (c.fallback && !os.states[s].pending.empty()) continue;
      const Cost& upstream = os.best[s];
      if (upstream.value == kInfinite) continue;
      const Cost moved =
          c.as_is[k] == kAnyState ? Cost{} : reads_.reshard(o, os.keys[s], c.wants[k]);
      const Cost total = scaled(upstream + moved);
      if (cheaper(total, best.first)) best = {total, static_cast<int>(s)};
    }
    return best;
  }

  // A read of a shared value priced against the last round's choice: in the state the value was
  // chosen in, what this read adds to the value's reads (the others' kept); in another state, the
  // whole cost of making it there and resharding (the others not counted).
  std::pair<Cost, int> marginal_read(ValueId id, const Cand& c, std::size_t k) {
    const ValueId o = g_[id].operands[k];
    const Space& os = space_[o];
    const int chosen = last_state_[o];
    // The other reads and their cost, the same for every candidate of `id` (made once a round).
    MarginalMemo& memo = memo_[id][k];
    if (!memo.ready) {
      memo.others = last_wants_[o];
      const Cand& mine = space_[id].cands[static_cast<std::size_t>(last_pick_[id])];
      if (mine.as_is[k] == kRead) {
        const auto it = std::find(memo.others.begin(), memo.others.end(), mine.wants[k]);
        if (it != memo.others.end()) memo.others.erase(it);
      }
      memo.without = reads_.cost(o, os.keys[static_cast<std::size_t>(chosen)], memo.others);
      memo.ready = true;
    }
    std::pair<Cost, int> best{kInf, -1};
    for (std::size_t s = 0; s < os.states.size(); ++s) {
      const int si = static_cast<int>(s);
      if (c.as_is[k] >= 0 && c.as_is[k] != si) continue;
      if (c.fallback && c.as_is[k] == kRead && !os.states[s].pending.empty()) continue;
      Cost total;
      if (si == chosen) {
        if (c.as_is[k] == kRead) total = added_read(memo, o, os.keys[s], c.wants[k]);
      } else {
        if (os.best[s].value == kInfinite) continue;
        total = os.best[s];
        if (c.as_is[k] == kRead) total += reads_.reshard(o, os.keys[s], c.wants[k]);
      }
      if (cheaper(total, best.first)) best = {total, si};
    }
    return best;
  }

  // What a read in `want` adds to the other reads of o (in its chosen state `at`), memoized by
  // the sharding wanted.
  Cost added_read(MarginalMemo& memo, ValueId o, StateKey at, Spec want) {
    for (const auto& [w, cost] : memo.with) {
      if (w == want) return cost;
    }
    std::vector<Spec>& with = with_;
    with.assign(memo.others.begin(), memo.others.end());
    with.push_back(want);
    Cost total = reads_.cost(o, at, with);
    total.value -= memo.without.value;
    total.collectives -= memo.without.collectives;
    memo.with.emplace_back(want, total);
    return total;
  }

  // Step 1: each candidate's least total, each state's least candidate.
  void forward(ValueId id) {
    Space& sp = space_[id];
    sp.best.assign(sp.states.size(), kInf);
    sp.arg.assign(sp.states.size(), -1);
    for (std::size_t i = 0; i < sp.cands.size(); ++i) {
      Cand& c = sp.cands[i];
      c.total = c.fallback ? kInf : c.compute;
      for (std::size_t k = 0; k < g_[id].operands.size() && c.total.value < kInfinite; ++k) {
        c.total += read(id, c, k).first;
      }
      const auto s = static_cast<std::size_t>(c.state);
      const int a = sp.arg[s];
      if (a < 0 || before(c.total, c, static_cast<int>(i), sp.best[s],
                          sp.cands[static_cast<std::size_t>(a)], a)) {
        sp.best[s] = c.total;
        sp.arg[s] = static_cast<int>(i);
      }
    }
  }

  // Step 2: backward, each value's state given what its chosen users read it in.
  void extract() {
    pick_ = ValueMap<int>(g_.size(), -1);
    state_ = ValueMap<int>(g_.size(), -1);
    clear_each(wants_, g_.size());
    clear_each(need_, g_.size());
    for (const ValueId o : g_.outputs) wants_[o].push_back(out_specs_[o]);
    for (std::size_t i = g_.size(); i-- > 0;) {
      const ValueId v = value_id(i);
      const Space& sp = space_[v];
      std::vector<int>& allowed = allowed_;
      allowed.assign(need_[v].begin(), need_[v].end());
      if (allowed.empty()) {
        for (std::size_t s = 0; s < sp.states.size(); ++s) allowed.push_back(static_cast<int>(s));
      }
      std::sort(allowed.begin(), allowed.end());
      allowed.erase(std::unique(allowed.begin(), allowed.end()), allowed.end());
      Cost best = kInf;
      for (const int s : allowed) {
        const int a = sp.arg[static_cast<std::size_t>(s)];
        if (a < 0) continue;
        const Cost c = sp.best[static_cast<std::size_t>(s)] +
                         reads_.cost(v, key(v, s), wants_[v]);
        if (pick_[v] < 0 || before(c, sp.cands[static_cast<std::size_t>(a)], s, best,
                                   sp.cands[static_cast<std::size_t>(pick_[v])], state_[v])) {
          best = c;
          pick_[v] = a;
          state_[v] = s;
        }
      }
      if (pick_[v] < 0) {
        throw SpecError(fmt::format("[compile] the partitioner found no way to make {} {}",
                                    g_[v].op->name, to_string(g_[v].type)));
      }
      ask_operands(v, sp.cands[static_cast<std::size_t>(pick_[v])]);
    }
  }

  void ask_operands(ValueId v, const Cand& c) {
    const Node& n = g_[v];
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      const ValueId o = n.operands[k];
      if (c.as_is[k] >= 0) {
        need_[o].push_back(c.as_is[k]);
      } else if (c.as_is[k] == kRead) {
        wants_[o].push_back(c.wants[k]);
      }
    }
  }

  // Step 3: forward, every read as it is checked against the state chosen for its operand; a
  // node where one is not met takes its cheapest candidate given its operands' states.
  void realize() {
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId v = value_id(i);
      const Space& sp = space_[v];
      if (meets(v, sp.cands[static_cast<std::size_t>(pick_[v])])) continue;
      Cost best = kInf;
      int pick = -1;
      for (std::size_t c = 0; c < sp.cands.size(); ++c) {
        const Cand& cand = sp.cands[c];
        if (!meets(v, cand)) continue;
        Cost total = cand.compute;
        for (std::size_t k = 0; k < cand.as_is.size(); ++k) {
          const ValueId o = g_[v].operands[k];
          if (cand.as_is[k] == kRead) total += reads_.reshard(o, key(o, state_[o]), cand.wants[k]);
        }
        if (pick < 0 || before(total, cand, static_cast<int>(c), best,
                               sp.cands[static_cast<std::size_t>(pick)], pick)) {
          best = total;
          pick = static_cast<int>(c);
        }
      }
      if (pick < 0) {
        throw SpecError(fmt::format("[compile] the partitioner found no way to make {} {}",
                                    g_[v].op->name, to_string(g_[v].type)));
      }
      pick_[v] = pick;
      state_[v] = sp.cands[static_cast<std::size_t>(pick)].state;
    }
  }

  // Step 4 (partition_moves.hpp).
  void improve() { detail::improve(g_, out_specs_, uses_, space_, reads_, pick_, state_); }

  bool meets(ValueId v, const Cand& c) const { return detail::meets(g_, space_, state_, v, c); }

  Decision decision_of(ValueId v, const Cand& c) const {
    Decision d{.kind = c.kind, .result = c.result};
    d.wants.reserve(c.wants.size());
    for (const Spec w : c.wants) d.wants.push_back(*w);
    d.result.why = c.why;
    d.as_is.assign(c.as_is.size(), 0);
    for (std::size_t k = 0; k < c.as_is.size(); ++k) {
      if (c.as_is[k] == kRead) continue;
      d.as_is[k] = 1;
      const ValueId o = g_[v].operands[k];
      if (c.as_is[k] == kAnyState && state_[o] >= 0) d.wants[k] = state(o, state_[o]).spec;
    }
    return d;
  }

  // The cost of a whole assignment (CandidateSpace::cost; choose()'s own cost): the compute each
  // candidate does and each value's reads.
  double program_cost(const std::vector<int>& pick) {
    ValueMap<std::vector<Spec>>& wants = cost_wants_;
    clear_each(wants, g_.size());
    for (const ValueId o : g_.outputs) wants[o].push_back(out_specs_[o]);
    Cost total;
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId v = value_id(i);
      const Cand& c = space_[v].cands[static_cast<std::size_t>(pick[i])];
      total += c.compute;
      for (std::size_t k = 0; k < c.as_is.size(); ++k) {
        const ValueId o = g_[v].operands[k];
        const Cand& oc = space_[o].cands[static_cast<std::size_t>(pick[static_cast<std::size_t>(o)])];
        if (c.as_is[k] >= 0 && c.as_is[k] != oc.state) return kInfinite;
        if (c.fallback && c.as_is[k] == kRead && !oc.result.pending.empty()) return kInfinite;
        if (c.as_is[k] == kRead) wants[o].push_back(c.wants[k]);
      }
    }
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId v = value_id(i);
      const Cand& c = space_[v].cands[static_cast<std::size_t>(pick[i])];
      total += reads_.cost(v, key(v, c.state), wants[v]);
    }
    return total.value;
  }

  Choices finish() {
    Choices out;
    out.decisions = ValueMap<Decision>(g_.size());
    out.reads = ValueMap<ReadPlan>(g_.size());
    clear_each(wants_, g_.size());
    clear_each(need_, g_.size());  // (ask_operands fills both; a forced choice made neither)
    for (const ValueId o : g_.outputs) wants_[o].push_back(out_specs_[o]);
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId v = value_id(i);
      ask_operands(v, space_[v].cands[static_cast<std::size_t>(pick_[v])]);
    }
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId v = value_id(i);
      const Space& sp = space_[v];
      const Cand& c = sp.cands[static_cast<std::size_t>(pick_[v])];
      out.decisions[v] = decision_of(v, c);
      auto [reads, plan] = reads_.plan(v, key(v, state_[v]), wants_[v]);
      out.cost += (c.compute + reads).value;
      out.reads[v] = std::move(plan);
      out.decisions[v].decision = describe(v, c);
    }
    out.constants = std::move(uses_.constant);  // (the choice is made: nothing reads it after)
    return out;
  }

  // "pass factors first: 96 B; runner-up reduce factors first: 192 B" (each candidate's cost:
  // its compute, its operands' reads from their chosen states, its result's reads).
  std::string describe(ValueId v, const Cand& chosen) {
    const Space& sp = space_[v];
    if (sp.cands.size() < 2) return std::string(to_string(chosen.strategy));
    Cost runner = kInf;
    const Cand* second = nullptr;
    for (const Cand& c : sp.cands) {
      if (&c == &chosen || !meets(v, c)) continue;
      Cost total = c.compute + reads_.cost(v, key(v, c.state), wants_[v]);
      for (std::size_t k = 0; k < c.as_is.size(); ++k) {
        const ValueId o = g_[v].operands[k];
        if (c.as_is[k] == kRead) total += reads_.reshard(o, key(o, state_[o]), c.wants[k]);
      }
      if (second == nullptr || cheaper(total, runner)) {
        runner = total;
        second = &c;
      }
    }
    if (second == nullptr) return std::string(to_string(chosen.strategy));
    Cost own = chosen.compute + reads_.cost(v, key(v, state_[v]), wants_[v]);
    for (std::size_t k = 0; k < chosen.as_is.size(); ++k) {
      const ValueId o = g_[v].operands[k];
      if (chosen.as_is[k] == kRead) own += reads_.reshard(o, key(o, state_[o]), chosen.wants[k]);
    }
    return fmt::format("{}: {}; runner-up {}: {}", to_string(chosen.strategy), model_.format(own.value),
                       to_string(second->strategy), model_.format(runner.value));
  }

  const Graph& g_;
  const Propagator& prop_;
  const ValueMap<PartitionSpec>& specs_;
  const Mesh& mesh_;
  PartitionCost model_;
  ReadPricer reads_;
  SpecTable table_;  // the specs of space_ (its candidates' wants, its states) and the outputs'
  ValueMap<Space> space_;
  GraphUses uses_;
  ValueMap<int> pick_;   // by node: the chosen candidate
  ValueMap<int> state_;  // by value: its chosen state
  ValueMap<Spec> out_specs_;  // by output: specs_, interned
  ValueMap<std::vector<Spec>> wants_;  // by value: what chosen users read it in
  ValueMap<std::vector<int>> need_;             // by value: states chosen users read as they are
  bool marginal_ = false;                       // solve(): a round after the first
  ValueMap<std::vector<MarginalMemo>> memo_;
  ValueMap<int> last_state_, last_pick_;        // the last round's choice
  ValueMap<std::vector<Spec>> last_wants_;
  const ValueMap<int>& reads_of_;  // uses_.reads_of
  // Scratch, kept for its memory: added_read's, extract's, program_cost's.
  std::vector<Spec> with_;
  std::vector<int> allowed_;
  ValueMap<std::vector<Spec>> cost_wants_;
};

}  // namespace

Choices choose(const Graph& g, const Propagator& prop, const ValueMap<PartitionSpec>& specs,
               const CompileSpec& spec) {
  return Chooser(g, prop, specs, spec).run();
}

CandidateSpace candidate_space(const Graph& g, const Propagator& prop,
                               const ValueMap<PartitionSpec>& specs, const CompileSpec& spec) {
  auto chooser = std::make_shared<Chooser>(g, prop, specs, spec);
  CandidateSpace out = chooser->space();
  auto cost = std::move(out.cost);
  out.cost = [chooser, cost](const std::vector<int>& pick) { return cost(pick); };
  return out;
}

}  // namespace shardplan::detail
