// The rule a rule file builds: logical axes, regexes, fallback, strictness.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/safetensors.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures

TEST(RuleTable, RegexThenFallbackThenLogicalAxes) {
  const RulePtr rule = parse_rule_file(kSampleRules, "r.yaml").make_rule();
  const Mesh mesh = Mesh::parse("data:2,fsdp:2,tp:2", 8);
  auto decide = [&](std::string_view path, TensorSpec t) {
    return rule->apply(RuleInput{path, t, mesh});
  };
  EXPECT_EQ(decide("l/attn/q/w", {Shape{8, 8}, DType::kF32}).spec, P("tp", "fsdp"));
  const auto fb = decide("l/other", {Shape{4, 64}, DType::kF32});
  EXPECT_EQ(fb.spec, P(nullptr, "fsdp"));
  EXPECT_TRUE(fb.fell_through);
  EXPECT_EQ(fb.entry, 3);
  const auto small = decide("l/tiny", {Shape{4, 4}, DType::kF32});
  EXPECT_EQ(small.spec, P());
  EXPECT_EQ(decide("act", {Shape{8, 16}, DType::kF32, {"batch", "mlp"}}).spec, P("data", "tp"));
  EXPECT_EQ(rule->entry_labels().size(), 3u + 1u + 4u);
  EXPECT_EQ(rule->entry_labels()[3], "fsdp_fallback");
}

TEST(RuleTable, LogicalAxesThatDecidedADimensionAreNotUnmatched) {
  // Entries: 0 the regex, then the mappings 1..4 in the file's order.
  const RulePtr rule = parse_rule_file(
                           "rules:\n  - {match: norm, spec: []}\n"
                           "logical_axes: {batch: data, mlp: tp, embed: null, heads: tp}\n",
                           "r.yaml")
                           .make_rule();
  const Tree<TensorSpec> data =
      Tree<TensorSpec>::dict({{"norm", TensorSpec{Shape{16}, DType::kF32}},
                              {"w", TensorSpec{Shape{8, 16}, DType::kF32, {"embed", "mlp"}}},
                              {"x", TensorSpec{Shape{8, 16}, DType::kF32, {"batch", "embed"}}}});
  const PlanReport report =
      MeshShardingHelper(Mesh::parse("data:4,tp:2", 8)).plan(RuleTree(rule), data);
  ASSERT_EQ(report.unmatched_rules.size(), 1u);  // "heads" is on no tensor
  EXPECT_EQ(report.unmatched_rules[0].entry, 4);
  EXPECT_EQ(report.unmatched_rules[0].label, "heads -> tp");
}

TEST(RuleTable, LogicalAxesOfActivationsAreReportedApartFromUnmatchedWeightRules) {
  // Entries: 0 'norm', 1 'typo' (matches nothing), then the mappings 2..4; `batch` and `embed`
  // name the activation's dimensions, `heads` nothing: only 'typo' and `heads` are unmatched.
  const RulePtr rule = parse_rule_file(
                           "rules:\n  - {match: norm, spec: []}\n  - {match: typo, spec: []}\n"
                           "logical_axes: {batch: data, embed: null, heads: tp}\n"
                           "activations: {residual: [batch, null, embed]}\n",
                           "r.yaml")
                           .make_rule();
  EXPECT_EQ(rule->activation_entries(), (std::vector<int>{2, 3}));
  const Tree<TensorSpec> weights =
      Tree<TensorSpec>::dict({{"norm", TensorSpec{Shape{16}, DType::kF32}}});
  const PlanReport report =
      MeshShardingHelper(Mesh::parse("data:4,tp:2", 8)).plan(RuleTree(rule), weights);
  std::vector<std::tuple<int, std::string, bool>> unmatched;
  for (const UnmatchedRule& u : report.unmatched_rules) {
    unmatched.emplace_back(u.entry, u.label, u.activation);
  }
  EXPECT_EQ(unmatched, (std::vector<std::tuple<int, std::string, bool>>{
                           {1, "typo", false},
                           {2, "batch -> data", true},
                           {3, "embed -> null", true},
                           {4, "heads -> tp", false}}));
  using testing::HasSubstr;
  using testing::Not;
  const std::string text = report.summary();
  EXPECT_THAT(text, HasSubstr("unmatched rules:\n  #0 rules r.yaml"));
  EXPECT_THAT(text, HasSubstr("[1]: typo\n"));
  EXPECT_THAT(text, HasSubstr("[4]: heads -> tp\n"));
  EXPECT_THAT(text, HasSubstr("for activations only (not matched against weights): "
                              "batch -> data, embed -> null\n"));
  EXPECT_THAT(text, Not(HasSubstr("[2]: batch")));
  // Without activations, the same logical axes are ordinary entries: unmatched when unused.
  const RulePtr plain = parse_rule_file(
                            "rules:\n  - {match: norm, spec: []}\n"
                            "logical_axes: {batch: data}\n",
                            "r.yaml")
                            .make_rule();
  EXPECT_TRUE(plain->activation_entries().empty());
  const PlanReport plain_report =
      MeshShardingHelper(Mesh::parse("data:4,tp:2", 8)).plan(RuleTree(plain), weights);
  ASSERT_EQ(plain_report.unmatched_rules.size(), 1u);
  EXPECT_FALSE(plain_report.unmatched_rules[0].activation);
  EXPECT_THAT(plain_report.summary(), HasSubstr("[1]: batch -> data\n"));
}

TEST(RuleTable, StrictWithoutFallbackFailsNamingTheFileAndPath) {
  const RulePtr rule =
      parse_rule_file("rules:\n  - {match: attn, spec: []}\n", "r.yaml").make_rule();
  const Mesh mesh = Mesh::parse("x:2", 2);
  EXPECT_THROW_WITH(rule->apply(RuleInput{"mlp/w", {Shape{4, 4}, DType::kF32}, mesh}), RuleError,
                    "r.yaml", "'mlp/w'", "[4, 4]");
  const auto steps = rule->explain(RuleInput{"mlp/w", {Shape{4, 4}, DType::kF32}, mesh});
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_FALSE(steps.back().decided);
}

}  // namespace
}  // namespace shardplan
