// The runtime on 8 virtual devices: collectives as bus bandwidth (nccl-tests convention) beside a
// two-thread memcpy of the same bytes, reshard costs for common transitions, and the executor's
// overhead for an empty step.
//
// Counters: algbw = S / time (S: the data size of the collective, below); busbw = algbw x
// 2(n-1)/n for all-reduce and x (n-1)/n for all-gather, reduce-scatter and all-to-all;
// moved = bytes copied between devices in all / time (comparable with memcpy's bandwidth).
#include <benchmark/benchmark.h>

#include <cstring>
#include <thread>
#include <vector>

#include "shardplan/collectives.hpp"

namespace {

using namespace shardplan;

constexpr int kDevices = 8;

const Executor& executor() {
  static const Executor exec(kDevices);
  return exec;
}

const Mesh& mesh() {
  static const Mesh m = Mesh::parse("x:8", kDevices);
  return m;
}

void set_counters(benchmark::State& state, double size, double factor, double moved) {
  const double iters = static_cast<double>(state.iterations());
  state.counters["algbw"] =
      benchmark::Counter(size * iters, benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
  state.counters["busbw"] = benchmark::Counter(size * factor * iters, benchmark::Counter::kIsRate,
                                               benchmark::Counter::kIs1024);
  state.counters["moved"] =
      benchmark::Counter(moved * iters, benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

// A pending (partial-sum) f32 array whose every device holds `bytes` of summands.
Array pending(std::int64_t bytes) {
  const NamedSharding s(mesh(), P());
  const Array values = Array::uniform(Shape{bytes / 4}, DType::kF32, s, executor(), 1);
  std::vector<std::shared_ptr<Buffer>> bufs(kDevices);
  for (int d = 0; d < kDevices; ++d) {
    bufs[static_cast<std::size_t>(d)] = std::make_shared<Buffer>(executor().allocate(d, bytes));
    std::memcpy(bufs[static_cast<std::size_t>(d)]->data(), values.shard(d).data(),
                static_cast<std::size_t>(bytes));
  }
  return Array::from_buffers(executor(), Shape{bytes / 4}, DType::kF32, s, bufs,
                             Pending{ReduceOp::kSum, {"x"}});
}

constexpr double kN = kDevices;

// S = the gathered size (each device ends with S).
void BM_AllGather(benchmark::State& state) {
  const std::int64_t size = state.range(0);
  const Array x =
      Array::uniform(Shape{size / 4}, DType::kF32, NamedSharding(mesh(), P("x")), executor(), 1);
  for (auto _ : state) benchmark::DoNotOptimize(all_gather(x, {"x"}));
  set_counters(state, static_cast<double>(size), (kN - 1) / kN,
               (kN - 1) * static_cast<double>(size));
}

// S = each device's buffer (summands in, sums out).
void BM_AllReduce(benchmark::State& state) {
  const std::int64_t size = state.range(0);
  const Array x = pending(size);
  for (auto _ : state) benchmark::DoNotOptimize(all_reduce(x));
  set_counters(state, static_cast<double>(size), 2 * (kN - 1) / kN,
               2 * (kN - 1) * static_cast<double>(size));
}

// S = each device's input (summands); each device ends with S / n.
void BM_ReduceScatter(benchmark::State& state) {
  const std::int64_t size = state.range(0);
  const Array x = pending(size);
  for (auto _ : state) benchmark::DoNotOptimize(reduce_scatter(x, 0));
  set_counters(state, static_cast<double>(size), (kN - 1) / kN,
               (kN - 1) * static_cast<double>(size));
}

// S = each device's buffer; it keeps 1/n of it and receives the rest from the others.
void BM_AllToAll(benchmark::State& state) {
  const std::int64_t size = state.range(0);  // per device
  // Rows sharded over x, moved to columns: each device holds `size` bytes before and after.
  const std::int64_t rows = 1024;
  const std::int64_t cols = size / 4 * kDevices / rows;
  const Array y =
      Array::uniform(Shape{rows, cols}, DType::kF32, NamedSharding(mesh(), P("x")), executor(), 1);
  for (auto _ : state) benchmark::DoNotOptimize(all_to_all(y, {"x"}, 0, 1));
  set_counters(state, static_cast<double>(size), (kN - 1) / kN,
               (kN - 1) * static_cast<double>(size));
}

// Two threads copying `bytes` (half each) between buffers touched beforehand.
void BM_Memcpy2Threads(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::thread t([&] { std::memcpy(dst.data(), src.data(), bytes / 2); });
    std::memcpy(dst.data() + bytes / 2, src.data() + bytes / 2, bytes - bytes / 2);
    t.join();
    benchmark::DoNotOptimize(dst.data());
  }
  state.counters["bw"] =
      benchmark::Counter(static_cast<double>(bytes) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

constexpr std::int64_t kMiB = 1 << 20;

BENCHMARK(BM_AllGather)
    ->Arg(16 * kMiB)
    ->Arg(64 * kMiB)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AllReduce)
    ->Arg(16 * kMiB)
    ->Arg(64 * kMiB)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_ReduceScatter)
    ->Arg(16 * kMiB)
    ->Arg(64 * kMiB)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AllToAll)
    ->Arg(16 * kMiB)
    ->Arg(64 * kMiB)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// The bytes each collective above moves in all, for S = 16 and 64 MiB: 7S (all-gather,
// reduce-scatter, all-to-all) and 14S (all-reduce).
BENCHMARK(BM_Memcpy2Threads)
    ->Arg(7 * 16 * kMiB)
    ->Arg(14 * 16 * kMiB)
    ->Arg(7 * 64 * kMiB)
    ->Arg(14 * 64 * kMiB)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Reshard of a 4096 x 4096 f32 array (64 MiB) over a 4 x 2 mesh.
const Mesh& mesh42() {
  static const Mesh m = Mesh::parse("x:4,y:2", kDevices);
  return m;
}

void reshard_case(benchmark::State& state, const PartitionSpec& from, const PartitionSpec& to) {
  const Array a =
      Array::uniform(Shape{4096, 4096}, DType::kF32, NamedSharding(mesh42(), from), executor(), 3);
  const NamedSharding target(mesh42(), to);
  std::int64_t moved = 0;
  for (auto _ : state) {
    ReshardResult r = reshard(a, target);
    moved = 0;
    for (const auto& s : r.steps) moved += s.total_bytes_in();
    benchmark::DoNotOptimize(r);
  }
  state.counters["moved_MiB"] = static_cast<double>(moved) / kMiB;
}

void BM_Reshard_Slice(benchmark::State& s) { reshard_case(s, P(), P("x", "y")); }
void BM_Reshard_AllGather(benchmark::State& s) { reshard_case(s, P("x", "y"), P()); }
void BM_Reshard_AllToAll(benchmark::State& s) { reshard_case(s, P("x", "y"), P("y", "x")); }
void BM_Reshard_RowsToCols(benchmark::State& s) { reshard_case(s, P("x"), P(nullptr, "x")); }
BENCHMARK(BM_Reshard_Slice)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Reshard_AllGather)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Reshard_AllToAll)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Reshard_RowsToCols)->Unit(benchmark::kMillisecond)->UseRealTime();

// One step of 8 empty tasks: the executor's own cost per step.
void BM_EmptyStep(benchmark::State& state) {
  const Executor& exec = executor();
  for (auto _ : state) exec.run([](int) {});
}
BENCHMARK(BM_EmptyStep)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
