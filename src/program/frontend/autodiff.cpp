#include "shardplan/autodiff.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "../../profiler/recorder.hpp"
#include "../ir/primitive.hpp"
#include "../ir/primitives.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "trace.hpp"

namespace shardplan::detail {
namespace {

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16; }

// The values the backward pass reads inside checkpointed regions (remat.hpp): what a region's
// policy saves is the forward pass's value; the rest is computed again, once, when the backward
// pass first reaches the region, from the region's operands read through optimization_barrier
// (so that a gathered weight is gathered again there). A node belongs to the innermost region
// open when it was recorded; a region reads what it needs of an enclosing one as saved.
Contraction contraction(const Node& n) {
  return n.op->contraction != nullptr ? n.op->contraction(n) : Contraction::kNone;
}

// While alive, ops recorded on this thread carry `n`'s named scope and composite op: a value
// made again, replayed or differentiated is named as the node it comes from (the scope open now
// when `n` has none).
class NamedAs {
 public:
  explicit NamedAs(const Node& n)
      : scope_(n.scope ? n.scope : profiler::detail::current_scope()), composite_(n.composite) {}

 private:
  profiler::detail::ScopeOverride scope_;
  CompositeScope composite_;
};

class Recompute {
 public:
  Recompute(const Graph& g, const TraceContext& tc, const ValueMap<Array>& vals,
            const Array& placement)
      : g_(g), tc_(tc), vals_(vals), placement_(placement), rec_(g.size()),
        done_(tc.remat_regions.size(), 0) {
    check_names();
  }

  /// The value of `v` as the backward pass of node `user` reads it.
  Array read(ValueId user, ValueId v) {
    if (remade(v)) return remake(user, v);
    const int r = tc_.region_of(user);
    if (r < 0 || g_[user].is(prim::input)) return vals_[v];
    // Saving everything is no checkpoint: nothing is recomputed or read through a barrier.
    if (tc_.remat_regions[static_cast<std::size_t>(r)].policy.kind() ==
        RematPolicy::Kind::kEverythingSaveable) {
      return vals_[v];
    }
    if (done_[static_cast<std::size_t>(r)] == 0) recompute(r);
    return view(r, v);
  }

 private:
  bool inside(int r, ValueId v) const { return !g_[v].is(prim::input) && tc_.region_of(v) == r; }

  // `v` is made again where the backward pass reads it (Primitive::remade_for_backward), when
  // that keeps fewer bytes: its operands hold fewer elements than it. Traced only: eagerly the
  // forward value exists already.
  bool remade(ValueId v) const {
    const Node& n = g_[v];
    if (!n.op->remade_for_backward || n.is(prim::input) || current_trace() == nullptr) return false;
    return std::all_of(n.operands.begin(), n.operands.end(), [&](ValueId o) {
      return g_[o].type.shape.numel() < n.type.shape.numel();
    });
  }

  // `v` made from its operands as the backward pass of `user` reads them, once per region.
  Array remake(ValueId user, ValueId v) {
    const auto key = std::pair{tc_.region_of(user), index(v)};
    if (const auto it = remade_.find(key); it != remade_.end()) return it->second;
    const Node& n = g_[v];
    std::vector<Array> ins;
    ins.reserve(n.operands.size());
    for (const ValueId o : n.operands) ins.push_back(read(user, o));
    const NamedAs as_traced(n);
    return remade_.emplace(key, apply(*n.op, n.attrs, ins, &placement_)).first->second;
  }

  bool saved(int r, ValueId v) const {
    const RematPolicy& p = tc_.remat_regions[static_cast<std::size_t>(r)].policy;
    const Node& n = g_[v];
    switch (p.kind()) {
      case RematPolicy::Kind::kEverythingSaveable:
        return true;
      case RematPolicy::Kind::kNothingSaveable:
        return false;
      case RematPolicy::Kind::kDotsSaveable:
        return contraction(n) != Contraction::kNone;
      case RematPolicy::Kind::kDotsWithNoBatchDimsSaveable:
        return contraction(n) == Contraction::kUnbatched;
      case RematPolicy::Kind::kSaveOnlyTheseNames:
        return named(v, p);
      case RematPolicy::Kind::kSaveAnythingExceptTheseNames:
        return !named(v, p);
    }
    return true;
  }

  // `v` is given one of the names `p` lists.
  bool named(ValueId v, const RematPolicy& p) const {
    const auto it = tc_.value_names.find(v);
    if (it == tc_.value_names.end()) return false;
    return std::any_of(it->second.begin(), it->second.end(), [&](const std::string& name) {
      return std::find(p.names().begin(), p.names().end(), name) != p.names().end();
    });
  }

  Array view(int r, ValueId v) {
    if (!inside(r, v)) {
      if (!tc_.remat_regions[static_cast<std::size_t>(r)].prevent_cse) return vals_[v];
      const auto key = std::pair{r, index(v)};
      auto it = barriers_.find(key);
      if (it == barriers_.end()) it = barriers_.emplace(key, optimization_barrier(vals_[v])).first;
      return it->second;
    }
    return saved(r, v) ? vals_[v] : rec_[v];
  }

  void recompute(int r) {
    done_[static_cast<std::size_t>(r)] = 1;
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId id = value_id(i);
      if (!inside(r, id) || saved(r, id)) continue;
      const Node& n = g_[id];
      std::vector<Array> ins;
      ins.reserve(n.operands.size());
      for (const ValueId o : n.operands) ins.push_back(view(r, o));
      const NamedAs as_traced(n);
      rec_[id] = apply(*n.op, n.attrs, ins, &placement_);
    }
  }

  // Every name a save_only_these_names or save_anything_except_these_names policy lists is
  // given by a checkpoint_name inside its region (or a region nested in it): else the policy
  // would silently save nothing (or everything). A policy that ignores absent names (one
  // written for many models, as MaxText's) is not checked.
  void check_names() const {
    for (std::size_t r = 0; r < tc_.remat_regions.size(); ++r) {
      const RematPolicy& p = tc_.remat_regions[r].policy;
      if (p.names().empty() || p.absent_names_ignored()) continue;
      std::vector<std::string> given;
      for (const auto& [v, names] : tc_.value_names) {
        if (!within(tc_.region_of(v), static_cast<int>(r))) continue;
        for (const std::string& n : names) {
          if (std::find(given.begin(), given.end(), n) == given.end()) given.push_back(n);
        }
      }
      for (const std::string& want : p.names()) {
        if (std::find(given.begin(), given.end(), want) != given.end()) continue;
        std::vector<std::string> quoted;
        for (const std::string& n : given) quoted.push_back(fmt::format("'{}'", n));
        throw SpecError(fmt::format(
            "[checkpoint] {}: no checkpoint_name inside the checkpointed function gives '{}' "
            "(names given there: {})",
            p.to_string(), want, quoted.empty() ? std::string("none") : fmt::format("{}", fmt::join(quoted, ", "))));
      }
    }
  }

  // Region `r` is `outer` or nested in it.
  bool within(int r, int outer) const {
    for (; r >= 0; r = tc_.remat_regions[static_cast<std::size_t>(r)].parent) {
      if (r == outer) return true;
    }
    return false;
  }

  const Graph& g_;
  const TraceContext& tc_;
  const ValueMap<Array>& vals_;
  const Array& placement_;
  ValueMap<Array> rec_;
  std::vector<char> done_;
  std::map<std::pair<int, std::size_t>, Array> barriers_;
  std::map<std::pair<int, std::size_t>, Array> remade_;  // by region of the reader, value
};

// acc += c (c may be none).
void accumulate(Array& acc, const Array& c) {
  if (c.valid()) acc = acc.valid() ? acc + c : c;
}

// What a custom_vjp backward function gives must be one cotangent per primal input, each of its
// input's shape and dtype, or none (an empty Array), as JAX checks a bwd rule's output: a wrong
// one would flow on as a gradient of another shape or type.
void check_custom_cotangents(const TraceContext::CustomRegion& r, const ValueMap<Array>& vals,
                             const std::vector<Array>& cts) {
  constexpr const char* kRule =
      "[custom_vjp] Custom VJP bwd rule must produce an output with the same shape/dtypes as the "
      "args tuple of the primal function";
  if (cts.size() != r.inputs.size()) {
    throw SpecError(fmt::format("{}, but it gave {} cotangents for {} inputs", kRule, cts.size(),
                                r.inputs.size()));
  }
  for (std::size_t k = 0; k < cts.size(); ++k) {
    const Array& primal = vals[r.inputs[k]];
    if (!cts[k].valid() || (cts[k].shape() == primal.shape() && cts[k].dtype() == primal.dtype())) {
      continue;
    }
    throw SpecError(fmt::format("{}, but at input {} it produced a cotangent {} for an input {}",
                                kRule, k, type_str(cts[k]), type_str(primal)));
  }
}

// A custom_vjp region's backward function, called at its first output (the backward pass has
// then passed every output): its residuals as the backward pass reads them, a cotangent per
// output (zeros where none flowed); what it gives goes to the region's inputs. The region's own
// nodes get no cotangent, so their VJPs never run.
void custom_backward(const TraceContext::CustomRegion& r, ValueId at, const ValueMap<Array>& vals,
                     ValueMap<Array>& ct, Recompute& remat) {
  if (at != *std::min_element(r.outputs.begin(), r.outputs.end())) return;
  if (std::none_of(r.outputs.begin(), r.outputs.end(), [&](ValueId o) { return ct[o].valid(); })) {
    return;
  }
  std::vector<Array> residuals, cts;
  for (const ValueId v : r.residuals) residuals.push_back(remat.read(at, v));
  for (const ValueId o : r.outputs) cts.push_back(ct[o].valid() ? ct[o] : full_like(vals[o], 0));
  std::optional<EagerPerDeviceScope> eager;
  if (current_trace() == nullptr) eager.emplace();  // lax's collectives take its arrays as they are
  const std::vector<Array> in_cts = (*r.bwd)(residuals, cts);
  check_custom_cotangents(r, vals, in_cts);
  for (std::size_t k = 0; k < in_cts.size(); ++k) accumulate(ct[r.inputs[k]], in_cts[k]);
}

// Node `id`'s result as its VJP reads it: for a primitive whose backward pass keeps less than its
// result (Primitive::kept), restored from the kept values keep_for_backward recorded (made here
// from the result when none were: the result is then held).
Array result_for_vjp(const Node& n, ValueId id, const std::vector<Array>& ins,
                     const TraceContext& inner, Recompute& remat) {
  if (n.op->kept == nullptr) return remat.read(id, id);
  std::vector<Array> kept;
  if (const auto it = inner.kept.find(id); it != inner.kept.end()) {
    for (const ValueId v : it->second) kept.push_back(remat.read(id, v));
  } else {
    kept = n.op->kept->keep(n, ins, remat.read(id, id));
  }
  return n.op->kept->restore(n, kept);
}

// The backward pass: cotangents from the loss down, each primitive's VJP in turn (a custom_vjp
// region's backward function for its nodes).
ValueMap<Array> backward(const Graph& g, const TraceContext& inner, const ValueMap<Array>& vals,
                         const Array& placement, ValueId loss_node) {
  Recompute remat(g, inner, vals, placement);
  ValueMap<Array> ct(g.size());
  ct[loss_node] = full_like(vals[loss_node], 1);
  for (std::size_t i = index(loss_node) + 1; i-- > 0;) {
    const ValueId id = value_id(i);
    const Node& n = g[id];
    if (const auto it = inner.custom_output.find(id); it != inner.custom_output.end()) {
      custom_backward(inner.custom_regions[static_cast<std::size_t>(it->second)], id, vals, ct,
                      remat);
      continue;
    }
    if (!ct[id].valid() || n.is(prim::input)) continue;
    std::vector<Array> ins;
    for (const ValueId o : n.operands) ins.push_back(remat.read(id, o));
    // The backward ops of a node carry its named scope (the profiler's events name it) and the
    // composite op it belongs to.
    const NamedAs as_forward(n);
    const std::vector<Array> cts = n.op->vjp(n, ins, result_for_vjp(n, id, ins, inner, remat), ct[id]);
    for (std::size_t k = 0; k < cts.size() && k < n.operands.size(); ++k) {
      accumulate(ct[n.operands[k]], cts[k]);
    }
  }
  return ct;
}

// The tracer of parameter `leaf` in the gradient's trace `inner`. Inside a shard_map's function
// a per-device parameter stays one, varying over the same axes (lax works on it).
Array add_parameter(TraceContext& inner, const TraceContext* outer, const Array& leaf) {
  Array t = inner.add_argument(TensorType{leaf.shape(), leaf.dtype()});
  if (outer != nullptr && outer->vary_of(leaf) != kNotManual) {
    inner.node_vary.resize(inner.graph.size(), kNotManual);
    inner.node_vary.back() = outer->vary_of(leaf);
  }
  return t;
}

// The names the forward pass's values were given, on their replayed values in the enclosing
// trace (for people: the memory timeline's labels).
void keep_names(const Graph& g, const ValueMap<Array>& vals, TraceContext& outer) {
  for (const auto& [v, names] : g.names) {
    const Array& a = vals[v];
    if (!a.valid() || !a.is_tracer() || ArrayAccess::trace(a) != &outer) continue;
    std::vector<std::string>& to = outer.graph.names[value_id(static_cast<std::size_t>(ArrayAccess::node(a)))];
    to.insert(to.end(), names.begin(), names.end());
  }
}

}  // namespace

ValueAndGrad value_and_grad_impl(
    const Tree<Array>& params,
    const std::function<std::pair<Array, Tree<Array>>(const Tree<Array>&)>& fn) {
  const std::vector<Array> leaves = params.leaves();
  if (leaves.empty())
    throw SpecError("[grad] the first argument holds no arrays to differentiate by");
  for (const Array& a : leaves) {
    if (!is_float(a.dtype())) {
      throw SpecError(fmt::format("[grad] cannot differentiate by a {} array", name(a.dtype())));
    }
  }
  TraceContext* outer = current_trace();
  TraceContext inner(outer != nullptr ? outer->executor : ArrayAccess::executor(leaves[0]),
                     outer != nullptr ? outer->mesh : leaves[0].mesh());
  inner.capture_foreign = true;
  inner.shard_map_depth = outer != nullptr ? outer->shard_map_depth : 0;
  inner.annotation_rules = outer != nullptr ? outer->annotation_rules : nullptr;
  inner.allow_unknown_annotations = outer == nullptr || outer->allow_unknown_annotations;
  Graph g;  // outputs: the loss, then the aux leaves
  Tree<int> aux_structure;
  {
    TraceScope scope(&inner);
    std::vector<Array> tracers;
    for (const Array& a : leaves) tracers.push_back(add_parameter(inner, outer, a));
    std::size_t k = 0;
    const Tree<Array> traced = params.map([&](const Array&) { return tracers[k++]; });
    auto [loss, aux] = fn(traced);
    if (loss.shape().rank() != 0 || !is_float(loss.dtype())) {
      throw SpecError(fmt::format("[grad] the function must return a float scalar, got {}{}",
                                  name(loss.dtype()), loss.shape().to_string()));
    }
    std::vector<Array> outputs{loss};
    int next_output = 1;
    aux_structure = aux.map([&](const Array& a) {
      outputs.push_back(a);
      return next_output++;
    });
    g = inner.finish(outputs);
  }
  const ValueId loss_node = g.outputs[0];
  const std::size_t num_args = leaves.size();
  const Array& placement = leaves[0];
  // The forward pass again, as ops of the enclosing trace (or eagerly).
  ValueMap<Array> vals(g.size());
  if (outer != nullptr) outer->begin_phase(StepPhase::kForward);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const ValueId id = value_id(i);
    const Node& n = g[id];
    if (n.is(prim::input)) {
      const auto input = static_cast<std::size_t>(n.attr<InputAttrs>().index);
      vals[id] = input < num_args ? leaves[input] : inner.captured[input - num_args];
      continue;
    }
    std::vector<Array> ins;
    for (const ValueId o : n.operands) ins.push_back(vals[o]);
    // Each replayed op keeps the scope it was traced under (the whole nested path) and its
    // composite op, as the backward ops do.
    const NamedAs as_traced(n);
    vals[id] = apply(*n.op, n.attrs, ins, &placement);
  }
  if (outer != nullptr) {
    keep_names(g, vals, *outer);
    outer->begin_phase(StepPhase::kBackward);
  }
  const ValueMap<Array> ct = backward(g, inner, vals, placement, loss_node);
  std::vector<Array> grads(leaves.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.is(prim::input) && static_cast<std::size_t>(n.attr<InputAttrs>().index) < num_args) {
      grads[static_cast<std::size_t>(n.attr<InputAttrs>().index)] = ct[value_id(i)];
    }
  }
  for (std::size_t p = 0; p < leaves.size(); ++p) {
    const Array& leaf = leaves[p];
    Array gr = grads[p].valid() ? grads[p] : full(leaf.shape(), leaf.dtype(), 0, leaf);
    // Gradients take their parameter's sharding (outside sjit, at once; inside, the parameter's
    // sharding is fixed when the program is compiled).
    gr = leaf.is_tracer() ? with_sharding_like(gr, leaf)
                          : with_sharding_constraint(gr, leaf.sharding().spec());
    grads[p] = gr;
  }
  std::size_t k = 0;
  ValueAndGrad out;
  out.value = vals[loss_node];
  out.grads = params.map([&](const Array&) { return grads[k++]; });
  out.aux = aux_structure.map(
      [&](int output) { return vals[g.outputs[static_cast<std::size_t>(output)]]; });
  return out;
}

}  // namespace shardplan::detail

namespace shardplan {

std::vector<Array> custom_vjp(const CustomVjpFwd& fwd, const CustomVjpBwd& bwd,
                              const std::vector<Array>& inputs) {
  detail::TraceContext* ctx = detail::current_trace();
  if (ctx == nullptr) return fwd(inputs).outputs;  // nothing differentiates it
  detail::TraceContext::CustomRegion r;
  r.bwd = std::make_shared<const CustomVjpBwd>(bwd);
  for (const Array& a : inputs) r.inputs.push_back(ctx->node_of(a));
  CustomVjpForward f = fwd(inputs);
  for (const Array& a : f.residuals) r.residuals.push_back(ctx->node_of(a));
  std::vector<Array> outs;
  for (const Array& o : f.outputs) {
    outs.push_back(optimization_barrier(o));
    r.outputs.push_back(ctx->node_of(outs.back()));
  }
  const int region = static_cast<int>(ctx->custom_regions.size());
  for (const detail::ValueId o : r.outputs) ctx->custom_output[o] = region;
  ctx->custom_regions.push_back(std::move(r));
  return outs;
}

}  // namespace shardplan
