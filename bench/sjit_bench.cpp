// sjit on 8 virtual devices beside 1 device and beside plain Eigen, same run: the guide's matmul
// and MLP forward, and the dispatch overhead of a cached call.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "../examples/mlp.hpp"
#include "paired.hpp"
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

// An eager elementwise op (x + x) on a small array on 2 devices, outside any sjit. First call:
// each iteration a shape the executor has not run (cycling through more shapes than its cache of
// one-op programs holds), so the op's program is compiled: what compile() costs a one-op
// program. Cached: the same shape every iteration (the program is found, then run).
void eager_add_case(benchmark::State& state, bool first_call) {
  static const Executor exec2(2);
  const Mesh mesh = Mesh::parse("data:2", 2);
  const std::size_t shapes = first_call ? 5000 : 1;  // above kEagerProgramsKept (4096)
  std::vector<Array> xs;
  xs.reserve(shapes);
  for (std::size_t k = 0; k < shapes; ++k) {
    const auto rows = static_cast<std::int64_t>(2 * (1 + k % 100));
    const auto cols = static_cast<std::int64_t>(1 + k / 100);
    xs.push_back(Array::ones(Shape{rows, cols}, DType::kF32, NamedSharding(mesh, P("data")), exec2));
  }
  std::size_t k = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(xs[k] + xs[k]);
    k = (k + 1) % shapes;
  }
}
void BM_EagerAddFirstCall(benchmark::State& s) { eager_add_case(s, true); }
void BM_EagerAddCached(benchmark::State& s) { eager_add_case(s, false); }
BENCHMARK(BM_EagerAddFirstCall)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_EagerAddCached)->Unit(benchmark::kMicrosecond)->UseRealTime();
// For counting under callgrind (docs/performance.md): the first calls above, exactly 1 or 2,001
// of them after the same setup; the two runs' counts differ by 2,000 first calls.
void BM_CountedEagerFirstCalls(benchmark::State& s) { eager_add_case(s, true); }
BENCHMARK(BM_CountedEagerFirstCalls)->Iterations(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CountedEagerFirstCalls)->Iterations(2001)->Unit(benchmark::kMicrosecond);

// The guide's matmul: [N, N] x [N, N], P('a', None) x P(None, 'b') on 4 x 2 devices (no
// communication) vs the same program on one device.
// One call of the matmul on `devices` (8 or 1), compiled and run once beforehand.
// [rows, n] x [n, n] (rows: n unless given); on one device, `own` (if given) is its executor.
std::function<void()> make_matmul(std::int64_t n, int devices, std::int64_t rows = 0,
                                  const Executor* own = nullptr) {
  const Mesh mesh = devices == 8 ? Mesh::parse("a:4,b:2", 8) : Mesh::parse("a:1,b:1", 1);
  const Executor& exec = devices == 8 ? exec8() : own != nullptr ? *own : exec1();
  const Array a = Array::normal(Shape{rows > 0 ? rows : n, n}, DType::kF32,
                                NamedSharding(mesh, P("a", nullptr)), exec, 1);
  const Array b =
      Array::normal(Shape{n, n}, DType::kF32, NamedSharding(mesh, P(nullptr, "b")), exec, 2);
  auto f = sjit(mesh, [](const Array& x, const Array& y) { return matmul(x, y); });
  f(a, b);
  return [f, a, b]() mutable { benchmark::DoNotOptimize(f(a, b)); };
}

void matmul_case(benchmark::State& state, int devices) {
  const std::int64_t n = state.range(0);
  std::function<void()> call = make_matmul(n, devices);
  for (auto _ : state) call();
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
// One forward call on `devices` (8 or 1) over `batch` rows; on one device, `own` (if given) is its
// executor.
std::function<void()> make_mlp_forward(int devices, std::int64_t batch = 2048,
                                       const Executor* own = nullptr) {
  const std::vector<std::int64_t> sizes = {784, 2048, 2048, 2048, 10};
  const Mesh mesh = devices == 8 ? Mesh::parse("data:8", 8) : Mesh::parse("data:1", 1);
  const Executor& exec = devices == 8 ? exec8() : own != nullptr ? *own : exec1();
  std::vector<Tree<Array>> layers;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers.push_back(Tree<Array>::dict(
        {{"w", Array::normal(Shape{sizes[i], sizes[i + 1]}, DType::kF32, NamedSharding(mesh, P()),
                             exec, i, 0, 0.02)},
         {"b", Array::zeros(Shape{sizes[i + 1]}, DType::kF32, NamedSharding(mesh, P()), exec)}}));
  }
  const Tree<Array> params = Tree<Array>::list(layers);
  const Array x =
      Array::normal(Shape{batch, 784}, DType::kF32, NamedSharding(mesh, P("data")), exec, 9);
  auto f = sjit(mesh, &mlp::logits);
  f(params, x);
  return [f, params, x]() mutable { benchmark::DoNotOptimize(f(params, x)); };
}

void mlp_case(benchmark::State& state, int devices) {
  std::function<void()> call = make_mlp_forward(devices);
  for (auto _ : state) call();
}
void BM_MlpForward8Devices(benchmark::State& s) { mlp_case(s, 8); }
void BM_MlpForward1Device(benchmark::State& s) { mlp_case(s, 1); }
BENCHMARK(BM_MlpForward8Devices)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_MlpForward1Device)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

// 8 devices against 1 measured in pairs (issue 14): each iteration times a 1-device call and an
// 8-device call back to back, so that a machine slowing down for a while slows both alike.
// Counters: the median call of each (ms_1, ms_8) and the median of the per-pair speed-ups (x_8).
// With `halves` (two independent 1-device calls on half the data, on two threads: the ceiling
// for 2 cores) also timed in each iteration: ms_halves and x_halves.
void speedup_pairs(benchmark::State& state, std::function<void()> one, std::function<void()> eight,
                   std::function<void()> halves = {}) {
  std::vector<double> t1, t8, x, th, xh;
  for (auto _ : state) {
    t1.push_back(bench::ms_of(one));
    t8.push_back(bench::ms_of(eight));
    x.push_back(t1.back() / t8.back());
    if (halves) {
      th.push_back(bench::ms_of(halves));
      xh.push_back(t1.back() / th.back());
    }
  }
  state.counters["ms_1"] = bench::median(t1);
  state.counters["ms_8"] = bench::median(t8);
  state.counters["x_8"] = bench::median(x);
  if (halves) {
    state.counters["ms_halves"] = bench::median(th);
    state.counters["x_halves"] = bench::median(xh);
  }
}

// Two 1-device calls on two threads at once (each made on its own executor).
std::function<void()> side_by_side(std::function<void()> first, std::function<void()> second) {
  return [first, second] {
    std::thread other(second);
    first();
    other.join();
  };
}
const Executor& own_executor(int i) {
  static const Executor a(1), b(1);
  return i == 0 ? a : b;
}
void BM_MatmulSpeedup(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  speedup_pairs(state, make_matmul(n, 1), make_matmul(n, 8),
                side_by_side(make_matmul(n, 1, n / 2, &own_executor(0)),
                             make_matmul(n, 1, n / 2, &own_executor(1))));
}
void BM_MlpForwardSpeedup(benchmark::State& state) {
  speedup_pairs(state, make_mlp_forward(1), make_mlp_forward(8),
                side_by_side(make_mlp_forward(1, 1024, &own_executor(0)),
                             make_mlp_forward(1, 1024, &own_executor(1))));
}
BENCHMARK(BM_MatmulSpeedup)
    ->Arg(1024)
    ->Arg(2048)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);
BENCHMARK(BM_MlpForwardSpeedup)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

// ---- Pending sums carried through linear ops (issue 25) -------------------------------------
// Programs whose sums are reduced once when a pending sum flows through a linear op, and once per
// operand when it does not. Counters: the bytes a device receives (the program's static cost,
// which the run moves: tests/support/check_programs.cpp) and the call's time.
//  - scaled_gradients: 0.5 * (x1^T @ dy1) + 0.5 * (x2^T @ dy2), batch sharded over data:8 (two
//    micro-batches' weight gradients, each scaled: the mean over micro-batches);
//  - reshaped_partials: reshape(a1 @ b1) + reshape(a2 @ b2), the contraction sharded over
//    model:8 (tensor-parallel outputs put back into heads before a residual add).
void pending_case(benchmark::State& state, bool scaled) {
  const Mesh mesh = scaled ? Mesh::parse("data:8", 8) : Mesh::parse("model:8", 8);
  const std::int64_t n = 512;
  const NamedSharding s =
      scaled ? NamedSharding(mesh, P("data", nullptr)) : NamedSharding(mesh, P(nullptr, "model"));
  const NamedSharding t = scaled ? s : NamedSharding(mesh, P("model", nullptr));
  const Array a1 = Array::normal(Shape{n, n}, DType::kF32, s, exec8(), 1);
  const Array b1 = Array::normal(Shape{n, n}, DType::kF32, t, exec8(), 2);
  const Array a2 = Array::normal(Shape{n, n}, DType::kF32, s, exec8(), 3);
  const Array b2 = Array::normal(Shape{n, n}, DType::kF32, t, exec8(), 4);
  auto f = sjit(mesh, [scaled](const Array& x1, const Array& y1, const Array& x2, const Array& y2) {
    if (scaled)
      return matmul(transpose(x1, {1, 0}), y1) * 0.5 + matmul(transpose(x2, {1, 0}), y2) * 0.5;
    const Shape heads{n, 8, n / 8};
    return reshape(matmul(x1, y1), heads) + reshape(matmul(x2, y2), heads);
  });
  std::int64_t bytes = 0;
  for (const auto& [kind, b] : f.lower(a1, b1, a2, b2).cost().bytes_by_kind) bytes += b;
  f(a1, b1, a2, b2);
  for (auto _ : state) benchmark::DoNotOptimize(f(a1, b1, a2, b2));
  state.counters["bytes_per_device"] = static_cast<double>(bytes);
}
void BM_PendingThroughScaledGradients(benchmark::State& s) { pending_case(s, true); }
void BM_PendingThroughReshapedPartials(benchmark::State& s) { pending_case(s, false); }
BENCHMARK(BM_PendingThroughScaledGradients)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PendingThroughReshapedPartials)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
