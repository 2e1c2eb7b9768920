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
  const FSDPShardingRule rule("fsdp", 16);
  // 4096 and 11008 both divide by 4: the larger wins.
  EXPECT_EQ(decide(rule, "w", {Shape{4096, 11008}, DType::kF32}, fsdp_tp_mesh()).spec,
            P(nullptr, "fsdp"));
  // 11010 does not divide by 4: the largest that divides wins.
  EXPECT_EQ(decide(rule, "w", {Shape{4096, 11010}, DType::kF32}, fsdp_tp_mesh()).spec,
            P("fsdp", nullptr));
}

TEST(FsdpRule, TiesGoToTheLowerIndex) {
  const FSDPShardingRule rule("fsdp", 16);
  EXPECT_EQ(decide(rule, "w", {Shape{64, 64, 64}, DType::kF32}, fsdp_tp_mesh()).spec,
            P("fsdp", nullptr, nullptr));
}

TEST(FsdpRule, BelowMinSizeIsReplicatedAndAtMinSizeIsSharded) {
  const FSDPShardingRule rule("fsdp", 1024);
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
  const FSDPShardingRule rule("fsdp", 0);
  EXPECT_EQ(decide(rule, "step", {Shape{}, DType::kI32}, fsdp_tp_mesh()).spec, P());
}

TEST(FsdpRule, NoDivisibleDimensionReplicates) {
  const FSDPShardingRule rule("fsdp", 4);
  const auto d = decide(rule, "w", {Shape{7, 9}, DType::kF32}, fsdp_tp_mesh());
  EXPECT_EQ(d.spec, P());
  EXPECT_THAT(d.reason, ::testing::HasSubstr("divisible"));
}

TEST(FsdpRule, GivenAxisSizeOverridesTheMesh) {
  const FSDPShardingRule rule("fsdp", 4, 3);
  EXPECT_EQ(decide(rule, "w", {Shape{8, 6}, DType::kF32}, fsdp_tp_mesh()).spec, P(nullptr, "fsdp"));
}

TEST(FsdpRule, PowerOfTwoModeMatchesScalaxGuess) {
  const FSDPShardingRule rule("fsdp", 4, std::nullopt, FSDPShardingRule::Mode::kPowerOfTwo);
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
  const FSDPShardingRule rule("data", 4);
  EXPECT_THROW_WITH(decide(rule, "params/w", {Shape{64, 64}, DType::kF32}, fsdp_tp_mesh()),
                    RuleError, "'data'", "params/w", "[64, 64]", "fsdp");
}

TEST(FsdpRule, BadConstructionIsAnError) {
  EXPECT_THROW_WITH(FSDPShardingRule("", 4), RuleError, "axis name is empty");
  EXPECT_THROW_WITH(FSDPShardingRule("fsdp", -1), RuleError, "min_size -1");
  EXPECT_THROW_WITH(FSDPShardingRule("fsdp", 4, 0), RuleError, "axis_size 0");
}

TEST(FsdpRule, NameDescribesTheRule) {
  EXPECT_EQ(FSDPShardingRule().name(), "FSDPShardingRule(axis=fsdp, min_size=1048576)");
}

}  // namespace
}  // namespace shardplan
