// Mesh: axes, -1 inference, parsing, device order and errors.

#include "shardplan/mesh.hpp"

#include <set>
#include <sstream>

#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/shape.hpp"
#include "shardplan/tensor_spec.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {
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

TEST(Mesh, RejectsDuplicateAxisNames) {
  EXPECT_THROW_WITH(Mesh({{"x", 2}, {"y", 1}, {"x", 2}}, 4), SpecError, "duplicate", "'x'",
                    "axes 0 and 2");
}

TEST(Mesh, RejectsSizesThatDoNotMultiplyToTheDeviceCount) {
  EXPECT_THROW_WITH(Mesh::parse("fsdp:4,tp:4", 8), SpecError, "fsdp:4,tp:4", "16", "8");
}

TEST(Mesh, RejectsTwoInferredAxes) {
  EXPECT_THROW_WITH(Mesh::parse("-1,2,-1", 8, {"a", "b", "c"}), SpecError, "only one", "'a'",
                    "'c'");
}

TEST(Mesh, RejectsZeroAndNegativeSizes) {
  EXPECT_THROW_WITH(Mesh({{"x", 0}}, 1), SpecError, "'x'", "size 0", "positive");
  EXPECT_THROW_WITH(Mesh({{"x", 2}, {"y", -2}}, 4), SpecError, "'y'", "size -2");
}

TEST(Mesh, RejectsSizesWhoseProductOverflows) {
  // Each axis is within Mesh::kMaxDevices; the product of four is 2^80.
  EXPECT_THROW_WITH(Mesh::parse("x:1048576,y:1048576,z:1048576,w:1048576", 8), SpecError,
                    "overflow", "'w'");
  // Larger axes are rejected one by one, before any product.
  EXPECT_THROW_WITH(Mesh::parse("x:4294967296,y:4294967296", 8), SpecError, "'x'",
                    "size 4294967296", "limit");
}

TEST(Mesh, RejectsAnInferredAxisThatCannotDivide) {
  EXPECT_THROW_WITH(Mesh::parse("fsdp:-1,tp:3", 8), SpecError, "'fsdp'", "8 devices",
                    "not divisible by 3");
}

TEST(Mesh, RejectsMalformedText) {
  EXPECT_THROW_WITH(Mesh::parse("x:", 1), SpecError, "axis 'x'", "not an integer");
  EXPECT_THROW_WITH(Mesh::parse("x:2y", 2), SpecError, "'2y'");
  EXPECT_THROW_WITH(Mesh::parse("x:2,,y:1", 2), SpecError, "x:2,,y:1", "no axis name");
  EXPECT_THROW_WITH(Mesh::parse("4", 4), SpecError, "'4'", "no axis name");
  EXPECT_THROW_WITH(Mesh::parse("", 4), SpecError, "no axis name");
}

TEST(Mesh, RejectsEmptyNamesAndNoAxes) {
  EXPECT_THROW_WITH(Mesh({{"", 2}}, 2), SpecError, "empty name");
  EXPECT_THROW_WITH(Mesh(std::vector<std::pair<std::string, std::int64_t>>{}, 2), SpecError,
                    "at least one axis");
  EXPECT_THROW_WITH(Mesh({{"x", -1}}, 0), SpecError, "device count", "0");
}

TEST(Mesh, ParseWithNamesChecksNamedEntriesAgree) {
  EXPECT_EQ(Mesh::parse("dp:2,2", 4, {"dp", "tp"}).axis_names(),
            (std::vector<std::string>{"dp", "tp"}));
  EXPECT_THROW_WITH(Mesh::parse("dp:2,2", 4, {"fsdp", "tp"}), SpecError, "'dp'", "'fsdp'");
}

TEST(Mesh, ParseToleratesSpaces) {
  EXPECT_EQ(Mesh::parse(" fsdp : -1 , tp:2 ", 8), Mesh({{"fsdp", 4}, {"tp", 2}}, 8));
}

TEST(Mesh, RejectsDeviceIdsThatAreNotAPermutation) {
  EXPECT_THROW_WITH(Mesh({{"x", 2}}, std::vector<int>{0, 2}), SpecError, "permutation", "id 2");
  EXPECT_THROW_WITH(Mesh({{"x", 2}}, std::vector<int>{1, 1}), SpecError, "id 1", "position 1");
  EXPECT_THROW_WITH(Mesh({{"x", 3}}, std::vector<int>{0, 1}), SpecError, "multiply to 3", "2");
}

// Row-major: the last axis varies fastest, so position = sum_i c_i * prod_{j>i} size_j.
TEST(Mesh, CoordsOfEveryPositionAreRowMajorIn3D) {
  const Mesh m = Mesh::parse("a:2,b:3,c:4", 24);
  for (std::int64_t pos = 0; pos < 24; ++pos) {
    const auto c = m.coords_of_position(pos);
    ASSERT_EQ(c.size(), 3u);
    EXPECT_EQ(c[0] * 12 + c[1] * 4 + c[2], pos);
    EXPECT_LT(c[1], 3);
    EXPECT_LT(c[2], 4);
  }
}

TEST(Mesh, CustomDeviceOrderMapsIdsToPositions) {
  const std::vector<int> ids{4, 0, 5, 1, 6, 2, 7, 3};
  const Mesh m({{"x", 4}, {"y", 2}}, ids);
  EXPECT_EQ(m.devices(), ids);
  for (std::size_t pos = 0; pos < ids.size(); ++pos) {
    EXPECT_EQ(m.position_of_device(ids[pos]), static_cast<std::int64_t>(pos));
  }
  EXPECT_NE(m, Mesh({{"x", 4}, {"y", 2}}, 8));
}

TEST(Mesh, AxisLookups) {
  const Mesh m = Mesh::parse("dp:2,tp:4", 8);
  EXPECT_EQ(m.ndim(), 2);
  EXPECT_EQ(m.axis_index("tp"), 1);
  EXPECT_EQ(m.axis_size("tp"), 4);
  EXPECT_EQ(m.find_axis("zz"), std::nullopt);
  EXPECT_FALSE(m.has_axis("zz"));
  EXPECT_THROW_WITH(m.axis_size("zz"), SpecError, "'zz'", "dp, tp");
}

TEST(Mesh, PrintsLikeJax) {
  std::ostringstream os;
  os << Mesh::parse("fsdp:4,tp:2", 8);
  EXPECT_EQ(os.str(), "Mesh('fsdp': 4, 'tp': 2)");
}

TEST(Mesh, DeviceCountsAreBounded) {
  EXPECT_EQ(Mesh::kMaxDevices, 1'048'576);
  // The bound itself is a mesh.
  EXPECT_EQ(Mesh::parse("x:-1,y:2", Mesh::kMaxDevices).axis_sizes(),
            (std::vector<std::int64_t>{524'288, 2}));
  EXPECT_THROW_WITH(Mesh::parse("x:-1", 100'000'000), SpecError, "device count 100000000",
                    "limit of 1048576 devices");
  EXPECT_THROW_WITH(Mesh::parse("x:100000000", 100'000'000), SpecError, "100000000", "1048576");
  EXPECT_THROW_WITH(Mesh::parse("x:2000000,y:-1", 8), SpecError, "axis 'x'", "size 2000000",
                    "limit of 1048576 devices");
  EXPECT_THROW_WITH(Mesh::parse("x:99999999999999999999", 8), SpecError,
                    "size 99999999999999999999 of axis 'x'", "limit of 1048576 devices");
  EXPECT_THROW_WITH(Mesh({{"x", -1}}, std::vector<int>(Mesh::kMaxDevices + 1)), SpecError,
                    "device count 1048577");
  // Axes under the bound whose product is over it: the count cannot match.
  EXPECT_THROW_WITH(Mesh::parse("x:1048576,y:2", 8), SpecError, "multiply to 2097152",
                    "device count 8");
}

}  // namespace
}  // namespace shardplan
