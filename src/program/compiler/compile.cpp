// compile(): the passes in order (compile.hpp). The user's fixed shardings are collected here:
// in_shardings and the arrays' own (inputs), out_shardings (a constraint node per output),
// with_sharding_constraint, annotations, and gradients sharded like their parameters.
#include "compile.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <span>
#include <unordered_map>

#include "fuse.hpp"
#include "memory.hpp"
#include "partition.hpp"
#include "../ir/primitives.hpp"
#include "partition_choose.hpp"
#include "propagate.hpp"

namespace shardplan::detail {
namespace {

std::atomic<CompileObserver> compile_observer{nullptr};

// Outputs with a sharding get a constraint node, so that the output's own computation and its
// other users are free to differ.
Graph constrain_outputs(Graph g, const CompileSpec& spec) {
  for (std::size_t k = 0; k < g.outputs.size() && k < spec.outputs.size(); ++k) {
    if (!spec.outputs[k]) continue;
    const ValueId out = g.outputs[k];
    g.outputs[k] = g.add(
        Node{.op = &prim::sharding_constraint,
             .operands = {out},
             .type = g[out].type,
             .attrs = ConstraintAttrs{.spec = spec.outputs[k],
                                      .origin = fmt::format("output {} (out_shardings)", k),
                                      .padded = spec.pad_outputs}});
  }
  return g;
}

// The graph without the values no output depends on (dead-code elimination, as XLA runs before
// partitioning): a gradient nobody asked for (value_and_grad's VJP of x @ w also makes the
// cotangent of x), a loss value not returned. They would otherwise be computed, communicated and
// counted, and could pull propagated shardings their way. Inputs stay (the program binds every
// one by index); value numbers are renumbered in order, `like` references with them.
Graph without_dead_values(Graph g) {
  std::vector<char> live(g.size(), 0);
  for (const ValueId o : g.outputs) live[index(o)] = 1;
  for (std::size_t i = g.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    if (n.is(prim::input)) live[i] = 1;
    if (!live[i]) continue;
    for (const ValueId o : n.operands) live[index(o)] = 1;
    if (n.is(prim::sharding_constraint)) {
      if (const auto& like = n.attr<ConstraintAttrs>().like) live[index(*like)] = 1;
    }
  }
  if (std::all_of(live.begin(), live.end(), [](char c) { return c != 0; })) return g;
  Graph out;
  out.num_inputs = g.num_inputs;
  std::vector<ValueId> renamed(g.size(), ValueId{-1});
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!live[i]) continue;
    Node n = g.nodes[i];
    for (ValueId& o : n.operands) o = renamed[index(o)];
    if (n.is(prim::sharding_constraint) && n.attr<ConstraintAttrs>().like) {
      ConstraintAttrs c = n.attr<ConstraintAttrs>();
      c.like = renamed[index(*c.like)];
      n.attrs = std::move(c);
    }
    renamed[i] = out.add(std::move(n));
  }
  for (const ValueId o : g.outputs) out.outputs.push_back(renamed[index(o)]);
  // A phase begins at the first live node recorded in it.
  std::vector<std::size_t> live_before(g.size() + 1, 0);
  for (std::size_t i = 0; i < g.size(); ++i) live_before[i + 1] = live_before[i] + (live[i] ? 1 : 0);
  for (const auto& [node, phase] : g.phase_marks) {
    out.phase_marks.emplace_back(live_before[std::min(node, g.size())], phase);
  }
  for (const auto& [v, names] : g.names) {
    if (live[index(v)]) out.names[renamed[index(v)]] = names;
  }
  return out;
}

// The propagated sharding of every value, as specs: equal ones are one instance (made once,
// held once by the program, and compared by address first where the partitioner compares them).
ValueMap<PartitionSpec> propagated_specs(const Graph& g, const Propagator& prop) {
  ValueMap<PartitionSpec> specs(g.size());
  std::unordered_multimap<std::size_t, PartitionSpec> made;  // by hash_of(spec)
  for (std::size_t i = 0; i < g.size(); ++i) {
    const std::vector<AxisNames>& dims = prop.at(value_id(i)).dims;
    std::size_t n = dims.size();
    while (n > 0 && dims[n - 1].empty()) --n;  // as spec_of_dims
    const std::span<const AxisNames> kept(dims.data(), n);
    std::size_t h = n;  // hash_of(spec.dims())
    for (const AxisNames& d : kept) h = hash_combine(h, hash_of(d));
    const PartitionSpec* found = nullptr;
    for (auto [it, end] = made.equal_range(h); it != end && found == nullptr; ++it) {
      const std::vector<AxisNames>& have = it->second.dims();
      if (std::equal(have.begin(), have.end(), kept.begin(), kept.end())) found = &it->second;
    }
    if (found == nullptr) {
      found = &made.emplace(h, PartitionSpec(std::vector<AxisNames>(kept.begin(), kept.end())))
                   ->second;
    }
    specs[value_id(i)] = *found;
  }
  return specs;
}

// Every sharding the user fixed, in graph order (a "like" constraint follows its source).
void fix_user_shardings(const Graph& g, const CompileSpec& spec, Propagator& prop) {
  for (std::size_t i = 0; i < g.size(); ++i) {
    const ValueId id = value_id(i);
    const Node& n = g[id];
    if (n.is(prim::input)) {
      const InputSpec& in = spec.inputs.at(static_cast<std::size_t>(n.attr<InputAttrs>().index));
      if (in.spec) prop.fix(id, *in.spec, in.origin, in.padded ? Uneven::kPad : Uneven::kRefuse);
    } else if (n.is(prim::sharding_constraint)) {
      const ConstraintAttrs& c = n.attr<ConstraintAttrs>();
      if (c.spec) {
        prop.fix(id, *c.spec,
                 c.origin.empty() ? std::string("with_sharding_constraint") : c.origin,
                 c.padded ? Uneven::kPad : Uneven::kRefuse);
      } else if (c.like && prop.at(*c.like).fixed) {
        prop.fix(id, spec_of_dims(prop.at(*c.like).dims),
                 fmt::format("sharded like {} (the gradient of a parameter)", value_name(*c.like)),
                 prop.at(*c.like).padded ? Uneven::kPad : Uneven::kRefuse);
      }
    } else if (n.op->fixed_layout != nullptr) {  // shard_map's boundaries and collectives
      FixedLayout fl = n.op->fixed_layout(n);
      prop.fix(id, fl.result, std::move(fl.origin));
    } else if (n.is(prim::sharding_annotation)) {
      const AnnotationAttrs& a = n.attr<AnnotationAttrs>();
      if (a.spec) prop.fix(id, *a.spec, fmt::format("annotation '{}'", a.name));
    }
  }
}

}  // namespace

CandidateSpace partition_candidates(const Graph& input_graph, const CompileSpec& spec) {
  // What compile() partitions, kept alive as long as the space's cost function.
  struct Prepared {
    explicit Prepared(const CompileSpec& s) : spec(s) {}
    CompileSpec spec;
    Graph g;
    std::optional<Propagator> prop;
    ValueMap<PartitionSpec> specs;
  };
  auto p = std::make_shared<Prepared>(spec);
  p->g = without_dead_values(constrain_outputs(input_graph, spec));
  p->prop.emplace(p->g, p->spec.mesh);
  fix_user_shardings(p->g, p->spec, *p->prop);
  p->prop->run();
  std::vector<Pending> input_pending;
  for (const InputSpec& in : spec.inputs) input_pending.push_back(in.spec ? in.pending : Pending{});
  p->prop->carry_pending(input_pending);
  p->specs = propagated_specs(p->g, *p->prop);
  CandidateSpace space = candidate_space(p->g, *p->prop, p->specs, p->spec);
  space.cost = [p, cost = std::move(space.cost)](const std::vector<int>& pick) {
    return cost(pick);
  };
  return space;
}

Program compile(const Graph& input_graph, const CompileSpec& spec) {
  Graph g = without_dead_values(constrain_outputs(input_graph, spec));
  const Mesh& mesh = spec.mesh;
  Program prog(mesh);

  Propagator prop(g, mesh);
  fix_user_shardings(g, spec, prop);
  prop.run();
  std::vector<Pending> input_pending;
  for (const InputSpec& in : spec.inputs) input_pending.push_back(in.spec ? in.pending : Pending{});
  prop.carry_pending(input_pending);
  prog.specs_ = propagated_specs(g, prop);
  prog.origins_ = ValueMap<std::string>(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) prog.origins_[value_id(i)] = prop.at(value_id(i)).origin;

  Partitioned parts = partition(g, prop, prog.specs_, spec);
  if (spec.fuse) fuse_pointwise(g, parts, spec.eager);
  Liveness live = plan_memory(g, parts, spec);
  prog.steps_ = std::move(parts.steps);
  prog.num_slots_ = parts.num_slots;
  prog.input_slots_ = std::move(parts.input_slots);
  prog.input_shardings_ = std::move(parts.input_shardings);
  prog.input_pending_ = std::move(parts.input_pending);
  prog.output_slots_ = std::move(parts.output_slots);
  prog.output_shardings_ = std::move(parts.output_shardings);
  prog.layouts_ = std::move(parts.layouts);
  prog.cost_.flops = std::move(parts.flops);
  prog.cost_.bytes_by_kind = std::move(parts.bytes_by_kind);
  prog.cost_.bytes_by_axes = std::move(parts.bytes_by_axes);
  prog.cost_.matmul_flops = std::move(parts.matmul_flops);
  prog.cost_.attention_flops = std::move(parts.attention_flops);
  prog.cost_.matmul_fp8_flops = std::move(parts.matmul_fp8_flops);
  prog.cost_.memory_traffic = live.memory_traffic;
  prog.cost_.peak_bytes = std::move(live.peak_by_device);
  prog.cost_.peak_by_kind = std::move(live.peak_by_kind);
  prog.cost_.timeline = std::move(live.timeline);
  prog.free_after_ = std::move(live.free_after);
  prog.free_at_start_ = std::move(live.free_at_start);
  prog.slot_bytes_ = std::move(live.slot_bytes);
  prog.input_donated_ = std::move(live.input_donated);
  prog.any_donated_ = live.any_donated;
  prog.constant_slots_ = std::move(live.constant_slots);
  prog.cached_step_ = std::move(live.cached_step);
  prog.counts_constants_ = spec.count_constants;
  prog.graph_ = std::move(g);
  if (const CompileObserver observer = compile_observer.load()) observer(prog);
  return prog;
}

int devices_per_process(const Executor* executor, const Mesh& mesh) {
  if (executor == nullptr || executor->holds_all(mesh.devices())) return 0;
  return static_cast<int>(executor->local_devices().size());
}

CompileObserver set_compile_observer(CompileObserver observer) {
  return compile_observer.exchange(observer);
}

}  // namespace shardplan::detail
