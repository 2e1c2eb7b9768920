// The per-device kernels on one thread: the GEMM in each instruction-set variant this CPU runs
// (src/runtime/gemm.hpp) beside plain Eigen as this file is compiled (the library's default flags,
// which is what the GEMM was before the variants), two GEMMs side by side on two threads (the
// ceiling for 8 devices over 2 cores), the pairwise f32 sum beside a left-to-right loop, and
// the loss's row kernels (take_along_axis, fused_log_softmax) beside the composed log_softmax.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <thread>
#include <vector>

#include "gemm.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"

namespace {

using shardplan::detail::gemm;
using shardplan::detail::GemmIsa;

std::vector<float> filled(std::int64_t n, float v) {
  return std::vector<float>(static_cast<std::size_t>(n), v);
}

void report_flops(benchmark::State& state, double m, double n, double k) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2 * m * n * k * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["GFLOP/s"].value /= 1e9;
}

// y[m, n] = x[m, k] @ w[k, n] (trans_b: w stored [n, k]) in variant `isa`.
void BM_Gemm(benchmark::State& state, GemmIsa isa, bool trans_a, bool trans_b) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const auto a = filled(m * k, 0.5f), b = filled(k * n, 0.25f);
  auto y = filled(m * n, 0);
  for (auto _ : state) {
    gemm(isa, trans_a, trans_b, m, n, k, a.data(), b.data(), y.data());
    benchmark::DoNotOptimize(y.data());
  }
  report_flops(state, m, n, k);
}

// The same product with Eigen compiled as this file is (no -m flags: SSE2 on x86-64).
void BM_GemmPlainEigen(benchmark::State& state) {
  using M = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const M a = M::Constant(m, k, 0.5f), b = M::Constant(k, n, 0.25f);
  M y(m, n);
  for (auto _ : state) {
    y.noalias() = a * b;
    benchmark::DoNotOptimize(y.data());
  }
  report_flops(state, static_cast<double>(m), static_cast<double>(n), static_cast<double>(k));
}

// Two threads each running its own GEMM (the chosen variant): the throughput two devices get
// from two cores when nothing else is shared. GFLOP/s counts both.
void BM_GemmTwoThreads(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const auto a = filled(m * k, 0.5f), b = filled(k * n, 0.25f);
  auto y0 = filled(m * n, 0), y1 = filled(m * n, 0);
  for (auto _ : state) {
    std::thread other([&] { gemm(false, false, m, n, k, a.data(), b.data(), y1.data()); });
    gemm(false, false, m, n, k, a.data(), b.data(), y0.data());
    other.join();
    benchmark::DoNotOptimize(y0.data());
  }
  report_flops(state, 2.0 * static_cast<double>(m), static_cast<double>(n), static_cast<double>(k));
}
// One thread: y[m, n] = x[m, k] @ w[k, n] as `state.range(3)` GEMMs of m / parts rows each (one
// per device of a data-parallel step sharing a core), each with its own x and y blocks and the
// same w: what splitting the rows costs a core when w is packed once per GEMM (last argument 0)
// or once for all of them (1: gemm_shared_b, what the dot's group kernel runs).
void BM_GemmRowsSplit(benchmark::State& state) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const std::int64_t parts = state.range(3), rows = m / parts;
  const auto w = filled(k * n, 0.25f);
  std::vector<std::vector<float>> x, y;
  for (std::int64_t p = 0; p < parts; ++p) {
    x.push_back(filled(rows * k, 0.5f));
    y.push_back(filled(rows * n, 0));
  }
  const bool shared = state.range(4) != 0;
  std::vector<shardplan::detail::GemmRows<float>> rows_of;
  for (std::int64_t p = 0; p < parts; ++p) {
    const auto i = static_cast<std::size_t>(p);
    rows_of.push_back({rows, x[i].data(), y[i].data()});
  }
  for (auto _ : state) {
    if (shared) {
      shardplan::detail::gemm_shared_b<float>(false, false, n, k, w.data(), rows_of);
    } else {
      for (const auto& r : rows_of) gemm(false, false, r.m, n, k, r.a, w.data(), r.y);
    }
    benchmark::DoNotOptimize(y.back().data());
  }
  report_flops(state, static_cast<double>(m), static_cast<double>(n), static_cast<double>(k));
}
BENCHMARK(BM_GemmRowsSplit)
    ->Args({1024, 2048, 2048, 1, 0})
    ->Args({1024, 2048, 2048, 4, 0})
    ->Args({1024, 2048, 2048, 4, 1})
    ->Args({2048, 1024, 1024, 1, 0})
    ->Args({2048, 1024, 1024, 4, 0})
    ->Args({2048, 1024, 1024, 4, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_GemmPlainEigen)
    ->Args({1024, 1024, 1024})
    ->Args({512, 1024, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_GemmTwoThreads)
    ->Args({1024, 1024, 1024})
    ->Args({512, 1024, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// sum() of 2^22 f32 values on one device (the pairwise kernel) beside a left-to-right loop.
void BM_SumF32Pairwise(benchmark::State& state) {
  using namespace shardplan;
  const Mesh mesh = Mesh::parse("x:1", 1);
  const Executor ex(1);
  const Array x =
      Array::normal(Shape{std::int64_t{1} << 22}, DType::kF32, NamedSharding(mesh, P()), ex, 1);
  for (auto _ : state) benchmark::DoNotOptimize(sum(x));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * (4 << 22));
}
void BM_SumF32Loop(benchmark::State& state) {
  const auto x = filled(std::int64_t{1} << 22, 0.5f);
  for (auto _ : state) {
    float s = 0;
    for (const float v : x) s += v;
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * (4 << 22));
}
BENCHMARK(BM_SumF32Pairwise)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SumF32Loop)->Unit(benchmark::kMillisecond)->UseRealTime();

// nll_loss's read of the log-probabilities at the targets: take_along_axis of one element from
// each of 512 rows of 32,000 (Llama 2's vocabulary) on one device; fused_log_softmax of the same
// rows (the kernel before it, which reads every element) beside log_softmax composed of its
// max, exp, sum and log kernels (the baseline).
struct Rows {
  shardplan::Mesh mesh = shardplan::Mesh::parse("x:1", 1);
  shardplan::Executor ex{1};
  shardplan::Array x = shardplan::device_put(
      shardplan::Tensor::normal(shardplan::Shape{512, 32000}, shardplan::DType::kF32, 2),
      shardplan::NamedSharding(mesh, shardplan::P()), ex);
};
void BM_TakeAlongAxisRows(benchmark::State& state) {
  using namespace shardplan;
  const Rows r;
  std::vector<std::int32_t> at(512);
  for (std::size_t i = 0; i < at.size(); ++i) at[i] = static_cast<std::int32_t>(i * 61 % 32000);
  const Array idx =
      device_put(Tensor::from<std::int32_t>(Shape{512, 1}, at), NamedSharding(r.mesh, P()), r.ex);
  for (auto _ : state) benchmark::DoNotOptimize(take_along_axis(r.x, idx, 1));
}
void BM_FusedLogSoftmaxRows(benchmark::State& state) {
  const Rows r;
  for (auto _ : state) benchmark::DoNotOptimize(shardplan::fused_log_softmax(r.x, 1));
}
void BM_LogSoftmaxRows(benchmark::State& state) {  // the composed op: max, exp, sum, log
  const Rows r;
  for (auto _ : state) benchmark::DoNotOptimize(shardplan::log_softmax(r.x, 1));
}
BENCHMARK(BM_TakeAlongAxisRows)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_LogSoftmaxRows)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_FusedLogSoftmaxRows)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  for (const GemmIsa isa : shardplan::detail::gemm_isas()) {
    const std::string name(shardplan::detail::name(isa));
    for (const auto& [suffix, ta, tb] :
         {std::tuple{"", false, false}, std::tuple{"_BT", false, true},
          std::tuple{"_AT", true, false}}) {
      benchmark::RegisterBenchmark(("BM_Gemm_" + name + suffix).c_str(), BM_Gemm, isa, ta, tb)
          ->Args({1024, 1024, 1024})
          ->Args({512, 1024, 1024})
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
