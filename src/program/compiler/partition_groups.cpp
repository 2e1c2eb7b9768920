// Step 4's group moves (partition_moves.hpp): an exact search over the candidates of a group of
// coupled nodes, the rest of the program held.
#include <algorithm>
#include <functional>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "../ir/fields.hpp"
#include "../ir/primitive.hpp"
#include "partition_moves.hpp"
#include "shardplan/detail/hash.hpp"

namespace shardplan::detail {

namespace {

class Grouper {
 public:
  Grouper(const Graph& g, const ValueMap<Spec>& specs, const GraphUses& uses,
          const ValueMap<Space>& space, ReadPricer& reads, ValueMap<int>& pick,
          ValueMap<int>& state)
      : g_(g), specs_(specs), uses_(uses), space_(space), reads_(reads), pick_(pick), state_(state) {}

  // Every group evaluated (its best assignment); the one lowering the program's cost most
  // applied, the groups whose evaluation read a node it changed evaluated again; until none
  // lowers it. True when one did.
  bool run() {
    setup();
    make_groups();
    bool moved = false;
    for (std::size_t step = 0; step < kGroupMoves * (groups_.size() + 1); ++step) {
      for (Group& gr : groups_) {
        if (gr.stale) evaluate(gr);
      }
      Group* best = nullptr;
      for (Group& gr : groups_) {
        if (gr.delta < 0 && (best == nullptr || ahead(gr, *best))) best = &gr;
      }
      if (best == nullptr) break;
      apply(*best);
      moved = true;
    }
    return moved;
  }

 private:
  // A group: the nodes searched together and what the best assignment of their candidates
  // found (delta < 0: it lowers the program's cost by -delta).
  struct Group {
    std::vector<ValueId> nodes;      // in the search's order
    std::vector<std::size_t> local, names;  // its nodes' local names and names, sorted
    std::vector<ValueId> footprint;  // the nodes whose choice its evaluation reads
    bool stale = true;
    double delta = 0;
    std::vector<int> best;  // by node: the candidate
  };

  // A group grows from a node by whole rings of neighbours while it holds at most kGroupNodes;
  // its search visits at most kGroupVisits partial assignments (then its best so far stands: the
  // MLP step's largest search visits 938, the LLaMA step's 127); at most kGroupMoves moves per
  // group, in all, are applied (each lowers the cost: the bounds only guard compile time).
  static constexpr std::size_t kGroupNodes = 12;
  static constexpr std::size_t kGroupVisits = 5000;
  static constexpr std::size_t kGroupMoves = 4;

  void setup() {
    const std::size_t n = g_.size();
    wants_ = ValueMap<std::vector<Spec>>(n);
    for (const ValueId o : g_.outputs) wants_[o].push_back(specs_[o]);
    free_ = ValueMap<char>(n, 0);
    depth_ = ValueMap<int>(n, 0);
    members_ = ValueMap<std::size_t>(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const ValueId v = value_id(i);
      const Cand& c = space_[v].cands[static_cast<std::size_t>(pick_[v])];
      for (std::size_t k = 0; k < c.as_is.size(); ++k) {
        if (c.as_is[k] == kRead) wants_[g_[v].operands[k]].push_back(c.wants[k]);
      }
      free_[v] = space_[v].cands.size() > 1 ? 1 : 0;
      for (const ValueId o : g_[v].operands) depth_[v] = std::max(depth_[v], depth_[o] + 1);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const ValueId v = value_id(i);
      const std::vector<Layout>& states = space_[v].states;
      if (states.size() == 1 && states[0].pending.empty() && states[0].spec.is_replicated()) {
        continue;  // whole on every device, in one layout: any read of it is a local slice
      }
      members_[v] = free_[v];
      for (const auto& [u, pos] : uses_.users[v]) members_[v] += free_[u];
    }
    name_ = numbering_free_names(g_, uses_);
    local_names();
    trial_pick_ = pick_;
    trial_state_ = state_;
    slot_ = ValueMap<int>(n, -1);
    mark_ = ValueMap<char>(n, 0);
    known_ = ValueMap<char>(n, 0);
    now_ = ValueMap<double>(n, 0);
  }

  // Each node named by what it computes and what is next to it: its op, attributes and type,
  // its operands' in operand order and its readers' with the position each reads it at. Unlike
  // name_ (what the node's whole cone computes), a node of each of a stack's layers alike has
  // the same local name: groups alike, in every layer, are searched and moved in the same order.
  void local_names() {
    const std::size_t n = g_.size();
    ValueMap<std::size_t> own(n);
    local_ = ValueMap<std::size_t>(n);
    for (std::size_t i = 0; i < n; ++i) {
      const Node& node = g_.nodes[i];
      own[value_id(i)] = hash_combine(
          hash_combine(std::hash<std::string_view>()(node.op->name), node.attrs.hash()),
          hash_combine(hash_of(node.type.dtype), hash_of(node.type.shape)));
    }
    for (std::size_t i = 0; i < n; ++i) {
      const ValueId v = value_id(i);
      std::size_t h = own[v];
      for (const ValueId o : g_[v].operands) h = hash_combine(h, own[o]);
      std::size_t readers = 0;
      for (const auto& [u, pos] : uses_.users[v]) {
        readers += hash_combine(own[u], static_cast<std::size_t>(pos));
      }
      local_[v] = hash_combine(h, readers);
    }
  }

  // The free nodes (two candidates or more) a node shares a value with: its operands' makers,
  // their other readers and its readers. A node with one candidate couples none, nor does a
  // value whole on every device in its one layout (members_ 0). False (and none given) where a
  // value shared has more than kGroupNodes free makers and readers: a group holding the node
  // and its ring would hold them all.
  template <class F>
  bool neighbours(ValueId v, F&& f) const {
    if (members_[v] > kGroupNodes) return false;
    for (const ValueId o : g_[v].operands) {
      if (members_[o] > kGroupNodes) return false;
    }
    const auto each = [&](ValueId x) {
      if (members_[x] == 0) return;
      if (x != v && free_[x] != 0) f(x);
      for (const auto& [u, pos] : uses_.users[x]) {
        if (u != v && free_[u] != 0) f(u);
      }
    };
    each(v);
    for (const ValueId o : g_[v].operands) each(o);
    return true;
  }

  // From each free node, the nodes within a distance that keeps the group within kGroupNodes
  // (whole rings: no ring is cut, so the group does not depend on an order); equal groups once.
  void make_groups() {
    std::set<std::vector<ValueId>> seen;
    std::vector<ValueId> in, ring, next;
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId s = value_id(i);
      if (free_[s] == 0) continue;
      in.assign(1, s);
      ring.assign(1, s);
      mark_[s] = 1;
      while (!ring.empty()) {
        next.clear();
        bool fits = true;
        for (const ValueId v : ring) {
          fits = fits && neighbours(v, [&](ValueId u) {
                   if (mark_[u] != 0) return;
                   mark_[u] = 1;
                   next.push_back(u);
                 });
        }
        if (!fits || in.size() + next.size() > kGroupNodes) {
          for (const ValueId u : next) mark_[u] = 0;
          break;
        }
        in.insert(in.end(), next.begin(), next.end());
        ring.swap(next);
      }
      for (const ValueId v : in) mark_[v] = 0;
      if (in.size() < 2) continue;
      std::sort(in.begin(), in.end());
      seen.insert(in);
    }
    // A group within another is searched by the other (its assignments are the other's with
    // the rest held): only the largest are kept.
    ValueMap<std::vector<const std::vector<ValueId>*>> holding(g_.size());
    for (const auto& s : seen) {
      for (const ValueId v : s) holding[v].push_back(&s);
    }
    for (const auto& s : seen) {
      const bool within = std::any_of(
          holding[s.front()].begin(), holding[s.front()].end(), [&](const auto* t) {
            return t->size() > s.size() && std::includes(t->begin(), t->end(), s.begin(), s.end());
          });
      if (!within) add_group(s);
    }
  }

  void add_group(const std::vector<ValueId>& in) {
    Group gr;
    gr.nodes = in;
    std::sort(gr.nodes.begin(), gr.nodes.end(), [&](ValueId a, ValueId b) {
      return std::tuple(depth_[a], local_[a], name_[a], a) <
             std::tuple(depth_[b], local_[b], name_[b], b);
    });
    for (const ValueId v : gr.nodes) {
      gr.local.push_back(local_[v]);
      gr.names.push_back(name_[v]);
    }
    std::sort(gr.local.begin(), gr.local.end());
    std::sort(gr.names.begin(), gr.names.end());
    for (const ValueId v : gr.nodes) {
      gr.footprint.push_back(v);
      for (const ValueId o : g_[v].operands) {
        gr.footprint.push_back(o);
        for (const auto& [u, pos] : uses_.users[o]) gr.footprint.push_back(u);
      }
      for (const auto& [u, pos] : uses_.users[v]) gr.footprint.push_back(u);
    }
    std::sort(gr.footprint.begin(), gr.footprint.end());
    gr.footprint.erase(std::unique(gr.footprint.begin(), gr.footprint.end()), gr.footprint.end());
    groups_.push_back(std::move(gr));
  }

  // Of two groups lowering the cost, the one lowering it most; of equal ones, the one whose
  // nodes' local names come first, then their names (never their numbers unless the names are
  // equal).
  static bool ahead(const Group& a, const Group& b) {
    if (!same_cost(a.delta, b.delta)) return a.delta < b.delta;
    return std::tie(a.local, a.names, a.nodes) < std::tie(b.local, b.names, b.nodes);
  }

  // ---- one group's search --------------------------------------------------------------------

  // The least cost of the group's nodes' compute and of the reads of every value they make or
  // read, over every consistent assignment of their candidates (depth first, in the group's
  // order, each node's candidates in their order; a branch is cut where its cost so far and the
  // least compute of the nodes left reach the best so far). The assignment now is the first
  // best: only a strictly lower cost is a move.
  void evaluate(Group& gr) {
    gr.stale = false;
    gr.delta = 0;
    gr.best.clear();
    const std::vector<ValueId>& nodes = gr.nodes;
    for (std::size_t p = 0; p < nodes.size(); ++p) slot_[nodes[p]] = static_cast<int>(p);
    prepare(nodes);
    double base = 0;
    for (const ValueId v : nodes) base += cand(v, pick_[v]).compute.value;
    for (const ValueId x : values_) base += current_reads(x);
    best_ = base;
    best_pick_.clear();
    visits_ = 0;
    search(nodes, 0, 0);
    if (!best_pick_.empty()) {
      gr.delta = best_ - base;
      if (same_cost(best_, base)) gr.delta = 0;
      gr.best = best_pick_;
    }
    for (const ValueId v : nodes) slot_[v] = -1;
  }

  // The cost of x's reads as chosen now (remembered until a move changes x or a reader).
  double current_reads(ValueId x) {
    if (known_[x] == 0) {
      now_[x] = reads_.cost(x, key(x, state_[x]), wants_[x]).value;
      known_[x] = 1;
    }
    return now_[x];
  }

  // values_ (what the group makes or reads), the position at which each one's reads are known
  // (its maker and every reader in the group placed), its wants from readers outside the group,
  // and what readers outside ask of each node's state.
  void prepare(const std::vector<ValueId>& nodes) {
    values_.clear();
    for (const ValueId v : nodes) {
      values_.push_back(v);
      for (const ValueId o : g_[v].operands) values_.push_back(o);
    }
    std::sort(values_.begin(), values_.end());
    values_.erase(std::unique(values_.begin(), values_.end()), values_.end());
    done_at_.assign(nodes.size(), {});
    held_.assign(values_.size(), {});
    readers_.assign(values_.size(), {});
    for (std::size_t i = 0; i < values_.size(); ++i) {
      const ValueId x = values_[i];
      int last = slot_[x];
      std::vector<Spec>& held = held_[i];
      held = wants_[x];
      for (const auto& [u, pos] : uses_.users[x]) {
        if (slot_[u] < 0) continue;
        last = std::max(last, slot_[u]);
        const Cand& now = cand(u, pick_[u]);
        const auto k = static_cast<std::size_t>(pos);
        if (now.as_is[k] == kRead) {
          const auto it = std::find(held.begin(), held.end(), now.wants[k]);
          if (it != held.end()) held.erase(it);
        }
        readers_[i].emplace_back(u, pos);
      }
      done_at_[static_cast<std::size_t>(last)].push_back(i);
    }
    need_.assign(nodes.size(), -1);
    plain_.assign(nodes.size(), 0);
    for (std::size_t p = 0; p < nodes.size(); ++p) {
      for (const auto& [u, pos] : uses_.users[nodes[p]]) {
        if (slot_[u] >= 0) continue;
        const Cand& now = cand(u, pick_[u]);
        const int a = now.as_is[static_cast<std::size_t>(pos)];
        if (a >= 0) need_[p] = a;
        if (now.fallback && a == kRead) plain_[p] = 1;
      }
    }
    least_after_.assign(nodes.size() + 1, 0);
    for (std::size_t p = nodes.size(); p-- > 0;) {
      double least = kInfinite;
      for (const Cand& c : space_[nodes[p]].cands) least = std::min(least, c.compute.value);
      least_after_[p] = least_after_[p + 1] + least;
    }
  }

  void search(const std::vector<ValueId>& nodes, std::size_t p, double so_far) {
    if (++visits_ > kGroupVisits) return;
    if (p == nodes.size()) {
      if (so_far < best_ && !same_cost(so_far, best_)) {
        best_ = so_far;
        best_pick_.clear();
        for (const ValueId v : nodes) best_pick_.push_back(trial_pick_[v]);
      }
      return;
    }
    const ValueId v = nodes[p];
    const auto& cands = space_[v].cands;
    for (std::size_t ci = 0; ci < cands.size() && visits_ <= kGroupVisits; ++ci) {
      const Cand& c = cands[ci];
      // A fallback is no choice (Cand::fallback: a carry is taken whatever it costs); one that
      // is chosen now may stay.
      if ((c.fallback && static_cast<int>(ci) != pick_[v]) || !fits(p, v, c)) continue;
      trial_pick_[v] = static_cast<int>(ci);
      trial_state_[v] = c.state;
      double total = so_far + c.compute.value;
      for (const std::size_t i : done_at_[p]) total += reads_of(i);
      const double bound = total + least_after_[p + 1];
      if (bound < best_ && !same_cost(bound, best_)) search(nodes, p + 1, total);
    }
    trial_pick_[v] = pick_[v];
    trial_state_[v] = state_[v];
  }

  // Whether node v (at position p) can run candidate c: each read as it is meets its operand's
  // state (placed before it: operands are shallower), a fallback reads no pending sum, and
  // readers outside the group that take v as it is get the state they take.
  bool fits(std::size_t p, ValueId v, const Cand& c) const {
    for (std::size_t k = 0; k < c.as_is.size(); ++k) {
      const ValueId o = g_[v].operands[k];
      const int s = trial_state_[o];
      if (c.as_is[k] >= 0 && c.as_is[k] != s) return false;
      if (c.fallback && c.as_is[k] == kRead &&
          !space_[o].states[static_cast<std::size_t>(s)].pending.empty()) {
        return false;
      }
    }
    if (need_[p] >= 0 && c.state != need_[p]) return false;
    return plain_[p] == 0 || c.result.pending.empty();
  }

  // The cost of values_[i]'s reads under the trial assignment.
  double reads_of(std::size_t i) {
    const ValueId x = values_[i];
    std::vector<Spec>& w = scratch_;
    w.assign(held_[i].begin(), held_[i].end());
    for (const auto& [u, pos] : readers_[i]) {
      const Cand& c = cand(u, trial_pick_[u]);
      const auto k = static_cast<std::size_t>(pos);
      if (c.as_is[k] == kRead) w.push_back(c.wants[k]);
    }
    return reads_.cost(x, key(x, trial_state_[x]), w).value;
  }

  void apply(Group& gr) {
    std::vector<ValueId> changed;
    for (std::size_t p = 0; p < gr.nodes.size(); ++p) {
      const ValueId v = gr.nodes[p];
      const int c = gr.best[p];
      if (c == pick_[v]) continue;
      const Cand& from = cand(v, pick_[v]);
      const Cand& to = cand(v, c);
      for (std::size_t k = 0; k < to.as_is.size(); ++k) {
        std::vector<Spec>& w = wants_[g_[v].operands[k]];
        if (from.as_is[k] == kRead) w.erase(std::find(w.begin(), w.end(), from.wants[k]));
        if (to.as_is[k] == kRead) w.push_back(to.wants[k]);
      }
      known_[v] = 0;
      for (const ValueId o : g_[v].operands) known_[o] = 0;
      pick_[v] = trial_pick_[v] = c;
      state_[v] = trial_state_[v] = to.state;
      changed.push_back(v);
    }
    for (const ValueId v : changed) mark_[v] = 1;
    for (Group& other : groups_) {
      for (const ValueId u : other.footprint) {
        if (mark_[u] != 0) {
          other.stale = true;
          break;
        }
      }
    }
    for (const ValueId v : changed) mark_[v] = 0;
    gr.stale = true;
  }

  const Cand& cand(ValueId v, int c) const { return space_[v].cands[static_cast<std::size_t>(c)]; }
  StateKey key(ValueId v, int s) const { return space_[v].keys[static_cast<std::size_t>(s)]; }

  const Graph& g_;
  const ValueMap<Spec>& specs_;
  const GraphUses& uses_;
  const ValueMap<Space>& space_;
  ReadPricer& reads_;
  ValueMap<int>& pick_;
  ValueMap<int>& state_;
  ValueMap<std::vector<Spec>> wants_;  // by value: what the chosen readers read it in
  ValueMap<char> free_;                // two candidates or more
  ValueMap<int> depth_;                // the longest path from an input
  // By value: its free maker and readers (a reader per operand slot); 0: it couples none.
  ValueMap<std::size_t> members_;
  ValueMap<std::size_t> name_;         // numbering_free_names
  ValueMap<std::size_t> local_;        // local_names
  std::vector<Group> groups_;
  // One search's state: each node's place in the group (-1: outside), the trial assignment.
  ValueMap<int> slot_, trial_pick_, trial_state_;
  ValueMap<char> mark_;
  ValueMap<char> known_;  // current_reads
  ValueMap<double> now_;
  std::vector<ValueId> values_;
  std::vector<std::vector<std::size_t>> done_at_;  // by position: values_ whose reads are known
  std::vector<std::vector<Spec>> held_;            // by values_: wants of readers outside
  std::vector<std::vector<std::pair<ValueId, int>>> readers_;  // by values_: readers inside
  std::vector<int> need_;        // by position: the state readers outside take as it is, or -1
  std::vector<char> plain_;      // by position: a reader outside needs no pending sum
  std::vector<double> least_after_;
  double best_ = 0;
  std::vector<int> best_pick_;
  std::size_t visits_ = 0;
  std::vector<Spec> scratch_;
};

}  // namespace

bool improve_groups(const Graph& g, const ValueMap<Spec>& specs, const GraphUses& uses,
                    const ValueMap<Space>& space, ReadPricer& reads, ValueMap<int>& pick,
                    ValueMap<int>& state) {
  return Grouper(g, specs, uses, space, reads, pick, state).run();
}

}  // namespace shardplan::detail
