#pragma once
// The multilayer perceptron of JAX's "Distributed arrays" guide, shared by the examples, the
// sjit tests and the benchmarks: params is a list of {"w": [in, out], "b": [out]} layers, ReLU
// between them.
#include "shardplan/ops.hpp"

namespace mlp {

using namespace shardplan;

inline Array logits(const Tree<Array>& params, const Array& x) {
  Array h = x;
  const auto& layers = params.children();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    h = matmul(h, layers[i].at("w").leaf()) + layers[i].at("b").leaf();
    if (i + 1 < layers.size()) h = relu(h);
  }
  return h;
}

/// Mean cross-entropy against integer labels.
inline Array loss(const Tree<Array>& params, const Array& x, const Array& labels) {
  return mean(cross_entropy(logits(params, x), labels));
}

/// The fraction of positions whose largest logit (over the last axis) is the label's.
inline Array accuracy(const Array& logits, const Array& labels) {
  const int last = logits.shape().rank() - 1;
  const Array is_max = astype(equal(logits, max(logits, {last}, true)), logits.dtype());
  return mean(sum(is_max * one_hot(labels, logits.shape()[last], logits.dtype()), {last}));
}

}  // namespace mlp
