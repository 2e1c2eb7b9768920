#include "shardplan/autodiff.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "primitive.hpp"
#include "primitives.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "trace.hpp"

namespace shardplan::detail {
namespace {

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16; }

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
  inner.annotation_rules = outer != nullptr ? outer->annotation_rules : nullptr;
  inner.allow_unknown_annotations = outer == nullptr || outer->allow_unknown_annotations;
  Graph g;  // outputs: the loss, then the aux leaves
  Tree<int> aux_structure;
  {
    TraceScope scope(&inner);
    std::vector<Array> tracers;
    for (const Array& a : leaves)
      tracers.push_back(inner.add_argument(TensorType{a.shape(), a.dtype()}));
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
    vals[id] = apply(*n.op, n.attrs, ins, &placement);
  }
  // The backward pass: cotangents from the loss down, each primitive's VJP in turn.
  ValueMap<Array> ct(g.size());
  ct[loss_node] = full_like(vals[loss_node], 1);
  for (std::size_t i = index(loss_node) + 1; i-- > 0;) {
    const ValueId id = value_id(i);
    const Node& n = g[id];
    if (!ct[id].valid() || n.is(prim::input)) continue;
    std::vector<Array> ins;
    for (const ValueId o : n.operands) ins.push_back(vals[o]);
    const std::vector<Array> cts = n.op->vjp(n, ins, vals[id], ct[id]);
    for (std::size_t k = 0; k < cts.size() && k < n.operands.size(); ++k) {
      if (!cts[k].valid()) continue;
      Array& acc = ct[n.operands[k]];
      acc = acc.valid() ? acc + cts[k] : cts[k];
    }
  }
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
