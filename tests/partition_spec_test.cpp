// PartitionSpec: entries, printing and validation against a mesh.

#include "shardplan/partition_spec.hpp"

#include <set>

#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/shape.hpp"
#include "shardplan/tensor_spec.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {
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

}  // namespace
}  // namespace shardplan
