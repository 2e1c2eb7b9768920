#pragma once
// What the ring attention suite's files share (ring_attention_test*.cpp): the inputs, the
// whole-sequence reference, the run of a context-parallel kernel brought back to the natural
// order, and the comparisons.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shardplan/autodiff.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sjit.hpp"

namespace shardplan::ring_test {

constexpr std::int64_t kB = 2, kT = 64, kN = 4, kK = 2, kH = 8;

struct Inputs {
  Tensor q = Tensor::uniform(Shape{kB, kT, kN, kH}, DType::kF32, 1, -1, 1);
  Tensor k = Tensor::uniform(Shape{kB, kT, kK, kH}, DType::kF32, 2, -1, 1);
  Tensor v = Tensor::uniform(Shape{kB, kT, kK, kH}, DType::kF32, 3, -1, 1);
  Tensor w = Tensor::uniform(Shape{kB, kT, kN, kH}, DType::kF32, 4, -1, 1);  // loss weights
};

// Rows of dimension 1 of t in the order `pos` (row p of the result is row pos[p] of t).
inline Tensor reorder(const Tensor& t, const std::vector<std::int64_t>& pos) {
  Tensor out(t.shape(), t.dtype());
  const std::int64_t rows = t.shape()[1], inner = t.numel() / (t.shape()[0] * rows);
  for (std::int64_t b = 0; b < t.shape()[0]; ++b) {
    for (std::int64_t p = 0; p < rows; ++p) {
      for (std::int64_t e = 0; e < inner; ++e) {
        out.set((b * rows + p) * inner + e, t.get((b * rows + pos[static_cast<std::size_t>(p)]) * inner + e));
      }
    }
  }
  return out;
}

inline double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.get(i) - b.get(i)));
  return m;
}

struct Results {
  Tensor out, dq, dk, dv;
};

// sum(attention(q, k, v) * w) and its gradients, the reference on one device.
inline Results reference(const Inputs& in, bool causal) {
  const Executor one = Executor::process_local(1);
  const Mesh m = Mesh::parse("cp:1", 1);
  const auto put = [&](const Tensor& t) { return device_put(t, NamedSharding(m, P()), one); };
  const Array q = put(in.q), k = put(in.k), v = put(in.v), w = put(in.w);
  const AttentionOptions o{.is_causal = causal};
  const auto loss = [&](const Tree<Array>& p) {
    return sum(dot_product_attention(p.at(0).leaf(), p.at(1).leaf(), p.at(2).leaf(), o) * w);
  };
  const Tree<Array> params = Tree<Array>::list({Tree<Array>(q), Tree<Array>(k), Tree<Array>(v)});
  auto [value, grads] = value_and_grad(loss)(params);
  (void)value;
  return {dot_product_attention(q, k, v, o).to_host(), grads.at(0).leaf().to_host(),
          grads.at(1).leaf().to_host(), grads.at(2).leaf().to_host()};
}

// The same by ring (or `kernel`) over `devices` devices of `exec` (sequence over cp, reordered
// when causal), brought back to the natural order; `jit`: inside sjit.
inline Results by_ring(const Inputs& in, bool causal, const Executor& exec, int devices, bool jit,
                       RingRotate rotate = RingRotate::kPermute,
                       ContextKernel kernel = ContextKernel::kRing) {
  const Mesh m = Mesh::parse("cp:" + std::to_string(devices), devices);
  std::vector<std::int64_t> pos(static_cast<std::size_t>(kT));
  for (std::int64_t p = 0; p < kT; ++p) pos[static_cast<std::size_t>(p)] = p;
  if (causal) pos = load_balanced_positions(kT, devices);
  const PartitionSpec spec = P(nullptr, "cp");
  const auto put = [&](const Tensor& t) {
    return device_put(reorder(t, pos), NamedSharding(m, spec), exec);
  };
  const Tree<Array> params =
      Tree<Array>::list({Tree<Array>(put(in.q)), Tree<Array>(put(in.k)), Tree<Array>(put(in.v))});
  const Array w = put(in.w);
  const auto attend = [&](const Tree<Array>& p) {
    return context_parallel_attention(p.at(0).leaf(), p.at(1).leaf(), p.at(2).leaf(), m, spec,
                                      "cp", causal, std::nullopt, rotate, kernel);
  };
  const auto step = [&](const Tree<Array>& p, const Array& weights) {
    auto [value, grads] =
        value_and_grad([&](const Tree<Array>& x) { return sum(attend(x) * weights); })(p);
    (void)value;
    return Tree<Array>::list({Tree<Array>(attend(p)), grads});
  };
  const Tree<Array> got = jit ? sjit(m, step)(params, w) : step(params, w);
  std::vector<std::int64_t> back(static_cast<std::size_t>(kT));  // natural row -> reordered row
  for (std::int64_t p = 0; p < kT; ++p) back[static_cast<std::size_t>(pos[static_cast<std::size_t>(p)])] = p;
  const auto host = [&](const Array& a) { return reorder(a.to_host(), back); };
  const Tree<Array>& g = got.at(1);
  return {host(got.at(0).leaf()), host(g.at(0).leaf()), host(g.at(1).leaf()), host(g.at(2).leaf())};
}

inline void expect_close(const Results& got, const Results& want, double tol, const std::string& what) {
  EXPECT_LT(max_diff(got.out, want.out), tol) << what << " output";
  EXPECT_LT(max_diff(got.dq, want.dq), tol) << what << " dq";
  EXPECT_LT(max_diff(got.dk, want.dk), tol) << what << " dk";
  EXPECT_LT(max_diff(got.dv, want.dv), tol) << what << " dv";
}

inline void expect_bitwise(const Results& got, const Results& want, const std::string& what) {
  EXPECT_EQ(max_diff(got.out, want.out), 0) << what << " output";
  EXPECT_EQ(max_diff(got.dq, want.dq), 0) << what << " dq";
  EXPECT_EQ(max_diff(got.dk, want.dk), 0) << what << " dk";
  EXPECT_EQ(max_diff(got.dv, want.dv), 0) << what << " dv";
}

}  // namespace shardplan::ring_test
