// Array: device_put / to_host over every spec of meshes of 1 to 8 devices, generated arrays,
// pending (partial) arrays, memory accounting, errors.
#include "shardplan/array.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>

#include "runtime_fixtures.hpp"
#include "shardplan/error.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using test::all_specs;
using test::slice_of;

struct MeshCase {
  const char* axes;
  int devices;
};
const MeshCase kMeshes[] = {{"x:1", 1}, {"x:2", 2},     {"x:4", 4},        {"x:2,y:2", 4},
                            {"x:8", 8}, {"x:4,y:2", 8}, {"x:2,y:2,z:2", 8}};
const Shape kShapes[] = {Shape{16}, Shape{8, 16}, Shape{8, 8, 16}};

TEST(Array, DevicePutThenToHostIsBitExactForEverySpec) {
  int checked = 0;
  for (const auto& mc : kMeshes) {
    const Executor exec(mc.devices);
    // Devices in a non-trivial order, so block placement follows the mesh, not the ids.
    std::vector<int> order;
    for (int d = mc.devices - 1; d >= 0; --d) order.push_back(d);
    const Mesh parsed = Mesh::parse(mc.axes, mc.devices);
    std::vector<std::pair<std::string, std::int64_t>> axes;
    for (int i = 0; i < parsed.ndim(); ++i) {
      axes.emplace_back(parsed.axis_names()[static_cast<std::size_t>(i)],
                        parsed.axis_sizes()[static_cast<std::size_t>(i)]);
    }
    for (const bool reversed : {false, true}) {
      const Mesh mesh = reversed ? Mesh(axes, order) : parsed;
      for (const Shape& shape : kShapes) {
        const Tensor host = Tensor::normal(shape, DType::kF32, 11);
        for (const PartitionSpec& spec : all_specs(mesh, shape.rank())) {
          const NamedSharding sharding(mesh, spec);
          SCOPED_TRACE(
              fmt::format("{} {} {}", mesh.to_string(), shape.to_string(), spec.to_string()));
          const Array a = device_put(host, sharding, exec);
          ASSERT_TRUE(a.to_host() == host);
          const auto blocks = sharding.device_blocks(shape);
          for (const int d : mesh.devices()) {
            ASSERT_TRUE(a.shard_tensor(d) == slice_of(host, blocks[static_cast<std::size_t>(d)]));
            ASSERT_EQ(exec.memory(d).in_use, a.shard_nbytes());
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(Array, EveryComputableDtypeRoundTrips) {
  const Executor exec(4);
  const NamedSharding s(Mesh::parse("x:2,y:2", 4), P("y", "x"));
  for (const DType dt : {DType::kF32, DType::kBF16, DType::kF64, DType::kI32, DType::kI64}) {
    const Tensor host = Tensor::generate(Shape{4, 6}, dt, Generator::uniform(5, -100, 100));
    const Array a = device_put(host, s, exec);
    EXPECT_TRUE(a.to_host() == host) << name(dt);
    EXPECT_EQ(a.shard_nbytes(), 2 * 3 * static_cast<std::int64_t>(size_of(dt)));
  }
  // Bytes-only dtypes move too (no arithmetic needed).
  Tensor raw(Shape{4}, DType::kU8);
  for (int i = 0; i < 4; ++i) raw.bytes()[i] = std::byte(i * 60);
  EXPECT_TRUE(device_put(raw, NamedSharding(Mesh::parse("x:4", 4), P("x")), exec).to_host() == raw);
}

TEST(Array, GeneratedArraysEqualTheUnshardedFillAndNeverHoldTheWhole) {
  const Executor exec(8);
  const NamedSharding s(Mesh::parse("x:4,y:2", 8), P("x", "y"));
  const Shape shape{64, 32};
  exec.reset_peak();
  const Array a = Array::normal(shape, DType::kF32, s, exec, 123, 0.5, 2.0);
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(exec.memory(d).peak, a.shard_nbytes()) << d;  // 1/8 of the array, never more
  }
  EXPECT_EQ(a.shard_nbytes() * 8, a.nbytes());
  EXPECT_TRUE(a.to_host() == Tensor::normal(shape, DType::kF32, 123, 0.5, 2.0));
  EXPECT_TRUE(Array::uniform(shape, DType::kBF16, NamedSharding(s.mesh(), P(nullptr, "x")), exec, 9)
                  .to_host() == Tensor::uniform(shape, DType::kBF16, 9));
  EXPECT_TRUE(Array::ones(Shape{8}, DType::kI32, NamedSharding(s.mesh(), P("x")), exec).to_host() ==
              Tensor::ones(Shape{8}, DType::kI32));
}

TEST(Array, ReplicasHoldCopiesAndAreAccountedEach) {
  const Executor exec(4);
  const NamedSharding s(Mesh::parse("x:2,y:2", 4), P("x"));
  const Tensor host = Tensor::generate(Shape{4, 2}, DType::kF32, Generator::iota());
  const Array a = device_put(host, s, exec);
  // Devices 0,1 hold rows 0-1; devices 2,3 rows 2-3 (y replicates).
  EXPECT_TRUE(a.shard_tensor(0) == a.shard_tensor(1));
  EXPECT_EQ(a.shard_tensor(2).to_doubles(), (std::vector<double>{4, 5, 6, 7}));
  for (int d = 0; d < 4; ++d) EXPECT_EQ(exec.memory(d).in_use, 16);
  EXPECT_NE(a.shard(0).data(), a.shard(1).data());
}

TEST(Array, PendingArraysReduceOnTheWayToTheHost) {
  const Executor exec(4);
  const Mesh mesh = Mesh::parse("x:2,y:2", 4);
  const NamedSharding s(mesh, P("x"));
  const Shape shape{4};
  // Device d holds (d+1) * [1, 2] for its block; y is pending.
  auto make = [&](ReduceOp op) {
    std::vector<std::shared_ptr<Buffer>> bufs(4);
    for (int d = 0; d < 4; ++d) {
      bufs[static_cast<std::size_t>(d)] = std::make_shared<Buffer>(exec.allocate(d, 8));
      auto* p = reinterpret_cast<float*>(bufs[static_cast<std::size_t>(d)]->data());
      p[0] = static_cast<float>(d + 1);
      p[1] = static_cast<float>(2 * (d + 1));
    }
    return Array::from_buffers(exec, shape, DType::kF32, s, bufs, Pending{op, {"y"}});
  };
  // Devices 0 and 1 (x=0) hold rows 0-1, devices 2 and 3 (x=1) rows 2-3.
  EXPECT_EQ(make(ReduceOp::kSum).to_host().to_doubles(), (std::vector<double>{3, 6, 7, 14}));
  EXPECT_EQ(make(ReduceOp::kMax).to_host().to_doubles(), (std::vector<double>{2, 4, 4, 8}));
  EXPECT_EQ(make(ReduceOp::kMin).to_host().to_doubles(), (std::vector<double>{1, 2, 3, 6}));
  EXPECT_EQ(make(ReduceOp::kMean).to_host().to_doubles(), (std::vector<double>{1.5, 3, 3.5, 7}));
  EXPECT_THAT(make(ReduceOp::kSum).visualize(), ::testing::HasSubstr("pending sum over 'y'"));
  EXPECT_THAT(make(ReduceOp::kSum).to_string(), ::testing::HasSubstr("pending sum over 'y'"));
}

TEST(Array, DeviceGroupsDifferOnlyAlongTheGivenAxes) {
  const Mesh mesh = Mesh::parse("x:2,y:4", 8);
  EXPECT_EQ(device_group(mesh, 5, {"y"}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(device_group(mesh, 5, {"x"}), (std::vector<int>{1, 5}));
  EXPECT_EQ(device_group(mesh, 5, {}), (std::vector<int>{5}));
  EXPECT_EQ(device_group(mesh, 5, {"x", "y"}).size(), 8u);
  EXPECT_THROW(device_group(mesh, 5, {"z"}), SpecError);
}

// device_group enumerates only the group's coordinates; check it against the definition (every
// device whose mesh coordinates equal the given device's off the axes, in mesh order), on meshes
// with a permuted device order and with axes named twice or out of mesh order.
// varying_axes marks the listed axes in mesh order whatever order they are given in (the axes a
// group over them varies along; device_group and the collectives' group sizes and ranks use it).
TEST(Array, VaryingAxesMarksTheListedAxesInMeshOrder) {
  const Mesh mesh = Mesh::parse("a:2,b:3,c:2", 12);
  EXPECT_EQ(varying_axes(mesh, {"c", "a"}), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(varying_axes(mesh, {}), (std::vector<bool>{false, false, false}));
  EXPECT_THROW_WITH(varying_axes(mesh, {"b", "z"}), SpecError, "'z'");
}

TEST(Array, DeviceGroupsMatchTheDefinitionOnPermutedMeshes) {
  std::vector<int> order(24);
  for (int i = 0; i < 24; ++i) order[static_cast<std::size_t>(i)] = (i * 7) % 24;  // a permutation
  const std::vector<Mesh> meshes{Mesh::parse("a:2,b:3,c:4", 24),
                                 Mesh({{"a", 2}, {"b", 3}, {"c", 4}}, order),
                                 Mesh({{"a", 4}, {"b", 1}, {"c", 6}}, order)};
  const std::vector<std::vector<std::string>> axes_sets{
      {}, {"a"}, {"b"}, {"c"}, {"c", "a"}, {"a", "b", "c"}, {"b", "b"}, {"c", "b"}};
  for (const Mesh& mesh : meshes) {
    for (const auto& axes : axes_sets) {
      for (const int d : mesh.devices()) {
        const auto mine = mesh.coords_of_position(mesh.position_of_device(d));
        std::vector<int> expect;
        for (std::int64_t pos = 0; pos < mesh.size(); ++pos) {
          const auto c = mesh.coords_of_position(pos);
          bool same = true;
          for (int i = 0; i < mesh.ndim(); ++i) {
            const std::string& n = mesh.axis_names()[static_cast<std::size_t>(i)];
            const bool varies = std::find(axes.begin(), axes.end(), n) != axes.end();
            same = same &&
                   (varies || c[static_cast<std::size_t>(i)] == mine[static_cast<std::size_t>(i)]);
          }
          if (same) expect.push_back(mesh.devices()[static_cast<std::size_t>(pos)]);
        }
        ASSERT_EQ(device_group(mesh, d, axes), expect)
            << mesh.to_string() << " device " << d << " axes " << axes.size();
      }
    }
  }
}

TEST(Array, TreesArePutWithAPrefixTreeOfShardings) {
  const Executor exec(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  const Tree<Tensor> params =
      Tree<Tensor>::dict({{"w", Tensor::ones(Shape{4, 2}, DType::kF32)},
                          {"layers", Tree<Tensor>::list({Tensor::ones(Shape{2}, DType::kF32),
                                                         Tensor::ones(Shape{6}, DType::kF32)})}});
  const Tree<NamedSharding> shardings = Tree<NamedSharding>::dict(
      {{"w", NamedSharding(mesh, P(nullptr, "x"))}, {"layers", NamedSharding(mesh, P("x"))}});
  const Tree<Array> arrays = device_put(params, shardings, exec);
  EXPECT_EQ(arrays.at("w").leaf().shard_shape(), Shape({4, 1}));
  EXPECT_EQ(arrays.at_path("layers/1").leaf().shard_shape(), Shape({3}));
  EXPECT_EQ(to_host(arrays), params);
  const Tree<Tensor> odd = Tree<Tensor>::dict({{"w", Tensor::ones(Shape{3}, DType::kF32)}});
  EXPECT_THROW_WITH(device_put(odd, Tree<NamedSharding>(NamedSharding(mesh, P("x"))), exec),
                    SpecError, "'w'", "[3]", "'x'");
}

TEST(Array, ANoneNodeInTheShardingTreeIsReplicated) {
  const Executor exec(2);
  const Mesh mesh = Mesh::parse("x:2", 2);
  const Tree<Tensor> params =
      Tree<Tensor>::dict({{"w", Tensor::normal(Shape{4, 2}, DType::kF32, 1)},
                          {"b", Tensor::normal(Shape{6}, DType::kF32, 2)}});
  const Tree<NamedSharding> shardings = Tree<NamedSharding>::dict(
      {{"w", NamedSharding(mesh, P("x"))}, {"b", Tree<NamedSharding>::none()}});
  const Tree<Array> arrays = device_put(params, shardings, exec);
  EXPECT_EQ(arrays.at("w").leaf().shard_shape(), Shape({2, 2}));
  EXPECT_EQ(arrays.at("b").leaf().sharding(), NamedSharding(mesh, P()));
  EXPECT_EQ(arrays.at("b").leaf().shard_shape(), Shape({6}));
  EXPECT_EQ(to_host(arrays), params);
  // With no sharding anywhere there is no mesh to replicate over.
  EXPECT_THROW_WITH(device_put(params, Tree<NamedSharding>::none(), exec), TreeError, "the root",
                    "None", "mesh");
}

TEST(Array, ErrorsNameWhatIsWrong) {
  const Executor exec(4);
  const Mesh mesh8 = Mesh::parse("x:8", 8);
  const Tensor t = Tensor::ones(Shape{8}, DType::kF32);
  EXPECT_THROW_WITH(device_put(t, NamedSharding(mesh8, P("x")), exec), ArrayError, "device 7",
                    "4 devices");
  const Mesh mesh = Mesh::parse("x:4", 4);
  EXPECT_THROW_WITH(
      device_put(Tensor::ones(Shape{6}, DType::kF32), NamedSharding(mesh, P("x")), exec), SpecError,
      "[6]", "'x'");
  // A mesh over fewer devices than the executor has: the others hold nothing.
  const Array a = device_put(t, NamedSharding(Mesh::parse("x:2", 2), P("x")), exec);
  EXPECT_THROW_WITH(a.shard(3), ArrayError, "device 3 holds no shard");
  EXPECT_EQ(a.shard_tensor(1).to_doubles(), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_THROW_WITH(Array().shape(), ArrayError, "empty");
  std::vector<std::shared_ptr<Buffer>> bufs(4);
  for (int d = 0; d < 4; ++d)
    bufs[static_cast<std::size_t>(d)] = std::make_shared<Buffer>(exec.allocate(d, 4));
  EXPECT_THROW_WITH(
      Array::from_buffers(exec, Shape{8}, DType::kF32, NamedSharding(mesh, P("x")), bufs),
      ArrayError, "8 bytes", "got 4 bytes");
  EXPECT_THROW_WITH(Array::from_buffers(exec, Shape{4}, DType::kF32, NamedSharding(mesh, P("x")),
                                        bufs, Pending{ReduceOp::kSum, {"x"}}),
                    SpecError, "pending axis 'x'", "shards a dimension");
  EXPECT_THROW_WITH(Array::zeros(Shape{4}, DType::kU8, NamedSharding(mesh, P("x")), exec),
                    SpecError, "u8");
}

TEST(Array, FailedAllocationLeavesNothingBehind) {
  const Executor exec(4, 64);
  const NamedSharding s(Mesh::parse("x:2", 2), P());
  Buffer hog = exec.allocate(1, 40);
  EXPECT_THROW(Array::zeros(Shape{8}, DType::kF32, s, exec), OutOfMemoryError);  // 32 B each
  EXPECT_EQ(exec.memory(0).in_use, 0);
  EXPECT_EQ(exec.memory(1).in_use, 40);
}

TEST(Array, VisualizeDrawsTheShardingPicture) {
  const Executor exec(8);
  const NamedSharding s(Mesh::parse("x:4,y:2", 8), P("x", "y"));
  const Array a = Array::zeros(Shape{8, 8}, DType::kF32, s, exec);
  EXPECT_EQ(visualize(a), s.visualize(Shape{8, 8}));
}

TEST(Array, ShapesWhoseGlobalBytesOverflowThrowBeforeAllocating) {
  const Executor exec(2);
  const NamedSharding s(Mesh::parse("x:2", 2), P("x"));
  // f32[2^61]: 2^63 bytes in all (past int64), though each shard's 2^62 would fit.
  EXPECT_THROW_WITH(Array::zeros(Shape{2305843009213693952}, DType::kF32, s, exec), SpecError,
                    "byte size of f32[2305843009213693952]", "overflows int64");
  EXPECT_EQ(exec.memory(0).in_use, 0);
  EXPECT_EQ(exec.memory(0).peak, 0);
  EXPECT_EQ(exec.memory(1).peak, 0);
  std::vector<std::shared_ptr<Buffer>> none(2);
  EXPECT_THROW_WITH(Array::from_buffers(exec, Shape{2305843009213693952}, DType::kF32, s, none),
                    SpecError, "f32[2305843009213693952]");
}

}  // namespace
}  // namespace shardplan
