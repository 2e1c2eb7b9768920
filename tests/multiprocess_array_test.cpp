// Arrays over a mesh whose devices span processes. ctest runs this file one process per test and
// under `mpirun -np 2` and `-np 4` (tests/CMakeLists.txt): the same 8-device program, with each
// process holding 8, 4 or 2 of the devices. The expectations are host tensors every process
// computes alone (Tensor's own generators and copies), compared bit for bit.
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <set>

#include "shardplan/array.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/ops.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

namespace dist = shardplan::distributed;

TEST(MultiProcess, TheExecutorHoldsItsProcessesDevicesOnly) {
  const int p_count = dist::process_count(), me = dist::process_index();
  const int local = 8 / p_count;
  Executor exec(8);
  EXPECT_EQ(exec.num_devices(), 8);
  ASSERT_EQ(exec.local_devices().size(), static_cast<std::size_t>(local));
  for (int i = 0; i < local; ++i) {
    EXPECT_EQ(exec.local_devices()[static_cast<std::size_t>(i)], me * local + i);
  }
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(exec.process_of(d), d / local);
    EXPECT_EQ(exec.is_local(d), d / local == me);
  }
  // A step runs on this process's devices, once each.
  std::mutex mu;
  std::multiset<int> ran;
  exec.run([&](int d) {
    const std::lock_guard lock(mu);
    ran.insert(d);
  });
  EXPECT_EQ(ran, std::multiset<int>(exec.local_devices().begin(), exec.local_devices().end()));
  ran.clear();
  exec.run(std::vector<int>{0, 7}, [&](int d) {
    const std::lock_guard lock(mu);
    ran.insert(d);
  });
  std::multiset<int> want;
  for (int d : {0, 7}) {
    if (exec.is_local(d)) want.insert(d);
  }
  EXPECT_EQ(ran, want);
  EXPECT_EQ(exec.memory().size(), static_cast<std::size_t>(local));
  if (p_count > 1) {
    const int other = ((me + 1) % p_count) * local;
    EXPECT_THROW_WITH(exec.allocate(other, 64), SpecError,
                      fmt::format("device {} is held by process {}", other, (me + 1) % p_count));
    EXPECT_THROW_WITH(exec.memory(other), SpecError, "held by process");
    EXPECT_THROW_WITH(Executor(4 * p_count + 1), SpecError,
                      fmt::format("{} devices do not split evenly over {} processes",
                                  4 * p_count + 1, p_count));
  }
  EXPECT_EQ(Executor::default_device_count() % p_count, 0);
}

TEST(MultiProcess, DevicePutThenToHostGivesTheTensorBackOnEveryProcess) {
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:4,b:2", 8);
  const Tensor x = Tensor::normal(Shape{16, 8}, DType::kF32, /*seed=*/7);
  for (const PartitionSpec& spec : {P("a", "b"), P(), P(nullptr, "b"), P("b", "a"),
                                    P(AxisNames{"a", "b"}, nullptr)}) {
    const Array y = device_put(x, NamedSharding(mesh, spec), exec);
    EXPECT_EQ(y.to_host(), x) << spec.to_string();
    // Each local device holds exactly its block; another process's shard is not here.
    for (int d = 0; d < 8; ++d) {
      if (exec.is_local(d)) {
        const Block& b = y.block(d);
        const Tensor s = y.shard_tensor(d);
        for (std::int64_t i = 0; i < b[0].size; ++i) {
          for (std::int64_t j = 0; j < b[1].size; ++j) {
            ASSERT_EQ(s.get(i * b[1].size + j), x.get((b[0].start + i) * 8 + b[1].start + j));
          }
        }
      } else {
        EXPECT_THROW_WITH(y.shard(d), ArrayError,
                          fmt::format("device {} is held by process {}", d, exec.process_of(d)));
      }
    }
  }
}

TEST(MultiProcess, GeneratedArraysAreTheHostGeneratorsNumbers) {
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:2,b:4", 8);
  const Array y = Array::normal(Shape{8, 12}, DType::kF32, NamedSharding(mesh, P("a", "b")), exec,
                                /*seed=*/11);
  EXPECT_EQ(y.to_host(), Tensor::normal(Shape{8, 12}, DType::kF32, 11));
}

TEST(MultiProcess, PerDeviceStepsRunOnEachProcessesOwnShards) {
  // An elementwise op needs no bytes from another device: each process computes its shards.
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  const Tensor x = Tensor::normal(Shape{32, 4}, DType::kF32, 3);
  const Array y = sin(device_put(x, NamedSharding(mesh, P("a")), exec));
  const Tensor got = y.to_host();
  for (std::int64_t i = 0; i < x.shape().numel(); ++i) {
    ASSERT_EQ(static_cast<float>(got.get(i)), std::sin(static_cast<float>(x.get(i)))) << i;
  }
}

/// Process p's local rows: value p * 1000 + row-major index.
Tensor local_rows(int p, std::int64_t rows, std::int64_t cols) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(p * 1000 + static_cast<int>(i));
  return Tensor::from<float>(Shape{rows, cols}, v);
}

TEST(MultiProcess, LocalDataBecomesOneGlobalArrayInProcessOrder) {
  const int p_count = dist::process_count(), me = dist::process_index();
  Executor exec(8);
  const Mesh mesh = Mesh::parse("data:4,model:2", 8);
  const std::int64_t rows = 8, cols = 4;
  // The expectation: every process's rows stacked in process order.
  std::vector<float> stacked;
  for (int p = 0; p < p_count; ++p) {
    const Tensor t = local_rows(p, rows, cols);
    for (std::int64_t i = 0; i < rows * cols; ++i) stacked.push_back(static_cast<float>(t.get(i)));
  }
  const Tensor want = Tensor::from<float>(Shape{rows * p_count, cols}, stacked);
  // Batch over 'data' (rows stay with their process), replicated, and over columns only (rows
  // cross processes).
  for (const PartitionSpec& spec : {P(AxisNames{"data", "model"}), P("data", "model"), P(),
                                    P(nullptr, "model")}) {
    const Array g = local_data_to_global_array(local_rows(me, rows, cols),
                                               NamedSharding(mesh, spec), exec);
    EXPECT_EQ(g.shape(), Shape({rows * p_count, cols})) << spec.to_string();
    EXPECT_EQ(g.to_host(), want) << spec.to_string();
  }
  if (p_count > 1) {
    // A process with other rows than the rest: an error on every process, not a hang.
    const std::int64_t my_rows = me == 1 ? rows + 1 : rows;
    EXPECT_THROW_WITH(local_data_to_global_array(local_rows(me, my_rows, cols),
                                                 NamedSharding(mesh, P()), exec),
                      DistributedError, "local data", "process 1: 'f32[9, 4]'");
  }
}

TEST(MultiProcess, CollectivesBetweenProcessesAreAClearErrorUntilBuilt) {
  if (dist::process_count() == 1) GTEST_SKIP() << "needs two processes";
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  const Array y = device_put(Tensor::normal(Shape{8}, DType::kF32, 1), NamedSharding(mesh, P("a")),
                             exec);
  EXPECT_THROW_WITH(all_gather(y, {"a"}), ArrayError, "spans processes", "not built yet");
  EXPECT_THROW_WITH(reshard(y, NamedSharding(mesh, P())), ArrayError, "spans processes");
}

}  // namespace
}  // namespace shardplan
