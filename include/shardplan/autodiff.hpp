#pragma once
// Reverse-mode differentiation of functions of sharded arrays, as jax.grad / jax.value_and_grad:
// the function is traced once into the primitive graph, then its forward pass and the
// vector-Jacobian products of every primitive are emitted as ordinary ops. So grad works the
// same outside sjit (eagerly, shard by shard) and inside it (where it becomes part of the traced
// program, with the collectives the shardings need), and gradients come out sharded like their
// parameters: a replicated weight's gradient is all-reduced, an FSDP-sharded one reduce-scattered.

#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/detail/array_tree.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"

namespace shardplan {

namespace detail {

/// The value of `fn(params)` (a scalar of a float dtype) and its gradient with respect to every
/// leaf of `params`, and the auxiliary outputs `fn` returns beside the value.
struct ValueAndGrad {
  Array value;
  Tree<Array> grads;
  Tree<Array> aux;
};
ValueAndGrad value_and_grad_impl(
    const Tree<Array>& params,
    const std::function<std::pair<Array, Tree<Array>>(const Tree<Array>&)>& fn);

}  // namespace detail

/// What the forward function of custom_vjp returns: its outputs, and the values its backward
/// function reads (residuals).
struct CustomVjpForward {
  std::vector<Array> outputs;
  std::vector<Array> residuals;
};
using CustomVjpFwd = std::function<CustomVjpForward(const std::vector<Array>& inputs)>;
/// Given the residuals and one cotangent per output (zeros where none flows), one cotangent per
/// input (an empty Array: none).
using CustomVjpBwd = std::function<std::vector<Array>(const std::vector<Array>& residuals,
                                                      const std::vector<Array>& output_cts)>;

/// jax.custom_vjp: fwd(inputs)'s outputs, differentiated by `bwd` instead of through fwd's ops
/// (value_and_grad calls bwd where the backward pass reaches the outputs, and keeps for it only
/// the residuals). For an algorithm whose backward pass is not the reverse of its ops: ring
/// attention recirculates the keys instead of keeping every block it received. Inside a
/// checkpoint the residuals are recomputed as any value there. Outside differentiation, fwd's
/// outputs.
std::vector<Array> custom_vjp(const CustomVjpFwd& fwd, const CustomVjpBwd& bwd,
                              const std::vector<Array>& inputs);

/// jax.value_and_grad(f): a callable taking f's arguments and returning {f(...), df/dfirst}, the
/// gradient with respect to the first argument (an Array, a Tree<Array> or a registered struct)
/// in the same shape. f returns a scalar Array.
template <class F>
auto value_and_grad(F f) {
  return [f](const auto& params, const auto&... rest) {
    using P = std::remove_cvref_t<decltype(params)>;
    auto r = detail::value_and_grad_impl(detail::to_array_tree(params), [&](const Tree<Array>& p) {
      return std::pair<Array, Tree<Array>>{f(detail::from_array_tree<P>(p), rest...),
                                           Tree<Array>()};
    });
    return std::pair<Array, P>{r.value, detail::from_array_tree<P>(r.grads)};
  };
}

/// value_and_grad with auxiliary outputs (has_aux=True): f returns {loss, aux} with aux a
/// Tree<Array>; the callable returns {{loss, aux}, grads}.
template <class F>
auto value_and_grad_with_aux(F f) {
  return [f](const auto& params, const auto&... rest) {
    using P = std::remove_cvref_t<decltype(params)>;
    auto r = detail::value_and_grad_impl(detail::to_array_tree(params), [&](const Tree<Array>& p) {
      auto [loss, aux] = f(detail::from_array_tree<P>(p), rest...);
      return std::pair<Array, Tree<Array>>{loss, aux};
    });
    return std::pair<std::pair<Array, Tree<Array>>, P>{{r.value, r.aux},
                                                       detail::from_array_tree<P>(r.grads)};
  };
}

/// value_and_grad over micro-batches (gradient accumulation): the array arguments after the
/// first are split along their first dimension into `micro_batches` equal pieces, f's value and
/// gradient are computed on each in turn and averaged, so a step needs the activations of one
/// micro-batch at a time. Equal to value_and_grad(f) on the whole batch when f is a mean over
/// rows. Throws SpecError when a batch does not split evenly.
template <class F>
auto value_and_grad_accumulated(F f, int micro_batches) {
  return [f, micro_batches](const auto& params, const auto&... batch) {
    using P = std::remove_cvref_t<decltype(params)>;
    const auto piece = [micro_batches](const Array& a, int k) {
      const std::int64_t rows = a.shape()[0];
      if (micro_batches < 1 || rows % micro_batches != 0) {
        throw SpecError("[grad] a batch of " + std::to_string(rows) + " rows does not split into " +
                        std::to_string(micro_batches) + " micro-batches");
      }
      std::vector<std::int64_t> starts(static_cast<std::size_t>(a.shape().rank()), 0);
      std::vector<std::int64_t> limits = a.shape().dims();
      starts[0] = rows / micro_batches * k;
      limits[0] = starts[0] + rows / micro_batches;
      return slice(a, starts, limits);
    };
    Array total;
    Tree<Array> grads;
    for (int k = 0; k < micro_batches; ++k) {
      auto [v, g] = value_and_grad(f)(params, piece(batch, k)...);
      const Tree<Array> gt = detail::to_array_tree(g);
      if (k == 0) {
        total = v;
        grads = gt;
      } else {
        total = total + v;
        const auto gl = gt.leaves();
        std::size_t i = 0;
        grads = grads.map([&](const Array& a) { return a + gl[i++]; });
      }
    }
    const double inv = 1.0 / micro_batches;
    grads = grads.map([&](const Array& a) { return a * inv; });
    return std::pair<Array, P>{total * inv, detail::from_array_tree<P>(grads)};
  };
}

/// jax.grad(f): the gradient only.
template <class F>
auto grad(F f) {
  return [f](const auto& params, const auto&... rest) {
    return value_and_grad(f)(params, rest...).second;
  };
}

}  // namespace shardplan
