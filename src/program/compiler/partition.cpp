// The partitioner (partition.hpp) in its three phases: Chooser decides every node, Emitter emits
// the decided steps once, and `keep_read` drops what nothing reads and counts what is left.
#include "partition.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "../ir/fields.hpp"
#include "../ir/primitive.hpp"
#include "../ir/primitives.hpp"
#include "reshard_cost.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

bool equivalent(const Mesh& mesh, const PartitionSpec& a, const PartitionSpec& b, int rank) {
  return NamedSharding(mesh, a).is_equivalent_to(NamedSharding(mesh, b), rank);
}

// Mesh axes per factor of a node.
class FactorAxes {
 public:
  explicit FactorAxes(int factors = 0) : axes_(static_cast<std::size_t>(factors)) {}
  AxisNames& operator[](int factor) { return axes_[static_cast<std::size_t>(factor)]; }
  const AxisNames& operator[](int factor) const { return axes_[static_cast<std::size_t>(factor)]; }

 private:
  std::vector<AxisNames> axes_;
};

// One way to run a node: the axes of each factor, the sharding each operand is read in (or the
// operand as it is, pending sum kept: a linear flow), the result's sharding and pending state,
// and the bytes of the reshards that needs (the operands', then the result's to its propagated
// sharding).
struct Choice {
  FactorAxes axes;
  std::vector<PartitionSpec> wants;  // per operand
  std::vector<char> as_is;           // per operand
  std::vector<AxisNames> out_dims;
  Pending pend;
  std::int64_t cost = 0;          // all reshards
  std::int64_t operand_cost = 0;  // the operands' reshards only
  std::string why;
};

// What the emitter does for a node.
struct Decision {
  enum class Kind {
    kInput,   // bound to an input slot
    kKernel,  // operands brought to `wants` (or taken as they are), then a kernel step
    kAlias,   // no step: the value is its one operand's, brought to wants[0] or as it is
  };
  Kind kind = Kind::kKernel;
  std::vector<PartitionSpec> wants;
  std::vector<char> as_is;
  Layout result;
};

// ---- Phase 1: choose -------------------------------------------------------------------------

class Chooser {
 public:
  Chooser(const Graph& g, const Propagator& prop, const ValueMap<PartitionSpec>& specs,
          const CompileSpec& spec)
      : g_(g),
        prop_(prop),
        specs_(specs),
        mesh_(spec.mesh),
        dec_(g.size()),
        decided_(g.size(), 0),
        users_(g.size()),
        is_output_(g.size(), 0),
        pointwise_only_(g.size(), 1) {
    for (std::size_t i = 0; i < g.size(); ++i) {
      const Node& n = g.nodes[i];
      for (std::size_t k = 0; k < n.operands.size(); ++k) {
        users_[n.operands[k]].emplace_back(value_id(i), static_cast<int>(k));
      }
      // Values only pointwise nodes (or the gradient constraints that defer to them) read: a
      // split of them is gathered once, where a user needs the result whole. A value that an
      // output, a product or a user's constraint also reads will be made whole anyway; splitting
      // its pointwise users too would move it twice.
      if (n.op->pointwise && (!n.op->sharding_identity || is_gradient_constraint(n))) continue;
      for (const ValueId o : n.operands) pointwise_only_[o] = 0;
    }
    for (const ValueId o : g.outputs) {
      is_output_[o] = 1;
      pointwise_only_[o] = 0;
    }
    mark_constants();
  }

  ValueMap<Decision> run() {
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId id = value_id(i);
      dec_[id] = decide(id);
      decided_[id] = 1;
    }
    return std::move(dec_);
  }

  const ValueMap<char>& constants() const { return constant_; }

 private:
  const Layout& layout(ValueId v) const { return dec_[v].result; }

  // Values that depend on no input: cacheable sources and what is computed from them only.
  void mark_constants() {
    constant_ = ValueMap<char>(g_.size(), 0);
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const Node& n = g_.nodes[i];
      bool c = n.op->cacheable;
      if (!n.is(prim::input) && !n.operands.empty()) {
        c = std::all_of(n.operands.begin(), n.operands.end(),
                        [&](ValueId o) { return constant_[o] != 0; });
      }
      constant_[value_id(i)] = c ? 1 : 0;
    }
  }

  Decision decide(ValueId id) {
    const Node& n = g_[id];
    if (n.is(prim::input)) {  // as it arrives (the propagation's pending sum of an input is it)
      return Decision{.kind = Decision::Kind::kInput,
                      .result = {specs_[id], prop_.at(id).pending, {}}};
    }
    if (n.op->barrier) {
      return as_is_alias(id, "taken as it is (optimization barrier)");
    }
    if (n.op->fixed_layout != nullptr) {  // shard_map: the layouts the op fixes
      FixedLayout fl = n.op->fixed_layout(n);
      return Decision{.kind = Decision::Kind::kKernel,
                      .wants = std::move(fl.operands),
                      .as_is = std::vector<char>(n.operands.size(), 0),
                      .result = {std::move(fl.result), {}, {}}};
    }
    if (n.op->sharding_identity) {
      // A sum a convert_pending carried is reduced here, at the gradient's sharding, in its
      // dtype (FSDP2 reduce-scatters each gradient as soon as it is complete).
      const ValueId from = n.operands[0];
      if (is_gradient_constraint(n) && !layout(from).pending.empty() &&
          !linearity_of(g_, g_[from]).carry) {
        return as_is_alias(id, "a gradient's sharding; its sum is kept pending for its users");
      }
      Choice c = evaluate(id, assign(id, false));
      return Decision{.kind = Decision::Kind::kAlias,
                      .wants = std::move(c.wants),
                      .as_is = {0},
                      .result = {spec_of_dims(std::move(c.out_dims)), {}, {}}};
    }
    Choice best = choose(id);
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      if (best.as_is[k] == 0) remake_repeat(n.operands[k], best.wants[k]);
    }
    return Decision{.kind = Decision::Kind::kKernel,
                    .wants = std::move(best.wants),
                    .as_is = std::move(best.as_is),
                    .result = {spec_of_dims(std::move(best.out_dims)), std::move(best.pend),
                               std::move(best.why)}};
  }

  Decision as_is_alias(ValueId id, std::string why) const {
    const Layout& in = layout(g_[id].operands[0]);
    return Decision{.kind = Decision::Kind::kAlias,
                    .wants = {in.spec},
                    .as_is = {1},
                    .result = {in.spec, in.pending, std::move(why)}};
  }

  // The cheapest way to run a kernel node: the factors' axes as propagated (pass factors first,
  // or reduce factors first), split like a pending or split operand (split_pointwise), or a
  // pending sum carried through (linear_choice).
  Choice choose(ValueId id) const {
    const OpFactors& f = prop_.factors(id);
    Choice best = evaluate(id, assign(id, false));
    if (std::find(f.kinds.begin(), f.kinds.end(), FactorKind::kReduce) != f.kinds.end()) {
      Choice other = evaluate(id, assign(id, true));
      if (other.cost < best.cost) {
        best = std::move(other);
        best.why = "its reduce factors took the axes first (fewer bytes)";
      }
      // Axis by axis: some to the reduce factors, the others to the pass factors (a weight
      // gradient reduced over the batch axis but split over the tensor axis like its
      // parameter, its cotangent gathered along the sequence: Megatron's backward under
      // sequence parallelism).
      const std::vector<std::string> contested = contested_axes(id);
      if (contested.size() >= 2 && contested.size() <= 4) {
        for (unsigned mask = 1; mask + 1 < (1u << contested.size()); ++mask) {
          std::set<std::string> first;
          for (std::size_t i = 0; i < contested.size(); ++i) {
            if ((mask >> i) & 1u) first.insert(contested[i]);
          }
          Choice mixed = evaluate(id, assign(id, true, &first));
          if (mixed.cost < best.cost) {
            best = std::move(mixed);
            best.why = fmt::format("its reduce factors took {} first (fewer bytes)",
                                   fmt::join(first, ", "));
          }
        }
      }
    }
    if (auto axes = split_pointwise(id, best.axes)) {
      Choice s = evaluate(id, std::move(*axes));
      if (s.cost <= best.cost) {
        best = std::move(s);
        best.why = "split like its pending or split operand (1/n of the work)";
      }
    }
    if (auto lin = linear_choice(id)) {
      // Otherwise a tie goes to reducing now, which is no dearer and keeps less: a pending value is
      // whole-sized on every device of its sum, a reduced one may be split (a weight's gradient
      // reduce-scattered to its shard), and a split pointwise node does 1/n of the work. When a
      // user adds it to another pending sum, the result's reduction is that sum's (paid once there,
      // whatever this node does), so only the operands' reshards count here.
      const bool merged = flows_on(id, lin->pend);
      const bool forced = linearity_of(g_, g_[id]).carry;
      if (forced || lin->cost < best.cost || (merged && lin->operand_cost <= best.cost)) {
        best = std::move(*lin);
      }
    }
    return best;
  }

  // Axes per factor. Pass factors take the result's sharding and reduce factors the operands'
  // (first sharded dimension), an axis going to one factor only; `reduce_first` says which of
  // the two claims an axis they both want.
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

  // `only`: with reduce_first, the reduce factors take first only dimensions split over these
  // axes alone; the pass factors then take theirs, then the reduce factors the rest.
  FactorAxes assign(ValueId id, bool reduce_first,
                    const std::set<std::string>* only = nullptr) const {
    const Node& n = g_[id];
    const OpFactors& f = prop_.factors(id);
    const auto& rdims = prop_.at(id).dims;
    FactorAxes axes(f.count());
    std::set<std::string> used;
    auto take_pass = [&] {
      for (std::size_t d = 0; d < f.result.size(); ++d) {
        const int fac = f.result[d];
        if (fac < 0 || f.kind(fac) != FactorKind::kPass) continue;
        if (!axes[fac].empty()) continue;
        AxisNames kept;
        for (const auto& a : rdims[d]) {
          if (used.count(a)) break;  // a major-to-minor prefix only
          kept.push_back(a);
        }
        axes[fac] = kept;
        used.insert(kept.begin(), kept.end());
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
                                         [&](const auto& a) { return used.count(a) > 0; });
          if (!free || f.size(fac) % product(mesh_, odims[d]) != 0) continue;
          axes[fac] = odims[d];
          used.insert(odims[d].begin(), odims[d].end());
        }
      }
    };
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
  // result is pending over their axes (and over the node's own reduce factors). Only where the
  // operands' layouts are the factors' (a pending sum is not moved).
  std::optional<Choice> linear_choice(ValueId id) const {
    const Node& n = g_[id];
    const Linearity lin = linearity_of(g_, n);
    std::vector<Pending> in;
    for (const ValueId o : n.operands) in.push_back(layout(o).pending);
    const std::optional<Pending> carried_sum = carried_pending(lin, in);
    if (!carried_sum || n.op->partial != ReduceOp::kSum) return std::nullopt;
    const Pending* carried = &*carried_sum;
    std::vector<char> pending(n.operands.size(), 0);
    const PartitionSpec* pending_spec = nullptr;
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      if (in[k].empty()) continue;
      // Pending alike: the same blocks too (a pending sum is not moved).
      if (pending_spec != nullptr && !(layout(n.operands[k]).spec == *pending_spec)) {
        return std::nullopt;
      }
      pending_spec = &layout(n.operands[k]).spec;
      pending[k] = 1;
    }
    const std::size_t first =
        static_cast<std::size_t>(std::find(pending.begin(), pending.end(), 1) - pending.begin());
    const OpFactors& f = prop_.factors(id);
    FactorAxes axes(f.count());
    const auto dims =
        padded(layout(n.operands[first]).spec, g_[n.operands[first]].type.shape.rank());
    for (std::size_t d = 0; d < dims.size(); ++d) {
      if (dims[d].empty()) continue;
      const int fac = f.operands[first][d];
      if (fac < 0 || f.kind(fac) == FactorKind::kReplicate) return std::nullopt;
      axes[fac] = dims[d];
    }
    Choice c = evaluate(id, std::move(axes), carried, pending);
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      if (pending[k] != 0 && !equivalent(mesh_, c.wants[k], layout(n.operands[k]).spec,
                                         g_[n.operands[k]].type.shape.rank())) {
        return std::nullopt;
      }
    }
    c.why = "a pending sum carried through a linear op";
    return c;
  }

  // The sum a value not decided yet can be left pending over: a node with reduce factors, its
  // reduce factors taking the axes its operands are split over (what `assign(id, true)` gives
  // them), or a unary op carrying its operand's; else the propagation's estimate.
  Pending can_pend(ValueId id, int depth = 0) const {
    const Node& n = g_[id];
    if (decided_[id] != 0) return layout(id).pending;
    const OpFactors& f = prop_.factors(id);
    if (std::find(f.kinds.begin(), f.kinds.end(), FactorKind::kReduce) != f.kinds.end()) {
      return Pending{n.op->partial, reduce_axes(id)};
    }
    if (n.operands.size() == 1 && depth < 8 && linearity_of(g_, n).covers(0)) {
      return can_pend(n.operands[0], depth + 1);
    }
    return prop_.at(id).pending;
  }

  // Whether a user of `id` would add its pending sum `pend` to another one: a node jointly linear
  // in it and in another operand pending alike (the others whole), directly or through users that
  // carry it on alone (a reshape, a product with a whole value); or would carry it whatever it
  // costs (Linearity::carry).
  bool flows_on(ValueId id, const Pending& pend, int depth = 0) const {
    for (const auto& [user, pos] : users_[id]) {
      const Node& u = g_[user];
      // A gradient's constraint keeps the sum pending for its users (decide()'s as_is_alias).
      if (is_gradient_constraint(u)) {
        if (depth < 8 && flows_on(user, pend, depth + 1)) return true;
        continue;
      }
      const Linearity lin = linearity_of(g_, u);
      if (!lin.covers(static_cast<std::size_t>(pos))) continue;
      bool fits = true;
      bool merges = false;
      for (std::size_t q = 0; q < u.operands.size() && fits; ++q) {
        if (static_cast<int>(q) == pos) continue;
        const ValueId o = u.operands[q];
        if (o == id) {  // x * x is not linear in x; x + x carries it
          fits = lin.kind == Linearity::Kind::kJointly && lin.covers(q);
          continue;
        }
        // A value not decided yet: the propagation's estimate of its pending sum.
        const Pending& op = decided_[o] != 0 ? layout(o).pending : prop_.at(o).pending;
        if (lin.kind == Linearity::Kind::kJointly && lin.covers(q)) {
          // ... or the sum it can be left pending over, when it is decided (a weight gradient's
          // product, which the propagation split where it may as well be left pending).
          fits = op == pend || (decided_[o] == 0 && can_pend(o) == pend);
          merges = true;
        } else {
          fits = op.empty();
        }
      }
      if (!fits) continue;
      // A user that carries the sum whatever it costs (convert_pending) reduces it after itself.
      if (merges || lin.carry) return true;
      // Carried on alone by a unary op (a neg, a reshape): one of its users may merge it. Not
      // followed through a node with other operands (a scaling): that node decides by its own
      // costs, and looking through it predicted merges it did not make (train_bench's LLaMA
      // FSDP+TP step moved 12.60 -> 13.13 MB a device when it did).
      const bool carries = u.operands.size() == 1;
      if (carries && depth < 8 && flows_on(user, pend, depth + 1)) return true;
    }
    return false;
  }

  // A repetition of its operand (a scalar or bias broadcast) made for one user only, which wants
  // it in another sharding (a split update): decided again in that sharding rather than made
  // whole and then sliced. Nothing is emitted yet, so nothing is undone. Fusion then reads it as
  // its operand again.
  void remake_repeat(ValueId o, const PartitionSpec& want) {
    const Node& rn = g_[o];
    Decision& d = dec_[o];
    if (rn.op->repeat == nullptr || users_[o].size() != 1 || is_output_[o] != 0 ||
        d.kind != Decision::Kind::kKernel || !d.result.pending.empty() ||
        equivalent(mesh_, d.result.spec, want, rn.type.shape.rank())) {
      return;
    }
    const OpFactors& f = prop_.factors(o);
    FactorAxes axes(f.count());
    const auto dims = padded(want, rn.type.shape.rank());
    for (std::size_t d2 = 0; d2 < dims.size(); ++d2) {
      const int fac = f.result[d2];
      if (fac < 0 || f.kind(fac) != FactorKind::kPass) return;  // not made by its factors
      axes[fac] = dims[d2];
    }
    Choice c = evaluate(o, std::move(axes));
    if (!equivalent(mesh_, spec_of_dims(c.out_dims), want, rn.type.shape.rank())) return;
    d = Decision{
        .kind = Decision::Kind::kKernel,
        .wants = std::move(c.wants),
        .as_is = std::move(c.as_is),
        .result = {spec_of_dims(std::move(c.out_dims)), {}, "made in its one user's sharding"}};
  }

  // The sharded weight update XLA makes of an all-reduce followed by elementwise work, made here
  // for every pointwise node: when the propagation leaves the result whole over mesh axes on
  // which an operand is a pending sum (a gradient summed over the batch axis) or is already split
  // (the previous node of such a chain), the node runs split over them instead: the pending
  // operand is reduce-scattered rather than all-reduced, the other operands are sliced locally,
  // each device does 1/n of the work, and the result is gathered only where a user needs it
  // whole (the reduce-scatter and that all-gather are the all-reduce's own two halves). Returns
  // the factor axes of that split, or nothing when no operand offers one.
  std::optional<FactorAxes> split_pointwise(ValueId id, const FactorAxes& base) const {
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
    std::set<std::string> used;
    for (int fac = 0; fac < f.count(); ++fac) used.insert(base[fac].begin(), base[fac].end());
    const auto free = [&](const AxisNames& axes) {
      return !axes.empty() && std::none_of(axes.begin(), axes.end(),
                                           [&](const auto& a) { return used.count(a) > 0; });
    };
    for (const ValueId o : n.operands) {
      if (pointwise_only_[o] == 0) continue;
      const Layout& os = layout(o);
      FactorAxes axes = base;
      bool changed = false;
      if (!os.pending.empty()) {
        // Split the first (most major) dimension that is whole and divides.
        if (!free(os.pending.axes)) continue;
        for (int d = 0; d < shape.rank() && !changed; ++d) {
          const int fac = f.result[static_cast<std::size_t>(d)];
          if (!axes[fac].empty() || shape[d] % product(mesh_, os.pending.axes) != 0) continue;
          axes[fac] = os.pending.axes;
          changed = true;
        }
      } else {
        const auto dims = padded(os.spec, shape.rank());
        for (int d = 0; d < shape.rank(); ++d) {
          const auto& on = dims[static_cast<std::size_t>(d)];
          const int fac = f.result[static_cast<std::size_t>(d)];
          if (!axes[fac].empty() || !free(on)) continue;
          axes[fac] = on;
          used.insert(on.begin(), on.end());
          changed = true;
        }
      }
      if (changed) return axes;
    }
    return std::nullopt;
  }

  // What running node `id` with these factor axes asks of its operands and gives its result, and
  // the bytes of the reshards that needs. Operands marked in `as_is` are read as they are (their
  // reshard costs nothing) and `carried`, their pending sum, stays pending in the result.
  Choice evaluate(ValueId id, FactorAxes axes, const Pending* carried = nullptr,
                  std::vector<char> as_is = {}) const {
    const Node& n = g_[id];
    const OpFactors& f = prop_.factors(id);
    Choice c;
    c.axes = std::move(axes);
    c.as_is = as_is.empty() ? std::vector<char>(n.operands.size(), 0) : std::move(as_is);
    // Held operands (keep_alive) are read as they are.
    if (n.op->holds_operands) std::fill(c.as_is.begin() + 1, c.as_is.end(), char{1});
    // A dimension takes its factor's axes when they split both: a reshape's compound dimension
    // is larger than the factor it shares, and splitting it further than the factor is not a
    // split of the factor (its blocks would not be the operand's).
    auto fits = [&](std::int64_t size, int fac) {
      if (fac < 0) return false;
      const std::int64_t ways = std::max<std::int64_t>(1, product(mesh_, c.axes[fac]));
      return size % ways == 0 && f.size(fac) % ways == 0;
    };
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      const ValueId o = n.operands[k];
      const TensorType& ot = g_[o].type;
      std::vector<AxisNames> want(static_cast<std::size_t>(ot.shape.rank()));
      for (std::size_t d = 0; d < want.size(); ++d) {
        const int fac = f.operands[k][d];
        if (fits(ot.shape[static_cast<int>(d)], fac)) want[d] = c.axes[fac];
      }
      c.wants.push_back(n.op->holds_operands && k > 0 ? layout(o).spec : spec_of_dims(want));
      if (c.as_is[k] != 0) continue;
      const Layout& os = layout(o);
      c.cost = add_bytes(c.cost, costs_.bytes(ot, os.spec, os.pending, c.wants.back()),
                         "a node's reshard cost");
    }
    c.operand_cost = c.cost;
    c.out_dims.assign(static_cast<std::size_t>(n.type.shape.rank()), {});
    for (std::size_t d = 0; d < c.out_dims.size(); ++d) {
      const int fac = f.result[d];
      if (fits(n.type.shape[static_cast<int>(d)], fac)) c.out_dims[d] = c.axes[fac];
    }
    c.pend = carried != nullptr ? *carried : Pending{n.op->partial, {}};
    for (int fac = 0; fac < f.count(); ++fac) {
      if (f.kind(fac) == FactorKind::kReduce) {
        c.pend.axes.insert(c.pend.axes.end(), c.axes[fac].begin(), c.axes[fac].end());
      }
    }
    c.cost = add_bytes(
        c.cost,
        costs_.bytes(n.type, spec_of_dims(c.out_dims), c.pend, spec_of_dims(prop_.at(id).dims)),
        "a node's reshard cost");
    return c;
  }

  const Graph& g_;
  const Propagator& prop_;
  const ValueMap<PartitionSpec>& specs_;
  const Mesh& mesh_;
  ValueMap<Decision> dec_;
  ValueMap<char> decided_;
  ValueMap<std::vector<std::pair<ValueId, int>>> users_;  // (node, operand position), by value
  ValueMap<char> is_output_;
  ValueMap<char> pointwise_only_;  // read by pointwise nodes only (see the constructor)
  ValueMap<char> constant_;
  mutable ReshardCosts costs_{mesh_};  // evaluate's reshard bytes, each question planned once
};

// ---- Phase 2: emit ---------------------------------------------------------------------------

class Emitter {
 public:
  Emitter(const Graph& g, const ValueMap<Decision>& dec, const ValueMap<char>& constant,
          const ValueMap<PartitionSpec>& specs, const CompileSpec& spec)
      : g_(g),
        dec_(dec),
        constant_(constant),
        specs_(specs),
        mesh_(spec.mesh),
        devices_per_process_(spec.devices_per_process),
        slot_(g.size(), SlotId{-1}),
        resharded_(g.size()),
        source_(g.size()) {}

  Partitioned run() {
    plan_reduced_sources();
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId id = value_id(i);
      const Decision& d = dec_[id];
      switch (d.kind) {
        case Decision::Kind::kInput:
          bind_input(id);
          break;
        case Decision::Kind::kAlias:
          slot_[id] = read(g_[id].operands[0], d, 0);
          break;
        case Decision::Kind::kKernel:
          emit_kernel(id);
          break;
      }
    }
    // Outputs in their propagated shardings, nothing pending.
    for (const ValueId o : g_.outputs) {
      out_.output_slots.push_back(require(o, specs_[o]));
      out_.output_shardings.emplace_back(mesh_, specs_[o]);
    }
    out_.num_slots = next_slot_;
    out_.layouts = ValueMap<Layout>(g_.size());
    for (std::size_t i = 0; i < g_.size(); ++i)
      out_.layouts[value_id(i)] = dec_[value_id(i)].result;
    return std::move(out_);
  }

 private:
  SlotId new_slot() { return static_cast<SlotId>(next_slot_++); }

  void bind_input(ValueId id) {
    const auto k = static_cast<std::size_t>(g_[id].attr<InputAttrs>().index);
    slot_[id] = new_slot();
    if (out_.input_slots.size() <= k) {
      out_.input_slots.resize(k + 1, SlotId{-1});
      out_.input_shardings.resize(k + 1, NamedSharding(mesh_, PartitionSpec()));
      out_.input_pending.resize(k + 1);
    }
    out_.input_slots[k] = slot_[id];
    out_.input_shardings[k] = NamedSharding(mesh_, dec_[id].result.spec);
    out_.input_pending[k] = dec_[id].result.pending;
  }

  // Operand k of a decided node: as it is, or brought to the sharding the decision wants.
  SlotId read(ValueId operand, const Decision& d, std::size_t k) {
    return d.as_is[k] != 0 ? slot_[operand] : require(operand, d.wants[k]);
  }

  // The slot holding `value` in sharding `want` (nothing pending), adding a reshard step when it
  // is not there yet (once per value and sharding).
  SlotId require(ValueId value, const PartitionSpec& want) {
    const Layout& at = dec_[value].result;
    if (at.pending.empty() && at.spec == want) return slot_[value];  // (the common case, cheaply)
    const TensorType& t = g_[value].type;
    const NamedSharding cur(mesh_, at.spec);
    const NamedSharding target(mesh_, want);
    if (at.pending.empty() && cur.is_equivalent_to(target, t.shape.rank())) return slot_[value];
    for (const auto& [done, slot] : resharded_[value]) {
      if (done == want) return slot;
    }
    // From the value as it is, or, for a pending sum, from the reduced copy plan_reduced_sources
    // chose (made first when it is not yet).
    SlotId from = slot_[value];
    std::vector<CollectiveRecord> cost;
    const PartitionSpec* source = nullptr;
    for (const auto& [spec, src] : source_[value]) {
      if (spec == want && src.has_value()) source = &*src;
    }
    if (source != nullptr) {
      from = require(value, *source);
      cost = plan_reshard(t.shape, t.dtype, NamedSharding(mesh_, *source), {}, target,
                          devices_per_process_);
    } else {
      cost = plan_reshard(t.shape, t.dtype, cur, at.pending, target, devices_per_process_);
    }
    Step step{.kind = Step::Kind::kReshard,
              .node = value,
              .in = {from},
              .out = new_slot(),
              .type = t,
              .sharding = target,
              .cost = std::move(cost),
              .constant = constant_[value] != 0};
    resharded_[value].emplace_back(want, step.out);
    out_.steps.push_back(std::move(step));
    return out_.steps.back().out;
  }

  // Where each sharding a pending sum is wanted in is made from: the summands (reduced there) or
  // another wanted sharding's reduced copy (sliced or gathered from it), decided for all of the
  // value's wanted shardings at once before anything is emitted, so the order of the value's
  // uses does not matter. The least bytes received, then the fewest collectives (a reduction
  // and a local slice before two collectives of half the bytes), then the first in the order of
  // the shardings' text with the summands first. Exact over every forest of up to six wanted
  // shardings; beyond that (not met in the tests or benchmarks) each is reduced from the
  // summands.
  void plan_reduced_sources() {
    ValueMap<std::vector<PartitionSpec>> wanted(g_.size());
    const auto want = [&](ValueId v, const PartitionSpec& spec) {
      if (dec_[v].result.pending.empty()) return;
      auto& w = wanted[v];
      if (std::find(w.begin(), w.end(), spec) == w.end()) w.push_back(spec);
    };
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId id = value_id(i);
      const Decision& d = dec_[id];
      if (d.kind == Decision::Kind::kInput) continue;
      const std::size_t reads = d.kind == Decision::Kind::kAlias ? 1 : g_[id].operands.size();
      for (std::size_t k = 0; k < reads; ++k) {
        if (d.as_is[k] == 0) want(g_[id].operands[k], d.wants[k]);
      }
    }
    for (const ValueId o : g_.outputs) want(o, specs_[o]);
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId v = value_id(i);
      if (!wanted[v].empty()) source_[v] = plan_sources(v, std::move(wanted[v]));
    }
  }

  std::vector<std::pair<PartitionSpec, std::optional<PartitionSpec>>> plan_sources(
      ValueId v, std::vector<PartitionSpec> targets) const {
    std::sort(targets.begin(), targets.end(), [](const PartitionSpec& a, const PartitionSpec& b) {
      return a.to_string() < b.to_string();
    });
    const int n = static_cast<int>(targets.size());
    const TensorType& t = g_[v].type;
    const Layout& at = dec_[v].result;
    // cost[s + 1][j]: (bytes, collectives) of target j made from source s (-1: the summands).
    using Cost = std::pair<std::int64_t, int>;
    std::vector<std::vector<Cost>> cost(static_cast<std::size_t>(n + 1),
                                        std::vector<Cost>(static_cast<std::size_t>(n)));
    for (int s = -1; s < n; ++s) {
      for (int j = 0; j < n; ++j) {
        if (s == j) continue;
        const NamedSharding target(mesh_, targets[static_cast<std::size_t>(j)]);
        const auto plan =
            s < 0 ? plan_reshard(t.shape, t.dtype, NamedSharding(mesh_, at.spec), at.pending,
                                 target, devices_per_process_)
                  : plan_reshard(t.shape, t.dtype,
                                 NamedSharding(mesh_, targets[static_cast<std::size_t>(s)]), {},
                                 target, devices_per_process_);
        const auto collectives = std::count_if(plan.begin(), plan.end(), [](const auto& r) {
          return r.kind != CollectiveKind::kSlice;
        });
        cost[static_cast<std::size_t>(s + 1)][static_cast<std::size_t>(j)] = {
            bytes_received(plan), static_cast<int>(collectives)};
      }
    }
    std::vector<int> parent(static_cast<std::size_t>(n), -1);
    std::vector<int> best = parent;
    if (n <= 6) {
      Cost best_cost{std::numeric_limits<std::int64_t>::max(), 0};
      // Every assignment of a source to each target, in order (the summands first); the
      // forests only (each target reaches the summands).
      const auto reaches_root = [&](int j) {
        for (int steps = 0; steps <= n; ++steps) {
          if (j < 0) return true;
          j = parent[static_cast<std::size_t>(j)];
        }
        return false;
      };
      std::function<void(int)> search = [&](int j) {
        if (j == n) {
          Cost c{0, 0};
          for (int k = 0; k < n; ++k) {
            if (!reaches_root(k)) return;
            const Cost& e = cost[static_cast<std::size_t>(parent[static_cast<std::size_t>(k)] + 1)]
                                [static_cast<std::size_t>(k)];
            c.first += e.first;
            c.second += e.second;
          }
          if (c < best_cost) {
            best_cost = c;
            best = parent;
          }
          return;
        }
        for (int s = -1; s < n; ++s) {
          if (s == j) continue;
          parent[static_cast<std::size_t>(j)] = s;
          search(j + 1);
        }
        parent[static_cast<std::size_t>(j)] = -1;
      };
      search(0);
    }
    std::vector<std::pair<PartitionSpec, std::optional<PartitionSpec>>> out;
    for (int j = 0; j < n; ++j) {
      const int s = best[static_cast<std::size_t>(j)];
      out.emplace_back(targets[static_cast<std::size_t>(j)],
                       s < 0 ? std::nullopt
                             : std::optional<PartitionSpec>(targets[static_cast<std::size_t>(s)]));
    }
    return out;
  }

  void emit_kernel(ValueId id) {
    const Node& n = g_[id];
    const Decision& d = dec_[id];
    std::vector<SlotId> in_slots;
    std::vector<Shape> in_local;
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      const ValueId o = n.operands[k];
      in_slots.push_back(read(o, d, k));
      in_local.push_back(NamedSharding(mesh_, d.wants[k]).shard_shape(g_[o].type.shape));
    }
    const NamedSharding out_sharding(mesh_, d.result.spec);
    Node local = n;
    local.type.shape = out_sharding.shard_shape(n.type.shape);
    if (n.op->localize != nullptr) n.op->localize(local, operand_shapes(g_, n), in_local);
    Step step{.kind = Step::Kind::kKernel,
              .node = id,
              .local = std::move(local),
              .in = std::move(in_slots),
              .out = new_slot(),
              .type = n.type,
              .sharding = out_sharding,
              .pending = d.result.pending,
              .constant = constant_[id] != 0};
    std::tie(step.blocks, step.offsets) = blocks_of(d.result.spec, n.type.shape);
    step.flops = n.op->flops(step.local, in_local, step.local.type.shape);
    if (n.op->collective != nullptr) {
      step.cost =
          collective_cost(n.op->collective(step.local, {in_local[0], g_[n.operands[0]].type.dtype}),
                          g_[n.operands[0]].type.dtype, mesh_, devices_per_process_);
    }
    slot_[id] = step.out;
    out_.steps.push_back(std::move(step));
  }

  // Each device's block of a result, and the blocks' starts, made once per (spec, shape): the
  // key compares both (the hash only picks the bucket).
  struct BlocksKey {
    PartitionSpec spec;
    Shape shape;
    friend bool operator==(const BlocksKey&, const BlocksKey&) = default;
  };
  struct BlocksKeyHash {
    std::size_t operator()(const BlocksKey& k) const {
      return hash_combine(hash_of(k.spec), hash_of(k.shape));
    }
  };
  using Offsets = std::vector<std::vector<std::int64_t>>;
  using SharedBlocks =
      std::pair<std::shared_ptr<const std::vector<Block>>, std::shared_ptr<const Offsets>>;

  SharedBlocks blocks_of(const PartitionSpec& spec, const Shape& shape) {
    BlocksKey key{spec, shape};
    if (const auto it = blocks_.find(key); it != blocks_.end()) return it->second;
    auto blocks =
        std::make_shared<const std::vector<Block>>(NamedSharding(mesh_, spec).device_blocks(shape));
    auto offsets = std::make_shared<Offsets>();
    for (const Block& b : *blocks) {
      std::vector<std::int64_t> starts;
      for (const auto& dim : b) starts.push_back(dim.start);
      offsets->push_back(std::move(starts));
    }
    SharedBlocks made{std::move(blocks), std::move(offsets)};
    blocks_.emplace(std::move(key), made);
    return made;
  }

  const Graph& g_;
  const ValueMap<Decision>& dec_;
  const ValueMap<char>& constant_;
  const ValueMap<PartitionSpec>& specs_;
  const Mesh& mesh_;
  const int devices_per_process_;  // CompileSpec::devices_per_process
  ValueMap<SlotId> slot_;
  ValueMap<std::vector<std::pair<PartitionSpec, SlotId>>> resharded_;  // reshards made, by value
  // By pending value: each sharding it is wanted in, and the reduced copy it is made from
  // (nullopt: from the summands); plan_reduced_sources.
  ValueMap<std::vector<std::pair<PartitionSpec, std::optional<PartitionSpec>>>> source_;
  std::unordered_map<BlocksKey, SharedBlocks, BlocksKeyHash> blocks_;
  int next_slot_ = 0;
  Partitioned out_;
};

}  // namespace

Partitioned partition(const Graph& g, const Propagator& prop, const ValueMap<PartitionSpec>& specs,
                      const CompileSpec& spec) {
  Chooser chooser(g, prop, specs, spec);
  const ValueMap<Decision> decisions = chooser.run();
  Partitioned out = Emitter(g, decisions, chooser.constants(), specs, spec).run();
  keep_read(g, out, spec.mesh.size());  // phase 3 (partition_keep.cpp)
  return out;
}

}  // namespace shardplan::detail
