// Padded (uneven) shardings in the runtime (NamedSharding with Uneven::kPad; the split itself is
// tested in named_sharding_test.cpp): device_put, to_host, generate, local_data_to_global_array,
// reshard between every pair of shardings and the pending reductions, over meshes of 3, 5, 6, 7
// and 8 devices on one and two axes. The expectation is JAX's split, written out independently
// below: blocks of ceil(n/k) rows, the last ones holding fewer (possibly none), and a block's
// buffer holding its rows first and zeros after them. Under mpirun the meshes whose devices do
// not spread evenly over the processes are skipped (3, 5, 6, 7 over 2 or 4); the 8-device meshes
// run there.
#include <fmt/format.h>

#include <cstring>

#include "runtime_fixtures.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using test::all_specs;
using test::local;
using test::slice_of;

struct PaddedCase {
  const char* axes;
  int devices;
  Shape shape;
};
// Sizes that do not divide: 10 over 3, 12 over 5 (8192 over 96 in small), 7 over 7 (divides),
// 5 over 6 (a device with no row), 5 over 8 (three without), and two axes.
const PaddedCase kCases[] = {
    {"x:3", 3, Shape{10}},   {"x:5", 5, Shape{12}},        {"x:7", 7, Shape{7, 3}},
    {"x:6", 6, Shape{5}},    {"x:2,y:3", 6, Shape{7, 5}},  {"x:3,y:2", 6, Shape{5, 10}},
    {"x:8", 8, Shape{5, 2}}, {"x:4,y:2", 8, Shape{10, 3}}, {"x:5,y:1", 5, Shape{12, 2}},
};

// JAX's block of a dimension of n rows cut in k, written from its documentation: block i covers
// rows [i*ceil(n/k), min(n, (i+1)*ceil(n/k))), empty once it starts past n.
DimSlice jax_block(std::int64_t n, std::int64_t k, std::int64_t i) {
  const std::int64_t b = (n + k - 1) / k;
  const std::int64_t lo = i * b;
  const std::int64_t hi = std::min(n, (i + 1) * b);
  return DimSlice{lo, std::max<std::int64_t>(0, hi - lo)};
}

// The block device `device` holds, from its mesh coordinates (row-major positions) and JAX's
// split of each dimension over the mixed-radix number of its axes' coordinates.
Block expected_block(const NamedSharding& s, const Shape& shape, int device) {
  const Mesh& m = s.mesh();
  std::int64_t pos = 0;
  while (m.devices()[static_cast<std::size_t>(pos)] != device) ++pos;
  std::vector<std::int64_t> c(m.axis_sizes().size());
  for (std::size_t i = c.size(); i-- > 0;) {
    c[i] = pos % m.axis_sizes()[i];
    pos /= m.axis_sizes()[i];
  }
  Block b;
  for (int d = 0; d < shape.rank(); ++d) {
    std::int64_t idx = 0, k = 1;
    if (d < s.spec().size()) {
      for (const auto& a : s.spec()[d]) {
        const int ai = m.axis_index(a);
        idx = idx * m.axis_size(a) + c[static_cast<std::size_t>(ai)];
        k *= m.axis_size(a);
      }
    }
    b.push_back(jax_block(shape[d], k, idx));
  }
  return b;
}

// What device d's buffer must hold: the host rows of its block at the front of a buffer of
// the padded shard shape, zeros after them.
Tensor expected_shard(const Tensor& host, const NamedSharding& s, int device) {
  const Shape shard = s.shard_shape(host.shape());
  const Block b = expected_block(s, host.shape(), device);
  const Tensor rows = slice_of(host, b);
  Tensor out = Tensor::zeros(shard, host.dtype());
  for (std::int64_t i = 0; i < rows.numel(); ++i) {
    std::int64_t rest = i, at = 0, stride = 1;
    for (int d = host.shape().rank() - 1; d >= 0; --d) {
      const std::int64_t r = b[static_cast<std::size_t>(d)].size;
      at += (rest % r) * stride;
      rest /= r;
      stride *= shard[d];
    }
    out.set(at, rows.get(i));
  }
  return out;
}

NamedSharding padded(const Mesh& mesh, const PartitionSpec& spec) {
  return NamedSharding(mesh, spec, Uneven::kPad);
}

TEST(PaddedShards, DevicePutAndToHostAreBitwiseTheHostArray) {
  int checked = 0;
  for (const auto& c : kCases) {
    if (!test::divides_over_processes(c.devices)) continue;
    const Executor exec(c.devices);
    const Mesh mesh = Mesh::parse(c.axes, c.devices);
    const Tensor host = Tensor::uniform(c.shape, DType::kF32, 3, -1, 1);
    for (const PartitionSpec& spec : all_specs(mesh, c.shape.rank())) {
      const NamedSharding s = padded(mesh, spec);
      SCOPED_TRACE(s.to_string() + " " + c.shape.to_string());
      const Array a = device_put(host, s, exec);
      for (const int d : local(mesh, exec)) {
        ASSERT_EQ(a.block(d), expected_block(s, c.shape, d));
        ASSERT_TRUE(a.shard_tensor(d) == expected_shard(host, s, d));
      }
      ASSERT_TRUE(a.to_host() == host);
      const auto one = to_host_on_process(a, 0);
      if (distributed::process_index() == 0) {
        ASSERT_TRUE(one.has_value() && *one == host);
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(PaddedShards, GenerateFillsEachBlocksRowsAsTheWholeArrayWould) {
  for (const auto& c : kCases) {
    if (!test::divides_over_processes(c.devices)) continue;
    const Executor exec(c.devices);
    const Mesh mesh = Mesh::parse(c.axes, c.devices);
    const Tensor whole = Tensor::normal(c.shape, DType::kF32, 9);
    for (const PartitionSpec& spec : all_specs(mesh, c.shape.rank())) {
      const NamedSharding s = padded(mesh, spec);
      const Array a = Array::normal(c.shape, DType::kF32, s, exec, 9);
      for (const int d : local(mesh, exec)) {
        ASSERT_TRUE(a.shard_tensor(d) == expected_shard(whole, s, d)) << s << " device " << d;
      }
    }
  }
}

// Every pair of specs of each case, padded on both sides (and unpadded where a spec divides):
// values bitwise, zeros in the padding, the plan's kind, bytes and staging those of the run.
TEST(PaddedShards, ReshardBetweenEveryPairKeepsTheValuesAndThePlanIsTheRun) {
  int pairs = 0;
  for (const auto& c : kCases) {
    if (!test::divides_over_processes(c.devices)) continue;
    const Executor exec(c.devices);
    const Mesh mesh = Mesh::parse(c.axes, c.devices);
    const Tensor host = Tensor::uniform(c.shape, DType::kF32, 5, -1, 1);
    const auto specs = all_specs(mesh, c.shape.rank());
    for (const PartitionSpec& from : specs) {
      const Array src = device_put(host, padded(mesh, from), exec);
      for (const PartitionSpec& to : specs) {
        const NamedSharding target = padded(mesh, to);
        SCOPED_TRACE(fmt::format("{} {}: {} -> {}", mesh.to_string(), c.shape.to_string(),
                                 from.to_string(), to.to_string()));
        const ReshardResult r = reshard(src, target);
        const auto planned = plan_reshard(c.shape, DType::kF32, src.sharding(), {}, target,
                                          test::devices_per_process(exec, mesh));
        ASSERT_EQ(planned.size(), r.steps.size());
        for (std::size_t k = 0; k < planned.size(); ++k) {
          ASSERT_EQ(planned[k].kind, r.steps[k].kind);
          ASSERT_EQ(test::local_bytes(planned[k], mesh, exec),
                    test::local_bytes(r.steps[k], mesh, exec));
          ASSERT_EQ(test::local_staging(planned[k], mesh, exec),
                    test::local_staging(r.steps[k], mesh, exec));
        }
        for (const int d : local(mesh, exec)) {
          ASSERT_TRUE(r.array.shard_tensor(d) == expected_shard(host, target, d)) << d;
        }
        ++pairs;
      }
    }
  }
  EXPECT_GT(pairs, 0);
}

TEST(PaddedShards, AllGatherReceivesOnlyTheRowsADeviceLacks) {
  // f32[10] over 3: devices hold 4, 4 and 2 rows and receive the other 6, 6 and 8 (by hand).
  if (!test::divides_over_processes(3)) GTEST_SKIP() << "3 devices over the processes";
  const Executor exec(3);
  const Mesh mesh = Mesh::parse("x:3", 3);
  const Tensor host = Tensor::uniform(Shape{10}, DType::kF32, 1, 0, 1);
  CollectiveRecord rec;
  const Array g = all_gather(device_put(host, padded(mesh, P("x")), exec), {"x"}, &rec);
  EXPECT_EQ(g.sharding(), padded(mesh, P()));
  EXPECT_EQ(rec.bytes_in, (std::vector<std::int64_t>{6 * 4, 6 * 4, 8 * 4}));
  for (const int d : local(mesh, exec)) EXPECT_TRUE(g.shard_tensor(d) == host);
}

// A pending sum over `axes` whose device of rank r in its group holds (r + 1) (i + 1) at global
// element i (in its block, zeros in the padding): small integers in f32, so every order of
// additions gives the sum n (n + 1) / 2 (i + 1) for groups of n, the expectation by hand.
Array pending_padded(const Executor& exec, const NamedSharding& s, const Shape& shape,
                     const std::vector<std::string>& axes, Tensor* sum) {
  std::int64_t n = 1;
  for (const auto& a : axes) n *= s.mesh().axis_size(a);
  std::vector<std::shared_ptr<Buffer>> bufs(static_cast<std::size_t>(exec.num_devices()));
  for (const int d : local(s.mesh(), exec)) {
    const auto g = device_group(s.mesh(), d, axes);
    const double r = static_cast<double>(std::find(g.begin(), g.end(), d) - g.begin());
    const Tensor t =
        expected_shard(Tensor::generate(shape, DType::kF32, Generator::iota(r + 1, r + 1)), s, d);
    auto b = std::make_shared<Buffer>(exec.allocate(d, t.nbytes()));
    std::memcpy(b->data(), t.bytes(), static_cast<std::size_t>(t.nbytes()));
    bufs[static_cast<std::size_t>(d)] = b;
  }
  const auto w = static_cast<double>(n * (n + 1) / 2);
  *sum = Tensor::generate(shape, DType::kF32, Generator::iota(w, w));
  return Array::from_buffers(exec, shape, DType::kF32, s, bufs, {ReduceOp::kSum, axes});
}

TEST(PaddedShards, PendingSumsReshardToEverySpecWithThePlanTheRun) {
  for (const auto& c :
       {PaddedCase{"x:2,y:3", 6, Shape{7, 5}}, PaddedCase{"x:4,y:2", 8, Shape{10, 3}},
        PaddedCase{"x:3,y:2", 6, Shape{5, 10}}}) {
    if (!test::divides_over_processes(c.devices)) continue;
    const Executor exec(c.devices);
    const Mesh mesh = Mesh::parse(c.axes, c.devices);
    for (const PartitionSpec& from : {P("x"), P(nullptr, "x")}) {
      Tensor sum;
      const Array x = pending_padded(exec, padded(mesh, from), c.shape, {"y"}, &sum);
      ASSERT_TRUE(x.to_host() == sum) << from.to_string();
      for (const PartitionSpec& to : all_specs(mesh, c.shape.rank())) {
        const NamedSharding target = padded(mesh, to);
        SCOPED_TRACE(fmt::format("{} {}: {} pending over 'y' -> {}", mesh.to_string(),
                                 c.shape.to_string(), from.to_string(), to.to_string()));
        const ReshardResult r = reshard(x, target);
        const auto planned = plan_reshard(c.shape, DType::kF32, x.sharding(), x.pending(), target,
                                          test::devices_per_process(exec, mesh));
        ASSERT_EQ(planned.size(), r.steps.size());
        for (std::size_t k = 0; k < planned.size(); ++k) {
          ASSERT_EQ(planned[k].kind, r.steps[k].kind);
          ASSERT_EQ(test::local_bytes(planned[k], mesh, exec),
                    test::local_bytes(r.steps[k], mesh, exec));
          ASSERT_EQ(test::local_staging(planned[k], mesh, exec),
                    test::local_staging(r.steps[k], mesh, exec));
        }
        for (const int d : local(mesh, exec)) {
          ASSERT_TRUE(r.array.shard_tensor(d) == expected_shard(sum, target, d)) << d;
        }
      }
    }
  }
}

TEST(PaddedShards, ReduceScatterIntoPaddedBlocksAndWhereTheyDoNotNest) {
  if (!test::divides_over_processes(6)) GTEST_SKIP() << "6 devices over the processes";
  const Executor exec(6);
  const Mesh mesh = Mesh::parse("x:2,y:3", 6);
  Tensor sum;
  // Dim 1 (5 columns) over 'y' (3): blocks of 2, 2 and 1; each device reads the two others'
  // summands of its block: 2 x (7 x cols) f32, its padding not counted.
  const Array x = pending_padded(exec, padded(mesh, P()), Shape{7, 5}, {"y"}, &sum);
  CollectiveRecord rec;
  const Array y = reduce_scatter(x, 1, {"y"}, &rec);
  EXPECT_EQ(y.sharding(), padded(mesh, P(nullptr, "y")));
  for (const int d : local(mesh, exec)) {
    const std::int64_t cols = d % 3 == 2 ? 1 : 2;
    EXPECT_EQ(rec.bytes_in[static_cast<std::size_t>(d)], 2 * 7 * cols * 4) << d;
    EXPECT_TRUE(y.shard_tensor(d) == expected_shard(sum, y.sharding(), d)) << d;
  }
  // 7 rows over 'x' (blocks of 4) split further over 'y' (blocks of 2 of 7 over 6): block 2
  // [4:6] is not inside block 0 [0:4] of 'x', so no device could reduce its part alone.
  Tensor sum2;
  const Array z = pending_padded(exec, padded(mesh, P("x")), Shape{7, 5}, {"y"}, &sum2);
  EXPECT_THROW_WITH(reduce_scatter(z, 0, {"y"}), SpecError, "[reduce_scatter] dim 0",
                    "7 rows, padded", "'y'", "all_reduce, then reshard");
  // reshard goes round it: an all-reduce, then the move.
  const ReshardResult r = reshard(z, padded(mesh, P(AxisNames{"x", "y"})));
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[0].kind, CollectiveKind::kAllReduce);
  EXPECT_TRUE(r.array.to_host() == sum2);
}

// A sum pending on a sharding that refuses (it divides) reshards onto a padded target by a
// reduce-scatter into the padded blocks, as plan_reshard routes it (a program's gradient reduced
// onto its padded parameter's sharding, issue 41); before, the scatter kept the source's policy
// and refused the split.
TEST(PaddedShards, APendingSumOfARefusingShardingScattersOntoAPaddedTarget) {
  if (!test::divides_over_processes(6)) GTEST_SKIP() << "6 devices over the processes";
  const Executor exec(6);
  const Mesh mesh = Mesh::parse("x:2,y:3", 6);
  Tensor sum;
  const Array x = pending_padded(exec, NamedSharding(mesh, P()), Shape{7, 5}, {"y"}, &sum);
  const NamedSharding target = padded(mesh, P(nullptr, "y"));
  const ReshardResult r = reshard(x, target);
  const auto planned = plan_reshard(Shape{7, 5}, DType::kF32, x.sharding(), x.pending(), target,
                                    test::devices_per_process(exec, mesh));
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].kind, CollectiveKind::kReduceScatter);
  ASSERT_EQ(planned.size(), 1u);
  EXPECT_EQ(planned[0].kind, CollectiveKind::kReduceScatter);
  EXPECT_EQ(test::local_bytes(planned[0], mesh, exec), test::local_bytes(r.steps[0], mesh, exec));
  EXPECT_EQ(r.array.sharding(), target);
  for (const int d : local(mesh, exec)) {
    EXPECT_TRUE(r.array.shard_tensor(d) == expected_shard(sum, target, d)) << d;
  }
}

// Every process passes its 5 rows; the global array (5 rows per process) is placed padded over 3
// or 2 devices per process: blocks of 2 (5p over 3p) or of 3 (5p over 2p), some crossing
// processes' rows, some empty.
TEST(PaddedShards, LocalDataToGlobalArrayPlacesEachProcesssRows) {
  const int processes = distributed::process_count();
  const std::int64_t rows = 5;
  const Tensor global =
      Tensor::generate(Shape{rows * processes, 2}, DType::kF32, Generator::iota());
  Tensor mine(Shape{rows, 2}, DType::kF32);
  for (std::int64_t i = 0; i < mine.numel(); ++i) {
    mine.set(i, global.get(distributed::process_index() * rows * 2 + i));
  }
  for (const int per_process : {3, 2}) {
    const int devices = per_process * processes;
    const Executor exec(devices);
    const Mesh mesh = Mesh::parse(fmt::format("x:{}", devices), devices);
    const NamedSharding s = padded(mesh, P("x"));
    const Array a = local_data_to_global_array(mine, s, exec);
    for (const int d : local(mesh, exec)) {
      EXPECT_TRUE(a.shard_tensor(d) == expected_shard(global, s, d)) << devices << " device " << d;
    }
    EXPECT_TRUE(a.to_host() == global) << devices;
  }
}

TEST(PaddedShards, ARefusingShardingStillRefusesNamingPathShapeAndAxis) {
  if (!test::divides_over_processes(3)) GTEST_SKIP() << "3 devices over the processes";
  const Executor exec(3);
  const Mesh mesh = Mesh::parse("x:3", 3);
  const Tensor host = Tensor::zeros(Shape{10}, DType::kF32);
  EXPECT_THROW_WITH(device_put(host, NamedSharding(mesh, P("x")), exec), SpecError,
                    "(shape [10]) is not divisible by mesh axis 'x' (size 3)");
  const Tree<Tensor> tree = Tree<Tensor>::dict({{"w", host}});
  EXPECT_THROW_WITH(device_put(tree, Tree<NamedSharding>(NamedSharding(mesh, P("x"))), exec),
                    SpecError, "10 is not a multiple of 3", "(leaf 'w')");
  // A padded array resharded onto a refusing sharding that does not divide.
  const Array a = device_put(host, padded(mesh, P("x")), exec);
  EXPECT_THROW_WITH(reshard(a, NamedSharding(mesh, P("x"))), SpecError, "'reshard'", "[10]",
                    "'x' (size 3)");
  EXPECT_TRUE(reshard(a, NamedSharding(mesh, P())).array.to_host() == host);
}

}  // namespace
}  // namespace shardplan
