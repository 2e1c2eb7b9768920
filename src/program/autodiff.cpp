#include "shardplan/autodiff.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "trace.hpp"

namespace shardplan::detail {
namespace {

std::vector<int> iota_vec(int from, int to) {
  std::vector<int> v;
  for (int i = from; i < to; ++i) v.push_back(i);
  return v;
}

std::vector<int> free_dims(int rank, const std::vector<int>& batch,
                           const std::vector<int>& contract) {
  std::vector<int> f;
  for (int d = 0; d < rank; ++d) {
    if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
        std::find(contract.begin(), contract.end(), d) == contract.end()) {
      f.push_back(d);
    }
  }
  return f;
}

// The permutation that puts a result whose dimension t is operand dimension order[t] back in
// operand order.
std::vector<int> back_to(const std::vector<int>& order) {
  std::vector<int> perm(order.size());
  for (std::size_t t = 0; t < order.size(); ++t)
    perm[static_cast<std::size_t>(order[t])] = static_cast<int>(t);
  return perm;
}

Array maybe_transpose(const Array& x, const std::vector<int>& perm) {
  for (std::size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int>(i)) return transpose(x, perm);
  }
  return x;
}

// Gradient of dot_general with respect to its lhs (rhs when `for_rhs`): a dot of the cotangent
// with the other operand over the other operand's free dimensions, put back in order.
Array dot_vjp(const Array& g, const Array& lhs, const Array& rhs, const DotDims& d, bool for_rhs) {
  const int nb = static_cast<int>(d.lhs_batch.size());
  const auto lfree = free_dims(lhs.shape().rank(), d.lhs_batch, d.lhs_contract);
  const auto rfree = free_dims(rhs.shape().rank(), d.rhs_batch, d.rhs_contract);
  const int nl = static_cast<int>(lfree.size());
  const int nr = static_cast<int>(rfree.size());
  // g dims: [batch (nb), lhs free (nl), rhs free (nr)].
  const std::vector<int> g_batch = iota_vec(0, nb);
  if (!for_rhs) {
    DotDims dd{g_batch, d.rhs_batch, iota_vec(nb + nl, nb + nl + nr), rfree};
    const Array r = dot_general(g, rhs, dd);
    // Result dims: batch, lhs free, then rhs's remaining dims (its contracting dims, ascending),
    // each standing for the lhs dimension paired with it.
    std::vector<std::pair<int, int>> rc;
    for (std::size_t j = 0; j < d.rhs_contract.size(); ++j)
      rc.emplace_back(d.rhs_contract[j], d.lhs_contract[j]);
    std::sort(rc.begin(), rc.end());
    std::vector<int> order = d.lhs_batch;
    order.insert(order.end(), lfree.begin(), lfree.end());
    for (const auto& [r_dim, l_dim] : rc) order.push_back(l_dim);
    return maybe_transpose(r, back_to(order));
  }
  DotDims dd{g_batch, d.lhs_batch, iota_vec(nb, nb + nl), lfree};
  const Array r = dot_general(g, lhs, dd);
  std::vector<std::pair<int, int>> lc;
  for (std::size_t j = 0; j < d.lhs_contract.size(); ++j)
    lc.emplace_back(d.lhs_contract[j], d.rhs_contract[j]);
  std::sort(lc.begin(), lc.end());
  std::vector<int> order = d.rhs_batch;
  order.insert(order.end(), rfree.begin(), rfree.end());
  for (const auto& [l_dim, r_dim] : lc) order.push_back(r_dim);
  return maybe_transpose(r, back_to(order));
}

Array zeros(const Shape& shape, DType dtype, const Array& like) {
  return full(shape, dtype, 0, like);
}

Array sign(const Array& x) {
  const Array zero = full_like(x, 0);
  return where(greater(x, zero), full_like(x, 1), where(less(x, zero), full_like(x, -1), zero));
}

// Cotangents of the operands of `n` (empty where none) given its result's cotangent `g`.
std::vector<Array> vjp(const Node& n, const std::vector<Array>& in, const Array& out,
                       const Array& g) {
  const auto dt = [&](const Array& a) { return a.dtype(); };
  switch (n.op) {
    case Op::kNeg:
      return {-g};
    case Op::kExp:
      return {g * out};
    case Op::kLog:
      return {g / in[0]};
    case Op::kSqrt:
      return {g * 0.5 / out};
    case Op::kRsqrt:
      return {g * -0.5 * out / in[0]};
    case Op::kSin:
      return {g * cos(in[0])};
    case Op::kCos:
      return {-(g * sin(in[0]))};
    case Op::kTanh:
      return {g * (1.0 - out * out)};
    case Op::kRelu:
      return {g * astype(greater(in[0], full_like(in[0], 0)), dt(g))};
    case Op::kSigmoid:
      return {g * out * (1.0 - out)};
    case Op::kAbs:
      return {g * sign(in[0])};
    case Op::kGelu: {
      const Array& x = in[0];
      const double c = std::sqrt(2.0 / 3.141592653589793);
      const Array t = tanh((x + x * x * x * 0.044715) * c);
      const Array dt_dx = (1.0 - t * t) * ((x * x * (3 * 0.044715) + 1.0) * c);
      return {g * ((t + 1.0) * 0.5 + x * 0.5 * dt_dx)};
    }
    case Op::kAdd:
      return {g, g};
    case Op::kSub:
      return {g, -g};
    case Op::kMul:
      return {g * in[1], g * in[0]};
    case Op::kDiv:
      return {g / in[1], -(g * in[0] / (in[1] * in[1]))};
    case Op::kMax:
    case Op::kMin: {
      // Ties split the cotangent evenly, as JAX does.
      const Array a_wins =
          astype(n.op == Op::kMax ? greater(in[0], in[1]) : less(in[0], in[1]), dt(g));
      const Array tie = astype(equal(in[0], in[1]), dt(g));
      const Array wa = a_wins + tie * 0.5;
      return {g * wa, g * (1.0 - wa)};
    }
    case Op::kPow: {
      const Array& a = in[0];
      const Array& b = in[1];
      return {g * b * power(a, b - 1.0), g * out * log(a)};
    }
    case Op::kEq:
    case Op::kNe:
    case Op::kLt:
    case Op::kLe:
    case Op::kGt:
    case Op::kGe:
      return {Array(), Array()};
    case Op::kSelect: {
      const Array zero = full_like(g, 0);
      return {Array(), where(in[0], g, zero), where(in[0], zero, g)};
    }
    case Op::kConvert: {
      const DType from = in[0].dtype();
      if (from == DType::kI32 || from == DType::kI64 || from == DType::kBool) return {Array()};
      return {astype(g, from)};
    }
    case Op::kDot:
      return {dot_vjp(g, in[0], in[1], n.dot, false), dot_vjp(g, in[0], in[1], n.dot, true)};
    case Op::kReduceSum: {
      std::vector<std::int64_t> keep = in[0].shape().dims();
      for (const int a : n.axes) keep[static_cast<std::size_t>(a)] = 1;
      return {broadcast_to(reshape(g, Shape(keep)), in[0].shape())};
    }
    case Op::kReduceMax:
    case Op::kReduceMin: {
      std::vector<std::int64_t> keep = in[0].shape().dims();
      for (const int a : n.axes) keep[static_cast<std::size_t>(a)] = 1;
      const Array y = broadcast_to(reshape(out, Shape(keep)), in[0].shape());
      const Array mask = astype(equal(in[0], y), dt(g));
      const Array count = broadcast_to(sum(mask, n.axes, true), in[0].shape());
      return {broadcast_to(reshape(g, Shape(keep)), in[0].shape()) * mask / count};
    }
    case Op::kReshape:
      return {reshape(g, in[0].shape())};
    case Op::kTranspose:
      return {transpose(g, back_to(n.axes))};
    case Op::kBroadcast: {
      const Shape& s = in[0].shape();
      std::vector<int> summed;
      for (int d = 0; d < n.type.shape.rank(); ++d) {
        const auto it = std::find(n.axes.begin(), n.axes.end(), d);
        if (it == n.axes.end()) {
          summed.push_back(d);
        } else if (s[static_cast<int>(it - n.axes.begin())] != n.type.shape[d]) {
          summed.push_back(d);  // a size-1 dimension broadcast
        }
      }
      const Array r = summed.empty() ? g : sum(g, summed, true);
      return {reshape(r, s)};
    }
    case Op::kSlice: {
      Array r = g;
      const Shape& s = in[0].shape();
      for (int d = 0; d < s.rank(); ++d) {
        const auto i = static_cast<std::size_t>(d);
        std::vector<Array> parts;
        std::vector<std::int64_t> dims = r.shape().dims();
        if (n.starts[i] > 0) {
          dims[i] = n.starts[i];
          parts.push_back(zeros(Shape(dims), dt(g), g));
        }
        parts.push_back(r);
        if (n.limits[i] < s[d]) {
          dims[i] = s[d] - n.limits[i];
          parts.push_back(zeros(Shape(dims), dt(g), g));
        }
        if (parts.size() > 1) r = concatenate(parts, d);
      }
      return {r};
    }
    case Op::kConcat: {
      std::vector<Array> out_cts;
      std::int64_t at = 0;
      for (const Array& x : in) {
        std::vector<std::int64_t> starts(static_cast<std::size_t>(g.shape().rank()), 0);
        std::vector<std::int64_t> limits = g.shape().dims();
        starts[static_cast<std::size_t>(n.axis)] = at;
        at += x.shape()[n.axis];
        limits[static_cast<std::size_t>(n.axis)] = at;
        out_cts.push_back(slice(g, starts, limits));
      }
      return out_cts;
    }
    case Op::kTake: {
      // d/dx of take: scatter-add, written as a contraction of the cotangent with the one-hot
      // encoding of the indices.
      const Array& x = in[0];
      const Array& idx = in[1];
      const int a = n.axis;
      const int ni = idx.shape().rank();
      const Array oh = one_hot(idx, x.shape()[a], dt(g));  // [I..., V]
      // g dims: x[:a], I, x[a+1:]; contract the I dims with oh's first ni dims.
      const std::vector<int> g_idx = iota_vec(a, a + ni);
      const Array r = dot_general(oh, g, DotDims{{}, {}, iota_vec(0, ni), g_idx});
      // r dims: V, x[:a], x[a+1:] -> back to x's order.
      std::vector<int> order = {a};
      for (int d = 0; d < x.shape().rank(); ++d) {
        if (d != a) order.push_back(d);
      }
      return {maybe_transpose(r, back_to(order)), Array()};
    }
    case Op::kConstraint:
      return {n.spec ? with_sharding_constraint(g, *n.spec) : g};
    case Op::kAnnotation:
      return {g};
    case Op::kIota:
    case Op::kConstant:
    case Op::kRandom:
    case Op::kInput:
      return {};
  }
  return {};
}

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
  TraceContext inner(outer != nullptr ? outer->executor : leaves[0].executor(),
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
  const int loss_node = g.outputs[0];
  const std::size_t num_args = leaves.size();
  const Array& placement = leaves[0];
  // The forward pass again, as ops of the enclosing trace (or eagerly).
  std::vector<Array> vals(g.nodes.size());
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == Op::kInput) {
      const auto input = static_cast<std::size_t>(n.index);
      vals[i] = input < num_args ? leaves[input] : inner.captured[input - num_args];
      continue;
    }
    std::vector<Array> ins;
    for (const int o : n.operands) ins.push_back(vals[static_cast<std::size_t>(o)]);
    vals[i] = apply_node(n, ins, &placement);
  }
  // The backward pass: cotangents from the loss down.
  std::vector<Array> ct(g.nodes.size());
  ct[static_cast<std::size_t>(loss_node)] = full_like(vals[static_cast<std::size_t>(loss_node)], 1);
  for (int i = loss_node; i >= 0; --i) {
    const Node& n = g.nodes[static_cast<std::size_t>(i)];
    if (!ct[static_cast<std::size_t>(i)].valid() || n.op == Op::kInput) continue;
    std::vector<Array> ins;
    for (const int o : n.operands) ins.push_back(vals[static_cast<std::size_t>(o)]);
    const auto cts =
        vjp(n, ins, vals[static_cast<std::size_t>(i)], ct[static_cast<std::size_t>(i)]);
    for (std::size_t k = 0; k < cts.size() && k < n.operands.size(); ++k) {
      if (!cts[k].valid()) continue;
      Array& acc = ct[static_cast<std::size_t>(n.operands[k])];
      acc = acc.valid() ? acc + cts[k] : cts[k];
    }
  }
  std::vector<Array> grads(leaves.size());
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op == Op::kInput && static_cast<std::size_t>(n.index) < num_args)
      grads[static_cast<std::size_t>(n.index)] = ct[i];
  }
  for (std::size_t p = 0; p < leaves.size(); ++p) {
    const Array& leaf = leaves[p];
    Array gr = grads[p].valid() ? grads[p] : zeros(leaf.shape(), leaf.dtype(), leaf);
    // Gradients take their parameter's sharding (outside sjit, at once; inside, the parameter's
    // sharding is fixed when the program is compiled).
    gr = leaf.is_tracer() ? with_sharding_like(gr, leaf)
                          : with_sharding_constraint(gr, leaf.sharding().spec());
    grads[p] = gr;
  }
  std::size_t k = 0;
  ValueAndGrad out;
  out.value = vals[static_cast<std::size_t>(loss_node)];
  out.grads = params.map([&](const Array&) { return grads[k++]; });
  out.aux = aux_structure.map([&](int output) {
    return vals[static_cast<std::size_t>(g.outputs[static_cast<std::size_t>(output)])];
  });
  return out;
}

}  // namespace shardplan::detail
