// Mesh: axes, -1 inference, parsing, device order and errors.

#include "shardplan/mesh.hpp"

#include <set>

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

}  // namespace
}  // namespace shardplan
