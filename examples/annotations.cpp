// One function, two programs: the function names its hidden activation with
// with_sharding_annotation(h, "hidden"), and two sjit wrappers give that name two shardings
// (rows over 'data', or columns over 'model') without touching the function. Both agree with one
// device; their programs differ.
#include <cmath>
#include <iostream>

#include "shardplan/sjit.hpp"

using namespace shardplan;

Array block(const Array& x, const Array& w1, const Array& w2) {
  const Array h = with_sharding_annotation(gelu(matmul(x, w1)), "hidden");
  return matmul(h, w2);
}

int main() {
  const Executor exec(8), one(1);
  const Mesh mesh = Mesh::parse("data:4,model:2", 8);
  const Tensor x = Tensor::normal(Shape{32, 16}, DType::kF32, 1);
  const Tensor w1 = Tensor::normal(Shape{16, 64}, DType::kF32, 2);
  const Tensor w2 = Tensor::normal(Shape{64, 16}, DType::kF32, 3);
  const NamedSharding rep(mesh, P());
  const Array xs = device_put(x, rep, exec), w1s = device_put(w1, rep, exec),
              w2s = device_put(w2, rep, exec);
  SjitOptions rows, cols;
  rows.annotation_shardings = {{"hidden", RuleTree(P("data", nullptr))}};
  cols.annotation_shardings = {{"hidden", RuleTree(P(nullptr, "model"))}};
  auto by_rows = sjit(mesh, &block, rows);
  auto by_cols = sjit(mesh, &block, cols);
  std::cout << "hidden sharded by rows:\n" << by_rows.lower(xs, w1s, w2s).text() << "\n";
  std::cout << "hidden sharded by columns:\n" << by_cols.lower(xs, w1s, w2s).text() << "\n";
  const Mesh single = Mesh::parse("data:1,model:1", 1);
  const NamedSharding r1(single, P());
  const Tensor ref =
      block(device_put(x, r1, one), device_put(w1, r1, one), device_put(w2, r1, one)).to_host();
  double e = 0;
  for (const Tensor& got : {by_rows(xs, w1s, w2s).to_host(), by_cols(xs, w1s, w2s).to_host()}) {
    for (std::int64_t i = 0; i < got.numel(); ++i)
      e = std::max(e, std::abs(got.get(i) - ref.get(i)));
  }
  const bool differ = by_rows.lower(xs, w1s, w2s).text() != by_cols.lower(xs, w1s, w2s).text();
  std::cout << "max difference from one device: " << e << "; the programs differ: " << differ
            << "\n";
  return e < 1e-4 && differ ? 0 : 1;
}
