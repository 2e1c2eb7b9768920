// NamedSharding: shard shapes, device blocks (padded ones too), replicas, equivalence and pictures.

#include "shardplan/named_sharding.hpp"

#include <algorithm>
#include <set>
#include <sstream>

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

TEST(NamedSharding, AxisUsedTwiceFailsAtConstruction) {
  EXPECT_THROW_WITH(NamedSharding(Mesh::parse("x:2,y:2", 4), P("x", AxisNames{"y", "x"})),
                    SpecError, "'x'", "more than once", "dim 1");
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

TEST(NamedSharding, NonDivisibleSingleAxisMessageReadsAsTheStyleGuide) {
  const NamedSharding s(Mesh::parse("fsdp:1,tp:8", 8), P(nullptr, "tp"));
  EXPECT_THROW_WITH(s.shard_shape(Shape{4096, 11006}, "params/h/3/mlp/w_in"), SpecError,
                    "dim 1 of 'params/h/3/mlp/w_in' (shape [4096, 11006]) is not divisible by "
                    "mesh axis 'tp' (size 8)");
}

TEST(NamedSharding, UnevenPadSplitsAsJaxByHand) {
  // 10 over 3: blocks of 4, the last holds 2.
  EXPECT_EQ(split_block(10, 3, 0), (DimSlice{0, 4}));
  EXPECT_EQ(split_block(10, 3, 1), (DimSlice{4, 4}));
  EXPECT_EQ(split_block(10, 3, 2), (DimSlice{8, 2}));
  // 12 over 5: blocks of 3; block 4 starts at 12 and holds nothing.
  EXPECT_EQ(split_block(12, 5, 3), (DimSlice{9, 3}));
  EXPECT_EQ(split_block(12, 5, 4), (DimSlice{12, 0}));
  // 5 over 6: one row each, the sixth none; 7 over 7 divides.
  EXPECT_EQ(split_block(5, 6, 5), (DimSlice{5, 0}));
  EXPECT_EQ(split_block(7, 7, 6), (DimSlice{6, 1}));
  const NamedSharding s(Mesh::parse("x:3", 3), P("x"), Uneven::kPad);
  EXPECT_EQ(s.shard_shape(Shape{10, 2}), (Shape{4, 2}));
  EXPECT_TRUE(s.is_padded(Shape{10, 2}));
  EXPECT_FALSE(s.is_padded(Shape{9, 2}));
  EXPECT_EQ(s.device_blocks(Shape{10}),
            (std::vector<Block>{{DimSlice{0, 4}}, {DimSlice{4, 4}}, {DimSlice{8, 2}}}));
  // Bytes per device are the padded block's, the same on every device.
  EXPECT_EQ(s.shard_bytes(Shape{10, 2}, 4), 4 * 2 * 4);
}

TEST(NamedSharding, UnevenRefuseIsTheDefaultAndThePolicyIsPartOfTheValue) {
  const Mesh mesh = Mesh::parse("x:3", 3);
  const NamedSharding strict(mesh, P("x"));
  EXPECT_EQ(strict.uneven(), Uneven::kRefuse);
  EXPECT_THROW_WITH(strict.shard_shape(Shape{10}, "w"), SpecError,
                    "dim 0 of 'w' (shape [10]) is not divisible by mesh axis 'x' (size 3)",
                    "10 is not a multiple of 3");
  const NamedSharding pad = strict.with_uneven(Uneven::kPad);
  EXPECT_FALSE(pad == strict);
  EXPECT_TRUE(pad.is_equivalent_to(strict, 1));  // the same placement
  EXPECT_EQ(pad.to_string(),
            "NamedSharding(mesh=Mesh('x': 3), spec=PartitionSpec('x'), "
            "uneven=pad)");
  EXPECT_THROW_WITH(pad.check_divides(Shape{4, 10}, "sjit", "arg", "; not yet"), SpecError,
                    "[sjit] dim 0 of 'arg' (shape [4, 10])", "; not yet");
  const NamedSharding two(Mesh::parse("x:2,y:3", 6), P(AxisNames{"x", "y"}), Uneven::kPad);
  EXPECT_THROW_WITH(two.check_divides(Shape{10}, "checkpoint"), SpecError,
                    "mesh axes 'x' (size 2) x 'y' (size 3) = 6; 10 is not a multiple of 6");
}

TEST(NamedSharding, ShardBytesAndSpecPastTheRankErrorsNameThePath) {
  const NamedSharding s(Mesh::parse("x:4", 4), P(nullptr, "x"));
  EXPECT_EQ(s.shard_bytes(Shape{3, 8}, 4), 3 * 2 * 4);
  EXPECT_THROW_WITH(s.shard_bytes(Shape{6}, 4, "w"), SpecError, "'w'", "[6]", "rank 1");
  EXPECT_THROW_WITH(s.device_blocks(Shape{3, 6}), SpecError, "[3, 6]", "'x' (size 4)");
}

TEST(NamedSharding, ScalarIsOneEmptyBlockPerDevice) {
  const NamedSharding s(Mesh::parse("x:2", 2), P());
  EXPECT_EQ(s.shard_shape(Shape{}), Shape{});
  EXPECT_EQ(s.device_blocks(Shape{}), (std::vector<Block>{Block{}, Block{}}));
  EXPECT_EQ(s.replica_groups(Shape{}), (std::vector<std::vector<int>>{{0, 1}}));
}

// Independent: device at mesh position p has coordinates c (row-major); along a dimension sharded
// over axes (a1..ak) its block index is the mixed-radix number c[a1]..c[ak].
Block expected_block(const Mesh& m, const PartitionSpec& spec, const Shape& g, int device) {
  std::int64_t pos = 0;
  while (m.devices()[static_cast<std::size_t>(pos)] != device) ++pos;
  std::vector<std::int64_t> c(m.axis_sizes().size());
  std::int64_t rest = pos;
  for (std::size_t i = c.size(); i-- > 0;) {
    c[i] = rest % m.axis_sizes()[i];
    rest /= m.axis_sizes()[i];
  }
  Block b;
  for (int d = 0; d < g.rank(); ++d) {
    std::int64_t idx = 0, parts = 1;
    for (const auto& a : spec[d]) {
      const auto ai = static_cast<std::size_t>(m.axis_index(a));
      idx = idx * m.axis_sizes()[ai] + c[ai];
      parts *= m.axis_sizes()[ai];
    }
    b.push_back(DimSlice{idx * (g[d] / parts), g[d] / parts});
  }
  return b;
}

TEST(NamedSharding, DeviceBlocksFor1DAnd2DMeshesWithCustomDeviceOrder) {
  const std::vector<Mesh> meshes{
      Mesh({{"x", 8}}, std::vector<int>{7, 6, 5, 4, 3, 2, 1, 0}),
      Mesh({{"x", 4}, {"y", 2}}, std::vector<int>{4, 0, 5, 1, 6, 2, 7, 3}),
      Mesh::parse("x:2,y:4", 8)};
  for (const Mesh& m : meshes) {
    // Built with room for all six (GCC 12's -Warray-bounds misreads growing a vector that an
    // initializer list sized).
    std::vector<PartitionSpec> specs;
    specs.reserve(6);
    specs.push_back(P());
    specs.push_back(P(m.axis_names()[0]));
    specs.push_back(P(nullptr, m.axis_names()[0]));
    if (m.ndim() == 2) {
      specs.push_back(P("y", "x"));
      specs.push_back(P(AxisNames{"y", "x"}));
      specs.push_back(P(nullptr, AxisNames{"x", "y"}));
    }
    const Shape g{16, 24};
    for (const auto& spec : specs) {
      const NamedSharding s(m, spec);
      const auto blocks = s.device_blocks(g);
      ASSERT_EQ(blocks.size(), 8u);
      for (int dev = 0; dev < 8; ++dev) {
        EXPECT_EQ(blocks[static_cast<std::size_t>(dev)], expected_block(m, spec, g, dev))
            << m << " " << spec << " device " << dev;
      }
    }
  }
}

TEST(NamedSharding, ReplicaGroupsMatchAnIndependentGrouping) {
  const Mesh m({{"a", 2}, {"b", 3}, {"c", 2}},
               std::vector<int>{11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  const Shape g{12, 12};
  for (const PartitionSpec& spec :
       {P("b"), P(AxisNames{"c", "a"}), P(nullptr, "c"), P(), P("a", AxisNames{"b", "c"})}) {
    std::vector<std::vector<int>> expect;
    std::vector<Block> seen;
    for (int dev = 0; dev < 12; ++dev) {
      const Block b = expected_block(m, spec, g, dev);
      auto it = std::find(seen.begin(), seen.end(), b);
      if (it == seen.end()) {
        seen.push_back(b);
        expect.push_back({dev});
      } else {
        expect[static_cast<std::size_t>(it - seen.begin())].push_back(dev);
      }
    }
    const NamedSharding s(m, spec);
    EXPECT_EQ(s.replica_groups(g), expect) << spec;
    EXPECT_EQ(s.replication_factor(), 12 / static_cast<std::int64_t>(expect.size())) << spec;
  }
}

TEST(NamedSharding, EquivalenceNeedsTheSameMeshAndPaddedSpec) {
  const Mesh m = Mesh::parse("x:2,y:2", 4);
  EXPECT_FALSE(NamedSharding(m, P("x")).is_equivalent_to(NamedSharding(m, P("y")), 1));
  EXPECT_FALSE(NamedSharding(m, P(AxisNames{"x", "y"}))
                   .is_equivalent_to(NamedSharding(m, P(AxisNames{"y", "x"})), 1));
  EXPECT_TRUE(NamedSharding(m, P()).is_equivalent_to(NamedSharding(m, P(nullptr, nullptr)), 2));
  EXPECT_FALSE(NamedSharding(m, P("x")).is_equivalent_to(
      NamedSharding(Mesh::parse("y:2,x:2", 4), P("x")), 1));
}

TEST(NamedSharding, EqualityAndPrinting) {
  const Mesh m = Mesh::parse("x:4,y:2", 8);
  EXPECT_EQ(NamedSharding(m, P("x", "y")), NamedSharding(Mesh::parse("x:4,y:2", 8), P("x", "y")));
  EXPECT_NE(NamedSharding(m, P("x", "y")), NamedSharding(m, P("x")));
  std::ostringstream os;
  os << NamedSharding(m, P("x", "y")) << " " << DimSlice{4, 2};
  EXPECT_EQ(os.str(),
            "NamedSharding(mesh=Mesh('x': 4, 'y': 2), spec=PartitionSpec('x', 'y')) [4:6]");
}

TEST(NamedSharding, VisualizeReplicated2DIsOneBlockWithEveryDevice) {
  const NamedSharding s(Mesh::parse("x:4,y:2", 8), P());
  const std::string pic = s.visualize(Shape{8, 8});
  EXPECT_EQ(labels(pic), (std::vector<std::string>{"devices 0,1,2,3,4,5,6,7"}));
  EXPECT_EQ(std::count(pic.begin(), pic.end(), '\n'), 1 * 4 + 1);
}

TEST(NamedSharding, Visualize2DTransposedSpecPutsMinorAxisOnRows) {
  // P('y', 'x') on x:4,y:2: rows follow y (2), columns follow x (4); block (r, c) is held by
  // the device at coordinates x=c, y=r, i.e. mesh position 2c + r.
  const NamedSharding s(Mesh::parse("x:4,y:2", 8), P("y", "x"));
  const std::string pic = s.visualize(Shape{8, 8});
  std::vector<std::string> expect;
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 4; ++c) expect.push_back("device " + std::to_string(2 * c + r));
  }
  EXPECT_EQ(labels(pic), expect);
  EXPECT_EQ(std::count(pic.begin(), pic.end(), '\n'), 2 * 4 + 1);
  // Four columns: the top border has three inner junctions.
  const std::string top = pic.substr(0, pic.find('\n'));
  std::size_t junctions = 0;
  for (std::size_t p = top.find("┬"); p != std::string::npos; p = top.find("┬", p + 1)) ++junctions;
  EXPECT_EQ(junctions, 3u);
}

TEST(NamedSharding, Visualize2DColumnsOnlyAndReplicatedColumns) {
  const NamedSharding s(Mesh::parse("x:4,y:2", 8), P(nullptr, "y"));
  EXPECT_EQ(labels(s.visualize(Shape{8, 8})),
            (std::vector<std::string>{"devices 0,2,4,6", "devices 1,3,5,7"}));
}

TEST(NamedSharding, Visualize1DOverOneAxisOfA2DMesh) {
  const NamedSharding s(Mesh({{"x", 4}, {"y", 2}}, std::vector<int>{7, 6, 5, 4, 3, 2, 1, 0}),
                        P("x"));
  // x = 0 holds positions 0, 1 (devices 7, 6), and so on; labels list devices sorted.
  EXPECT_EQ(labels(s.visualize(Shape{16})),
            (std::vector<std::string>{"devices 6,7", "devices 4,5", "devices 2,3", "devices 0,1"}));
}

TEST(NamedSharding, VisualizeRejectsScalarsAndNonDivisibleShapes) {
  const NamedSharding s(Mesh::parse("x:4", 4), P("x"));
  EXPECT_THROW_WITH(s.visualize(Shape{}), SpecError, "1-D and 2-D", "[]");
  EXPECT_THROW_WITH(s.visualize(Shape{6}), SpecError, "[6]", "'x' (size 4)");
}

TEST(NamedSharding, ShardBytesPastInt64NameThePathAndShapes) {
  const NamedSharding s(Mesh::parse("x:2", 2), P("x"));
  // 2^62 elements split in two: 2^61 per device, times 2 bytes = 2^62 fits, times 4 = 2^63 not.
  EXPECT_EQ(s.shard_bytes(Shape{4611686018427387904}, 2, "w"), 4611686018427387904LL);
  EXPECT_THROW_WITH(s.shard_bytes(Shape{4611686018427387904}, 4, "params/w"), SpecError,
                    "'params/w'", "[2305843009213693952]", "[4611686018427387904]",
                    "overflows int64");
}

}  // namespace
}  // namespace shardplan
