// LogicalAxisRule: Flax's logical-to-mesh axis mapping.

#include "shardplan/rules/logical_axis_rule.hpp"

#include <sstream>
#include <stdexcept>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/rules/fsdp_sharding_rule.hpp"
#include "shardplan/rules/policy_sharding_rule.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures
// ---- Logical axes ----

LogicalAxisRule flax_rules() {
  return LogicalAxisRule({{"batch", AxisNames{"data"}},
                          {"mlp", AxisNames{"tp"}},
                          {"heads", AxisNames{"tp"}},
                          {"embed", std::nullopt},
                          {"vocab", AxisNames{"tp"}},
                          {"vocab", AxisNames{"data"}}});
}

TEST(LogicalAxisRule, MapsNamesToMeshAxes) {
  const Mesh mesh = Mesh::parse("data:4,tp:2", 8);
  const auto rule = flax_rules();
  const TensorSpec t{Shape{4096, 11008}, DType::kF32, {"embed", "mlp"}};
  const auto d = decide(rule, "w", t, mesh);
  EXPECT_EQ(d.spec, P(nullptr, "tp"));
  EXPECT_EQ(d.entry, 1);
}

TEST(LogicalAxisRule, EveryEntryThatDecidedADimensionIsReported) {
  const Mesh mesh = Mesh::parse("data:4,tp:2", 8);
  // "embed -> null" (3) decides dim 0 (not sharded), "mlp -> tp" (1) dim 1.
  const auto w = decide(flax_rules(), "w", {Shape{8, 16}, DType::kF32, {"embed", "mlp"}}, mesh);
  EXPECT_EQ(w.entry, 1);
  EXPECT_EQ(w.also_decided, std::vector<int>{3});
  // "vocab -> tp" (4) is skipped, tp being taken by "mlp" (1): it decided nothing.
  const auto v = decide(flax_rules(), "v", {Shape{8, 16}, DType::kF32, {"vocab", "mlp"}}, mesh);
  EXPECT_EQ(v.spec, P("data", "tp"));
  EXPECT_EQ(v.entry, 5);
  EXPECT_EQ(v.also_decided, std::vector<int>{1});
  // No entry decides a name the mapping does not have ("length").
  const auto x = decide(flax_rules(), "x", {Shape{8, 16}, DType::kF32, {"batch", "length"}}, mesh);
  EXPECT_EQ(x.entry, 0);
  EXPECT_TRUE(x.also_decided.empty());
  std::ostringstream os;
  os << w;
  EXPECT_EQ(os.str(),
            "RuleDecision(PartitionSpec(None, 'tp'), entry 1, logical axes [embed, mlp], "
            "also entries 3)");
}

TEST(LogicalAxisRule, AnAxisAlreadyUsedFallsBackToTheNextEntry) {
  const auto rule = flax_rules();
  // "mlp" takes tp first, so "vocab" cannot: its next entry maps it to data.
  EXPECT_EQ(rule.to_mesh_spec({"mlp", "vocab"}), P("tp", "data"));
  EXPECT_EQ(rule.to_mesh_spec({"vocab", "embed"}), P("tp", nullptr));
  // Entries are visited in order, so "mlp" (entry 1) takes tp before "vocab" (entries 4, 5).
  EXPECT_EQ(rule.to_mesh_spec({"vocab", "mlp"}), P("data", "tp"));
}

TEST(LogicalAxisRule, UnknownNamesAreNotSharded) {
  EXPECT_EQ(flax_rules().to_mesh_spec({"batch", "length", "embed"}), P("data", nullptr, nullptr));
}

TEST(LogicalAxisRule, RankMismatchIsAnError) {
  const TensorSpec t{Shape{4, 4}, DType::kF32, {"batch"}};
  EXPECT_THROW_WITH(decide(flax_rules(), "x/act", t, fsdp_tp_mesh()), RuleError, "'x/act'",
                    "[4, 4]", "batch");
}

TEST(LogicalAxisRule, DuplicateNameIsAnError) {
  EXPECT_THROW_WITH(flax_rules().to_mesh_spec({"mlp", "mlp"}), RuleError, "'mlp'", "dims 0 and 1");
}

TEST(LogicalAxisRule, NoNamesReplicatesOrFailsWhenStrict) {
  const TensorSpec t{Shape{4, 4}, DType::kF32};
  const auto d = decide(flax_rules(), "w", t, fsdp_tp_mesh());
  EXPECT_EQ(d.spec, P());
  EXPECT_TRUE(d.fell_through);
  const LogicalAxisRule strict({{"batch", AxisNames{"data"}}}, true);
  EXPECT_THROW_WITH(decide(strict, "w", t, fsdp_tp_mesh()), RuleError, "'w'",
                    "no logical axis names");
}

TEST(LogicalAxisRule, LabelsDescribeMappings) {
  EXPECT_EQ(flax_rules().entry_labels()[0], "batch -> data");
  EXPECT_EQ(flax_rules().entry_labels()[3], "embed -> null");
}

}  // namespace
}  // namespace shardplan
