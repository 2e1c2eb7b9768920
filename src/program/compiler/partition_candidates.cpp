// The candidates of every node (partition_space.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

#include "partition_space.hpp"
#include "../ir/fields.hpp"
#include "../ir/primitive.hpp"
#include "../ir/primitives.hpp"

namespace shardplan::detail {

// NamedSharding::is_equivalent_to without building the shardings (called for every candidate
// against every state): the same axes per dimension once the axes of size 1 are left out.
bool equivalent(const Mesh& mesh, const PartitionSpec& a, const PartitionSpec& b, int rank) {
  const int dims = std::max({rank, a.size(), b.size()});
  static const AxisNames kNone;
  for (int d = 0; d < dims; ++d) {
    const AxisNames& x = d < a.size() ? a[d] : kNone;
    const AxisNames& y = d < b.size() ? b[d] : kNone;
    std::size_t i = 0, j = 0;
    while (true) {
      while (i < x.size() && mesh.axis_size(x[i]) == 1) ++i;
      while (j < y.size() && mesh.axis_size(y[j]) == 1) ++j;
      if (i == x.size() || j == y.size()) {
        if (i != x.size() || j != y.size()) return false;
        break;
      }
      if (x[i] != y[j]) return false;
      ++i;
      ++j;
    }
  }
  return true;
}

namespace {

// The elements of a block of `shape` split as `spec` (value_sharding's shard_shape: a padded
// input's block is ceil(n/k) rows).
std::int64_t block_numel(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape) {
  std::int64_t numel = 1;
  for (int d = 0; d < shape.rank(); ++d) {
    std::int64_t ways = 1;
    if (d < spec.size()) {
      for (const std::string& axis : spec[d]) ways *= mesh.axis_size(axis);
    }
    if (shape[d] % ways != 0) return value_sharding(mesh, spec, shape).shard_shape(shape).numel();
    numel *= shape[d] / ways;
  }
  return numel;
}

}  // namespace

Spec SpecTable::intern(const PartitionSpec& spec) {
  return intern(spec.dims().data(), spec.dims().size());
}

Spec SpecTable::intern_dims(const std::vector<AxisNames>& dims) {
  std::size_t n = dims.size();
  while (n > 0 && dims[n - 1].empty()) --n;  // as spec_of_dims
  return intern(dims.data(), n);
}

Spec SpecTable::intern(const AxisNames* dims, std::size_t n) {
  std::size_t h = n;
  for (std::size_t d = 0; d < n; ++d) h = hash_combine(h, hash_of(dims[d]));
  for (auto [it, end] = by_hash_.equal_range(h); it != end; ++it) {
    const std::vector<AxisNames>& have = it->second->spec.dims();
    if (have.size() == n && std::equal(have.begin(), have.end(), dims)) return Spec(it->second);
  }
  entries_.push_back({PartitionSpec(std::vector<AxisNames>(dims, dims + n)),
                      static_cast<int>(entries_.size())});
  by_hash_.emplace(h, &entries_.back());
  return Spec(&entries_.back());
}

GraphUses::GraphUses(const Graph& g)
    : users(g.size()),
      reads_of(g.size(), 0),
      is_output(g.size(), 0),
      pointwise_only(g.size(), 1),
      constant(g.size(), 0) {
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes[i];
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      users[n.operands[k]].emplace_back(value_id(i), static_cast<int>(k));
      ++reads_of[n.operands[k]];
    }
    // Values only pointwise nodes (or the gradient constraints that defer to them) read: a split
    // of them is gathered once, where a user needs the result whole. A value that an output, a
    // product or a user's constraint also reads will be made whole anyway; splitting its
    // pointwise users too would move it twice.
    bool c = n.op->cacheable;
    if (!n.is(prim::input) && !n.operands.empty()) {
      c = std::all_of(n.operands.begin(), n.operands.end(),
                      [&](ValueId o) { return constant[o] != 0; });
    }
    constant[value_id(i)] = c ? 1 : 0;
    if (n.op->pointwise && (!n.op->sharding_identity || is_gradient_constraint(n))) continue;
    for (const ValueId o : n.operands) pointwise_only[o] = 0;
  }
  for (const ValueId o : g.outputs) {
    ++reads_of[o];
    is_output[o] = 1;
    pointwise_only[o] = 0;
  }
}

namespace {

class CandidateBuilder {
 public:
  CandidateBuilder(const Graph& g, const Propagator& prop, const ValueMap<PartitionSpec>& specs,
                   const Mesh& mesh, const PartitionCost& model, const GraphUses& uses,
                   SpecTable& table)
      : g_(g),
        prop_(prop),
        specs_(specs),
        mesh_(mesh),
        model_(model),
        space_(g.size()),
        users_(uses.users),
        is_output_(uses.is_output),
        pointwise_only_(uses.pointwise_only),
        constant_(uses.constant),
        table_(table) {}

  ValueMap<Space> run() {
    build();
    return std::move(space_);
  }

 private:
  const Layout& state(ValueId v, int s) const {
    return space_[v].states[static_cast<std::size_t>(s)];
  }


  // Every node's candidates, in graph order (a candidate may depend on the layouts its operands
  // can be in), then a repetition's candidates in the shardings its one user reads it in.
  void build() {
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId id = value_id(i);
      std::vector<Cand> cands = candidates(id);
      // By strategy, equal ones in the order made (an insertion sort: a node has a handful of
      // candidates, and std::stable_sort allocates a buffer for them).
      for (std::size_t k = 1; k < cands.size(); ++k) {
        for (std::size_t j = k; j > 0 && cands[j].strategy < cands[j - 1].strategy; --j) {
          std::swap(cands[j], cands[j - 1]);
        }
      }
      for (Cand& c : cands) add(id, std::move(c));
    }
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId id = value_id(i);
      const Node& n = g_[id];
      if (n.op->repeat == nullptr || users_[id].size() != 1 || is_output_[id] != 0) continue;
      const auto [user, pos] = users_[id].front();
      std::vector<Spec> wanted;
      for (const Cand& c : space_[user].cands) {
        const auto k = static_cast<std::size_t>(pos);
        if (c.as_is[k] == kRead &&
            std::find(wanted.begin(), wanted.end(), c.wants[k]) == wanted.end()) {
          wanted.push_back(c.wants[k]);
        }
      }
      for (const Spec want : wanted) {
        if (auto c = made_for_user(id, *want)) add(id, std::move(*c));
      }
    }
  }

  // Adds a candidate unless an alike one is there; gives it its state.
  void add(ValueId id, Cand c) {
    Space& sp = space_[id];
    for (const Cand& o : sp.cands) {
      if (o.kind == c.kind && o.wants == c.wants && o.as_is == c.as_is &&
          o.result.spec == c.result.spec && o.result.pending == c.result.pending) {
        return;
      }
    }
    const int rank = g_[id].type.shape.rank();
    c.state = -1;
    for (std::size_t s = 0; s < sp.states.size(); ++s) {
      if (sp.states[s].pending == c.result.pending &&
          equivalent(mesh_, sp.states[s].spec, c.result.spec, rank)) {
        c.state = static_cast<int>(s);
        c.result.spec = sp.states[s].spec;
      }
    }
    if (c.state < 0) {
      c.state = static_cast<int>(sp.states.size());
      sp.states.push_back(Layout{c.result.spec, c.result.pending, {}});
    }
    const TensorType& t = g_[id].type;
    c.held = block_numel(mesh_, c.result.spec, t.shape) *
             static_cast<std::int64_t>(size_of(t.dtype));
    sp.cands.push_back(std::move(c));
  }

  std::vector<Cand> candidates(ValueId id) {
    const Node& n = g_[id];
    std::vector<Cand> out;
    if (n.is(prim::input)) {  // as it arrives (the propagation's pending sum of an input is it)
      Cand c{.strategy = Strategy::kFixed, .kind = Decision::Kind::kInput};
      c.result = {specs_[id], prop_.at(id).pending, {}};
      out.push_back(std::move(c));
      return out;
    }
    if (n.op->barrier) {  // taken as it is, in any layout its operand is in
      for (std::size_t s = 0; s < space_[n.operands[0]].states.size(); ++s) {
        out.push_back(as_is_alias(id, static_cast<int>(s), "taken as it is (optimization barrier)"));
      }
      return out;
    }
    if (n.op->fixed_layout != nullptr) {  // shard_map: the layouts the op fixes
      FixedLayout fl = n.op->fixed_layout(n);
      Cand c{.strategy = Strategy::kFixed, .kind = Decision::Kind::kKernel};
      for (const PartitionSpec& w : fl.operands) c.wants.push_back(table_.intern(w));
      c.as_is.assign(n.operands.size(), kRead);
      c.result = {std::move(fl.result), {}, {}};
      out.push_back(std::move(c));
      return out;
    }
    if (n.op->sharding_identity) {
      Cand c = evaluate(id, assign(id, false), Strategy::kFixed);
      c.kind = Decision::Kind::kAlias;
      out.push_back(std::move(c));
      // A gradient's constraint may leave its sum pending for its users (reduced where they
      // read it); a sum a convert_pending carried is reduced here, in the dtype it asked for.
      const ValueId from = n.operands[0];
      if (is_gradient_constraint(n) && !linearity_of(g_, g_[from]).carry) {
        for (std::size_t s = 0; s < space_[from].states.size(); ++s) {
          if (space_[from].states[s].pending.empty()) continue;
          out.push_back(as_is_alias(id, static_cast<int>(s),
                                    "a gradient's sharding; its sum is kept pending for its users"));
        }
      }
      return out;
    }
    kernel_candidates(id, out);
    return out;
  }

  Cand as_is_alias(ValueId id, int s, std::string why) const {
    const ValueId o = g_[id].operands[0];
    const Layout& in = state(o, s);
    Cand c{.strategy = Strategy::kFixed, .why = std::move(why), .kind = Decision::Kind::kAlias};
    c.wants = {table_.intern(in.spec)};
    c.as_is = {s};
    c.result = {in.spec, in.pending, {}};
    return c;
  }

  // A kernel node's candidates: the factors' axes as propagated, the pass factors first; the
  // reduce factors first, taking all the contested axes or any subset of them; split like a
  // pending or split operand (a pointwise node); a pending sum carried through (a linear op).
  void kernel_candidates(ValueId id, std::vector<Cand>& out) {
    const Node& n = g_[id];
    const OpFactors& f = prop_.factors(id);
    const FactorAxes base = assign(id, false);
    out.push_back(evaluate(id, base, Strategy::kPassFirst));
    if (std::find(f.kinds.begin(), f.kinds.end(), FactorKind::kReduce) != f.kinds.end()) {
      Cand c = evaluate(id, assign(id, true), Strategy::kReduceFirst);
      c.why = "its reduce factors took the axes first";
      out.push_back(std::move(c));
      // Axis by axis: some to the reduce factors, the others to the pass factors (a weight
      // gradient reduced over the batch axis but split over the tensor axis like its parameter,
      // its cotangent gathered along the sequence: Megatron's backward under sequence
      // parallelism). Every subset: a mesh has few axes.
      const std::vector<std::string> contested = contested_axes(id);
      for (std::size_t mask = 1; mask + 1 < (std::size_t{1} << contested.size()); ++mask) {
        std::set<std::string> first;
        for (std::size_t i = 0; i < contested.size(); ++i) {
          if ((mask >> i) & 1u) first.insert(contested[i]);
        }
        Cand m = evaluate(id, assign(id, true, &first), Strategy::kReduceFirst);
        m.why = fmt::format("its reduce factors took {} first", fmt::join(first, ", "));
        out.push_back(std::move(m));
      }
    }
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      const Node& on = g_[n.operands[k]];
      if (on.is(prim::sharding_constraint) && on.attr<ConstraintAttrs>().readers_keep) {
        Cand c = evaluate(id, assign(id, false, nullptr, k), Strategy::kPassFirst);
        c.why = fmt::format("its factors split as operand {} is (read as it is)", k);
        out.push_back(std::move(c));
      }
    }
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      const ValueId o = n.operands[k];
      if (pointwise_only_[o] == 0) continue;
      for (const Layout& os : space_[o].states) {
        if (auto axes = split_pointwise(id, base, os)) {
          Cand c = evaluate(id, *axes, Strategy::kSplitLike);
          c.why = "split like its pending or split operand (1/n of the work)";
          out.push_back(std::move(c));
        }
      }
    }
    const std::size_t carried_from = out.size();
    const Linearity lin = linearity_of(g_, n);
    carry_candidates(id, lin, out);
    if (lin.carry && out.size() > carried_from) {
      // Carried whenever it can be (convert_pending): the others read reduced operands only.
      for (std::size_t i = 0; i < carried_from; ++i) out[i].fallback = true;
    }
  }

  // The mesh axes `id`'s operands (as propagated) split its reduce factors over, each once, in
  // order of first appearance.
  std::vector<std::string> reduce_axes(ValueId id) const {
    const Node& n = g_[id];
    const OpFactors& f = prop_.factors(id);
    std::vector<std::string> axes;
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      const auto& odims = prop_.at(n.operands[k]).dims;
      for (std::size_t d = 0; d < f.operands[k].size() && d < odims.size(); ++d) {
        const int fac = f.operands[k][d];
        if (fac < 0 || f.kind(fac) != FactorKind::kReduce) continue;
        for (const auto& a : odims[d]) {
          if (std::find(axes.begin(), axes.end(), a) == axes.end()) axes.push_back(a);
        }
      }
    }
    return axes;
  }

  // The mesh axes both a pass factor (in the propagated result) and a reduce factor (in an
  // operand) of `id` would take.
  std::vector<std::string> contested_axes(ValueId id) const {
    const OpFactors& f = prop_.factors(id);
    std::set<std::string> pass, reduce;
    const auto& rdims = prop_.at(id).dims;
    for (std::size_t d = 0; d < f.result.size() && d < rdims.size(); ++d) {
      if (f.result[d] >= 0) pass.insert(rdims[d].begin(), rdims[d].end());
    }
    for (const std::string& a : reduce_axes(id)) reduce.insert(a);
    std::vector<std::string> both;
    std::set_intersection(pass.begin(), pass.end(), reduce.begin(), reduce.end(),
                          std::back_inserter(both));
    return both;
  }

  // Axes per factor. Pass factors take the result's sharding and reduce factors the operands'
  // (first sharded dimension), an axis going to one factor only; `reduce_first` says which of
  // the two claims an axis they both want. `only`: with reduce_first, the reduce factors take
  // first only dimensions split over these axes alone; the pass factors then take theirs, then
  // the reduce factors the rest.
  FactorAxes assign(ValueId id, bool reduce_first, const std::set<std::string>* only = nullptr,
                    std::optional<std::size_t> kept_operand = std::nullopt) const {
    const Node& n = g_[id];
    const OpFactors& f = prop_.factors(id);
    const auto& rdims = prop_.at(id).dims;
    FactorAxes axes(f.count());
    // The axes taken (a mesh has few: a list searched beats a tree of strings).
    std::vector<std::string> used;
    const auto is_used = [&](const std::string& a) {
      return std::find(used.begin(), used.end(), a) != used.end();
    };
    auto take_pass = [&] {
      for (std::size_t d = 0; d < f.result.size(); ++d) {
        const int fac = f.result[d];
        if (fac < 0 || f.kind(fac) != FactorKind::kPass) continue;
        if (!axes[fac].empty()) continue;
        AxisNames kept;
        for (const auto& a : rdims[d]) {
          if (is_used(a)) break;  // a major-to-minor prefix only
          kept.push_back(a);
        }
        used.insert(used.end(), kept.begin(), kept.end());
        axes[fac] = std::move(kept);
      }
    };
    auto take_reduce = [&](const std::set<std::string>* among) {
      for (std::size_t k = 0; k < n.operands.size(); ++k) {
        const auto& odims = prop_.at(n.operands[k]).dims;
        for (std::size_t d = 0; d < f.operands[k].size(); ++d) {
          const int fac = f.operands[k][d];
          if (fac < 0 || f.kind(fac) != FactorKind::kReduce) continue;
          if (!axes[fac].empty() || odims[d].empty()) continue;
          if (among != nullptr && std::any_of(odims[d].begin(), odims[d].end(), [&](const auto& a) {
                return among->count(a) == 0;
              })) {
            continue;
          }
          const bool free = std::none_of(odims[d].begin(), odims[d].end(),
                                         [&](const auto& a) { return is_used(a); });
          if (!free || f.size(fac) % product(mesh_, odims[d]) != 0) continue;
          axes[fac] = odims[d];
          used.insert(used.end(), odims[d].begin(), odims[d].end());
        }
      }
    };
    // An operand its readers read as it is (ConstraintAttrs::readers_keep): its dimensions'
    // axes first, whatever their factors' kind.
    if (kept_operand) {
      const auto& odims = prop_.at(n.operands[*kept_operand]).dims;
      const auto& facs = f.operands[*kept_operand];
      for (std::size_t d = 0; d < facs.size() && d < odims.size(); ++d) {
        const int fac = facs[d];
        if (fac < 0 || !axes[fac].empty() || odims[d].empty()) continue;
        if (std::any_of(odims[d].begin(), odims[d].end(), is_used)) continue;
        axes[fac] = odims[d];
        used.insert(used.end(), odims[d].begin(), odims[d].end());
      }
    }
    if (reduce_first) {
      take_reduce(only);
      take_pass();
      take_reduce(nullptr);
    } else {
      take_pass();
      take_reduce(nullptr);
    }
    return axes;
  }

  // A pending sum carried through a node linear in its pending operands (Primitive::linearity):
  // the devices apply the op to their summands, the operands are read as they are, and the
  // result is pending over their axes (and over the node's own reduce factors). One candidate per
  // pending layout an operand can be in, where the operands' layouts are the factors' (a pending
  // sum is not moved).
  void carry_candidates(ValueId id, const Linearity& lin, std::vector<Cand>& out) {
    const Node& n = g_[id];
    if (n.op->partial != ReduceOp::kSum || lin.kind == Linearity::Kind::kNone) return;
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      if (!lin.covers(k)) continue;
      const Space& ks = space_[n.operands[k]];
      for (const Layout& S : ks.states) {
        if (S.pending.empty()) continue;
        if (auto c = carry(id, lin, S)) out.push_back(std::move(*c));
      }
    }
  }

  std::optional<Cand> carry(ValueId id, const Linearity& lin, const Layout& S) {
    const Node& n = g_[id];
    std::vector<Pending> in(n.operands.size());
    std::vector<int> as_is(n.operands.size(), kRead);
    std::size_t first = n.operands.size();
    for (std::size_t q = 0; q < n.operands.size(); ++q) {
      if (!lin.covers(q)) continue;
      const Space& qs = space_[n.operands[q]];
      for (std::size_t s = 0; s < qs.states.size(); ++s) {
        if (qs.states[s].pending == S.pending && qs.states[s].spec == S.spec) {
          in[q] = S.pending;
          as_is[q] = static_cast<int>(s);
          first = std::min(first, q);
        }
      }
    }
    const std::optional<Pending> carried = carried_pending(lin, in);
    if (!carried || first == n.operands.size()) return std::nullopt;
    const OpFactors& f = prop_.factors(id);
    FactorAxes axes(f.count());
    for (int d = 0; d < S.spec.size(); ++d) {  // (past its end, nothing is split)
      if (S.spec[d].empty()) continue;
      const int fac = f.operands[first][static_cast<std::size_t>(d)];
      if (fac < 0 || f.kind(fac) == FactorKind::kReplicate) return std::nullopt;
      axes[fac] = S.spec[d];
    }
    Cand c = evaluate(id, axes, Strategy::kCarry, &*carried, std::move(as_is));
    for (std::size_t q = 0; q < n.operands.size(); ++q) {
      if (c.as_is[q] >= 0 && !equivalent(mesh_, *c.wants[q], S.spec,
                                         g_[n.operands[q]].type.shape.rank())) {
        return std::nullopt;
      }
    }
    c.why = "a pending sum carried through a linear op";
    return c;
  }

  // The split XLA makes of an all-reduce followed by elementwise work: a pointwise node whose
  // propagated result is whole over mesh axes on which an operand is a pending sum (a gradient
  // summed over the batch axis) or is already split runs split over them instead (the pending
  // operand reduce-scattered rather than all-reduced, the others sliced locally, 1/n of the
  // work; the result gathered only where a user needs it whole). The factor axes of that split
  // for an operand in layout `os`, or nothing.
  std::optional<FactorAxes> split_pointwise(ValueId id, const FactorAxes& base,
                                            const Layout& os) const {
    const Node& n = g_[id];
    const OpFactors& f = prop_.factors(id);
    if (n.op->sharding_identity || constant_[id] != 0 || n.operands.empty()) return std::nullopt;
    if (std::any_of(f.kinds.begin(), f.kinds.end(),
                    [](FactorKind k) { return k != FactorKind::kPass; })) {
      return std::nullopt;
    }
    const Shape& shape = n.type.shape;
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      // Same shape, dimension by dimension on the result's factors: a pointwise node.
      if (!(g_[n.operands[k]].type.shape == shape) || f.operands[k] != f.result) {
        return std::nullopt;
      }
    }
    // The axes taken are base's and the split's own: searched where they are (a mesh has few),
    // and base copied only once the split changes it (most operands split nothing further).
    std::optional<FactorAxes> axes;
    const auto current = [&]() -> const FactorAxes& { return axes ? *axes : base; };
    const auto used = [&](const std::string& a) {
      const FactorAxes& now = current();
      for (int fac = 0; fac < f.count(); ++fac) {
        if (std::find(now[fac].begin(), now[fac].end(), a) != now[fac].end()) return true;
      }
      return false;
    };
    const auto free = [&](const AxisNames& on) {
      return !on.empty() && std::none_of(on.begin(), on.end(), used);
    };
    const auto take = [&](int fac, const AxisNames& on) {
      if (!axes) axes = base;
      (*axes)[fac] = on;
    };
    if (!os.pending.empty()) {
      // Split the first (most major) dimension that is whole and divides.
      if (!free(os.pending.axes)) return std::nullopt;
      for (int d = 0; d < shape.rank(); ++d) {
        const int fac = f.result[static_cast<std::size_t>(d)];
        if (!base[fac].empty() || shape[d] % product(mesh_, os.pending.axes) != 0) continue;
        take(fac, os.pending.axes);
        break;
      }
    } else {
      for (int d = 0; d < shape.rank(); ++d) {
        const AxisNames& on = os.spec[d];  // empty past the spec's end
        const int fac = f.result[static_cast<std::size_t>(d)];
        if (!current()[fac].empty() || !free(on)) continue;
        take(fac, on);
      }
    }
    return axes;  // nothing when it splits nothing further
  }

  // A repetition (a scalar or bias broadcast) with one user, made in a sharding that user reads
  // it in rather than made whole and then sliced.
  std::optional<Cand> made_for_user(ValueId o, const PartitionSpec& want) {
    const Node& rn = g_[o];
    const OpFactors& f = prop_.factors(o);
    FactorAxes axes(f.count());
    const int dims = std::max(rn.type.shape.rank(), want.size());
    for (int d = 0; d < dims; ++d) {
      const int fac = f.result[static_cast<std::size_t>(d)];
      if (fac < 0 || f.kind(fac) != FactorKind::kPass) return std::nullopt;
      axes[fac] = want[d];  // empty past the spec's end
    }
    Cand c = evaluate(o, axes, Strategy::kMadeForUser);
    if (!c.result.pending.empty() ||
        !equivalent(mesh_, c.result.spec, want, rn.type.shape.rank())) {
      return std::nullopt;
    }
    c.why = "made in its one user's sharding";
    return c;
  }

  // What running node `id` with these factor axes asks of its operands and gives its result.
  // Operands with a state in `as_is` are read as they are and `carried`, their pending sum,
  // stays pending in the result.
  Cand evaluate(ValueId id, const FactorAxes& axes, Strategy strategy,
                const Pending* carried = nullptr, std::vector<int> as_is = {}) {
    const Node& n = g_[id];
    const OpFactors& f = prop_.factors(id);
    Cand c{.strategy = strategy};
    c.as_is = as_is.empty() ? std::vector<int>(n.operands.size(), kRead) : std::move(as_is);
    // Held operands (keep_alive) are read as they are.
    if (n.op->holds_operands) std::fill(c.as_is.begin() + 1, c.as_is.end(), kAnyState);
    // A dimension takes its factor's axes when they split both: a reshape's compound dimension
    // is larger than the factor it shares, and splitting it further than the factor is not a
    // split of the factor (its blocks would not be the operand's).
    std::vector<std::int64_t>& fac_ways = fac_ways_;  // the devices each factor is split over
    fac_ways.resize(static_cast<std::size_t>(f.count()));
    for (int fac = 0; fac < f.count(); ++fac) {
      fac_ways[static_cast<std::size_t>(fac)] =
          std::max<std::int64_t>(1, product(mesh_, axes[fac]));
    }
    // A pointwise node whose operands have its shape (or a per-element one beside scalars) takes
    // a padded split (takes_padded).
    const bool pads = takes_padded(g_, n);
    auto fits = [&](std::int64_t size, int fac) {
      if (fac < 0) return false;
      const std::int64_t ways = fac_ways[static_cast<std::size_t>(fac)];
      return pads || (size % ways == 0 && f.size(fac) % ways == 0);
    };
    // Each operand's dims, then the result's, in one scratch (its lists keep their memory).
    std::vector<AxisNames>& dims = dims_;
    const auto spec_of = [&](const Shape& shape, const std::vector<int>& factors) {
      dims.resize(static_cast<std::size_t>(shape.rank()));
      for (std::size_t d = 0; d < dims.size(); ++d) {
        dims[d].clear();
        const int fac = factors[d];
        if (fits(shape[static_cast<int>(d)], fac)) {
          dims[d].assign(axes[fac].begin(), axes[fac].end());
        }
      }
      return table_.intern_dims(dims);
    };
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      c.wants.push_back(spec_of(g_[n.operands[k]].type.shape, f.operands[k]));
    }
    c.result.spec = *spec_of(n.type.shape, f.result);
    c.result.pending = carried != nullptr ? *carried : Pending{n.op->partial, {}};
    std::int64_t ways = 1;
    for (int fac = 0; fac < f.count(); ++fac) {
      ways *= fac_ways[static_cast<std::size_t>(fac)];
      if (f.kind(fac) == FactorKind::kReduce) {
        c.result.pending.axes.insert(c.result.pending.axes.end(), axes[fac].begin(),
                                     axes[fac].end());
      }
    }
    c.work = 1.0 / static_cast<double>(ways);
    if (model_.timed()) {
      c.compute = model_.compute(n.op->flops(n, operand_shapes(g_, n), n.type.shape) * c.work);
    }
    return c;
  }

  const Graph& g_;
  const Propagator& prop_;
  const ValueMap<PartitionSpec>& specs_;
  const Mesh& mesh_;
  const PartitionCost& model_;
  ValueMap<Space> space_;
  const ValueMap<std::vector<std::pair<ValueId, int>>>& users_;
  const ValueMap<char>& is_output_;
  const ValueMap<char>& pointwise_only_;
  const ValueMap<char>& constant_;
  SpecTable& table_;
  std::vector<AxisNames> dims_;         // evaluate's scratch
  std::vector<std::int64_t> fac_ways_;  // evaluate's scratch
};

}  // namespace

ValueMap<Space> build_candidates(const Graph& g, const Propagator& prop,
                                 const ValueMap<PartitionSpec>& specs, const Mesh& mesh,
                                 const PartitionCost& model, const GraphUses& uses,
                                 SpecTable& table) {
  return CandidateBuilder(g, prop, specs, mesh, model, uses, table).run();
}

void read_pieces(const Graph& g, const ValueMap<PartitionSpec>& specs, const ValueMap<Space>& space,
                 CandidateSpace& out,
                 const std::function<Cost(ValueId, const Layout&, const PartitionSpec&)>& reshard) {
  const auto index_of = [&](ValueId v, const PartitionSpec& w) {
    std::vector<PartitionSpec>& list = out.nodes[v].wanted;
    const auto it = std::find(list.begin(), list.end(), w);
    if (it != list.end()) return static_cast<int>(it - list.begin());
    list.push_back(w);
    return static_cast<int>(list.size()) - 1;
  };
  for (const ValueId o : g.outputs) out.nodes[o].output = index_of(o, specs[o]);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const ValueId v = value_id(i);
    for (std::size_t c = 0; c < space[v].cands.size(); ++c) {
      const Cand& cand = space[v].cands[c];
      for (std::size_t k = 0; k < cand.as_is.size(); ++k) {
        if (cand.as_is[k] != kRead) continue;
        out.nodes[v].candidates[c].wanted[k] = index_of(g[v].operands[k], *cand.wants[k]);
      }
    }
  }
  for (std::size_t i = 0; i < g.size(); ++i) {
    const ValueId v = value_id(i);
    CandidateSpace::NodeSpace& ns = out.nodes[v];
    const bool pending = std::any_of(ns.states.begin(), ns.states.end(),
                                     [](const Layout& l) { return !l.pending.empty(); });
    for (const PartitionSpec& w : ns.wanted) {
      auto& row = ns.from_state.emplace_back();
      for (const Layout& s : ns.states) row.push_back(reshard(v, s, w).value);
      if (!pending) continue;
      auto& copies = ns.from_copy.emplace_back();
      for (const PartitionSpec& r : ns.wanted) {
        copies.push_back(r == w ? kInfinite : reshard(v, Layout{r, {}, {}}, w).value);
      }
    }
  }
}

}  // namespace shardplan::detail
