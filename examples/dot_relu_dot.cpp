// Flax's DotReluDot ("Scale up Flax Modules on multiple devices"): W1 (None, 'model'), W2
// ('model', None), a constraint ('data', 'model') on the hidden activation, the input ('data',
// None). lower() shows where each sharding came from and how the partial sums of the second dot
// over 'model' are reduced for the ('data', None) output. Compared with one device.
#include <cmath>
#include <iostream>

#include "shardplan/sjit.hpp"

using namespace shardplan;

Array dot_relu_dot(const Array& x, const Array& w1, const Array& w2) {
  Array y = relu(matmul(x, w1));
  y = with_sharding_constraint(y, P("data", "model"));
  return matmul(y, w2);
}

int main() {
  const Executor exec(8), one(1);
  const Mesh mesh = Mesh::parse("data:4,model:2", 8);
  const Tensor x = Tensor::normal(Shape{64, 32}, DType::kF32, 1);
  const Tensor w1 = Tensor::normal(Shape{32, 128}, DType::kF32, 2);
  const Tensor w2 = Tensor::normal(Shape{128, 32}, DType::kF32, 3);
  SjitOptions options;
  options.in_shardings = RuleTree::list(
      {RuleTree(P("data", nullptr)), RuleTree(P(nullptr, "model")), RuleTree(P("model", nullptr))});
  options.out_shardings = RuleTree(P("data", nullptr));
  auto step = sjit(MeshShardingHelper(mesh), &dot_relu_dot, options);
  const NamedSharding replicated(mesh, P());
  const Array xs = device_put(x, replicated, exec), w1s = device_put(w1, replicated, exec),
              w2s = device_put(w2, replicated, exec);
  const Lowered low = step.lower(xs, w1s, w2s);
  std::cout << low.jaxpr() << "\n\n" << low.text() << "\n";
  const Array z = step(xs, w1s, w2s);
  const Mesh single = Mesh::parse("data:1,model:1", 1);
  const NamedSharding r1(single, P());
  const Tensor ref =
      dot_relu_dot(device_put(x, r1, one), device_put(w1, r1, one), device_put(w2, r1, one))
          .to_host();
  double e = 0;
  const Tensor got = z.to_host();
  for (std::int64_t i = 0; i < got.numel(); ++i) e = std::max(e, std::abs(got.get(i) - ref.get(i)));
  std::cout << "output " << z << "\nmax difference from one device: " << e << "\n\n";
  // A ('data', None) output needs every partial sum over 'model' in full: an all-reduce (run as
  // a reduce-scatter then an all-gather inside each 'model' pair). When the consumer keeps the
  // output split over 'model' too, as the next layer of a stack does, the partial sums are only
  // reduce-scattered, and half the bytes move:
  SjitOptions scattered = options;
  scattered.out_shardings = RuleTree(P("data", "model"));
  auto step2 = sjit(MeshShardingHelper(mesh), &dot_relu_dot, scattered);
  const Lowered low2 = step2.lower(xs, w1s, w2s);
  std::cout << low2.text();
  const bool has_rs = low2.cost().bytes_by_kind.count(CollectiveKind::kReduceScatter) == 1;
  return e < 1e-4 && z.sharding().spec() == P("data") && has_rs ? 0 : 1;
}
