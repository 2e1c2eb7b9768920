// Fused attention (dot_product_attention) against today's decomposed attention
// (softmax(causal_mask(Q K^T * scale)) V with the other ops), forward and backward: the gradient
// of sum(o * w) with respect to q, k and v, under sjit over a 2-device mesh with the heads
// sharded (both cores work). B = 1, T = S = 2048, 16 heads of 64, causal, f32. Each iteration
// times both back to back, alternating which goes first; the counters are the medians
// (ms_fused, ms_decomposed, x_faster) and the compiled programs' peak bytes per device.
#include <benchmark/benchmark.h>

#include <cmath>

#include "paired.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"

namespace {

using namespace shardplan;

constexpr std::int64_t kT = 2048, kHeads = 16, kHeadSize = 64;

Array decomposed(const Array& q, const Array& k, const Array& v) {
  const double scale = 1 / std::sqrt(static_cast<double>(kHeadSize));
  const Array s = matmul(transpose(q, {0, 2, 1, 3}), transpose(k, {0, 2, 3, 1})) * scale;
  return transpose(matmul(softmax(causal_mask(s), -1), transpose(v, {0, 2, 1, 3})), {0, 2, 1, 3});
}

auto step(bool fused) {
  return [fused](const Array& q, const Array& k, const Array& v, const Array& w) {
    const Tree<Array> p = Tree<Array>::dict({{"q", q}, {"k", k}, {"v", v}});
    return value_and_grad([&](const Tree<Array>& t) {
             const Array& a = t.at("q").leaf();
             const Array& b = t.at("k").leaf();
             const Array& c = t.at("v").leaf();
             AttentionOptions o;
             o.is_causal = true;
             return sum((fused ? dot_product_attention(a, b, c, o) : decomposed(a, b, c)) * w);
           })(p)
        .second;
  };
}

// q, k, v and the cotangent's weights w, [1, T, heads, head size] f32, the heads over 2 devices.
struct Inputs {
  Executor exec{2};
  Mesh mesh = Mesh::parse("model:2", 2);
  Array q = put(1), k = put(2), v = put(3), w = put(4);
  Array put(std::uint64_t seed) const {
    return device_put(Tensor::normal(Shape{1, kT, kHeads, kHeadSize}, DType::kF32, seed),
                      NamedSharding(mesh, P(nullptr, nullptr, "model")), exec);
  }
};

void BM_AttentionFusedVsDecomposed(benchmark::State& state) {
  const Inputs in;
  const Mesh& mesh = in.mesh;
  const Array &q = in.q, &k = in.k, &v = in.v, &w = in.w;
  auto fused = sjit(mesh, step(true));
  auto naive = sjit(mesh, step(false));
  const auto run = [&](auto& f) {
    return bench::ms_of([&] { benchmark::DoNotOptimize(f(q, k, v, w)); });
  };
  run(fused);  // compile and warm up both
  run(naive);
  std::vector<double> ms_fused, ms_naive, ratio;
  bool fused_first = true;
  for (auto _ : state) {
    double a = 0, b = 0;
    if (fused_first) {
      a = run(fused);
      b = run(naive);
    } else {
      b = run(naive);
      a = run(fused);
    }
    fused_first = !fused_first;
    ms_fused.push_back(a);
    ms_naive.push_back(b);
    ratio.push_back(b / a);
  }
  state.counters["ms_fused"] = bench::median(ms_fused);
  state.counters["ms_decomposed"] = bench::median(ms_naive);
  state.counters["x_faster"] = bench::median(ratio);
  state.counters["peak_fused"] =
      static_cast<double>(fused.lower(q, k, v, w).cost().peak_bytes.at(0));
  state.counters["peak_decomposed"] =
      static_cast<double>(naive.lower(q, k, v, w).cost().peak_bytes.at(0));
}
BENCHMARK(BM_AttentionFusedVsDecomposed)->Unit(benchmark::kMillisecond)->Iterations(6);

// The fused step alone (forward and backward), for tuning the kernel.
void BM_AttentionFused(benchmark::State& state) {
  const Inputs in;
  const Mesh& mesh = in.mesh;
  const Array &q = in.q, &k = in.k, &v = in.v, &w = in.w;
  auto fused = sjit(mesh, step(true));
  benchmark::DoNotOptimize(fused(q, k, v, w));
  for (auto _ : state) benchmark::DoNotOptimize(fused(q, k, v, w));
}
BENCHMARK(BM_AttentionFused)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
