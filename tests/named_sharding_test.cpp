// NamedSharding: shard shapes, device blocks, replicas, equivalence and pictures.

#include "shardplan/named_sharding.hpp"

#include <set>

#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/shape.hpp"
#include "shardplan/tensor_spec.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {
/// Counts the labelled blocks of a picture and which devices each names, row by row.
std::vector<std::string> labels(const std::string& picture) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while ((pos = picture.find("device", pos)) != std::string::npos) {
    std::size_t end = picture.find("  ", pos);
    std::string label = picture.substr(pos, end - pos);
    while (!label.empty() && (label.back() == ' ')) label.pop_back();
    out.push_back(label);
    pos = end;
  }
  return out;
}

TEST(NamedSharding, ShardShapeDividesEachDimension) {
  const NamedSharding s(Mesh::parse("fsdp:4,tp:2", 8), P("tp", "fsdp"));
  EXPECT_EQ(s.shard_shape(Shape{32000, 4096}), Shape({16000, 1024}));
  EXPECT_EQ(s.shard_bytes(Shape{32000, 4096}, 2), 16000LL * 1024 * 2);
  EXPECT_EQ(s.num_shards(0), 2);
  EXPECT_EQ(s.num_shards(2), 1);
  const NamedSharding both(Mesh::parse("fsdp:4,tp:2", 8), P(AxisNames{"fsdp", "tp"}));
  EXPECT_EQ(both.shard_shape(Shape{64, 3}), Shape({8, 3}));
}

TEST(NamedSharding, NonDivisibleDimensionErrorNamesPathShapeDimAxesAndSizes) {
  const NamedSharding s(Mesh::parse("fsdp:4,tp:2", 8), P(nullptr, AxisNames{"fsdp", "tp"}));
  EXPECT_THROW_WITH(s.shard_shape(Shape{10, 12}, "params/h/3/w"), SpecError, "'params/h/3/w'",
                    "[10, 12]", "dim 1", "fsdp", "tp", "8");
  EXPECT_THROW_WITH(s.shard_shape(Shape{16}, "b"), SpecError, "'b'", "rank 1");
}

// An independent computation of each device's block: device at mesh coords c holds, along dim d
// sharded over axes (a1..ak, major to minor), block index sum_i c[a_i] * prod_{j>i} size(a_j).
TEST(NamedSharding, DeviceBlocksMatchAnIndependentComputation) {
  const Mesh m = Mesh::parse("a:2,b:3,c:2", 12);
  const Shape global{12, 6, 4};
  for (const PartitionSpec& spec : {P("a", "b", "c"), P(AxisNames{"a", "c"}, nullptr, nullptr),
                                    P(AxisNames{"c", "b"}, "a"), P(nullptr, nullptr, "c"), P()}) {
    const NamedSharding s(m, spec);
    const auto blocks = s.device_blocks(global);
    ASSERT_EQ(blocks.size(), 12u);
    for (int dev = 0; dev < 12; ++dev) {
      const auto coords = m.coords_of_position(m.position_of_device(dev));
      for (int d = 0; d < 3; ++d) {
        std::int64_t index = 0, parts = 1;
        for (const std::string& axis : spec[d]) {
          const int ai = m.axis_index(axis);
          index = index * m.axis_sizes()[ai] + coords[ai];
          parts *= m.axis_sizes()[ai];
        }
        const std::int64_t size = global[d] / parts;
        EXPECT_EQ(blocks[dev][d], (DimSlice{index * size, size})) << spec << " device " << dev;
      }
    }
  }
}

TEST(NamedSharding, ReplicaGroupsHoldTheSameBlock) {
  const NamedSharding s(Mesh::parse("x:2,y:2", 4), P("x"));
  EXPECT_EQ(s.replica_groups(Shape{8, 8}), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(s.replication_factor(), 2);
  const NamedSharding r(Mesh::parse("x:2,y:2", 4), P());
  EXPECT_EQ(r.replica_groups(Shape{8}), (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
}

TEST(NamedSharding, EquivalenceIgnoresTrailingNonesAndSizeOneAxes) {
  const Mesh m = Mesh::parse("x:4,one:1", 4);
  EXPECT_TRUE(NamedSharding(m, P("x")).is_equivalent_to(NamedSharding(m, P("x", nullptr)), 2));
  EXPECT_TRUE(
      NamedSharding(m, P(AxisNames{"x", "one"})).is_equivalent_to(NamedSharding(m, P("x")), 1));
  EXPECT_FALSE(NamedSharding(m, P("x")).is_equivalent_to(NamedSharding(m, P(nullptr, "x")), 2));
  const Mesh other = Mesh::parse("x:4,one:1", 4);
  EXPECT_TRUE(NamedSharding(m, P("x")).is_equivalent_to(NamedSharding(other, P("x")), 1));
  const Mesh permuted({{"x", 4}, {"one", 1}}, std::vector<int>{1, 0, 2, 3});
  EXPECT_FALSE(NamedSharding(m, P("x")).is_equivalent_to(NamedSharding(permuted, P("x")), 1));
}

TEST(NamedSharding, UnknownAxisFailsAtConstruction) {
  EXPECT_THROW_WITH(NamedSharding(Mesh::parse("x:2", 2), P("y")), SpecError, "'y'");
}

TEST(NamedSharding, Visualize2DDrawsAGridLabelledByDevice) {
  const NamedSharding s(Mesh::parse("x:4,y:2", 8), P("x", "y"));
  const std::string pic = s.visualize(Shape{8192, 8192});
  // 4 rows of 2 blocks, devices in row-major order as JAX draws them.
  EXPECT_EQ(labels(pic),
            (std::vector<std::string>{"device 0", "device 1", "device 2", "device 3", "device 4",
                                      "device 5", "device 6", "device 7"}));
  EXPECT_EQ(std::count(pic.begin(), pic.end(), '\n'), 4 * 4 + 1);
}

TEST(NamedSharding, VisualizeReplicatedBlocksListAllTheirDevices) {
  const NamedSharding s(Mesh::parse("x:4,y:2", 8), P("x"));
  const auto l = labels(s.visualize(Shape{8192, 8192}));
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0], "devices 0,1");
  EXPECT_EQ(l[3], "devices 6,7");
}

TEST(NamedSharding, Visualize1DAndRankErrors) {
  const NamedSharding s(Mesh::parse("x:4", 4), P("x"));
  EXPECT_EQ(labels(s.visualize(Shape{16})).size(), 4u);
  EXPECT_THROW_WITH(s.visualize(Shape{4, 4, 4}), SpecError, "[4, 4, 4]");
}

}  // namespace
}  // namespace shardplan
