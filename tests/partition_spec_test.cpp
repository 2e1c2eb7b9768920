// PartitionSpec: entries, printing and validation against a mesh.

#include "shardplan/partition_spec.hpp"

#include <set>
#include <sstream>

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

TEST(PartitionSpec, EmptyFormsAreEqualAndPrint) {
  EXPECT_EQ(P(), PartitionSpec());
  EXPECT_EQ(P(), PartitionSpec(std::vector<AxisNames>{}));
  EXPECT_EQ(P().size(), 0);
  EXPECT_EQ(P().to_string(), "PartitionSpec()");
  std::ostringstream os;
  os << P(nullptr, "tp");
  EXPECT_EQ(os.str(), "PartitionSpec(None, 'tp')");
}

TEST(PartitionSpec, OneAxisGroupEqualsTheAxisInEveryConstructor) {
  EXPECT_EQ((PartitionSpec{{"tp"}, nullptr}), P("tp", nullptr));
  EXPECT_EQ(PartitionSpec(std::vector<AxisNames>{{"tp"}}), P("tp"));
  EXPECT_EQ(P(AxisNames{"tp"}).to_string(), P("tp").to_string());
  EXPECT_EQ(P(std::string("tp")), P("tp"));
}

TEST(PartitionSpec, EqualityIsByEntriesAndOrderMatters) {
  EXPECT_NE(P("x", "y"), P("y", "x"));
  EXPECT_NE(P(AxisNames{"x", "y"}), P(AxisNames{"y", "x"}));
  EXPECT_NE(P("x"), P("x", nullptr));
  const auto a = P("x", "y");
  const auto b = a;
  EXPECT_TRUE(a.same_instance(b));
  EXPECT_EQ(a, P("x", "y"));
  EXPECT_FALSE(a.same_instance(P("x", "y")));
}

TEST(PartitionSpec, ValidateRejectsUnknownAxisNamingItTheDimAndWhere) {
  const Mesh m = Mesh::parse("fsdp:4,tp:2", 8);
  EXPECT_THROW_WITH(P(nullptr, AxisNames{"fsdp", "data"}).validate(m, 2, "params/w"), SpecError,
                    "'params/w'", "unknown mesh axis 'data'", "dim 1", "[fsdp, tp]");
}

TEST(PartitionSpec, ValidateRejectsAnAxisUsedTwiceEvenInOneGroup) {
  const Mesh m = Mesh::parse("fsdp:4,tp:2", 8);
  EXPECT_THROW_WITH(P(AxisNames{"tp", "tp"}).validate(m, 1, "b"), SpecError, "'b'", "'tp'",
                    "more than once", "dim 0");
  EXPECT_THROW_WITH(P("fsdp", nullptr, "fsdp").validate(m, 3), SpecError, "'fsdp'", "dim 2");
}

TEST(PartitionSpec, ValidateRejectsMoreEntriesThanDimsNamingTheSpec) {
  const Mesh m = Mesh::parse("fsdp:4,tp:2", 8);
  EXPECT_THROW_WITH(P("fsdp").validate(m, 0, "step"), SpecError, "'step'", "PartitionSpec('fsdp')",
                    "1 entries", "rank 0");
  EXPECT_NO_THROW(P("fsdp", "tp").validate(m, -1));
  EXPECT_NO_THROW(P("fsdp").validate(m, 3));
  EXPECT_NO_THROW(P().validate(m, 0));
}

}  // namespace
}  // namespace shardplan
