// FSDPShardingRule: which dimension it shards, min_size, modes and errors.

#include "shardplan/rules/fsdp_sharding_rule.hpp"

#include <stdexcept>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/rules/logical_axis_rule.hpp"
#include "shardplan/rules/policy_sharding_rule.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures
// ---- FSDP ----

TEST(FsdpRule, ShardsLargestDimensionDivisibleByTheMeshAxis) {
  const FSDPShardingRule rule({.min_size = 16});
  // 4096 and 11008 both divide by 4: the larger wins.
  EXPECT_EQ(decide(rule, "w", {Shape{4096, 11008}, DType::kF32}, fsdp_tp_mesh()).spec,
            P(nullptr, "fsdp"));
  // 11010 does not divide by 4: the largest that divides wins.
  EXPECT_EQ(decide(rule, "w", {Shape{4096, 11010}, DType::kF32}, fsdp_tp_mesh()).spec,
            P("fsdp", nullptr));
}

TEST(FsdpRule, TiesGoToTheLowerIndex) {
  const FSDPShardingRule rule({.min_size = 16});
  EXPECT_EQ(decide(rule, "w", {Shape{64, 64, 64}, DType::kF32}, fsdp_tp_mesh()).spec,
            P("fsdp", nullptr, nullptr));
}

TEST(FsdpRule, BelowMinSizeIsReplicatedAndAtMinSizeIsSharded) {
  const FSDPShardingRule rule({.min_size = 1024});
  const auto below = decide(rule, "w", {Shape{1020}, DType::kF32}, fsdp_tp_mesh());
  EXPECT_EQ(below.spec, P());
  EXPECT_THAT(below.reason, ::testing::HasSubstr("min_size 1024"));
  EXPECT_EQ(decide(rule, "w", {Shape{1024}, DType::kF32}, fsdp_tp_mesh()).spec, P("fsdp"));
}

TEST(FsdpRule, DefaultMinSizeIsTwoToTheTwenty) {
  const FSDPShardingRule rule;
  EXPECT_EQ(rule.min_size(), 1 << 20);
  EXPECT_EQ(decide(rule, "w", {Shape{1024, 1023}, DType::kF32}, fsdp_tp_mesh()).spec, P());
  EXPECT_EQ(decide(rule, "w", {Shape{1024, 1024}, DType::kF32}, fsdp_tp_mesh()).spec,
            P("fsdp", nullptr));
}

TEST(FsdpRule, ScalarsAreNeverSharded) {
  const FSDPShardingRule rule({.min_size = 0});
  EXPECT_EQ(decide(rule, "step", {Shape{}, DType::kI32}, fsdp_tp_mesh()).spec, P());
}

TEST(FsdpRule, NoDivisibleDimensionReplicates) {
  const FSDPShardingRule rule({.min_size = 4});
  const auto d = decide(rule, "w", {Shape{7, 9}, DType::kF32}, fsdp_tp_mesh());
  EXPECT_EQ(d.spec, P());
  EXPECT_THAT(d.reason, ::testing::HasSubstr("divisible"));
}

TEST(FsdpRule, GivenAxisSizeOverridesTheMesh) {
  const FSDPShardingRule rule({.axis_size = 3, .min_size = 4});
  EXPECT_EQ(decide(rule, "w", {Shape{8, 6}, DType::kF32}, fsdp_tp_mesh()).spec, P(nullptr, "fsdp"));
}

TEST(FsdpRule, PowerOfTwoModeMatchesScalaxGuess) {
  const FSDPShardingRule rule({.min_size = 4, .mode = FSDPShardingRule::Mode::kPowerOfTwo});
  // 96 = 32*3 has a larger power-of-two divisor than 1000 = 8*125.
  EXPECT_EQ(decide(rule, "w", {Shape{1000, 96}, DType::kF32}, fsdp_tp_mesh()).spec,
            P(nullptr, "fsdp"));
  // Equal divisors: the lower index.
  EXPECT_EQ(decide(rule, "w", {Shape{24, 40}, DType::kF32}, fsdp_tp_mesh()).spec,
            P("fsdp", nullptr));
  // Dims of size 1 are skipped even though 1 "divides".
  EXPECT_EQ(decide(rule, "w", {Shape{1, 7}, DType::kF32}, fsdp_tp_mesh()).spec, P(nullptr, "fsdp"));
}

TEST(FsdpRule, MissingMeshAxisIsAnErrorNamingIt) {
  const FSDPShardingRule rule({.axis = "data", .min_size = 4});
  EXPECT_THROW_WITH(decide(rule, "params/w", {Shape{64, 64}, DType::kF32}, fsdp_tp_mesh()),
                    RuleError, "'data'", "params/w", "[64, 64]", "fsdp");
}

TEST(FsdpRule, BadConstructionIsAnError) {
  EXPECT_THROW_WITH(FSDPShardingRule({.axis = "", .min_size = 4}), RuleError, "axis name is empty");
  EXPECT_THROW_WITH(FSDPShardingRule({.min_size = -1}), RuleError, "axis=fsdp", "min_size -1");
  EXPECT_THROW_WITH(FSDPShardingRule({.axis = "dp", .axis_size = 0}), RuleError, "axis=dp",
                    "axis_size 0 is not positive");
  EXPECT_THROW_WITH(FSDPShardingRule({.axis_size = -2}), RuleError, "axis_size -2");
}

TEST(FsdpRule, NameDescribesTheRule) {
  EXPECT_EQ(FSDPShardingRule().name(), "FSDPShardingRule(axis=fsdp, min_size=1048576)");
  EXPECT_EQ(FSDPShardingRule({.axis = "dp", .axis_size = 8, .min_size = 2048}).name(),
            "FSDPShardingRule(axis=dp, axis_size=8, min_size=2048)");
  EXPECT_EQ(FSDPShardingRule({.min_size = 4, .mode = FSDPShardingRule::Mode::kPowerOfTwo}).name(),
            "FSDPShardingRule(axis=fsdp, min_size=4, power_of_two)");
}

TEST(FsdpRule, NamedOptionsKeepTheirMeaningWhateverTheOtherFields) {
  // The spelling: axis size 8 and min_size 2048, not the other way round.
  const FSDPShardingRule rule({.axis = "fsdp", .axis_size = 8, .min_size = 2048});
  EXPECT_EQ(rule.options().axis_size, 8);
  EXPECT_EQ(rule.min_size(), 2048);
  EXPECT_EQ(rule.axis(), "fsdp");
  // 2047 elements: below min_size 2048.
  const auto small = decide(rule, "w", {Shape{2047}, DType::kF32}, fsdp_tp_mesh());
  EXPECT_EQ(small.spec, P());
  EXPECT_THAT(small.reason, ::testing::HasSubstr("min_size 2048"));
  // [8, 300]: only 8 divides by 8 (300 = 8 * 37 + 4). The mesh's fsdp axis (4) would have picked
  // the larger 300: the given axis_size wins.
  EXPECT_EQ(decide(rule, "w", {Shape{8, 300}, DType::kF32}, fsdp_tp_mesh()).spec,
            P("fsdp", nullptr));
  // A positional brace list follows scalax's positional order (axis, axis_size, min_size).
  const FSDPShardingRule positional({"fsdp", 8, 2048});
  EXPECT_EQ(positional.options().axis_size, 8);
  EXPECT_EQ(positional.min_size(), 2048);
}

TEST(FsdpRule, AxisSizeMinusOneMeansTheMeshAxis) {
  const FSDPShardingRule rule({.axis_size = -1, .min_size = 4});
  // fsdp_tp_mesh's fsdp axis has size 4: [12, 200] -> 200 % 4 == 0 and is larger than 12.
  EXPECT_EQ(decide(rule, "w", {Shape{12, 200}, DType::kF32}, fsdp_tp_mesh()).spec,
            P(nullptr, "fsdp"));
  EXPECT_EQ(decide(rule, "w", {Shape{12, 202}, DType::kF32}, fsdp_tp_mesh()).spec,
            P("fsdp", nullptr));
}

}  // namespace
}  // namespace shardplan
