// The MLP of JAX's "Distributed arrays and automatic parallelization" guide, trained: 30 SGD steps
// with 8-way data parallelism, then with 4-way data x 2-way tensor parallelism (W2 P(None,
// 'model'), W3 P('model', None)), each beside the single-device run. Prints the losses; exits
// non-zero unless the loss goes down and every step's loss matches one device's.
// SHARDPLAN_EXAMPLE_SMALL=1 (set by ctest) uses hidden layers of 128 instead of 8192.
//
// The same program runs over processes: `mpirun -np 2 example_mlp_training` puts 4 of the 8
// devices in each process (docs/distributed.md). It then also trains both sharded runs on 8
// devices of one process and checks that every loss is the same bits.
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "mlp.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/sjit.hpp"

using namespace shardplan;

namespace {

std::pair<Array, Tree<Array>> loss_fn(const Tree<Array>& params, const Array& x, const Array& y) {
  const Array l = mlp::logits(params, x);
  return {mean(cross_entropy(l, y)), Tree<Array>::dict({{"accuracy", mlp::accuracy(l, y)}})};
}

std::vector<double> train(const std::vector<std::int64_t>& sizes, std::vector<double>& accuracy,
                          const Mesh& mesh, const Executor& exec,
                          const std::vector<PartitionSpec>& w_specs,
                          const std::vector<PartitionSpec>& b_specs, const PartitionSpec& batch) {
  std::vector<Tree<Array>> layers;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(sizes[i]));
    layers.push_back(Tree<Array>::dict(
        {{"w", Array::normal(Shape{sizes[i], sizes[i + 1]}, DType::kF32,
                             NamedSharding(mesh, w_specs[i]), exec, 10 + i, 0, scale)},
         {"b",
          Array::zeros(Shape{sizes[i + 1]}, DType::kF32, NamedSharding(mesh, b_specs[i]), exec)}}));
  }
  Tree<Array> params = Tree<Array>::list(layers);
  const Array x =
      Array::normal(Shape{128, sizes.front()}, DType::kF32, NamedSharding(mesh, batch), exec, 1);
  std::vector<std::int32_t> lab;
  for (int i = 0; i < 128; ++i) lab.push_back(i % 10);
  const Array y =
      device_put(Tensor::from<std::int32_t>(Shape{128}, lab), NamedSharding(mesh, batch), exec);
  const Optimizer sgd = Optimizer::sgd(0.05);
  Tree<Array> state = sgd.init(params);
  SjitOptions o;
  o.donate_argnums = {0};
  auto step = sjit(
      mesh,
      [&](const Tree<Array>& p, const Tree<Array>& s, const Array& xb, const Array& yb) {
        const auto [loss_aux, g] = value_and_grad_with_aux(loss_fn)(p, xb, yb);
        auto [np, ns] = sgd.update(g, s, p);
        return Tree<Array>::dict({{"loss", loss_aux.first},
                                  {"accuracy", loss_aux.second.at("accuracy")},
                                  {"params", np},
                                  {"state", ns}});
      },
      o);
  std::vector<double> losses;
  for (int i = 0; i < 30; ++i) {
    const Tree<Array> out = step(params, state, x, y);
    params = out.at("params");
    state = out.at("state");
    losses.push_back(out.at("loss").leaf().to_host().get(0));
    accuracy.push_back(out.at("accuracy").leaf().to_host().get(0));
  }
  return losses;
}

}  // namespace

int main() {
  const std::int64_t hidden = std::getenv("SHARDPLAN_EXAMPLE_SMALL") != nullptr ? 128 : 8192;
  const std::vector<std::int64_t> sizes = {784, hidden, hidden, hidden, 10};
  // One device of this process for the reference; 8 devices over however many processes run.
  const Executor one = Executor::process_local(1), eight(8);
  const bool processes = distributed::process_count() > 1;
  const bool print = distributed::process_index() == 0;
  const std::vector<PartitionSpec> none(4, P());
  std::vector<double> acc1, acc8, acc42;
  const auto single = train(sizes, acc1, Mesh::parse("batch:1,model:1", 1), one, none, none, P());
  const auto dp = train(sizes, acc8, Mesh::parse("batch:8", 8), eight, none, none, P("batch"));
  const auto tp = train(sizes, acc42, Mesh::parse("batch:4,model:2", 8), eight,
                        {P(), P(nullptr, "model"), P("model", nullptr), P()},
                        {P(), P("model"), P(), P()}, P("batch"));
  double most = 0;
  for (std::size_t i = 0; i < single.size(); ++i) {
    if (print) {
      std::cout << "step " << i << "  loss: 1 device " << single[i] << ", 8-way data " << dp[i]
                << ", 4x2 data x tensor " << tp[i] << "  accuracy " << acc1[i] << ", "
                << acc8[i] << ", " << acc42[i] << "\n";
    }
    most = std::max({most, std::abs(dp[i] - single[i]), std::abs(tp[i] - single[i])});
  }
  bool ok = single.back() < single.front() && most < 1e-3;
  if (print) std::cout << "largest difference from one device: " << most << "\n";
  if (processes) {
    // The same runs on 8 devices of this process alone: the same bits, step by step.
    const Executor here = Executor::process_local(8);
    std::vector<double> a8, a42;
    const auto dp_here = train(sizes, a8, Mesh::parse("batch:8", 8), here, none, none, P("batch"));
    const auto tp_here = train(sizes, a42, Mesh::parse("batch:4,model:2", 8), here,
                               {P(), P(nullptr, "model"), P("model", nullptr), P()},
                               {P(), P("model"), P(), P()}, P("batch"));
    const bool same = dp_here == dp && tp_here == tp;  // doubles converted from f32: exact
    if (print) {
      std::cout << distributed::process_count() << " processes x "
                << eight.local_devices().size() << " devices: every loss "
                << (same ? "is the same bits as" : "DIFFERS from") << " 1 process x 8 devices\n";
    }
    ok = ok && same;
  }
  if (print) std::cout << (ok ? "ok\n" : "FAILED\n");
  return ok ? 0 : 1;
}
