// shard_map and context parallelism (docs/shard_map.md). First a matmul written per device, with
// the contraction split over y and the partial products summed with lax::psum; then causal
// attention over a sequence split over cp:8 by ring (the tokens in the load-balanced order),
// against the same attention on one device. Prints the largest differences; exits 1 when they
// are not at float32 rounding.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "shardplan/ops.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sjit.hpp"

using namespace shardplan;

double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.get(i) - b.get(i)));
  return m;
}

// Rows of dimension 1 of t in the order `pos` (row p of the result is row pos[p] of t).
Tensor reorder(const Tensor& t, const std::vector<std::int64_t>& pos) {
  Tensor out(t.shape(), t.dtype());
  const std::int64_t rows = t.shape()[1], inner = t.numel() / (t.shape()[0] * rows);
  for (std::int64_t b = 0; b < t.shape()[0]; ++b)
    for (std::int64_t p = 0; p < rows; ++p)
      for (std::int64_t e = 0; e < inner; ++e)
        out.set((b * rows + p) * inner + e,
                t.get((b * rows + pos[static_cast<std::size_t>(p)]) * inner + e));
  return out;
}

int main() {
  const Executor exec(8);
  const Executor one = Executor::process_local(1);

  // 1. A matmul per device: a [8, 16] split ('x', 'y'), b [16, 4] split ('y'); each device
  // multiplies its blocks, psum over y adds the partial products.
  const Mesh xy = Mesh::parse("x:4,y:2", 8);
  const Tensor a = Tensor::normal(Shape{8, 16}, DType::kF32, 1);
  const Tensor b = Tensor::normal(Shape{16, 4}, DType::kF32, 2);
  auto matmul_psum = shard_map(
      [](const Array& ab, const Array& bb) { return lax::psum(matmul(ab, bb), "y"); }, xy,
      {P("x", "y"), P("y", nullptr)}, {P("x", nullptr)});
  const Array c = sjit(xy, matmul_psum)(device_put(a, NamedSharding(xy, P()), exec),
                                        device_put(b, NamedSharding(xy, P()), exec));
  const Mesh single = Mesh::parse("x:1", 1);
  const Tensor c1 = matmul(device_put(a, NamedSharding(single, P()), one),
                           device_put(b, NamedSharding(single, P()), one))
                        .to_host();
  const double d1 = max_diff(c.to_host(), c1);
  std::cout << "matmul with psum over y: " << c.to_string() << ", largest difference from one "
            << "device " << d1 << "\n";

  // 2. Ring attention: [1, T, 8 heads, 32] queries, 4 kv heads, T over cp:8.
  const bool small = std::getenv("SHARDPLAN_EXAMPLE_SMALL") != nullptr;
  const std::int64_t t = small ? 256 : 2048;
  const Mesh cp = Mesh::parse("cp:8", 8);
  const Tensor q = Tensor::normal(Shape{1, t, 8, 32}, DType::kF32, 3);
  const Tensor k = Tensor::normal(Shape{1, t, 4, 32}, DType::kF32, 4);
  const Tensor v = Tensor::normal(Shape{1, t, 4, 32}, DType::kF32, 5);
  const std::vector<std::int64_t> order = load_balanced_positions(t, 8);
  const auto put = [&](const Tensor& x) {
    return device_put(reorder(x, order), NamedSharding(cp, P(nullptr, "cp")), exec);
  };
  auto ring = sjit(cp, [&](const Array& qs, const Array& ks, const Array& vs) {
    return context_parallel_attention(qs, ks, vs, cp, P(nullptr, "cp"), "cp", true);
  });
  const Tensor got = ring(put(q), put(k), put(v)).to_host();
  AttentionOptions causal;
  causal.is_causal = true;
  // The reference on the natural order, then reordered like the ring's output.
  const auto put1 = [&](const Tensor& x) {
    return device_put(x, NamedSharding(Mesh::parse("cp:1", 1), P()), one);
  };
  const Tensor want =
      reorder(dot_product_attention(put1(q), put1(k), put1(v), causal).to_host(), order);
  const double d2 = max_diff(got, want);
  std::cout << "ring attention, " << t << " tokens over cp:8 (load-balanced): largest difference "
            << "from one device " << d2 << "\n";
  return d1 < 1e-4 && d2 < 1e-5 ? 0 : 1;
}
