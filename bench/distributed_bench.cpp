// The process group's collectives against Open MPI's own on the same bytes, in one run.
// Run it under mpirun (scripts/bench_distributed.sh):
//   mpirun -np 2 build-release/bench/distributed_bench
// Every benchmark has a fixed iteration count, so that all processes run the same collectives;
// process 0 prints. busbw follows the nccl-tests convention: algbw = S / time, times 2(n-1)/n
// for all-reduce and (n-1)/n for all-gather (S: each process's buffer for all-reduce, the
// gathered bytes for all-gather).
#include <benchmark/benchmark.h>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstddef>
#include <vector>

#include "shardplan/distributed.hpp"

namespace {

namespace dist = shardplan::distributed;

constexpr int kIterations = 20;

void set_counters(benchmark::State& state, double bytes, double bus_factor) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.counters["busbw_GBps"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * bytes * bus_factor / 1e9,
                         benchmark::Counter::kIsRate);
}

std::vector<float> floats(std::int64_t bytes) {
  std::vector<float> v(static_cast<std::size_t>(bytes) / sizeof(float));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1000) * 1e-3f;
  return v;
}

void BM_AllreduceSum(benchmark::State& state) {
  auto data = floats(state.range(0));
  const double n = dist::process_count();
  for (auto _ : state) {
    dist::allreduce_sum(data);
    benchmark::DoNotOptimize(data.data());
  }
  set_counters(state, static_cast<double>(state.range(0)), 2 * (n - 1) / n);
}

void BM_MpiAllreduce(benchmark::State& state) {
  auto data = floats(state.range(0));
  const double n = dist::process_count();
  for (auto _ : state) {
    MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    benchmark::DoNotOptimize(data.data());
  }
  set_counters(state, static_cast<double>(state.range(0)), 2 * (n - 1) / n);
}

void BM_AllgatherBytes(benchmark::State& state) {
  const int p = dist::process_count();
  std::vector<std::byte> mine(static_cast<std::size_t>(state.range(0) / p), std::byte{1});
  for (auto _ : state) {
    auto all = dist::allgather_bytes(mine);
    benchmark::DoNotOptimize(all.data());
  }
  set_counters(state, static_cast<double>(state.range(0)), (p - 1.0) / p);
}

void BM_MpiAllgather(benchmark::State& state) {
  const int p = dist::process_count();
  const std::size_t each = static_cast<std::size_t>(state.range(0) / p);
  std::vector<std::byte> mine(each, std::byte{1});
  std::vector<std::byte> all(each * static_cast<std::size_t>(p));
  for (auto _ : state) {
    MPI_Allgather(mine.data(), static_cast<int>(each), MPI_BYTE, all.data(), static_cast<int>(each),
                  MPI_BYTE, MPI_COMM_WORLD);
    benchmark::DoNotOptimize(all.data());
  }
  set_counters(state, static_cast<double>(state.range(0)), (p - 1.0) / p);
}

// Ours and MPI's alternate per size, so that both see the same machine.
BENCHMARK(BM_AllreduceSum)->Arg(16 << 20)->Arg(64 << 20)->Iterations(kIterations)->UseRealTime();
BENCHMARK(BM_MpiAllreduce)->Arg(16 << 20)->Arg(64 << 20)->Iterations(kIterations)->UseRealTime();
BENCHMARK(BM_AllgatherBytes)->Arg(16 << 20)->Arg(64 << 20)->Iterations(kIterations)->UseRealTime();
BENCHMARK(BM_MpiAllgather)->Arg(16 << 20)->Arg(64 << 20)->Iterations(kIterations)->UseRealTime();

/// What processes other than 0 report: nothing.
class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  dist::initialize();
  benchmark::Initialize(&argc, argv);
  if (dist::process_index() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Silent silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  return 0;
}
