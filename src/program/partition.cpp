#include "partition.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "primitive.hpp"
#include "primitives.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

// a + b, or SpecError naming what overflowed (a plan of absurd sizes, never a wrapped number).
std::int64_t add_bytes(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t out = 0;
  if (!checked_add(a, b, &out)) {
    throw SpecError(fmt::format("[compile] {} overflows int64 ({} + {} bytes)", what, a, b));
  }
  return out;
}

std::int64_t bytes_received(const std::vector<CollectiveRecord>& records) {
  std::int64_t total = 0;
  for (const auto& rec : records) total = add_bytes(total, rec.max_bytes_in(), "a reshard's bytes");
  return total;
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

// One way to run a node: the axes of each factor, what each operand must be resharded to, the
// result's sharding and pending state, and what the reshards cost.
struct Choice {
  FactorAxes axes;
  std::vector<PartitionSpec> wants;  // per operand
  std::vector<AxisNames> out_dims;
  Pending pend;
  std::int64_t cost = 0;
};

class Partitioner {
 public:
  Partitioner(const Graph& g, const Propagator& prop, const ValueMap<PartitionSpec>& specs,
              const CompileSpec& spec)
      : g_(g),
        prop_(prop),
        specs_(specs),
        spec_(spec),
        mesh_(spec.mesh),
        state_(g.size()),
        resharded_(g.size()) {
    out_.flops.assign(static_cast<std::size_t>(mesh_.size()), 0);
    mark_constants();
    uses_ = ValueMap<int>(g.size(), 0);
    for (const Node& n : g.nodes) {
      for (const ValueId o : n.operands) ++uses_[o];
    }
    for (const ValueId o : g.outputs) ++uses_[o];
    // Values only pointwise nodes (or the gradient constraints that defer to them) read: a split
    // of them is gathered once, where a user needs the result whole. A value that an output, a
    // product or a user's constraint also reads will be made whole anyway; splitting its
    // pointwise users too would move it twice.
    pointwise_only_ = ValueMap<char>(g.size(), 1);
    for (const Node& n : g.nodes) {
      const bool defers = n.is(prim::sharding_constraint) && n.attr<ConstraintAttrs>().like;
      if (n.op->pointwise && (!n.op->sharding_identity || defers)) continue;
      for (const ValueId o : n.operands) pointwise_only_[o] = 0;
    }
    for (const ValueId o : g.outputs) pointwise_only_[o] = 0;
    kernel_step_ = ValueMap<std::ptrdiff_t>(g.size(), -1);
  }

  Partitioned run() {
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId id = value_id(i);
      if (g_[id].is(prim::input)) {
        bind_input(id);
      } else {
        partition_node(id);
      }
    }
    // Outputs in their propagated shardings, nothing pending.
    for (const ValueId o : g_.outputs) {
      out_.output_slots.push_back(require(o, specs_[o]));
      out_.output_shardings.emplace_back(mesh_, specs_[o]);
    }
    if (!dead_.empty()) {
      std::vector<Step> kept;
      kept.reserve(out_.steps.size() - dead_.size());
      for (std::size_t i = 0; i < out_.steps.size(); ++i) {
        if (!dead_.count(i)) kept.push_back(std::move(out_.steps[i]));
      }
      out_.steps = std::move(kept);
    }
    out_.num_slots = next_slot_;
    return std::move(out_);
  }

 private:
  // Where a value lives while the program runs: its slot, sharding and pending state.
  struct State {
    SlotId slot{-1};
    PartitionSpec spec;
    Pending pending;
  };

  SlotId new_slot() { return static_cast<SlotId>(next_slot_++); }

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

  void bind_input(ValueId id) {
    const auto k = static_cast<std::size_t>(g_[id].attr<InputAttrs>().index);
    const InputSpec& in = spec_.inputs.at(k);
    State& st = state_[id];
    st.slot = new_slot();
    st.spec = specs_[id];
    st.pending = in.spec ? in.pending : Pending{};
    if (out_.input_slots.size() <= k) {
      out_.input_slots.resize(k + 1, SlotId{-1});
      out_.input_shardings.resize(k + 1, NamedSharding(mesh_, PartitionSpec()));
      out_.input_pending.resize(k + 1);
    }
    out_.input_slots[k] = st.slot;
    out_.input_shardings[k] = NamedSharding(mesh_, st.spec);
    out_.input_pending[k] = st.pending;
  }

  // The slot holding `value` in sharding `want` (nothing pending), adding a reshard step when it
  // is not there yet (once per value and sharding).
  SlotId require(ValueId value, const PartitionSpec& want) {
    const State& st = state_[value];
    const TensorType& t = g_[value].type;
    const NamedSharding cur(mesh_, st.spec);
    const NamedSharding target(mesh_, want);
    if (st.pending.empty() && cur.is_equivalent_to(target, t.shape.rank())) return st.slot;
    for (const auto& [done, slot] : resharded_[value]) {
      if (done == want) return slot;
    }
    Step step{.kind = Step::Kind::kReshard,
              .node = value,
              .in = {st.slot},
              .out = new_slot(),
              .type = t,
              .sharding = target,
              .cost = plan_reshard(t.shape, t.dtype, cur, st.pending, target),
              .constant = constant_[value] != 0};
    for (const auto& rec : step.cost) {
      std::int64_t& b = out_.bytes_by_kind[rec.kind];
      b = add_bytes(b, rec.max_bytes_in(), "the bytes received per step");
    }
    resharded_[value].emplace_back(want, step.out);
    out_.steps.push_back(std::move(step));
    return out_.steps.back().out;
  }

  // Axes per factor. Pass factors take the result's sharding and reduce factors the operands'
  // (first sharded dimension), an axis going to one factor only; `reduce_first` says which of
  // the two claims an axis they both want.
  FactorAxes assign(ValueId id, bool reduce_first) const {
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
    auto take_reduce = [&] {
      for (std::size_t k = 0; k < n.operands.size(); ++k) {
        const auto& odims = prop_.at(n.operands[k]).dims;
        for (std::size_t d = 0; d < f.operands[k].size(); ++d) {
          const int fac = f.operands[k][d];
          if (fac < 0 || f.kind(fac) != FactorKind::kReduce) continue;
          if (!axes[fac].empty() || odims[d].empty()) continue;
          const bool free = std::none_of(odims[d].begin(), odims[d].end(),
                                         [&](const auto& a) { return used.count(a) > 0; });
          if (!free || f.size(fac) % product(mesh_, odims[d]) != 0) {
            continue;
          }
          axes[fac] = odims[d];
          used.insert(odims[d].begin(), odims[d].end());
        }
      }
    };
    if (reduce_first) {
      take_reduce();
      take_pass();
    } else {
      take_pass();
      take_reduce();
    }
    return axes;
  }

  // A repetition of its operand (a scalar or bias broadcast) made for one user only, which now
  // wants it in another sharding (a split update): made again in that sharding, its first step
  // dropped, rather than made whole and then sliced. Fusion then reads it as its operand again.
  void remake_repeat(ValueId o, const PartitionSpec& want) {
    const Node& rn = g_[o];
    const std::ptrdiff_t at = kernel_step_[o];
    if (rn.op->repeat == nullptr || uses_[o] != 1 || at < 0) return;
    const State& os = state_[o];
    if (!os.pending.empty() ||
        NamedSharding(mesh_, os.spec)
            .is_equivalent_to(NamedSharding(mesh_, want), rn.type.shape.rank())) {
      return;
    }
    const OpFactors& f = prop_.factors(o);
    FactorAxes axes(f.count());
    const auto dims = padded(want, rn.type.shape.rank());
    for (std::size_t d = 0; d < dims.size(); ++d) {
      const int fac = f.result[d];
      if (fac < 0 || f.kind(fac) != FactorKind::kPass) return;  // not made by its factors
      axes[fac] = dims[d];
    }
    Choice c = evaluate(o, std::move(axes));
    if (!NamedSharding(mesh_, spec_of_dims(c.out_dims))
             .is_equivalent_to(NamedSharding(mesh_, want), rn.type.shape.rank())) {
      return;
    }
    const auto old = static_cast<std::size_t>(at);
    dead_.insert(old);
    for (double& fl : out_.flops) fl -= out_.steps[old].flops;
    std::vector<SlotId> in_slots;
    std::vector<Shape> in_local;
    for (std::size_t k = 0; k < rn.operands.size(); ++k) {
      in_slots.push_back(require(rn.operands[k], c.wants[k]));
      in_local.push_back(
          NamedSharding(mesh_, c.wants[k]).shard_shape(g_[rn.operands[k]].type.shape));
    }
    State& st = state_[o];
    st.spec = spec_of_dims(c.out_dims);
    st.pending = Pending{};
    emit_kernel(o, std::move(in_slots), in_local);
  }

  // For add and sub of operands that are all sums pending over the same axes, in the same
  // sharding: that pending state (their result is the sum of the devices' results).
  std::optional<Pending> sum_of_pending(const Node& n) const {
    if (!(n.is(prim::add) || n.is(prim::sub)) || n.operands.size() != 2) return std::nullopt;
    const State& a = state_[n.operands[0]];
    const State& b = state_[n.operands[1]];
    if (a.pending.empty() || a.pending.op != ReduceOp::kSum || !(a.pending == b.pending) ||
        !(a.spec == b.spec)) {
      return std::nullopt;
    }
    return a.pending;
  }

  // True for the constraint value_and_grad puts on a gradient (sharded like its parameter)
  // when the gradient is still a pending sum. A user's with_sharding_constraint, an output's
  // sharding and an annotation are resolved where they stand.
  bool defers_reduction(const Node& n) const {
    if (!n.is(prim::sharding_constraint) || !n.attr<ConstraintAttrs>().like) return false;
    return !state_[n.operands[0]].pending.empty();
  }

  // The sharded weight update XLA makes of an all-reduce followed by elementwise work, made
  // here for every pointwise node: when the propagation leaves the result whole over mesh axes
  // on which an operand is a pending sum (a gradient summed over the batch axis) or is already
  // split (the previous node of such a chain), the node runs split over them instead: the pending
  // operand is reduce-scattered rather than all-reduced, the other operands are sliced locally,
  // each device does 1/n of the work, and the result is gathered only where a user needs it
  // whole (the reduce-scatter and that all-gather are the all-reduce's own two halves). Returns
  // the factor axes of that split, or nothing when no operand offers one. The caller keeps it
  // only when its reshards cost no more bytes than `base`'s.
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
      const State& os = state_[o];
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
  // the bytes of the reshards that needs (the operands', then the result's to its propagated
  // sharding).
  Choice evaluate(ValueId id, FactorAxes axes) const {
    const Node& n = g_[id];
    const OpFactors& f = prop_.factors(id);
    Choice c;
    c.axes = std::move(axes);
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
      c.wants.push_back(spec_of_dims(want));
      const State& os = state_[o];
      c.cost =
          add_bytes(c.cost,
                    bytes_received(plan_reshard(ot.shape, ot.dtype, NamedSharding(mesh_, os.spec),
                                                os.pending, NamedSharding(mesh_, c.wants.back()))),
                    "a node's reshard cost");
    }
    c.out_dims.assign(static_cast<std::size_t>(n.type.shape.rank()), {});
    for (std::size_t d = 0; d < c.out_dims.size(); ++d) {
      const int fac = f.result[d];
      if (fits(n.type.shape[static_cast<int>(d)], fac)) c.out_dims[d] = c.axes[fac];
    }
    c.pend = Pending{n.op->partial, {}};
    for (int fac = 0; fac < f.count(); ++fac) {
      if (f.kind(fac) == FactorKind::kReduce) {
        c.pend.axes.insert(c.pend.axes.end(), c.axes[fac].begin(), c.axes[fac].end());
      }
    }
    c.cost =
        add_bytes(c.cost,
                  bytes_received(plan_reshard(
                      n.type.shape, n.type.dtype, NamedSharding(mesh_, spec_of_dims(c.out_dims)),
                      c.pend, NamedSharding(mesh_, spec_of_dims(prop_.at(id).dims)))),
                  "a node's reshard cost");
    return c;
  }

  void partition_node(ValueId id) {
    const Node& n = g_[id];
    const OpFactors& f = prop_.factors(id);
    if (const auto pend = sum_of_pending(n)) {
      // Partial + partial stays partial (DTensor's rule for linear ops): the devices add their
      // summands, and whoever needs the value reduces once instead of twice.
      std::vector<SlotId> in_slots;
      std::vector<Shape> in_local;
      for (const ValueId o : n.operands) {
        in_slots.push_back(state_[o].slot);
        in_local.push_back(NamedSharding(mesh_, state_[o].spec).shard_shape(g_[o].type.shape));
      }
      State& st = state_[id];
      st.spec = state_[n.operands[0]].spec;
      st.pending = *pend;
      emit_kernel(id, std::move(in_slots), in_local);
      return;
    }
    if (defers_reduction(n)) {
      // A gradient "sharded like its parameter" that is still a pending sum stays pending: its
      // users ask for the sharding they need (the propagation gave them the parameter's), so
      // an elementwise update can take it reduce-scattered (split_pointwise) where resolving
      // it here would all-reduce it first. An output is still reduced in full.
      state_[id] = state_[n.operands[0]];
      return;
    }
    Choice choice = evaluate(id, assign(id, false));
    if (std::find(f.kinds.begin(), f.kinds.end(), FactorKind::kReduce) != f.kinds.end()) {
      Choice other = evaluate(id, assign(id, true));
      if (other.cost < choice.cost) choice = std::move(other);
    }
    if (auto axes = split_pointwise(id, choice.axes)) {
      Choice split = evaluate(id, std::move(*axes));
      if (split.cost <= choice.cost) choice = std::move(split);
    }
    for (std::size_t k = 0; k < n.operands.size(); ++k)
      remake_repeat(n.operands[k], choice.wants[k]);
    // Operands brought to the sharding the factors ask for.
    std::vector<SlotId> in_slots;
    std::vector<Shape> in_local;
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      const ValueId o = n.operands[k];
      in_slots.push_back(require(o, choice.wants[k]));
      in_local.push_back(NamedSharding(mesh_, choice.wants[k]).shard_shape(g_[o].type.shape));
    }
    State& st = state_[id];
    st.spec = spec_of_dims(choice.out_dims);
    st.pending = choice.pend;
    if (n.op->sharding_identity) {  // no kernel: the value is its operand's
      st.slot = in_slots[0];
      st.pending = Pending{};
      return;
    }
    emit_kernel(id, std::move(in_slots), in_local);
  }

  void emit_kernel(ValueId id, std::vector<SlotId> in_slots, const std::vector<Shape>& in_local) {
    const Node& n = g_[id];
    State& st = state_[id];
    const NamedSharding out_sharding(mesh_, st.spec);
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
              .pending = st.pending,
              .constant = constant_[id] != 0};
    std::tie(step.blocks, step.offsets) = blocks_of(st.spec, n.type.shape);
    step.flops = n.op->flops(step.local, in_local, step.local.type.shape);
    for (double& fl : out_.flops) fl += step.flops;
    st.slot = step.out;
    kernel_step_[id] = static_cast<std::ptrdiff_t>(out_.steps.size());
    out_.steps.push_back(std::move(step));
  }

  const Graph& g_;
  const Propagator& prop_;
  const ValueMap<PartitionSpec>& specs_;
  const CompileSpec& spec_;
  const Mesh& mesh_;
  ValueMap<State> state_;
  ValueMap<char> constant_;
  ValueMap<int> uses_;                    // operand uses and outputs, by value
  ValueMap<char> pointwise_only_;         // read by pointwise nodes only (see the constructor)
  ValueMap<std::ptrdiff_t> kernel_step_;  // index of the value's kernel step, or -1
  std::set<std::size_t> dead_;            // steps replaced by remake_repeat
  ValueMap<std::vector<std::pair<PartitionSpec, SlotId>>> resharded_;  // reshards made, by value

  // Each device's block of a result, and the blocks' starts, made once per (spec, shape): the
  // key compares both (the hash only picks the bucket).
  struct BlocksKey {
    PartitionSpec spec;
    Shape shape;
    friend bool operator==(const BlocksKey&, const BlocksKey&) = default;
  };
  struct BlocksKeyHash {
    std::size_t operator()(const BlocksKey& k) const {
      std::size_t h = std::hash<std::string>()(k.spec.to_string());
      for (const std::int64_t d : k.shape.dims()) h = h * 1000003u ^ std::hash<std::int64_t>()(d);
      return h;
    }
  };
  using Offsets = std::vector<std::vector<std::int64_t>>;
  using SharedBlocks =
      std::pair<std::shared_ptr<const std::vector<Block>>, std::shared_ptr<const Offsets>>;
  std::unordered_map<BlocksKey, SharedBlocks, BlocksKeyHash> blocks_;

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
  int next_slot_ = 0;
  Partitioned out_;
};

}  // namespace

Partitioned partition(const Graph& g, const Propagator& prop, const ValueMap<PartitionSpec>& specs,
                      const CompileSpec& spec) {
  return Partitioner(g, prop, specs, spec).run();
}

}  // namespace shardplan::detail
