#pragma once
// The benchmarks' MLP training step (the guide's MLP, 784-1024-1024-1024-10, batch 4096,
// forward, backward and SGD update under sjit), shared by train_bench (1 vs 8 devices) and
// distributed_bench (8 devices over processes).
#include <benchmark/benchmark.h>

#include <functional>
#include <memory>

#include "../examples/mlp.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/sjit.hpp"

namespace bench {

inline constexpr std::int64_t kMlpBatch = 4096;
inline const std::vector<std::int64_t> kMlpSizes = {784, 1024, 1024, 1024, 10};

/// The step on `mesh` (its first axis splits the batch) as a function that runs it once, updating
/// the parameters it holds. `sizes`: the layers' widths, the input's first (the last must be 10,
/// the labels' classes).
/// With `sharded_update`, the update is written as ZeRO-1 / XLA's sharded weight update does it:
/// each gradient is reduce-scattered over the batch axis (instead of all-reduced), each device
/// updates its slice of every weight, and the new weights are all-gathered: the same bytes
/// moved, and 1/n of the update's work per device instead of all of it. Since the partitioner
/// makes the sharded weight update by itself (docs/design.md), the plain step runs the same
/// collectives; this variant stays as the hand-written reference. `fuse` is SjitOptions::fuse
/// (false: each pointwise op a step of its own, to measure what fusion gives).
inline std::function<void()> make_mlp_train_step(const shardplan::Executor& ex,
                                                 const shardplan::Mesh& mesh,
                                                 std::int64_t batch_size = kMlpBatch,
                                                 bool sharded_update = false, bool fuse = true,
                                                 const std::vector<std::int64_t>& sizes = kMlpSizes) {
  using namespace shardplan;
  const PartitionSpec batch = P(mesh.axis_names()[0]);
  struct State {
    Tree<Array> params, opt_state;
    Array x, y;
    Optimizer sgd = Optimizer::sgd(0.01);
  };
  auto st = std::make_shared<State>();
  std::vector<Tree<Array>> layers;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers.push_back(Tree<Array>::dict(
        {{"w", Array::normal(Shape{sizes[i], sizes[i + 1]}, DType::kF32, NamedSharding(mesh, P()),
                             ex, i, 0, 0.03)},
         {"b", Array::zeros(Shape{sizes[i + 1]}, DType::kF32, NamedSharding(mesh, P()), ex)}}));
  }
  st->params = Tree<Array>::list(layers);
  st->x = Array::normal(Shape{batch_size, sizes[0]}, DType::kF32, NamedSharding(mesh, batch),
                        ex, 9);
  std::vector<std::int32_t> lab;
  for (std::int64_t i = 0; i < batch_size; ++i) lab.push_back(static_cast<std::int32_t>(i % 10));
  st->y = device_put(Tensor::from<std::int32_t>(Shape{batch_size}, lab), NamedSharding(mesh, batch),
                     ex);
  st->opt_state = st->sgd.init(st->params);
  const std::string axis = mesh.axis_names()[0];
  const std::int64_t ways = mesh.axis_sizes()[0];
  SjitOptions options;
  options.fuse = fuse;
  auto step = sjit(
      mesh,
      [st, sharded_update, axis, ways](const Tree<Array>& p, const Tree<Array>& s, const Array& xb,
                                       const Array& yb) {
        const auto [loss, g] = value_and_grad(mlp::loss)(p, xb, yb);
        if (!sharded_update) {
          auto [np, ns] = st->sgd.update(g, s, p);
          return Tree<Array>::dict({{"params", np}, {"state", ns}});
        }
        // Each leaf's first dimension over the batch axis where it divides.
        const auto slice_of = [&](const Tree<Array>& t) {
          return t.map([&](const Array& a) {
            return a.shape().rank() > 0 && a.shape()[0] % ways == 0
                       ? with_sharding_constraint(a, P(axis))
                       : a;
          });
        };
        auto [np, ns] = st->sgd.update(slice_of(g), s, slice_of(p));
        return Tree<Array>::dict(
            {{"params", np.map([](const Array& a) { return with_sharding_constraint(a, P()); })},
             {"state", ns}});
      },
      std::move(options));
  return [st, step]() mutable {
    const Tree<Array> out = step(st->params, st->opt_state, st->x, st->y);
    st->params = out.at("params");
    st->opt_state = out.at("state");
  };
}

/// Runs the step once per benchmark iteration on `mesh`. With `warm_up`, one step is run (and
/// compiled) before the timing starts.
inline void run_mlp_train_steps(benchmark::State& state, const shardplan::Executor& ex,
                                const shardplan::Mesh& mesh, bool warm_up,
                                bool sharded_update = false) {
  std::function<void()> step = make_mlp_train_step(ex, mesh, kMlpBatch, sharded_update);
  if (warm_up) step();
  for (auto _ : state) step();
}

}  // namespace bench
