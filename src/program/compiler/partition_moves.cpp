// Step 4 of the partitioner's choice: moves, the best first (partition_moves.hpp).
#include "partition_moves.hpp"

#include <algorithm>
#include <functional>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "../ir/primitive.hpp"
#include "shardplan/detail/hash.hpp"

namespace shardplan::detail {

bool meets(const Graph& g, const ValueMap<Space>& space, const ValueMap<int>& state, ValueId v,
           const Cand& c) {
  for (std::size_t k = 0; k < c.as_is.size(); ++k) {
    const ValueId o = g[v].operands[k];
    if (c.as_is[k] >= 0 && c.as_is[k] != state[o]) return false;
    if (c.fallback && c.as_is[k] == kRead &&
        !space[o].states[static_cast<std::size_t>(state[o])].pending.empty()) {
      return false;
    }
  }
  return true;
}

// Its op, attributes and operands' names in operand order, then its readers' names with the
// position each reads it at (summed: their order does not count) and whether it is an output.
ValueMap<std::size_t> numbering_free_names(const Graph& g, const GraphUses& uses) {
  ValueMap<std::size_t> up(g.size()), name(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes[i];
    std::size_t h = hash_combine(std::hash<std::string_view>()(n.op->name), n.attrs.hash());
    for (const ValueId o : n.operands) h = hash_combine(h, up[o]);
    up[value_id(i)] = h;
  }
  for (std::size_t i = g.size(); i-- > 0;) {
    const ValueId v = value_id(i);
    std::size_t readers = 0;
    for (const auto& [u, pos] : uses.users[v]) {
      readers += hash_combine(name[u], static_cast<std::size_t>(pos));
    }
    name[v] = hash_combine(hash_combine(up[v], readers), uses.is_output[v] != 0 ? 1 : 0);
  }
  return name;
}

namespace {

class Mover {
 public:
  Mover(const Graph& g, const ValueMap<Spec>& specs, const GraphUses& uses,
        const ValueMap<Space>& space, ReadPricer& reads, ValueMap<int>& pick, ValueMap<int>& state)
      : g_(g), specs_(specs), uses_(uses), space_(space), reads_(reads), pick_(pick), state_(state) {}

  // Where values have several uses (the dynamic programming shares a value's cost among its
  // reads, which is exact only where they agree), moves that lower the whole program's cost:
  // every node's best move (move_of) and every shared sharding's (drop_a_want) are evaluated,
  // the best of all applied (best-improvement: which move comes first never depends on where a
  // node is numbered; ahead() is the order), and only the moves whose evaluation read a node
  // the applied move changed are evaluated again; until no move lowers the cost.
  static constexpr std::size_t kImprovePasses = 8;
  void run() {
    Wants wants(g_.size());
    for (const ValueId o : g_.outputs) wants[o].push_back(specs_[o]);
    bool shared = false;
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId v = value_id(i);
      const Cand& c = space_[v].cands[static_cast<std::size_t>(pick_[v])];
      for (std::size_t k = 0; k < c.as_is.size(); ++k) {
        if (c.as_is[k] == kRead) wants[g_[v].operands[k]].push_back(c.wants[k]);
      }
      shared |= uses_.reads_of[v] > 1;
    }
    if (!shared) return;  // every value read once: the dynamic programming was exact
    reads_now_ = ValueMap<Cost>(g_.size());
    reads_known_ = ValueMap<char>(g_.size(), 0);
    const std::size_t n = g_.size();
    // Entry i < n: node i's best move; entry n + i: the best move of value i's shared shardings.
    std::vector<Move> moves(2 * n);
    std::vector<char> stale(2 * n, 1);
    ValueMap<char> changed(n, 0);
    std::vector<ValueId> touched;
    // Each move lowers the cost, so this ends; the bound only keeps a pathological program's
    // compile time in check (kImprovePasses moves per node).
    for (std::size_t step = 0; step < kImprovePasses * n; ++step) {
      for (std::size_t e = 0; e < 2 * n; ++e) {
        if (stale[e] == 0) continue;
        moves[e] = e < n ? move_of(value_id(e), wants) : drop_a_want(value_id(e - n), wants);
        stale[e] = 0;
      }
      const Move* best = nullptr;
      for (const Move& m : moves) {
        if (!m.nodes.empty() && (best == nullptr || ahead(m, *best))) best = &m;
      }
      if (best == nullptr) break;
      const std::vector<std::pair<ValueId, int>> applied = best->nodes;
      apply(applied, wants);
      // A move's evaluation read the choice of its nodes, of their readers and operands, and the
      // other reads of those operands: it is stale where a changed node (a moved one or an
      // operand whose reads changed) is one of its nodes or an operand of one.
      touched.clear();
      for (const auto& [v, c] : applied) {
        touched.push_back(v);
        for (const ValueId o : g_[v].operands) touched.push_back(o);
      }
      for (const ValueId x : touched) {
        changed[x] = 1;
        for (const auto& [u, pos] : uses_.users[x]) changed[u] = 1;
      }
      for (std::size_t e = 0; e < 2 * n; ++e) {
        for (const ValueId u : moves[e].footprint) {
          if (changed[u] != 0) {
            stale[e] = 1;
            break;
          }
        }
      }
      for (const ValueId x : touched) {
        changed[x] = 0;
        for (const auto& [u, pos] : uses_.users[x]) changed[u] = 0;
      }
    }
  }

 private:
  using Wants = ValueMap<std::vector<Spec>>;

  // Nodes to new candidates, and the change of the program's cost that makes.
  struct Move {
    double delta = 0;
    std::vector<std::pair<ValueId, int>> nodes;  // empty: no move lowers the cost
    // Its place in the order of moves (ahead): a node's own move before a shared sharding's, the
    // node's numbering-free name (name_), the candidate's or the sharding's place.
    int kind = 0;
    int place = 0;
    ValueId origin{};
    // The nodes whose choice the evaluation read (the moved ones and the readers it followed).
    std::vector<ValueId> footprint;
  };

  // The order of moves: the one lowering the cost most, then (of equal ones) kind, the name of
  // the node or value it starts from, the place of its candidate or sharding; never the number
  // of a node unless two have the same name (the same computation of the same operands, read
  // alike), where either order makes the same program.
  bool ahead(const Move& a, const Move& b) {
    if (!same_cost(a.delta, b.delta)) return a.delta < b.delta;
    if (a.kind != b.kind) return a.kind < b.kind;
    if (a.origin == b.origin) return a.place < b.place;
    if (name_.size() == 0) name_ = numbering_free_names(g_, uses_);  // made at the first tie
    return std::tuple(name_[a.origin], a.place, a.origin) <
           std::tuple(name_[b.origin], b.place, b.origin);
  }

  // Node v's move that lowers the cost most (with the readers that follow it); of equal ones
  // the candidates' order (before()).
  Move move_of(ValueId v, const Wants& wants) {
    Move best;
    best.origin = v;
    best.footprint.push_back(v);
    const Space& sp = space_[v];
    if (sp.cands.size() < 2) return best;
    std::vector<std::pair<ValueId, int>> m;
    for (std::size_t ci = 0; ci < sp.cands.size(); ++ci) {
      const Cand& cand = sp.cands[ci];
      if (static_cast<int>(ci) == pick_[v] || cand.fallback || !meets(v, cand)) continue;
      m.clear();
      const bool possible = move_with_followers(v, static_cast<int>(ci), m);
      for (std::size_t k = 1; k < m.size(); ++k) best.footprint.push_back(m[k].first);
      if (!possible) continue;
      const double d = delta(m, wants);
      if (d >= 0) continue;
      const Cost cd{d, 0};
      if (best.nodes.empty() ||
          before(cd, cand, static_cast<int>(ci), Cost{best.delta, 0},
                 sp.cands[static_cast<std::size_t>(best.place)], best.place)) {
        best.delta = d;
        best.nodes = m;
        best.place = static_cast<int>(ci);
      }
    }
    return best;
  }

  // A sharding several readers of x share (a weight gathered once for two products) is kept by
  // each single move, since the others still pay for it; so the readers of x in one sharding
  // move together, each to its cheapest candidate that reads x otherwise: of x's shardings, the
  // move that lowers the program's cost most (of equal ones, the sharding first in order).
  Move drop_a_want(ValueId x, const Wants& wants) {
    Move best;
    best.kind = 1;
    best.origin = x;
    if (uses_.users[x].size() < 2) return best;
    for (const auto& [u, pos] : uses_.users[x]) best.footprint.push_back(u);
    std::vector<Spec> distinct = wants[x];
    std::sort(distinct.begin(), distinct.end(), [](const Spec& a, const Spec& b) {
      return a.dims() < b.dims();
    });
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    for (std::size_t wi = 0; wi < distinct.size(); ++wi) {
      const Spec w = distinct[wi];
      std::vector<std::pair<ValueId, int>> moves;
      bool possible = true;
      std::vector<ValueId> readers;
      for (const auto& [u, pos] : uses_.users[x]) {
        const Cand& now = space_[u].cands[static_cast<std::size_t>(pick_[u])];
        const auto k = static_cast<std::size_t>(pos);
        if (now.as_is[k] != kRead || !(now.wants[k] == w)) continue;
        if (std::find(readers.begin(), readers.end(), u) != readers.end()) continue;
        readers.push_back(u);
      }
      if (readers.size() < 2) continue;
      for (const ValueId u : readers) {
        double least = kInfinite;
        std::vector<std::pair<ValueId, int>> least_moves;
        const auto& cands = space_[u].cands;
        for (std::size_t c = 0; c < cands.size(); ++c) {
          const Cand& alt = cands[c];
          if (static_cast<int>(c) == pick_[u] || alt.fallback || !meets(u, alt)) continue;
          bool still = false;
          for (std::size_t q = 0; q < alt.as_is.size(); ++q) {
            still |= g_[u].operands[q] == x && alt.as_is[q] == kRead && alt.wants[q] == w;
          }
          if (still) continue;
          std::vector<std::pair<ValueId, int>> m;
          const bool followed = move_with_followers(u, static_cast<int>(c), m);
          for (const auto& [f, fc] : m) best.footprint.push_back(f);
          if (!followed) continue;
          const double d = delta(m, wants);
          if (d < least) {
            least = d;
            least_moves = std::move(m);
          }
        }
        if (least_moves.empty()) {
          possible = false;
          break;
        }
        moves.insert(moves.end(), least_moves.begin(), least_moves.end());
      }
      if (!possible) continue;
      // One move per node (followers of two readers may coincide).
      std::vector<ValueId> nodes;
      bool clash = false;
      for (const auto& [v, c] : moves) {
        clash |= std::find(nodes.begin(), nodes.end(), v) != nodes.end();
        nodes.push_back(v);
      }
      if (clash) continue;
      const double d = delta(moves, wants);
      if (d >= 0 || (!best.nodes.empty() && (same_cost(d, best.delta) || d > best.delta))) continue;
      best.delta = d;
      best.nodes = std::move(moves);
      best.place = static_cast<int>(wi);
    }
    return best;
  }

  // Node v to candidate ci, with every reader that takes v as it is (an optimization barrier, a
  // gradient's constraint keeping its sum, a carried sum) moved to its alike candidate reading v's
  // new state, transitively; false when a reader has none.
  bool move_with_followers(ValueId v, int ci, std::vector<std::pair<ValueId, int>>& moves) {
    moves.emplace_back(v, ci);
    const int from_state = state_[v];
    const int to_state = space_[v].cands[static_cast<std::size_t>(ci)].state;
    if (from_state == to_state) return true;
    for (const auto& [reader, pos] : uses_.users[v]) {
      const ValueId u = reader;  // (a lambda may not capture a structured binding in C++20)
      if (std::any_of(moves.begin(), moves.end(), [&](const auto& m) { return m.first == u; }))
        continue;
      const Cand& now = space_[u].cands[static_cast<std::size_t>(pick_[u])];
      const auto k = static_cast<std::size_t>(pos);
      if (now.as_is[k] != from_state) continue;  // reads v resharded (or held): any state does
      int follower = -1;
      const auto& cands = space_[u].cands;
      for (std::size_t c = 0; c < cands.size() && follower < 0; ++c) {
        const Cand& alt = cands[c];
        if (alt.strategy != now.strategy || alt.kind != now.kind || alt.fallback) continue;
        bool alike = true;
        for (std::size_t q = 0; q < alt.as_is.size() && alike; ++q) {
          if (g_[u].operands[q] == v) {
            alike = alt.as_is[q] == (now.as_is[q] >= 0 ? to_state : now.as_is[q]) &&
                    (alt.as_is[q] >= 0 || alt.wants[q] == now.wants[q]);
          } else {
            alike = alt.as_is[q] == now.as_is[q] && alt.wants[q] == now.wants[q];
          }
        }
        if (alike) follower = static_cast<int>(c);
      }
      if (follower < 0 || moves.size() > 64) return false;
      if (!move_with_followers(u, follower, moves)) return false;
    }
    return true;
  }

  // The change of the whole program's cost when the moved nodes take their new candidates.
  double delta(const std::vector<std::pair<ValueId, int>>& moves,
               const ValueMap<std::vector<Spec>>& wants) {
    const auto moved_to = [&](ValueId v) {
      for (const auto& [m, c] : moves) {
        if (m == v) return c;
      }
      return -1;
    };
    std::vector<ValueId> touched;
    for (const auto& [v, c] : moves) {
      touched.push_back(v);
      for (const ValueId o : g_[v].operands) touched.push_back(o);
    }
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    Cost before, after;
    for (const auto& [v, c] : moves) {
      before += space_[v].cands[static_cast<std::size_t>(pick_[v])].compute;
      after += space_[v].cands[static_cast<std::size_t>(c)].compute;
    }
    std::vector<Spec>& w = delta_wants_;
    for (const ValueId x : touched) {
      w.assign(wants[x].begin(), wants[x].end());
      for (const auto& [v, c] : moves) {
        swap_wants(w, space_[v].cands[static_cast<std::size_t>(pick_[v])],
                   space_[v].cands[static_cast<std::size_t>(c)], g_[v], x);
      }
      const int to = moved_to(x);
      const int new_state = to < 0 ? state_[x] : space_[x].cands[static_cast<std::size_t>(to)].state;
      before += current_reads(x, wants);
      after += reads_.cost(x, key(x, new_state), w);
    }
    if (same_cost(after.value, before.value)) return 0;
    return after.value - before.value;
  }

  // read_plan's cost of x as chosen now (improve: remembered until a move touches x).
  Cost current_reads(ValueId x, const ValueMap<std::vector<Spec>>& wants) {
    if (reads_known_[x] == 0) {
      reads_now_[x] = reads_.cost(x, key(x, state_[x]), wants[x]);
      reads_known_[x] = 1;
    }
    return reads_now_[x];
  }

  void apply(const std::vector<std::pair<ValueId, int>>& moves,
             ValueMap<std::vector<Spec>>& wants) {
    for (const auto& [v, c] : moves) {
      reads_known_[v] = 0;
      for (const ValueId o : g_[v].operands) reads_known_[o] = 0;
    }
    for (const auto& [v, c] : moves) {
      const Cand& from = space_[v].cands[static_cast<std::size_t>(pick_[v])];
      const Cand& to = space_[v].cands[static_cast<std::size_t>(c)];
      std::vector<ValueId> seen;
      for (const ValueId o : g_[v].operands) {
        if (std::find(seen.begin(), seen.end(), o) != seen.end()) continue;
        seen.push_back(o);
        swap_wants(wants[o], from, to, g_[v], o);
      }
    }
    for (const auto& [v, c] : moves) {
      pick_[v] = c;
      state_[v] = space_[v].cands[static_cast<std::size_t>(c)].state;
    }
  }

  // Value o's wants with user v's candidate `from` replaced by `to`.
  static void swap_wants(std::vector<Spec>& w, const Cand& from, const Cand& to,
                         const Node& n, ValueId o) {
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      if (n.operands[k] != o) continue;
      if (from.as_is[k] == kRead) {
        const auto it = std::find(w.begin(), w.end(), from.wants[k]);
        if (it != w.end()) w.erase(it);
      }
      if (to.as_is[k] == kRead) w.push_back(to.wants[k]);
    }
  }

  StateKey key(ValueId v, int s) const { return space_[v].keys[static_cast<std::size_t>(s)]; }
  bool meets(ValueId v, const Cand& c) const { return detail::meets(g_, space_, state_, v, c); }

  const Graph& g_;
  const ValueMap<Spec>& specs_;  // the outputs', interned
  const GraphUses& uses_;
  const ValueMap<Space>& space_;
  ReadPricer& reads_;
  ValueMap<int>& pick_;   // by node: the chosen candidate
  ValueMap<int>& state_;  // by value: its chosen state
  ValueMap<Cost> reads_now_;  // current_reads
  ValueMap<char> reads_known_;
  std::vector<Spec> delta_wants_;  // delta's scratch, kept for its memory
  ValueMap<std::size_t> name_;  // numbering_free_names
};

}  // namespace

void improve(const Graph& g, const ValueMap<Spec>& specs, const GraphUses& uses,
             const ValueMap<Space>& space, ReadPricer& reads, ValueMap<int>& pick,
             ValueMap<int>& state) {
  Mover(g, specs, uses, space, reads, pick, state).run();
}

}  // namespace shardplan::detail
