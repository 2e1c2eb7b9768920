#include <iostream>
#include "../examples/mlp.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/sjit.hpp"
using namespace shardplan;
int main(int argc, char**) {
  const int devices = argc > 1 ? 8 : 1;
  const Executor ex(devices);
  const Mesh mesh = Mesh::parse(devices == 8 ? "data:8" : "data:1", devices);
  const std::vector<std::int64_t> sizes = {784, 1024, 1024, 1024, 10};
  std::vector<Tree<Array>> layers;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers.push_back(Tree<Array>::dict(
        {{"w", Array::normal(Shape{sizes[i], sizes[i + 1]}, DType::kF32, NamedSharding(mesh, P()), ex, i, 0, 0.03)},
         {"b", Array::zeros(Shape{sizes[i + 1]}, DType::kF32, NamedSharding(mesh, P()), ex)}}));
  }
  Tree<Array> params = Tree<Array>::list(layers);
  Array x = Array::normal(Shape{4096, 784}, DType::kF32, NamedSharding(mesh, P("data")), ex, 9);
  std::vector<std::int32_t> lab(4096, 1);
  Array y = device_put(Tensor::from<std::int32_t>(Shape{4096}, lab), NamedSharding(mesh, P("data")), ex);
  Optimizer sgd = Optimizer::sgd(0.01);
  Tree<Array> s = sgd.init(params);
  auto step = sjit(mesh, [&](const Tree<Array>& p, const Tree<Array>& st, const Array& xb, const Array& yb) {
    const auto [loss, g] = value_and_grad(mlp::loss)(p, xb, yb);
    auto [np, ns] = sgd.update(g, st, p);
    return Tree<Array>::dict({{"params", np}, {"state", ns}});
  });
  std::cout << step.lower(params, s, x, y).text();
}
