// The rule a rule file builds: logical axes, regexes, fallback, strictness.
#include <unistd.h>

#include <filesystem>
#include <fstream>

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
