// DType, Shape, Mesh, PartitionSpec and NamedSharding.
#include <set>

#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/shape.hpp"
#include "shardplan/tensor_spec.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(size_of(DType::kF32), 4u);
  EXPECT_EQ(size_of(DType::kBF16), 2u);
  EXPECT_EQ(size_of(DType::kF8E4M3), 1u);
  EXPECT_EQ(size_of(DType::kF64), 8u);
  EXPECT_EQ(size_of(DType::kI64), 8u);
  EXPECT_EQ(size_of(DType::kU16), 2u);
  EXPECT_EQ(size_of(DType::kBool), 1u);
  EXPECT_EQ(safetensors_name(DType::kBF16), "BF16");
  EXPECT_EQ(safetensors_name(DType::kF8E5M2), "F8_E5M2");
}

TEST(DType, ParseAcceptsOwnAndSafetensorsNames) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(parse_dtype("I32"), DType::kI32);
  for (DType d : {DType::kBool, DType::kI8, DType::kU64, DType::kF16, DType::kF64}) {
    EXPECT_EQ(parse_dtype(name(d)), d);
    EXPECT_EQ(parse_dtype(safetensors_name(d)), d);
  }
  EXPECT_THROW_WITH(parse_dtype("F12"), SpecError, "'F12'", "BF16");
}

TEST(Shape, NumelAndBytes) {
  EXPECT_EQ(Shape({}).numel(), 1);
  EXPECT_EQ(Shape({4096, 11008}).numel(), 4096 * 11008);
  EXPECT_EQ((TensorSpec{Shape{4096, 11008}, DType::kBF16}.bytes()), 4096LL * 11008 * 2);
  EXPECT_EQ(Shape({4096, 11008}).to_string(), "[4096, 11008]");
  EXPECT_THROW_WITH(Shape({4, -1}), SpecError, "negative");
}

TEST(Mesh, InfersMinusOneFromDeviceCount) {
  const Mesh m = Mesh::parse("fsdp:-1,tp:2", 8);
  EXPECT_EQ(m.axis_names(), (std::vector<std::string>{"fsdp", "tp"}));
  EXPECT_EQ(m.axis_sizes(), (std::vector<std::int64_t>{4, 2}));
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.to_spec_string(), "fsdp:4,tp:2");
  EXPECT_EQ(Mesh::parse(m.to_spec_string(), 8), m);
}

TEST(Mesh, ParsesBareSizesWithNames) {
  const Mesh m = Mesh::parse("1,-1,2", 16, {"dp", "fsdp", "tp"});
  EXPECT_EQ(m.axis_sizes(), (std::vector<std::int64_t>{1, 8, 2}));
  EXPECT_EQ(m.axis_size("fsdp"), 8);
}

TEST(Mesh, DevicesAreInMeshOrderAndCoordsAreRowMajor) {
  const Mesh m = Mesh::parse("x:2,y:3", 6);
  EXPECT_EQ(m.devices(), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(m.coords_of_position(4), (std::vector<std::int64_t>{1, 1}));
  const Mesh custom({{"x", 2}, {"y", 2}}, std::vector<int>{3, 2, 1, 0});
  EXPECT_EQ(custom.position_of_device(3), 0);
}

TEST(Mesh, ErrorsNameTheProblem) {
  EXPECT_THROW_WITH(Mesh::parse("x:2,x:4", 8), SpecError, "duplicate", "'x'");
  EXPECT_THROW_WITH(Mesh::parse("x:3,y:2", 8), SpecError, "multiply to 6", "8");
  EXPECT_THROW_WITH(Mesh::parse("x:-1,y:-1", 8), SpecError, "'x'", "'y'", "-1");
  EXPECT_THROW_WITH(Mesh::parse("x:0,y:2", 8), SpecError, "'x'", "size 0");
  EXPECT_THROW_WITH(Mesh::parse("x:-3,y:2", 8), SpecError, "'x'", "-3");
  EXPECT_THROW_WITH(Mesh::parse("x:-1,y:3", 8), SpecError, "8");
  EXPECT_THROW_WITH(Mesh::parse("x:two", 2), SpecError, "'two'");
  EXPECT_THROW_WITH(Mesh::parse("1,2", 2, {"a"}), SpecError, "2 entries", "1 axis names");
  EXPECT_THROW_WITH(Mesh({{"x", 2}}, std::vector<int>{0, 0}), SpecError, "");
  EXPECT_THROW_WITH(Mesh::parse("fsdp:4", 4).axis_index("tp"), SpecError, "'tp'", "fsdp");
}

TEST(PartitionSpec, EmptyReplicatesAndOneAxisGroupEqualsTheAxis) {
  EXPECT_TRUE(P().is_replicated());
  EXPECT_TRUE(P(nullptr, nullptr).is_replicated());
  EXPECT_FALSE(P(nullptr, "tp").is_replicated());
  EXPECT_EQ(P(AxisNames{"tp"}), P("tp"));
  EXPECT_EQ(P(AxisNames{"fsdp", "tp"}, nullptr)[0], (AxisNames{"fsdp", "tp"}));
  EXPECT_TRUE(P("x")[5].empty());
}

TEST(PartitionSpec, PrintsInJaxAndSpecForms) {
  const auto s = P("fsdp", nullptr, AxisNames{"x", "y"});
  EXPECT_EQ(s.to_string(), "PartitionSpec('fsdp', None, ('x', 'y'))");
  EXPECT_EQ(s.to_spec_string(), R"(["fsdp", null, ["x", "y"]])");
  EXPECT_EQ(P().to_spec_string(), "[]");
  EXPECT_EQ(s.used_axes(), (std::vector<std::string>{"fsdp", "x", "y"}));
}

TEST(PartitionSpec, ValidateNamesUnknownAxisRepeatedAxisAndRank) {
  const Mesh m = Mesh::parse("fsdp:4,tp:2", 8);
  EXPECT_NO_THROW(P("fsdp", "tp").validate(m, 2));
  EXPECT_THROW_WITH(P("data").validate(m, 1, "w"), SpecError, "'data'", "fsdp", "tp");
  EXPECT_THROW_WITH(P("tp", AxisNames{"fsdp", "tp"}).validate(m, 2), SpecError, "'tp'",
                    "more than once");
  EXPECT_THROW_WITH(P("tp", nullptr, nullptr).validate(m, 2), SpecError, "3 entries", "rank 2");
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
  for (const PartitionSpec& spec :
       {P("a", "b", "c"), P(AxisNames{"a", "c"}, nullptr, nullptr), P(AxisNames{"c", "b"}, "a"),
        P(nullptr, nullptr, "c"), P()}) {
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
  EXPECT_TRUE(NamedSharding(m, P(AxisNames{"x", "one"})).is_equivalent_to(NamedSharding(m, P("x")), 1));
  EXPECT_FALSE(NamedSharding(m, P("x")).is_equivalent_to(NamedSharding(m, P(nullptr, "x")), 2));
  const Mesh other = Mesh::parse("x:4,one:1", 4);
  EXPECT_TRUE(NamedSharding(m, P("x")).is_equivalent_to(NamedSharding(other, P("x")), 1));
  const Mesh permuted({{"x", 4}, {"one", 1}}, std::vector<int>{1, 0, 2, 3});
  EXPECT_FALSE(NamedSharding(m, P("x")).is_equivalent_to(NamedSharding(permuted, P("x")), 1));
}

TEST(NamedSharding, UnknownAxisFailsAtConstruction) {
  EXPECT_THROW_WITH(NamedSharding(Mesh::parse("x:2", 2), P("y")), SpecError, "'y'");
}

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

TEST(NamedSharding, Visualize2DDrawsAGridLabelledByDevice) {
  const NamedSharding s(Mesh::parse("x:4,y:2", 8), P("x", "y"));
  const std::string pic = s.visualize(Shape{8192, 8192});
  // 4 rows of 2 blocks, devices in row-major order as JAX draws them.
  EXPECT_EQ(labels(pic), (std::vector<std::string>{"device 0", "device 1", "device 2", "device 3",
                                                   "device 4", "device 5", "device 6",
                                                   "device 7"}));
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
