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
#include <fmt/format.h>
#include <mpi.h>

#include <cstddef>
#include <vector>

#include "../examples/mlp.hpp"
#include "mlp_train_step.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/sjit.hpp"

namespace {

using namespace shardplan;
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

// The same with the input kept (separate send and receive buffers), as all_reduce keeps its
// argument and returns a new array.
void BM_MpiAllreduceOutOfPlace(benchmark::State& state) {
  const auto data = floats(state.range(0));
  std::vector<float> sum(data.size());
  const double n = dist::process_count();
  for (auto _ : state) {
    MPI_Allreduce(data.data(), sum.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    benchmark::DoNotOptimize(sum.data());
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

// The device collectives over processes (one device per process, on a mesh axis 'a' over all of
// them), against MPI's own on the same bytes per process.

/// A pending sum over 'a' of `bytes` per device: each local device holds its own partials.
Array pending_partials(const Executor& exec, const Mesh& mesh, std::int64_t bytes) {
  const std::int64_t n = bytes / 4;
  std::vector<std::shared_ptr<Buffer>> buffers(static_cast<std::size_t>(exec.num_devices()));
  for (const int d : exec.local_devices()) {
    auto b = std::make_shared<Buffer>(exec.allocate(d, n * 4));
    auto* v = reinterpret_cast<float*>(b->data());
    for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i + d) % 1000) * 1e-3f;
    buffers[static_cast<std::size_t>(d)] = std::move(b);
  }
  return Array::from_buffers(exec, Shape{n}, DType::kF32, NamedSharding(mesh, P()),
                             std::move(buffers), Pending{ReduceOp::kSum, {"a"}});
}

const Executor& one_device_per_process() {
  static const Executor e(dist::process_count());
  return e;
}
Mesh axis_over_processes() {
  return Mesh::parse(fmt::format("a:{}", dist::process_count()), dist::process_count());
}

void BM_DeviceAllReduce(benchmark::State& state) {
  const Array p = pending_partials(one_device_per_process(), axis_over_processes(), state.range(0));
  const double n = dist::process_count();
  for (auto _ : state) benchmark::DoNotOptimize(all_reduce(p));
  set_counters(state, static_cast<double>(state.range(0)), 2 * (n - 1) / n);
}

void BM_DeviceReduceScatter(benchmark::State& state) {
  const Array p = pending_partials(one_device_per_process(), axis_over_processes(), state.range(0));
  const double n = dist::process_count();
  for (auto _ : state) benchmark::DoNotOptimize(reduce_scatter(p, 0));
  set_counters(state, static_cast<double>(state.range(0)), (n - 1) / n);
}

void BM_MpiReduceScatter(benchmark::State& state) {
  auto data = floats(state.range(0));
  const int p = dist::process_count();
  std::vector<float> mine(data.size() / static_cast<std::size_t>(p));
  const double n = p;
  for (auto _ : state) {
    MPI_Reduce_scatter_block(data.data(), mine.data(), static_cast<int>(mine.size()), MPI_FLOAT,
                             MPI_SUM, MPI_COMM_WORLD);
    benchmark::DoNotOptimize(mine.data());
  }
  set_counters(state, static_cast<double>(state.range(0)), (n - 1) / n);
}

void BM_DeviceAllGather(benchmark::State& state) {
  const Mesh mesh = axis_over_processes();
  const Executor& exec = one_device_per_process();
  const Array x =
      Array::normal(Shape{state.range(0) / 4}, DType::kF32, NamedSharding(mesh, P("a")), exec, 1);
  const double n = dist::process_count();
  for (auto _ : state) benchmark::DoNotOptimize(all_gather(x, {"a"}));
  set_counters(state, static_cast<double>(state.range(0)), (n - 1) / n);
}

// The latency of the failure agreement (issue 24): all_succeed of a step that succeeds, a small
// all-gather (4 KiB gathered: the agreement before its exchange is most of what it adds), and a
// small sjit step that gathers its weights then multiplies (the program hash, the all-gather's
// agreement, the run's final agreement).
void BM_AllSucceed(benchmark::State& state) {
  for (auto _ : state) dist::all_succeed([] {});
}

void BM_DeviceAllGatherSmall(benchmark::State& state) {
  const Mesh mesh = axis_over_processes();
  const Array x = Array::normal(Shape{state.range(0) / 4}, DType::kF32, NamedSharding(mesh, P("a")),
                                one_device_per_process(), 1);
  for (auto _ : state) benchmark::DoNotOptimize(all_gather(x, {"a"}));
}

void BM_SjitGatherStepSmall(benchmark::State& state) {
  const Mesh mesh = axis_over_processes();
  const Executor& exec = one_device_per_process();
  const std::int64_t n = 8 * dist::process_count();
  const Array w = Array::normal(Shape{n, 16}, DType::kF32, NamedSharding(mesh, P("a")), exec, 1);
  const Array x = Array::normal(Shape{n, n}, DType::kF32, NamedSharding(mesh, P("a")), exec, 2);
  auto f = sjit(mesh, [](const Array& wa, const Array& xa) {
    return matmul(xa, with_sharding_constraint(wa, P()));
  });
  benchmark::DoNotOptimize(f(w, x));
  for (auto _ : state) benchmark::DoNotOptimize(f(w, x));
}

// The MLP training step of bench/train_bench.cpp (784-1024-1024-1024-10, batch 4096, SGD) on 8
// devices: run with -np 1 (8 devices in one process) and -np 2 (4 in each) to compare.
void BM_MlpTrainStep8Devices(benchmark::State& state) {
  static const Executor ex(8);
  bench::run_mlp_train_steps(state, ex, Mesh::parse("data:8", 8), /*warm_up=*/true);
  state.counters["processes"] = dist::process_count();
}

// Sizing a cluster run from one machine: the MLP's gradient step (1024-8192-8192-1024, batch
// 8192) lowered for 128 processes x 8 devices on abstract arguments (tests/
// multiprocess_training_test.cpp checks its cost). Run it without mpirun.
void BM_LowerStep1024Devices(benchmark::State& state) {
  const Mesh mesh = Mesh::parse("data:128,model:8", 1024);
  const std::vector<std::int64_t> sizes = {1024, 8192, 8192, 1024};
  std::vector<Tree<TensorSpec>> layers;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers.push_back(
        Tree<TensorSpec>::dict({{"w", TensorSpec{Shape{sizes[i], sizes[i + 1]}, DType::kF32}},
                                {"b", TensorSpec{Shape{sizes[i + 1]}, DType::kF32}}}));
  }
  const Tree<TensorSpec> params = Tree<TensorSpec>::list(layers);
  const TensorSpec x{Shape{8192, 1024}, DType::kF32}, y{Shape{8192}, DType::kI32};
  SjitOptions o;
  o.in_shardings =
      RuleTree::list({RuleTree::list({RuleTree::dict({{"w", P(nullptr, "model")}, {"b", P()}}),
                                      RuleTree::dict({{"w", P("model", nullptr)}, {"b", P()}}),
                                      RuleTree::dict({{"w", P()}, {"b", P()}})}),
                      RuleTree(P("data")), RuleTree(P("data"))});
  for (auto _ : state) {
    auto step = sjit(
        mesh,
        [&](const Tree<Array>& p, const Array& xb, const Array& yb) {
          const auto [loss, g] = value_and_grad(mlp::loss)(p, xb, yb);
          return Tree<Array>::dict({{"loss", loss}, {"grads", g}});
        },
        o);
    benchmark::DoNotOptimize(step.lower(params, x, y).cost().flops[0]);
  }
}
// Each size of a collective runs MPI's and ours back to back, so that both see the same machine
// (the shared-memory transport's speed drifts over a run); the lowering and the training step
// come last, since they leave the heap larger.
void per_size(std::initializer_list<std::pair<const char*, void (*)(benchmark::State&)>> group) {
  for (const std::int64_t bytes : {std::int64_t{16} << 20, std::int64_t{64} << 20}) {
    for (const auto& [name, fn] : group) {
      benchmark::RegisterBenchmark(name, fn)->Arg(bytes)->Iterations(kIterations)->UseRealTime();
    }
  }
}

const bool kRegistered = [] {
  per_size({{"BM_MpiAllreduce", BM_MpiAllreduce},
            {"BM_MpiAllreduceOutOfPlace", BM_MpiAllreduceOutOfPlace},
            {"BM_DeviceAllReduce", BM_DeviceAllReduce}});
  per_size({{"BM_MpiReduceScatter", BM_MpiReduceScatter},
            {"BM_DeviceReduceScatter", BM_DeviceReduceScatter}});
  per_size({{"BM_MpiAllgather", BM_MpiAllgather}, {"BM_DeviceAllGather", BM_DeviceAllGather}});
  per_size({{"BM_AllreduceSum", BM_AllreduceSum}, {"BM_AllgatherBytes", BM_AllgatherBytes}});
  benchmark::RegisterBenchmark("BM_AllSucceed", BM_AllSucceed)->Iterations(2000)->UseRealTime();
  benchmark::RegisterBenchmark("BM_DeviceAllGatherSmall", BM_DeviceAllGatherSmall)
      ->Arg(4096)
      ->Iterations(2000)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_SjitGatherStepSmall", BM_SjitGatherStepSmall)
      ->Iterations(2000)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_LowerStep1024Devices", BM_LowerStep1024Devices)
      ->Unit(benchmark::kMillisecond)
      ->Iterations(3)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_MlpTrainStep8Devices", BM_MlpTrainStep8Devices)
      ->Unit(benchmark::kMillisecond)
      ->Iterations(5)
      ->UseRealTime();
  return true;
}();

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
