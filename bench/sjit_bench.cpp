// sjit on 8 virtual devices beside 1 device and beside plain Eigen, same run: the guide's matmul
// and MLP forward, and the dispatch overhead of a cached call.
#include <benchmark/benchmark.h>

#include <Eigen/Core>

#include "../examples/mlp.hpp"
#include "shardplan/eigen.hpp"
#include "shardplan/sjit.hpp"

namespace {

using namespace shardplan;

const Executor& exec8() {
  static const Executor e(8);
  return e;
}
const Executor& exec1() {
  static const Executor e(1);
  return e;
}

// A cached call of a small function (x * 2 + 1 on an 8 x 8 array sharded over 8 devices).
void BM_CachedDispatch(benchmark::State& state) {
  const Mesh mesh = Mesh::parse("data:8", 8);
  const Array x = Array::ones(Shape{8, 8}, DType::kF32, NamedSharding(mesh, P("data")), exec8());
  auto f = sjit(mesh, [](const Array& a) { return a * 2.0 + 1.0; });
  f(x);
  for (auto _ : state) benchmark::DoNotOptimize(f(x));
}
BENCHMARK(BM_CachedDispatch)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The guide's matmul: [N, N] x [N, N], P('a', None) x P(None, 'b') on 4 x 2 devices (no
// communication) vs the same program on one device.
void matmul_case(benchmark::State& state, int devices) {
  const std::int64_t n = state.range(0);
  const Mesh mesh = devices == 8 ? Mesh::parse("a:4,b:2", 8) : Mesh::parse("a:1,b:1", 1);
  const Executor& exec = devices == 8 ? exec8() : exec1();
  const Array a =
      Array::normal(Shape{n, n}, DType::kF32, NamedSharding(mesh, P("a", nullptr)), exec, 1);
  const Array b =
      Array::normal(Shape{n, n}, DType::kF32, NamedSharding(mesh, P(nullptr, "b")), exec, 2);
  auto f = sjit(mesh, [](const Array& x, const Array& y) { return matmul(x, y); });
  f(a, b);
  for (auto _ : state) benchmark::DoNotOptimize(f(a, b));
  state.counters["GFLOPs"] =
      benchmark::Counter(2.0 * n * n * n * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
void BM_Matmul8Devices(benchmark::State& s) { matmul_case(s, 8); }
void BM_Matmul1Device(benchmark::State& s) { matmul_case(s, 1); }
BENCHMARK(BM_Matmul8Devices)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Matmul1Device)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same matmul written directly with Eigen (one thread), the baseline for sjit's overhead.
void BM_MatmulEigen(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor a = Tensor::normal(Shape{n, n}, DType::kF32, 1);
  Tensor b = Tensor::normal(Shape{n, n}, DType::kF32, 2);
  Tensor c(Shape{n, n}, DType::kF32);
  for (auto _ : state) {
    as_matrix<float>(c).noalias() = as_matrix<float>(a) * as_matrix<float>(b);
    benchmark::DoNotOptimize(c.bytes());
  }
  state.counters["GFLOPs"] =
      benchmark::Counter(2.0 * n * n * n * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_MatmulEigen)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

// The guide's MLP forward (layer sizes 784, 2048, 2048, 2048, 10; batch 2048), 8-way data
// parallel vs one device.
void mlp_case(benchmark::State& state, int devices) {
  const std::vector<std::int64_t> sizes = {784, 2048, 2048, 2048, 10};
  const Mesh mesh = devices == 8 ? Mesh::parse("data:8", 8) : Mesh::parse("data:1", 1);
  const Executor& exec = devices == 8 ? exec8() : exec1();
  std::vector<Tree<Array>> layers;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers.push_back(Tree<Array>::dict(
        {{"w", Array::normal(Shape{sizes[i], sizes[i + 1]}, DType::kF32, NamedSharding(mesh, P()),
                             exec, i, 0, 0.02)},
         {"b", Array::zeros(Shape{sizes[i + 1]}, DType::kF32, NamedSharding(mesh, P()), exec)}}));
  }
  const Tree<Array> params = Tree<Array>::list(layers);
  const Array x =
      Array::normal(Shape{2048, 784}, DType::kF32, NamedSharding(mesh, P("data")), exec, 9);
  auto f = sjit(mesh, &mlp::logits);
  f(params, x);
  for (auto _ : state) benchmark::DoNotOptimize(f(params, x));
}
void BM_MlpForward8Devices(benchmark::State& s) { mlp_case(s, 8); }
void BM_MlpForward1Device(benchmark::State& s) { mlp_case(s, 1); }
BENCHMARK(BM_MlpForward8Devices)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_MlpForward1Device)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

}  // namespace

BENCHMARK_MAIN();
