// JAX's "Distributed arrays and automatic parallelization" guide with sjit: sin of an array
// sharded 4 x 2, a dot of P('a', None) by P(None, 'b') that needs no communication, and the
// guide's MLP with 8-way data parallelism and with 4-way data x 2-way tensor parallelism. Every
// result is compared with the same program on one device; the exit status says whether they
// agree. SHARDPLAN_EXAMPLE_SMALL=1 (set by ctest) shrinks the sizes.
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "mlp.hpp"
#include "shardplan/sjit.hpp"

using namespace shardplan;

namespace {

double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.get(i) - b.get(i)));
  return m;
}

}  // namespace

int main() {
  const bool small = std::getenv("SHARDPLAN_EXAMPLE_SMALL") != nullptr;
  const std::int64_t n = small ? 512 : 8192;
  const Executor exec(8), one(1);
  const Mesh mesh = Mesh::parse("a:4,b:2", 8);
  const Mesh single = Mesh::parse("a:1,b:1", 1);
  bool ok = true;

  // y = jax.device_put(x, NamedSharding(mesh, P('a', 'b'))); z = jnp.sin(y)
  const Tensor x = Tensor::normal(Shape{n, n}, DType::kF32, 0);
  const Array y = device_put(x, NamedSharding(mesh, P("a", "b")), exec);
  auto f_sin = sjit(mesh, [](const Array& v) { return sin(v); });
  const Array z = f_sin(y);
  std::cout << "sin(y): " << z << "\n" << visualize(z);
  const double e_sin =
      max_diff(z.to_host(), sin(device_put(x, NamedSharding(single, P()), one)).to_host());
  std::cout << "  max difference from one device: " << e_sin << "\n\n";
  ok = ok && e_sin == 0;

  // A dot of P('a', None) by P(None, 'b') gives P('a', 'b') with no communication.
  const std::int64_t m = small ? 256 : 2048;
  const Tensor at = Tensor::normal(Shape{m, m}, DType::kF32, 1);
  const Tensor bt = Tensor::normal(Shape{m, m}, DType::kF32, 2);
  const Array a = device_put(at, NamedSharding(mesh, P("a", nullptr)), exec);
  const Array b = device_put(bt, NamedSharding(mesh, P(nullptr, "b")), exec);
  auto f_dot = sjit(mesh, [](const Array& l, const Array& r) { return matmul(l, r); });
  const Array c = f_dot(a, b);
  std::cout << "dot(P('a', None), P(None, 'b')): " << c << "\n" << visualize(c);
  std::cout << f_dot.lower(a, b).text() << "\n";
  const double e_dot = max_diff(c.to_host(), matmul(device_put(at, NamedSharding(single, P()), one),
                                                    device_put(bt, NamedSharding(single, P()), one))
                                                 .to_host());
  std::cout << "  max difference from one device: " << e_dot << "\n\n";
  ok = ok && e_dot < 1e-3 && f_dot.lower(a, b).cost().bytes_by_kind.empty();

  // The guide's MLP: layer_sizes = [784, 8192, 8192, 8192, 10] (512 when small), batch 128.
  const std::int64_t hidden = small ? 512 : 8192;
  const std::vector<std::int64_t> sizes = {784, hidden, hidden, hidden, 10};
  const Tensor xb = Tensor::normal(Shape{128, 784}, DType::kF32, 3);
  std::vector<std::int32_t> lab;
  for (int i = 0; i < 128; ++i) lab.push_back(i % 10);
  const Tensor labels = Tensor::from<std::int32_t>(Shape{128}, lab);
  auto loss_on = [&](const Mesh& on, const Executor& ex, const std::vector<PartitionSpec>& w_specs,
                     const std::vector<PartitionSpec>& b_specs, const PartitionSpec& batch) {
    std::vector<Tree<Array>> layers;
    for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
      const double scale = 1.0 / std::sqrt(static_cast<double>(sizes[i]));
      layers.push_back(Tree<Array>::dict(
          {{"w", Array::normal(Shape{sizes[i], sizes[i + 1]}, DType::kF32,
                               NamedSharding(on, w_specs[i]), ex, 10 + i, 0, scale)},
           {"b",
            Array::zeros(Shape{sizes[i + 1]}, DType::kF32, NamedSharding(on, b_specs[i]), ex)}}));
    }
    auto loss = sjit(on, &mlp::loss);
    return loss(Tree<Array>::list(layers), device_put(xb, NamedSharding(on, batch), ex),
                device_put(labels, NamedSharding(on, batch), ex))
        .to_host()
        .get(0);
  };
  const std::vector<PartitionSpec> none(4, P());
  const double l1 = loss_on(single, one, none, none, P());
  const Mesh dp = Mesh::parse("batch:8", 8);
  const double l_dp = loss_on(dp, exec, none, none, P("batch"));
  const Mesh dptp = Mesh::parse("batch:4,model:2", 8);
  const double l_tp = loss_on(dptp, exec, {P(), P(nullptr, "model"), P("model", nullptr), P()},
                              {P(), P("model"), P(), P()}, P("batch"));
  std::cout << "MLP loss: 1 device " << l1 << ", 8-way data parallel " << l_dp
            << ", 4-way data x 2-way tensor parallel " << l_tp << "\n";
  ok = ok && std::abs(l_dp - l1) < 1e-4 && std::abs(l_tp - l1) < 1e-4;
  std::cout << (ok ? "all equal to the single-device results\n" : "MISMATCH\n");
  return ok ? 0 : 1;
}
