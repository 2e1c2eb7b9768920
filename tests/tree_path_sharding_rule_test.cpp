// TreePathShardingRule: unanchored search, first match, strictness, catch-alls, explain.

#include "shardplan/rules/tree_path_sharding_rule.hpp"

#include <stdexcept>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/rules/fsdp_sharding_rule.hpp"
#include "shardplan/rules/logical_axis_rule.hpp"
#include "shardplan/rules/policy_sharding_rule.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures
// ---- Tree path ----

TEST(TreePathRule, SearchIsUnanchored) {
  const TreePathShardingRule rule({{"up_proj", P("tp")}});
  EXPECT_EQ(
      decide(rule, "model/layers/3/mlp/up_proj/weight", {Shape{8, 8}, DType::kF32}, fsdp_tp_mesh())
          .spec,
      P("tp"));
}

TEST(TreePathRule, FirstMatchWinsAndEntryIsReported) {
  const TreePathShardingRule rule({{"mlp/.*_proj", P("tp")}, {"up_proj", P("fsdp")}});
  const auto d = decide(rule, "mlp/up_proj/weight", {Shape{8, 8}, DType::kF32}, fsdp_tp_mesh());
  EXPECT_EQ(d.spec, P("tp"));
  EXPECT_EQ(d.entry, 0);
  EXPECT_FALSE(d.fell_through);
}

TEST(TreePathRule, OneElementTensorsAreReplicatedBeforeAnyRule) {
  const TreePathShardingRule rule({{".*", P("tp")}});
  const auto d = decide(rule, "w", {Shape{1, 1}, DType::kF32}, fsdp_tp_mesh());
  EXPECT_EQ(d.spec, P());
  EXPECT_EQ(d.entry, -1);
}

TEST(TreePathRule, StrictErrorNamesPathShapeAndPatterns) {
  const TreePathShardingRule rule({{"attn", P("tp")}, {"mlp", P("fsdp")}});
  EXPECT_THROW_WITH(
      decide(rule, "embed/weight", {Shape{32000, 4096}, DType::kBF16}, fsdp_tp_mesh()), RuleError,
      "'embed/weight'", "[32000, 4096]", "'attn'", "'mlp'");
}

TEST(TreePathRule, CatchAllIsReportedAsFellThrough) {
  const TreePathShardingRule rule({{"attn", P("tp")}, {".*", P()}});
  EXPECT_TRUE(
      decide(rule, "embed/weight", {Shape{8, 8}, DType::kF32}, fsdp_tp_mesh()).fell_through);
  EXPECT_FALSE(
      decide(rule, "attn/weight", {Shape{8, 8}, DType::kF32}, fsdp_tp_mesh()).fell_through);
}

TEST(TreePathRule, NonStrictNoMatchReplicatesAndFallsThrough) {
  const TreePathShardingRule rule({{"attn", P("tp")}}, false);
  const auto d = decide(rule, "mlp/w", {Shape{8, 8}, DType::kF32}, fsdp_tp_mesh());
  EXPECT_EQ(d.spec, P());
  EXPECT_TRUE(d.fell_through);
  EXPECT_FALSE(
      rule.try_match(RuleInput{"mlp/w", {Shape{8, 8}, DType::kF32}, fsdp_tp_mesh()}).has_value());
}

TEST(TreePathRule, BadRegexFailsAtConstructionNamingRuleAndPosition) {
  EXPECT_THROW_WITH(TreePathShardingRule({{"ok", P()}, {"mlp/(up", P()}}), RuleError, "rule 1",
                    "'mlp/(up'", "position");
}

TEST(TreePathRule, ExplainListsEveryEntryUntilTheWinner) {
  const TreePathShardingRule rule({{"attn", P("tp")}, {"mlp", P("fsdp")}, {"mlp/up", P()}});
  const auto steps =
      rule.explain(RuleInput{"mlp/up/w", {Shape{8, 8}, DType::kF32}, fsdp_tp_mesh()});
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

// The per-thread memo of DFA states must not survive its rule: rules built one after another in a
// loop usually get the address of the one just destroyed.
TEST(TreePathRule, ARuleBuiltWhereAnotherDiedDoesNotResumeItsStates) {
  const TensorSpec t{Shape{8, 8}, DType::kF32};
  for (int round = 0; round < 50; ++round) {
    {
      const TreePathShardingRule first({{"mlp/up$", P("tp")}, {"attn", P()}});
      ASSERT_EQ(decide(first, "model/mlp/up", t, fsdp_tp_mesh()).entry, 0);
    }
    const TreePathShardingRule second({{"attn", P("fsdp")}, {"^model/(mlp|attn)/", P("tp")}},
                                      false);
    const auto d = decide(second, "model/mlp/up", t, fsdp_tp_mesh());
    ASSERT_EQ(d.entry, 1) << "round " << round;
    ASSERT_EQ(d.spec, P("tp"));
    ASSERT_EQ(decide(second, "model/mlp/down", t, fsdp_tp_mesh()).entry, 1);
    ASSERT_EQ(decide(second, "other/mlp/up", t, fsdp_tp_mesh()).entry, -1);
  }
}

TEST(TreePathRule, TwoMatchCallsWithInlineRuleTreesDecideIndependently) {
  const auto model = Tree<TensorSpec>::dict(
      {{"mlp", Tree<TensorSpec>::dict({{"up", TensorSpec{Shape{8, 8}, DType::kF32}}})}});
  const MeshShardingHelper helper(fsdp_tp_mesh());
  for (int round = 0; round < 20; ++round) {
    const auto a =
        helper.match(RuleTree(RulePtr(std::make_shared<TreePathShardingRule>(
                         std::vector<TreePathShardingRule::Entry>{{"up$", P("tp")}, {".*", P()}}))),
                     model);
    ASSERT_EQ(a.at_path("mlp/up").leaf()->spec(), P("tp"));
    const auto b = helper.match(
        RuleTree(RulePtr(std::make_shared<TreePathShardingRule>(
            std::vector<TreePathShardingRule::Entry>{{"down$", P("tp")}, {"^mlp/", P("fsdp")}}))),
        model);
    ASSERT_EQ(b.at_path("mlp/up").leaf()->spec(), P("fsdp")) << "round " << round;
  }
}

// With an entry the DFA cannot decide (lookaround), the table is searched entry by entry; a
// pattern that matches the empty string must still not match every path (the Boost fallback did).
TEST(TreePathRule, EmptyMatchingPatternIsNotACatchAllForEveryPath) {
  const TreePathShardingRule rule({{"(?<=mlp/)up", P("tp")}, {"^[^/]*$", P("fsdp")}}, false);
  EXPECT_EQ(rule.path_automaton(), nullptr);
  const TensorSpec t{Shape{8, 8}, DType::kF32};
  EXPECT_EQ(decide(rule, "mlp/up", t, fsdp_tp_mesh()).entry, 0);
  EXPECT_EQ(decide(rule, "embed", t, fsdp_tp_mesh()).entry, 1);
  const auto d = decide(rule, "attn/w", t, fsdp_tp_mesh());
  EXPECT_EQ(d.entry, -1);
  EXPECT_EQ(d.spec, P());
}

// Consecutive paths that share a prefix ending inside a character (é and è share their first
// byte; an invalid byte is decoded by looking at the next one) must not resume a wrong state.
TEST(TreePathRule, ResumingAfterANonAsciiPrefixIsExact) {
  const TreePathShardingRule rule(
      {{"/\u00e9$", P("tp")}, {"/\u00e8$", P("fsdp")}, {"\u20ac$", P()}, {"\\udce2a$", P()}},
      false);
  const TensorSpec t{Shape{8, 8}, DType::kF32};
  const std::string invalid_then_a = std::string("a/\xe2") + "a";  // 0xe2 is escaped: U+DCE2
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(decide(rule, "a/\xc3\xa9", t, fsdp_tp_mesh()).entry, 0);
    EXPECT_EQ(decide(rule, "a/\xc3\xa8", t, fsdp_tp_mesh()).entry, 1);
    EXPECT_EQ(decide(rule, invalid_then_a, t, fsdp_tp_mesh()).entry, 3);
    EXPECT_EQ(decide(rule, "a/\xe2\x82\xac", t, fsdp_tp_mesh()).entry, 2);
    EXPECT_EQ(decide(rule, "a/\xc3", t, fsdp_tp_mesh()).entry, -1);
  }
}

TEST(TreePathRule, BacktrackingPastItsBoundIsARuleErrorNamingPatternAndPath) {
  const TreePathShardingRule rule({{"^(?=(a*)*b)", P("tp")}});
  const std::string path(40, 'a');
  EXPECT_THROW_WITH(decide(rule, path, {Shape{8, 8}, DType::kF32}, fsdp_tp_mesh()), RuleError,
                    "rule 0", "'^(?=(a*)*b)'", "'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'",
                    "backtracking steps");
}

TEST(TreePathRule, PythonSyntaxErrorsNameRulePatternPositionAndPythonsMessage) {
  EXPECT_THROW_WITH(TreePathShardingRule({{"ok", P()}, {"mlp/(?P<n>up)(?P=m)", P()}}), RuleError,
                    "rule 1", "'mlp/(?P<n>up)(?P=m)'", "position 17", "unknown group name 'm'");
  EXPECT_THROW_WITH(TreePathShardingRule({{"(?i)mlp", P()}}), RuleError, "rule 0", "IGNORECASE");
}

}  // namespace
}  // namespace shardplan
