// Collectives and reshard: values kept bit-exactly between every pair of shardings, results
// against plain references, the routes reshard picks and the bytes they move, errors. The same
// binary runs under mpirun with 2 and 4 processes (ctest mpi.np*.collectives_test): each process
// checks the shards of its own devices, and meshes that do not spread evenly are skipped.
#include "shardplan/collectives.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "runtime_fixtures.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using test::all_specs;
using test::local;
using test::slice_of;

TEST(Reshard, EveryPairOfShardingsKeepsTheValuesBitExactly) {
  // Every pair: a mesh of k axes has sum_m C(k, m) * r(r+1)...(r+m-1) specs of rank r (m axes
  // spread over r ordered lists), i.e. 2/3/4 (one axis), 5/11/19 (two), 16/49/106 (three) for
  // ranks 1/2/3; squared and summed: 29 pairs for one axis, 507 for two, 13893 for three.
  const struct {
    const char* axes;
    int devices;
    int pairs;
  } meshes[] = {{"x:1", 1, 29},
                {"x:2", 2, 29},
                {"x:2,y:2", 4, 507},
                {"x:4,y:2", 8, 507},
                {"x:2,y:2,z:2", 8, 13893}};
  int pairs = 0, expected = 0;
  for (const auto& mc : meshes) {
    if (!test::divides_over_processes(mc.devices)) continue;
    expected += mc.pairs;
    const Executor exec(mc.devices);
    const Mesh mesh = Mesh::parse(mc.axes, mc.devices);
    for (const Shape& shape : {Shape{16}, Shape{8, 16}, Shape{8, 8, 16}}) {
      const auto specs = all_specs(mesh, shape.rank());
      const Tensor host = Tensor::uniform(shape, DType::kF32, 5, -1, 1);
      for (std::size_t i = 0; i < specs.size(); ++i) {
        const Array src = device_put(host, NamedSharding(mesh, specs[i]), exec);
        for (const PartitionSpec& to : specs) {
          const NamedSharding target(mesh, to);
          SCOPED_TRACE(fmt::format("{} {}: {} -> {}", mesh.to_string(), shape.to_string(),
                                   specs[i].to_string(), to.to_string()));
          const ReshardResult r = reshard(src, target);
          ASSERT_EQ(r.array.sharding().spec(), to);
          // The static plan (used to cost programs) agrees with what ran, byte for byte.
          // Over processes also the bytes each device stages to receive from other processes.
          const auto planned = plan_reshard(shape, DType::kF32, src.sharding(), {}, target,
                                            test::devices_per_process(exec, mesh));
          ASSERT_EQ(planned.size(), r.steps.size());
          for (std::size_t k = 0; k < planned.size(); ++k) {
            ASSERT_EQ(planned[k].kind, r.steps[k].kind);
            ASSERT_EQ(test::local_bytes(planned[k], mesh, exec),
                      test::local_bytes(r.steps[k], mesh, exec));
            ASSERT_EQ(test::local_staging(planned[k], mesh, exec),
                      test::local_staging(r.steps[k], mesh, exec));
          }
          const auto blocks = target.device_blocks(shape);
          for (const int d : local(mesh, exec)) {
            ASSERT_TRUE(r.array.shard_tensor(d) ==
                        slice_of(host, blocks[static_cast<std::size_t>(d)]));
          }
          ++pairs;
        }
      }
    }
  }
  EXPECT_EQ(pairs, expected);
  if (distributed::process_count() == 1) {
    EXPECT_EQ(pairs, 14965);
  }
}

TEST(Reshard, PicksTheCheapestRouteAndCountsItsBytes) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("x:4,y:2", 8);
  const Shape shape{64, 32};  // f32: 8 KiB
  const std::int64_t total = 64 * 32 * 4;
  const Array a = Array::normal(shape, DType::kF32, NamedSharding(mesh, P("x")), exec, 1);

  // Splitting further: a local slice, nothing moves.
  ReshardResult r = reshard(a, NamedSharding(mesh, P("x", "y")));
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].kind, CollectiveKind::kSlice);
  EXPECT_EQ(r.steps[0].total_bytes_in(), 0);

  // Merging: all-gather; each device receives the 3/4 of the array it does not hold.
  r = reshard(a, NamedSharding(mesh, P()));
  EXPECT_EQ(r.steps[0].kind, CollectiveKind::kAllGather);
  EXPECT_EQ(r.steps[0].axes, (std::vector<std::string>{"x"}));
  for (const int d : local(mesh, exec))
    EXPECT_EQ(r.steps[0].bytes_in[static_cast<std::size_t>(d)], total * 3 / 4);

  // A split moving to the other dimension: all-to-all; each device keeps 1/4 of its new block.
  r = reshard(a, NamedSharding(mesh, P(nullptr, "x")));
  EXPECT_EQ(r.steps[0].kind, CollectiveKind::kAllToAll);
  EXPECT_EQ(r.steps[0].max_bytes_in(), total / 4 * 3 / 4);

  // Equivalent shardings: nothing at all.
  const Mesh m1 = Mesh::parse("x:4,one:1,y:2", 8);
  const Array b = Array::zeros(shape, DType::kF32, NamedSharding(m1, P("x")), exec);
  r = reshard(b, NamedSharding(m1, P(AxisNames{"x", "one"})));
  EXPECT_TRUE(r.steps.empty());
  const int first = local(m1, exec).front();
  EXPECT_EQ(r.array.shard(first).data(), b.shard(first).data());

  // Anything else: one general step, still fetching only what each device lacks.
  r = reshard(a, NamedSharding(mesh, P("y", "x")));
  EXPECT_EQ(r.steps[0].kind, CollectiveKind::kGeneral);
  EXPECT_TRUE(r.array.to_host() == a.to_host());
}

// Per-device f32 summands: device d holds value (d + 1) * (i + 1) / 7 at element i of its block.
Tensor summands(const Shape& shard, DType dtype, int d) {
  return Tensor::generate(shard, dtype, Generator::iota((d + 1) / 7.0, (d + 1) / 7.0));
}

// An array pending `p` whose device d holds summands(d) (the devices of this process only).
Array pending_array(const Executor& exec, const NamedSharding& s, const Shape& shape,
                    const Pending& p, DType dtype = DType::kF32) {
  const Shape shard = s.shard_shape(shape);
  std::vector<std::shared_ptr<Buffer>> bufs(static_cast<std::size_t>(exec.num_devices()));
  for (const int d : local(s.mesh(), exec)) {
    Tensor t = summands(shard, dtype, d);
    auto b = std::make_shared<Buffer>(exec.allocate(d, t.nbytes()));
    std::memcpy(b->data(), t.bytes(), static_cast<std::size_t>(t.nbytes()));
    bufs[static_cast<std::size_t>(d)] = b;
  }
  return Array::from_buffers(exec, shape, dtype, s, bufs, p);
}

// The reference: op over the group's summands in group order, in f32 (as the runtime
// accumulates).
Tensor reference_reduce(const Array& x, int device, const std::vector<std::string>& axes,
                        ReduceOp op) {
  const auto g = device_group(x.mesh(), device, axes);
  Tensor out = summands(x.shard_shape(), x.dtype(), g[0]);
  Tensor acc(out.shape(), DType::kF32);
  for (std::int64_t i = 0; i < out.numel(); ++i) acc.set(i, out.get(i));
  for (std::size_t k = 1; k < g.size(); ++k) {
    const Tensor t = summands(x.shard_shape(), x.dtype(), g[k]);
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      const float a = static_cast<float>(acc.get(i));
      const float v = static_cast<float>(t.get(i));
      acc.set(i, op == ReduceOp::kMax   ? std::max(a, v)
                 : op == ReduceOp::kMin ? std::min(a, v)
                                        : a + v);
    }
  }
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const float a = static_cast<float>(acc.get(i));
    out.set(i, op == ReduceOp::kMean ? a / static_cast<float>(g.size()) : a);
  }
  return out;
}

TEST(Collectives, AllReduceMatchesAPlainReferenceForEveryOp) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("x:2,y:4", 8);
  const NamedSharding s(mesh, P("x"));
  for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin}) {
    const Array x = pending_array(exec, s, Shape{6, 5}, Pending{op, {"y"}});
    CollectiveRecord rec;
    const Array y = all_reduce(x, {}, &rec);
    EXPECT_FALSE(y.is_pending());
    for (const int d : local(mesh, exec)) {
      EXPECT_TRUE(y.shard_tensor(d) == reference_reduce(x, d, {"y"}, op)) << to_string(op) << d;
    }
    EXPECT_TRUE(y.to_host() == x.to_host());  // to_host of the pending array reduces alike
    // Busbw convention: 2 (n-1)/n of the shard per device (15 elements split into 4 chunks).
    EXPECT_EQ(rec.kind, CollectiveKind::kAllReduce);
    EXPECT_NEAR(static_cast<double>(rec.max_bytes_in()), 2.0 * 3 / 4 * 15 * 4, 8.0);
  }
}

TEST(Collectives, AllReduceIsBitwiseTheSameEveryRunAndFreesItsTemporaries) {
  const Executor exec(8);
  const NamedSharding s(Mesh::parse("x:8", 8), P());
  const Array x = pending_array(exec, s, Shape{1000}, Pending{ReduceOp::kSum, {"x"}});
  const int d = local(s.mesh(), exec).back();
  const std::int64_t before = exec.memory(d).in_use;
  const Tensor first = all_reduce(x).shard_tensor(d);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(all_reduce(x).shard_tensor(d) == first);
  EXPECT_EQ(exec.memory(d).in_use, before);
}

TEST(Collectives, Bf16ReducesInF32AndRoundsOnce) {
  const Executor exec(4);
  const NamedSharding s(Mesh::parse("x:4", 4), P());
  const Array x = pending_array(exec, s, Shape{16}, Pending{ReduceOp::kSum, {"x"}}, DType::kBF16);
  const Array y = all_reduce(x);
  const int here = local(s.mesh(), exec).front();
  for (std::int64_t i = 0; i < 16; ++i) {
    float acc = 0;
    for (int d = 0; d < 4; ++d) {
      acc += static_cast<float>(summands(Shape{16}, DType::kBF16, d).get(i));
    }
    EXPECT_EQ(y.shard_tensor(here).get(i), static_cast<double>(static_cast<float>(bf16(acc))));
  }
}

TEST(Collectives, ReducingSomePendingAxesLeavesTheRestPending) {
  const Executor exec(8);
  const NamedSharding s(Mesh::parse("x:2,y:2,z:2", 8), P());
  const Array x = pending_array(exec, s, Shape{4}, Pending{ReduceOp::kSum, {"y", "z"}});
  const Array y = all_reduce(x, {"z"});
  EXPECT_EQ(y.pending().axes, (std::vector<std::string>{"y"}));
  EXPECT_TRUE(all_reduce(y).to_host() == all_reduce(x).to_host());
}

TEST(Collectives, ReduceScatterLeavesEachDeviceItsPartOfTheSum) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("x:2,y:4", 8);
  const Array x =
      pending_array(exec, NamedSharding(mesh, P("x")), Shape{4, 8}, Pending{ReduceOp::kSum, {"y"}});
  CollectiveRecord rec;
  const Array y = reduce_scatter(x, 1, {}, &rec);
  EXPECT_EQ(y.sharding().spec(), P("x", "y"));
  EXPECT_FALSE(y.is_pending());
  const Tensor full = x.to_host();
  const auto blocks = y.sharding().device_blocks(y.shape());
  for (const int d : local(mesh, exec)) {
    EXPECT_TRUE(y.shard_tensor(d) == slice_of(full, blocks[static_cast<std::size_t>(d)])) << d;
    EXPECT_EQ(rec.bytes_in[static_cast<std::size_t>(d)], 3 * y.shard_nbytes());
  }
  // The static plan of a pending reshard matches what runs.
  for (const PartitionSpec& to : {P("x", "y"), P(nullptr, "x"), P()}) {
    const ReshardResult ran = reshard(x, NamedSharding(mesh, to));
    const auto planned = plan_reshard(x.shape(), x.dtype(), x.sharding(), x.pending(),
                                      NamedSharding(mesh, to), test::devices_per_process(exec, mesh));
    ASSERT_EQ(planned.size(), ran.steps.size()) << to.to_string();
    for (std::size_t k = 0; k < planned.size(); ++k) {
      EXPECT_EQ(planned[k].kind, ran.steps[k].kind);
      EXPECT_EQ(test::local_bytes(planned[k], mesh, exec),
                test::local_bytes(ran.steps[k], mesh, exec))
          << to.to_string() << k;
      EXPECT_EQ(test::local_staging(planned[k], mesh, exec),
                test::local_staging(ran.steps[k], mesh, exec))
          << to.to_string() << k;
    }
  }
  // Reshard picks reduce-scatter for the same move, all-reduce for another target.
  EXPECT_EQ(reshard(x, NamedSharding(mesh, P("x", "y"))).steps.front().kind,
            CollectiveKind::kReduceScatter);
  const ReshardResult r = reshard(x, NamedSharding(mesh, P(nullptr, "x")));
  EXPECT_EQ(r.steps.front().kind, CollectiveKind::kAllReduce);
  EXPECT_TRUE(r.array.to_host() == full);
}

// A pending sum resharded: its values are the sum over all eight devices, as the all-reduce
// gives it (in another order of additions: within a few f32 roundings of eight terms), and the
// static plan (plan_reshard) is the steps that ran, kind, axes, bytes and staging.
void expect_the_sum_as_planned(const Array& x, const NamedSharding& to, const ReshardResult& ran,
                               const Executor& exec) {
  const Mesh& mesh = x.mesh();
  const Tensor want = all_reduce(x).to_host();
  const Tensor got = ran.array.to_host();
  ASSERT_EQ(got.numel(), want.numel());
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    EXPECT_NEAR(got.get(i), want.get(i), 8 * 0x1p-23 * std::abs(want.get(i))) << i;
  }
  const auto planned = plan_reshard(x.shape(), x.dtype(), x.sharding(), x.pending(), to,
                                    test::devices_per_process(exec, mesh));
  ASSERT_EQ(planned.size(), ran.steps.size());
  for (std::size_t k = 0; k < planned.size(); ++k) {
    EXPECT_EQ(planned[k].kind, ran.steps[k].kind);
    EXPECT_EQ(planned[k].axes, ran.steps[k].axes);
    EXPECT_EQ(test::local_bytes(planned[k], mesh, exec), test::local_bytes(ran.steps[k], mesh, exec));
    EXPECT_EQ(test::local_staging(planned[k], mesh, exec),
              test::local_staging(ran.steps[k], mesh, exec));
  }
}

// A sum pending over two axes, to a target that shards one dimension over each: two
// reduce-scatters (the mesh's innermost axis first), never an all-reduce and a slice. By hand,
// f32[8, 8] on x:2,y:4 to P("y", "x"): over y into dimension 0 (shard [2, 8], 3 x 64 bytes from
// the group), then over x into dimension 1 (shard [2, 4], 1 x 32 bytes).
TEST(Collectives, APendingSumOverTwoAxesIsReduceScatteredIntoTwoDimensions) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("x:2,y:4", 8);
  const Array x =
      pending_array(exec, NamedSharding(mesh, P()), Shape{8, 8}, Pending{ReduceOp::kSum, {"x", "y"}});
  const NamedSharding to(mesh, P("y", "x"));
  const ReshardResult ran = reshard(x, to);
  ASSERT_EQ(ran.steps.size(), 2u);
  EXPECT_EQ(ran.steps[0].kind, CollectiveKind::kReduceScatter);
  EXPECT_EQ(ran.steps[0].axes, (std::vector<std::string>{"y"}));
  EXPECT_EQ(ran.steps[1].kind, CollectiveKind::kReduceScatter);
  EXPECT_EQ(ran.steps[1].axes, (std::vector<std::string>{"x"}));
  for (const int d : local(mesh, exec)) {
    EXPECT_EQ(ran.steps[0].bytes_in[static_cast<std::size_t>(d)], 3 * 2 * 8 * 4);
    EXPECT_EQ(ran.steps[1].bytes_in[static_cast<std::size_t>(d)], 1 * 2 * 4 * 4);
  }
  EXPECT_EQ(ran.array.sharding().spec(), P("y", "x"));
  EXPECT_FALSE(ran.array.is_pending());
  expect_the_sum_as_planned(x, to, ran, exec);
}

// HSDP's gradient: a sum pending over (replicate x, shard y) to a target sharded over y only is
// a reduce-scatter in each y group, then an all-reduce of the part across x (FSDP's
// HYBRID_SHARD), not an all-reduce over both and a slice. By hand, f32[8, 8] on x:2,y:4 to
// P("y"): the reduce-scatter receives 3 x 64 B (shard [2, 8]); the all-reduce over x of [2, 8]
// (16 elements in 2 chunks of 8) receives 8 x 4 from the other device's chunk and 8 x 4 of the
// gathered half, 64 B: 256 B in all, where an all-reduce over all eight devices receives
// (7 x 8 + 56) x 4 = 448 B. (Before, this target was the all-reduce.)
TEST(Collectives, APendingSumOverAReplicaAxisIsAllReducedAfterTheScatter) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("x:2,y:4", 8);
  const Array x =
      pending_array(exec, NamedSharding(mesh, P()), Shape{8, 8}, Pending{ReduceOp::kSum, {"x", "y"}});
  const NamedSharding to(mesh, P("y"));
  const ReshardResult ran = reshard(x, to);
  ASSERT_EQ(ran.steps.size(), 2u);
  EXPECT_EQ(ran.steps[0].kind, CollectiveKind::kReduceScatter);
  EXPECT_EQ(ran.steps[0].axes, (std::vector<std::string>{"y"}));
  EXPECT_EQ(ran.steps[1].kind, CollectiveKind::kAllReduce);
  EXPECT_EQ(ran.steps[1].axes, (std::vector<std::string>{"x"}));
  for (const int d : local(mesh, exec)) {
    EXPECT_EQ(ran.steps[0].bytes_in[static_cast<std::size_t>(d)], 3 * 2 * 8 * 4);
    EXPECT_EQ(ran.steps[1].bytes_in[static_cast<std::size_t>(d)], 64);
  }
  EXPECT_EQ(ran.array.sharding().spec(), P("y"));
  EXPECT_FALSE(ran.array.is_pending());
  expect_the_sum_as_planned(x, to, ran, exec);
  // A target no pending axis shards a dimension over: one all-reduce over both.
  const ReshardResult whole = reshard(x, NamedSharding(mesh, P()));
  ASSERT_EQ(whole.steps.size(), 1u);
  EXPECT_EQ(whole.steps[0].kind, CollectiveKind::kAllReduce);
  EXPECT_EQ(whole.steps[0].axes, (std::vector<std::string>{"x", "y"}));
}

TEST(Collectives, AllGatherAndAllToAllKeepTheValue) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("x:4,y:2", 8);
  const Tensor host = Tensor::normal(Shape{8, 8}, DType::kF64, 2);
  const Array a = device_put(host, NamedSharding(mesh, P(AxisNames{"x", "y"})), exec);
  const Array g = all_gather(a, {"y"});
  EXPECT_EQ(g.sharding().spec(), P("x"));
  EXPECT_TRUE(g.to_host() == host);
  const Array t = all_to_all(a, {"y"}, 0, 1);
  EXPECT_EQ(t.sharding().spec(), P("x", "y"));
  EXPECT_TRUE(t.to_host() == host);
}

TEST(Collectives, PermuteShiftsBlocksAlongAnAxis) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("x:4,y:2", 8);
  const Array a = Array::generate(Shape{8, 2}, DType::kI32, NamedSharding(mesh, P("x", "y")), exec,
                                  Generator::iota());
  CollectiveRecord rec;
  // A ring: coordinate i sends to i+1; coordinate 0 receives from 3.
  const Array b = permute(a, "x", {{0, 1}, {1, 2}, {2, 3}, {3, 0}}, &rec);
  const Tensor host = a.to_host();
  const auto blocks = a.sharding().device_blocks(a.shape());
  auto block_of = [&](int d) { return slice_of(host, blocks[static_cast<std::size_t>(d)]); };
  for (const int d : local(mesh, exec)) {
    const auto c = mesh.coords_of_position(mesh.position_of_device(d));
    const int from = static_cast<int>((c[0] + 3) % 4 * 2 + c[1]);
    EXPECT_TRUE(b.shard_tensor(d) == block_of(from)) << d;
    EXPECT_EQ(rec.bytes_in[static_cast<std::size_t>(d)], a.shard_nbytes());
  }
  const Array c = permute(a, "x", {{0, 1}});
  if (exec.is_local(0)) {
    EXPECT_EQ(c.shard_tensor(0).to_doubles(), (std::vector<double>{0, 0}));  // nobody sends to 0
  }
  if (exec.is_local(2)) {
    EXPECT_TRUE(c.shard_tensor(2) == block_of(0));
  }
}

TEST(Collectives, ErrorsNameTheArrayAndTheAxes) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("x:4,y:2", 8);
  const Array a = Array::zeros(Shape{8, 8}, DType::kF32, NamedSharding(mesh, P("x")), exec);
  EXPECT_THROW_WITH(all_gather(a, {"y"}), SpecError, "axis 'y' shards no dimension");
  EXPECT_THROW_WITH(all_reduce(a), ArrayError, "not pending");
  EXPECT_THROW_WITH(all_to_all(a, {"y"}, 0, 1), SpecError, "'y'", "minor axes of dimension 0");
  EXPECT_THROW_WITH(all_to_all(a, {"x"}, 0, 0), SpecError, "dimensions 0 -> 0");
  EXPECT_THROW_WITH(permute(a, "x", {{0, 4}}), SpecError, "(0, 4)", "size 4");
  EXPECT_THROW_WITH(permute(a, "x", {{0, 1}, {2, 1}}), SpecError, "receives twice");
  const Array p =
      pending_array(exec, NamedSharding(mesh, P("x")), Shape{8}, {ReduceOp::kSum, {"y"}});
  EXPECT_THROW_WITH(all_gather(p, {"x"}), ArrayError, "pending a sum over 'y'");
  EXPECT_THROW_WITH(all_reduce(p, {"x"}), SpecError, "axis 'x' is not pending");
  const Mesh other = Mesh(std::vector<std::pair<std::string, std::int64_t>>{{"x", 4}, {"y", 2}},
                          std::vector<int>{7, 6, 5, 4, 3, 2, 1, 0});
  EXPECT_THROW_WITH(reshard(a, NamedSharding(other, P("x"))), ArrayError, "devices 0,1,2",
                    "devices 7,6,5");
  EXPECT_THROW_WITH(reshard(a, NamedSharding(mesh, P(nullptr, "z"))), SpecError, "'z'");
  const Array b = Array::zeros(Shape{8, 8}, DType::kF32, NamedSharding(other, P("x")), exec);
  EXPECT_THROW_WITH(check_same_placement(a, b, "add"), ArrayError, "[add]", "different meshes");
  EXPECT_THROW_WITH(
      check_same_placement(
          a, Array::zeros(Shape{8}, DType::kF32, NamedSharding(mesh, P()), Executor(8)), "add"),
      ArrayError, "different executors");
}

TEST(Collectives, RecordsPrintWhatMoved) {
  CollectiveRecord r{CollectiveKind::kAllGather, {"x"}, {0, 1024, 2048}};
  EXPECT_EQ(r.max_bytes_in(), 2048);
  EXPECT_EQ(r.total_bytes_in(), 3072);
  EXPECT_EQ(r.to_string(), "all_gather over 'x': 2.00 KiB max per device, 3.00 KiB in all");
}

TEST(PlanReshard, ChunksOfHugeShardsAreCountedWithoutOverflow) {
  const Mesh mesh = Mesh::parse("x:4", 4);
  const NamedSharding rep(mesh, P());
  // u8[2^62] pending over 4 devices: chunk = 2^60; each device receives 3 chunks in the
  // reduce-scatter and 3 in the all-gather: 6 * 2^60 bytes (r * total would pass int64).
  const auto steps = plan_reshard(Shape{4611686018427387904}, DType::kU8, rep,
                                  Pending{ReduceOp::kSum, {"x"}}, rep);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].kind, CollectiveKind::kAllReduce);
  for (const std::int64_t b : steps[0].bytes_in) EXPECT_EQ(b, 6917529027641081856LL);
  // u8[7 * 2^60]: 1.5 times that per device, past int64.
  EXPECT_THROW_WITH(plan_reshard(Shape{8070450532247928832}, DType::kU8, rep,
                                 Pending{ReduceOp::kSum, {"x"}}, rep),
                    SpecError, "all_reduce", "u8[8070450532247928832]", "overflow int64");
  EXPECT_THROW_WITH(plan_reshard(Shape{2305843009213693952}, DType::kF32, rep, {}, rep), SpecError,
                    "byte size of f32[2305843009213693952]");
}

TEST(CollectiveRecord, TotalsOfByteCountsSaturateAtInt64Max) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const CollectiveRecord rec{CollectiveKind::kAllGather, {"x"}, {kMax - 1, 5, 7}};
  EXPECT_EQ(rec.total_bytes_in(), kMax);
  EXPECT_EQ(rec.max_bytes_in(), kMax - 1);
  const CollectiveRecord small{CollectiveKind::kAllGather, {"x"}, {3, 5, 7}};
  EXPECT_EQ(small.total_bytes_in(), 15);
}

}  // namespace
}  // namespace shardplan
