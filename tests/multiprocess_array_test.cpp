// Arrays over a mesh whose devices span processes. ctest runs this file one process per test and
// under `mpirun -np 2` and `-np 4` (tests/CMakeLists.txt): the same 8-device program, with each
// process holding 8, 4 or 2 of the devices. The expectations are host tensors every process
// computes alone (Tensor's own generators and copies), compared bit for bit.
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
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
    EXPECT_THROW_WITH(
        Executor(4 * p_count + 1), SpecError,
        fmt::format("{} devices do not split evenly over {} processes", 4 * p_count + 1, p_count));
  }
  EXPECT_EQ(Executor::default_device_count() % p_count, 0);
}

TEST(MultiProcess, DevicePutThenToHostGivesTheTensorBackOnEveryProcess) {
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:4,b:2", 8);
  const Tensor x = Tensor::normal(Shape{16, 8}, DType::kF32, /*seed=*/7);
  for (const PartitionSpec& spec :
       {P("a", "b"), P(), P(nullptr, "b"), P("b", "a"), P(AxisNames{"a", "b"}, nullptr)}) {
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
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(p * 1000 + static_cast<int>(i));
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
  for (const PartitionSpec& spec :
       {P(AxisNames{"data", "model"}), P("data", "model"), P(), P(nullptr, "model")}) {
    const Array g =
        local_data_to_global_array(local_rows(me, rows, cols), NamedSharding(mesh, spec), exec);
    EXPECT_EQ(g.shape(), Shape({rows * p_count, cols})) << spec.to_string();
    EXPECT_EQ(g.to_host(), want) << spec.to_string();
  }
  EXPECT_THROW_WITH(local_data_to_global_array(Tensor::from<float>(Shape{}, {1.0f}),
                                               NamedSharding(mesh, P()), exec),
                    SpecError, "local_data_to_global_array", "scalar");
  if (p_count > 1) {
    // A process with other rows than the rest: an error on every process, not a hang.
    const std::int64_t my_rows = me == 1 ? rows + 1 : rows;
    EXPECT_THROW_WITH(
        local_data_to_global_array(local_rows(me, my_rows, cols), NamedSharding(mesh, P()), exec),
        DistributedError, "local data", "process 1: 'f32[9, 4]'");
  }
}

TEST(MultiProcess, ToHostOnOneProcessGivesTheArrayThereOnly) {
  const int p_count = dist::process_count(), me = dist::process_index();
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:4,b:2", 8);
  const Tensor x = Tensor::normal(Shape{16, 8}, DType::kF32, 21);
  for (const PartitionSpec& spec : {P("a", "b"), P(), P(nullptr, "b")}) {
    const Array y = device_put(x, NamedSharding(mesh, spec), exec);
    for (const int root : {0, p_count - 1}) {
      const std::optional<Tensor> got = to_host_on_process(y, root);
      if (me == root) {
        ASSERT_TRUE(got.has_value()) << spec.to_string();
        EXPECT_EQ(*got, x) << spec.to_string() << " on process " << root;
      } else {
        EXPECT_FALSE(got.has_value());
      }
    }
  }
  EXPECT_THROW_WITH(to_host_on_process(device_put(x, NamedSharding(mesh, P()), exec), p_count),
                    DistributedError, std::to_string(p_count) + " is not one of the");
}

/// Checks that every local device of `a` holds exactly its block of the host tensor `x`.
void expect_blocks_of(const Array& a, const Tensor& x, const std::string& what) {
  const Executor& exec = a.executor();
  const int rank = x.shape().rank();
  for (const int d : a.mesh().devices()) {
    if (!exec.is_local(d)) continue;
    const Block& b = a.block(d);
    const Tensor s = a.shard_tensor(d);
    // Walk the block in row-major order.
    std::vector<std::int64_t> idx(static_cast<std::size_t>(rank), 0);
    for (std::int64_t k = 0; k < s.shape().numel(); ++k) {
      std::int64_t g = 0;
      for (int r = 0; r < rank; ++r) {
        g = g * x.shape()[r] + b[static_cast<std::size_t>(r)].start +
            idx[static_cast<std::size_t>(r)];
      }
      ASSERT_EQ(s.get(k), x.get(g)) << what << ", device " << d << ", element " << k;
      for (int r = rank - 1; r >= 0; --r) {
        if (++idx[static_cast<std::size_t>(r)] < b[static_cast<std::size_t>(r)].size) break;
        idx[static_cast<std::size_t>(r)] = 0;
      }
    }
  }
}

TEST(MultiProcess, GatherAllToAllAndReshardMoveTheRightBytesBetweenProcesses) {
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:4,b:2", 8);
  const Tensor x = Tensor::normal(Shape{16, 8}, DType::kF32, 5);
  const Array y = device_put(x, NamedSharding(mesh, P("a", "b")), exec);
  const Array g = all_gather(y, {"a"});
  EXPECT_EQ(g.sharding().spec(), P(nullptr, "b"));
  expect_blocks_of(g, x, "all_gather a");
  expect_blocks_of(all_gather(y, {"a", "b"}), x, "all_gather a, b");
  expect_blocks_of(all_to_all(y, {"b"}, 1, 0), x, "all_to_all b 1 -> 0");
  for (const PartitionSpec& target : {P(), P("b", "a"), P(AxisNames{"b", "a"}, nullptr),
                                      P(nullptr, AxisNames{"a", "b"}), P("a")}) {
    const Array r = reshard(y, NamedSharding(mesh, target)).array;
    expect_blocks_of(r, x, "reshard to " + target.to_string());
    EXPECT_EQ(r.to_host(), x) << target.to_string();
  }
}

TEST(MultiProcess, ShardsReceivedStraightIntoTheirPlaceOrCopiedAreTheSame) {
  // One device per process: a remote shard that only one device reads, and that lies in its
  // output in one piece (rows), is received in place; columns are not in one piece and go
  // through a copy. Both must give every device its block.
  const int p_count = dist::process_count();
  Executor exec(p_count);
  const Mesh mesh = Mesh::parse(fmt::format("a:{}", p_count), p_count);
  const Tensor rows = Tensor::normal(Shape{4 * p_count, 3}, DType::kF32, 31);
  const Tensor cols = Tensor::normal(Shape{3, 4 * p_count}, DType::kF32, 32);
  expect_blocks_of(all_gather(device_put(rows, NamedSharding(mesh, P("a")), exec), {"a"}), rows,
                   "all_gather of rows");
  expect_blocks_of(all_gather(device_put(cols, NamedSharding(mesh, P(nullptr, "a")), exec), {"a"}),
                   cols, "all_gather of columns");
  const Tensor square = Tensor::normal(Shape{4 * p_count, 4 * p_count}, DType::kF32, 33);
  const Array r = reshard(device_put(square, NamedSharding(mesh, P("a")), exec),
                          NamedSharding(mesh, P(nullptr, "a")))
                      .array;
  expect_blocks_of(r, square, "rows to columns");
}

TEST(MultiProcess, PermuteSendsEachShardWhereThePairsSay) {
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:8", 8);
  const Tensor x = Tensor::normal(Shape{8, 3}, DType::kF32, 9);
  const Array y = device_put(x, NamedSharding(mesh, P("a")), exec);
  // A ring shift by 3, and one coordinate that receives nothing (zeros).
  std::vector<std::pair<int, int>> pairs;
  for (int i = 0; i < 8; ++i) {
    if (i != 2) pairs.emplace_back(i, (i + 3) % 8);
  }
  const Array z = permute(y, "a", pairs);
  for (const int d : exec.local_devices()) {
    const Tensor s = z.shard_tensor(d);
    const int from = (d + 8 - 3) % 8;
    for (std::int64_t k = 0; k < 3; ++k) {
      ASSERT_EQ(s.get(k), from == 2 ? 0.0 : x.get(from * 3 + k)) << "device " << d;
    }
  }
}

/// Device d's partial value at element i: magnitudes far apart, so that the order of the
/// additions shows in the bits.
float partial(int d, std::int64_t i) {
  const float scale = d % 3 == 0 ? 1e7f : (d % 3 == 1 ? 1e-2f : 3.0f);
  return scale * static_cast<float>((i * 31 + d * 17) % 101) / 7.0f;
}

/// A pending sum over axis 'b' of mesh a:4,b:2 with replicated spec: each local device holds
/// its own partial values.
Array pending_sum(const Executor& exec, const Mesh& mesh, const Shape& shape) {
  std::vector<std::shared_ptr<Buffer>> buffers(8);
  for (const int d : exec.local_devices()) {
    buffers[static_cast<std::size_t>(d)] =
        std::make_shared<Buffer>(exec.allocate(d, shape.numel() * 4));
    auto* v = reinterpret_cast<float*>(buffers[static_cast<std::size_t>(d)]->data());
    for (std::int64_t i = 0; i < shape.numel(); ++i) v[i] = partial(d, i);
  }
  return Array::from_buffers(exec, shape, DType::kF32, NamedSharding(mesh, P()), std::move(buffers),
                             Pending{ReduceOp::kSum, {"a"}});
}

TEST(MultiProcess, ReductionsOverProcessesAddInDeviceOrderBitForBit) {
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:4,b:2", 8);
  const Shape shape{8, 5};
  const Array p = pending_sum(exec, mesh, shape);
  // The expectation: for each element, the partials of the devices of a group over 'a' added
  // in mesh order; device (a, b) is 2a + b, so the group of column b is b, b + 2, b + 4, b + 6.
  auto reduced = [&](int b, std::int64_t i) {
    float acc = partial(b, i);
    for (int a = 1; a < 4; ++a) acc += partial(2 * a + b, i);
    return acc;
  };
  const Array r = all_reduce(p);
  EXPECT_FALSE(r.is_pending());
  for (const int d : exec.local_devices()) {
    const Tensor s = r.shard_tensor(d);
    for (std::int64_t i = 0; i < shape.numel(); ++i) {
      const float got = static_cast<float>(s.get(i)), want = reduced(d % 2, i);
      ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "device " << d << " element " << i;
    }
  }
  // Scattered over dimension 0: device (a, b) keeps rows [2a, 2a + 2) of its column's sum.
  const Array rs = reduce_scatter(p, 0);
  EXPECT_EQ(rs.sharding().spec(), P("a"));
  for (const int d : exec.local_devices()) {
    const Tensor s = rs.shard_tensor(d);
    const Block& b = rs.block(d);
    for (std::int64_t k = 0; k < s.shape().numel(); ++k) {
      const std::int64_t i = b[0].start * 5 + k;
      const float got = static_cast<float>(s.get(k)), want = reduced(d % 2, i);
      ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "device " << d << " element " << k;
    }
  }
  // to_host of the pending array reduces it the same way (every device's column 0 sum), also
  // onto one process.
  const std::optional<Tensor> on_last = to_host_on_process(p, dist::process_count() - 1);
  EXPECT_EQ(on_last.has_value(), dist::process_index() == dist::process_count() - 1);
  const Tensor host = p.to_host();
  if (on_last) {
    EXPECT_EQ(*on_last, host);
  }
  for (std::int64_t i = 0; i < shape.numel(); ++i) {
    const float got = static_cast<float>(host.get(i)), want = reduced(0, i);
    ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "element " << i;
  }
}

TEST(MultiProcess, ReductionsOfShardsSmallerThanTheirGroupLeaveSomeChunksEmpty) {
  // A group of 4 members reduces a shard of 3 elements (chunks of 0, 1, 1 and 1) and one of a
  // single element (chunks 0, 0, 0 and 1): the empty chunks cross no process and read nothing.
  Executor exec(8);
  const Mesh mesh = Mesh::parse("a:4,b:2", 8);
  for (const Shape& shape : {Shape{3}, Shape{}}) {
    const Array r = all_reduce(pending_sum(exec, mesh, shape));
    for (const int d : exec.local_devices()) {
      const Tensor s = r.shard_tensor(d);
      for (std::int64_t i = 0; i < shape.numel(); ++i) {
        float want = partial(d % 2, i);
        for (int a = 1; a < 4; ++a) want += partial(2 * a + d % 2, i);
        const float got = static_cast<float>(s.get(i));
        ASSERT_EQ(std::memcmp(&got, &want, 4), 0)
            << shape.to_string() << " device " << d << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace shardplan
