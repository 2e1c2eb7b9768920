// The built-in rules: FSDP, tree-path, policy and logical-axis rules, on their own.
#include <stdexcept>

#include "shardplan/error.hpp"
#include "shardplan/rules/fsdp_sharding_rule.hpp"
#include "shardplan/rules/logical_axis_rule.hpp"
#include "shardplan/rules/policy_sharding_rule.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

RuleDecision decide(const ShardingRule& rule, std::string_view path, const TensorSpec& t,
                    const Mesh& mesh) {
  return rule.apply(RuleInput{path, t, mesh});
}

const Mesh& mesh8() {
  static const Mesh m = Mesh::parse("fsdp:4,tp:2", 8);
  return m;
}

// ---- FSDP ----

TEST(FsdpRule, ShardsLargestDimensionDivisibleByTheMeshAxis) {
  const FSDPShardingRule rule("fsdp", 16);
  // 4096 and 11008 both divide by 4: the larger wins.
  EXPECT_EQ(decide(rule, "w", {Shape{4096, 11008}, DType::kF32}, mesh8()).spec, P(nullptr, "fsdp"));
  // 11010 does not divide by 4: the largest that divides wins.
  EXPECT_EQ(decide(rule, "w", {Shape{4096, 11010}, DType::kF32}, mesh8()).spec, P("fsdp", nullptr));
}

TEST(FsdpRule, TiesGoToTheLowerIndex) {
  const FSDPShardingRule rule("fsdp", 16);
  EXPECT_EQ(decide(rule, "w", {Shape{64, 64, 64}, DType::kF32}, mesh8()).spec,
            P("fsdp", nullptr, nullptr));
}

TEST(FsdpRule, BelowMinSizeIsReplicatedAndAtMinSizeIsSharded) {
  const FSDPShardingRule rule("fsdp", 1024);
  const auto below = decide(rule, "w", {Shape{1020}, DType::kF32}, mesh8());
  EXPECT_EQ(below.spec, P());
  EXPECT_THAT(below.reason, ::testing::HasSubstr("min_size 1024"));
  EXPECT_EQ(decide(rule, "w", {Shape{1024}, DType::kF32}, mesh8()).spec, P("fsdp"));
}

TEST(FsdpRule, DefaultMinSizeIsTwoToTheTwenty) {
  const FSDPShardingRule rule;
  EXPECT_EQ(rule.min_size(), 1 << 20);
  EXPECT_EQ(decide(rule, "w", {Shape{1024, 1023}, DType::kF32}, mesh8()).spec, P());
  EXPECT_EQ(decide(rule, "w", {Shape{1024, 1024}, DType::kF32}, mesh8()).spec, P("fsdp", nullptr));
}

TEST(FsdpRule, ScalarsAreNeverSharded) {
  const FSDPShardingRule rule("fsdp", 0);
  EXPECT_EQ(decide(rule, "step", {Shape{}, DType::kI32}, mesh8()).spec, P());
}

TEST(FsdpRule, NoDivisibleDimensionReplicates) {
  const FSDPShardingRule rule("fsdp", 4);
  const auto d = decide(rule, "w", {Shape{7, 9}, DType::kF32}, mesh8());
  EXPECT_EQ(d.spec, P());
  EXPECT_THAT(d.reason, ::testing::HasSubstr("divisible"));
}

TEST(FsdpRule, GivenAxisSizeOverridesTheMesh) {
  const FSDPShardingRule rule("fsdp", 4, 3);
  EXPECT_EQ(decide(rule, "w", {Shape{8, 6}, DType::kF32}, mesh8()).spec, P(nullptr, "fsdp"));
}

TEST(FsdpRule, PowerOfTwoModeMatchesScalaxGuess) {
  const FSDPShardingRule rule("fsdp", 4, std::nullopt, FSDPShardingRule::Mode::kPowerOfTwo);
  // 96 = 32*3 has a larger power-of-two divisor than 1000 = 8*125.
  EXPECT_EQ(decide(rule, "w", {Shape{1000, 96}, DType::kF32}, mesh8()).spec, P(nullptr, "fsdp"));
  // Equal divisors: the lower index.
  EXPECT_EQ(decide(rule, "w", {Shape{24, 40}, DType::kF32}, mesh8()).spec, P("fsdp", nullptr));
  // Dims of size 1 are skipped even though 1 "divides".
  EXPECT_EQ(decide(rule, "w", {Shape{1, 7}, DType::kF32}, mesh8()).spec, P(nullptr, "fsdp"));
}

TEST(FsdpRule, MissingMeshAxisIsAnErrorNamingIt) {
  const FSDPShardingRule rule("data", 4);
  EXPECT_THROW_WITH(decide(rule, "params/w", {Shape{64, 64}, DType::kF32}, mesh8()), RuleError,
                    "'data'", "params/w", "[64, 64]", "fsdp");
}

TEST(FsdpRule, BadConstructionIsAnError) {
  EXPECT_THROW_WITH(FSDPShardingRule("", 4), RuleError, "axis name is empty");
  EXPECT_THROW_WITH(FSDPShardingRule("fsdp", -1), RuleError, "min_size -1");
  EXPECT_THROW_WITH(FSDPShardingRule("fsdp", 4, 0), RuleError, "axis_size 0");
}

TEST(FsdpRule, NameDescribesTheRule) {
  EXPECT_EQ(FSDPShardingRule().name(), "FSDPShardingRule(axis=fsdp, min_size=1048576)");
}

// ---- Tree path ----

TEST(TreePathRule, SearchIsUnanchored) {
  const TreePathShardingRule rule({{"up_proj", P("tp")}});
  EXPECT_EQ(decide(rule, "model/layers/3/mlp/up_proj/weight", {Shape{8, 8}, DType::kF32}, mesh8())
                .spec,
            P("tp"));
}

TEST(TreePathRule, FirstMatchWinsAndEntryIsReported) {
  const TreePathShardingRule rule({{"mlp/.*_proj", P("tp")}, {"up_proj", P("fsdp")}});
  const auto d = decide(rule, "mlp/up_proj/weight", {Shape{8, 8}, DType::kF32}, mesh8());
  EXPECT_EQ(d.spec, P("tp"));
  EXPECT_EQ(d.entry, 0);
  EXPECT_FALSE(d.fell_through);
}

TEST(TreePathRule, OneElementTensorsAreReplicatedBeforeAnyRule) {
  const TreePathShardingRule rule({{".*", P("tp")}});
  const auto d = decide(rule, "w", {Shape{1, 1}, DType::kF32}, mesh8());
  EXPECT_EQ(d.spec, P());
  EXPECT_EQ(d.entry, -1);
}

TEST(TreePathRule, StrictErrorNamesPathShapeAndPatterns) {
  const TreePathShardingRule rule({{"attn", P("tp")}, {"mlp", P("fsdp")}});
  EXPECT_THROW_WITH(decide(rule, "embed/weight", {Shape{32000, 4096}, DType::kBF16}, mesh8()),
                    RuleError, "'embed/weight'", "[32000, 4096]", "'attn'", "'mlp'");
}

TEST(TreePathRule, CatchAllIsReportedAsFellThrough) {
  const TreePathShardingRule rule({{"attn", P("tp")}, {".*", P()}});
  EXPECT_TRUE(decide(rule, "embed/weight", {Shape{8, 8}, DType::kF32}, mesh8()).fell_through);
  EXPECT_FALSE(decide(rule, "attn/weight", {Shape{8, 8}, DType::kF32}, mesh8()).fell_through);
}

TEST(TreePathRule, NonStrictNoMatchReplicatesAndFallsThrough) {
  const TreePathShardingRule rule({{"attn", P("tp")}}, false);
  const auto d = decide(rule, "mlp/w", {Shape{8, 8}, DType::kF32}, mesh8());
  EXPECT_EQ(d.spec, P());
  EXPECT_TRUE(d.fell_through);
  EXPECT_FALSE(rule.try_match(RuleInput{"mlp/w", {Shape{8, 8}, DType::kF32}, mesh8()}).has_value());
}

TEST(TreePathRule, BadRegexFailsAtConstructionNamingRuleAndPosition) {
  EXPECT_THROW_WITH(TreePathShardingRule({{"ok", P()}, {"mlp/(up", P()}}), RuleError, "rule 1",
                    "'mlp/(up'", "position");
}

TEST(TreePathRule, ExplainListsEveryEntryUntilTheWinner) {
  const TreePathShardingRule rule({{"attn", P("tp")}, {"mlp", P("fsdp")}, {"mlp/up", P()}});
  const auto steps = rule.explain(RuleInput{"mlp/up/w", {Shape{8, 8}, DType::kF32}, mesh8()});
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_FALSE(steps[0].decided);
  EXPECT_THAT(steps[0].description, ::testing::HasSubstr("no match"));
  EXPECT_TRUE(steps[1].decided);
  EXPECT_EQ(steps[1].entry, 1);
}

TEST(TreePathRule, LabelsAndName) {
  const TreePathShardingRule rule({{"a", P()}, {"b", P()}}, false);
  EXPECT_EQ(rule.entry_labels(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(rule.name(), "TreePathShardingRule(2 rules, not strict)");
}

// ---- Policy ----

TEST(PolicyRule, ExceptionIsWrappedWithThePath) {
  const PolicyShardingRule rule(
      [](std::string_view, const TensorSpec&) -> PartitionSpec { throw std::runtime_error("boom"); },
      "mine");
  EXPECT_THROW_WITH(decide(rule, "params/w", {Shape{4, 4}, DType::kF32}, mesh8()), RuleError,
                    "policy 'mine'", "'params/w'", "[4, 4]", "boom");
}

TEST(PolicyRule, EmptyCallableIsAnError) {
  EXPECT_THROW_WITH(PolicyShardingRule(nullptr), RuleError, "empty callable");
}

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
  EXPECT_THROW_WITH(decide(flax_rules(), "x/act", t, mesh8()), RuleError, "'x/act'", "[4, 4]",
                    "batch");
}

TEST(LogicalAxisRule, DuplicateNameIsAnError) {
  EXPECT_THROW_WITH(flax_rules().to_mesh_spec({"mlp", "mlp"}), RuleError, "'mlp'", "dims 0 and 1");
}

TEST(LogicalAxisRule, NoNamesReplicatesOrFailsWhenStrict) {
  const TensorSpec t{Shape{4, 4}, DType::kF32};
  const auto d = decide(flax_rules(), "w", t, mesh8());
  EXPECT_EQ(d.spec, P());
  EXPECT_TRUE(d.fell_through);
  const LogicalAxisRule strict({{"batch", AxisNames{"data"}}}, true);
  EXPECT_THROW_WITH(decide(strict, "w", t, mesh8()), RuleError, "'w'", "no logical axis names");
}

TEST(LogicalAxisRule, LabelsDescribeMappings) {
  EXPECT_EQ(flax_rules().entry_labels()[0], "batch -> data");
  EXPECT_EQ(flax_rules().entry_labels()[3], "embed -> null");
}

}  // namespace
}  // namespace shardplan
