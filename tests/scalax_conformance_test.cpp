// Reproduces scalax's published tests (tests/sharding_test.py) and its LLaMA FSDP+TP rule table,
// with shardplan's rules and planner.
#include <fmt/format.h>

#include <memory>

#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/rules/fsdp_sharding_rule.hpp"
#include "shardplan/rules/policy_sharding_rule.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

TensorSpec f32(Shape s) { return TensorSpec{std::move(s), DType::kF32}; }

/// Applies a rule to every leaf of a tree, as scalax's ShardingRule.apply(pytree) does.
Tree<PartitionSpec> apply_rule(const ShardingRule& rule, const Tree<TensorSpec>& tree,
                               const Mesh& mesh) {
  return tree.map_with_path([&](const std::string& path, const TensorSpec& t) {
    return rule.apply(RuleInput{path, t, mesh}).spec;
  });
}

class ScalaxFsdp : public ::testing::TestWithParam<std::pair<std::int64_t, std::int64_t>> {};

TEST_P(ScalaxFsdp, ShardsAsScalaxTestExpects) {
  const auto [axis_size, min_size] = GetParam();
  const auto tree = Tree<TensorSpec>::dict({
      {"scaler", f32({})},
      {"small_vector", f32({min_size - axis_size})},
      {"large_vector", f32({min_size * 2})},
      {"small_matrix", f32({16, 16})},
      {"large_matrix", f32({min_size, min_size})},
      {"weird_matrix", f32({min_size + 1, min_size})},
      {"really_weird_matrix", f32({min_size + 1, min_size + 1})},
  });
  // scalax passes fsdp_axis_size explicitly; the mesh need not even have the axis.
  const FSDPShardingRule rule({.axis = "fsdp", .axis_size = axis_size, .min_size = min_size});
  const Mesh mesh({{"x", 1}}, 1);
  const auto expected = Tree<PartitionSpec>::dict({
      {"scaler", P()},
      {"small_vector", P()},
      {"large_vector", P("fsdp")},
      {"small_matrix", P()},
      {"large_matrix", P("fsdp", nullptr)},
      {"weird_matrix", P(nullptr, "fsdp")},
      {"really_weird_matrix", P()},
  });
  EXPECT_EQ(apply_rule(rule, tree, mesh), expected);
}

INSTANTIATE_TEST_SUITE_P(Scalax, ScalaxFsdp,
                         ::testing::Values(std::pair<std::int64_t, std::int64_t>{4, 1024},
                                           std::pair<std::int64_t, std::int64_t>{8, 2048},
                                           std::pair<std::int64_t, std::int64_t>{2, 512}));

Tree<TensorSpec> abcde_tree(bool with_e) {
  std::vector<Tree<TensorSpec>::DictEntry> entries = {
      {"a", f32({16, 16})},
      {"b", Tree<TensorSpec>::dict({{"c", f32({16, 16})}, {"d", f32({16, 16})}})},
  };
  if (with_e) entries.emplace_back("e", f32({}));
  return Tree<TensorSpec>::dict(std::move(entries));
}

TEST(ScalaxTreePath, FirstMatchingRegexAndScalarsReplicated) {
  const TreePathShardingRule rule({{"a", P("x", "y")}, {"b/c", P("x")}, {"b/d", P("y")}});
  const Mesh mesh({{"x", 2}, {"y", 4}}, 8);
  const auto expected = Tree<PartitionSpec>::dict({
      {"a", P("x", "y")},
      {"b", Tree<PartitionSpec>::dict({{"c", P("x")}, {"d", P("y")}})},
      {"e", P()},
  });
  EXPECT_EQ(apply_rule(rule, abcde_tree(true), mesh), expected);
}

TEST(ScalaxTreePath, StrictRaisesForAnUnmatchedLeaf) {
  const TreePathShardingRule rule({{"a", P("x", "y")}, {"b/c", P("x")}}, /*strict=*/true);
  const Mesh mesh({{"x", 2}, {"y", 4}}, 8);
  EXPECT_THROW_WITH(apply_rule(rule, abcde_tree(false), mesh), RuleError, "'b/d'", "[16, 16]");
}

TEST(ScalaxTreePath, NonStrictReplicatesAnUnmatchedLeaf) {
  const TreePathShardingRule rule({{"a", P("x", "y")}, {"b/c", P("x")}}, /*strict=*/false);
  const Mesh mesh({{"x", 2}, {"y", 4}}, 8);
  const auto specs = apply_rule(rule, abcde_tree(false), mesh);
  EXPECT_EQ(specs.at_path("b/d").leaf(), P());
  EXPECT_EQ(specs.at_path("b/c").leaf(), P("x"));
}

TEST(ScalaxPolicy, CallableSeesPathAndTensor) {
  const auto tree = Tree<TensorSpec>::dict({
      {"a", f32({16, 16})},
      {"b", Tree<TensorSpec>::dict(
                {{"c", f32({16, 16})}, {"d", TensorSpec{Shape{16, 16}, DType::kI32}}})},
      {"e", f32({})},
  });
  const PolicyShardingRule rule([](std::string_view path, const TensorSpec& t) {
    if (path == "a") return P("x");
    if (t.dtype == DType::kI32) return P("y");
    if (t.shape.rank() == 0) return P("z");
    return P();
  });
  const Mesh mesh({{"x", 2}, {"y", 2}, {"z", 2}}, 8);
  const auto expected = Tree<PartitionSpec>::dict({
      {"a", P("x")},
      {"b", Tree<PartitionSpec>::dict({{"c", P()}, {"d", P("y")}})},
      {"e", P("z")},
  });
  EXPECT_EQ(apply_rule(rule, tree, mesh), expected);
}

// scalax's LLaMA FSDP+TP example shards an EasyLM-style Flax LLaMA whose kernels are [in, out],
// with this table (first match wins, ending in a catch-all).
std::shared_ptr<TreePathShardingRule> easylm_llama_rule() {
  return std::make_shared<TreePathShardingRule>(std::vector<TreePathShardingRule::Entry>{
      {"transformer/wte/embedding", P("tp", "fsdp")},
      {"self_attention/(k_proj|q_proj|v_proj)/kernel", P("fsdp", "tp")},
      {"self_attention/o_proj/kernel", P("tp", "fsdp")},
      {"feedforward/up_proj/kernel", P("fsdp", "tp")},
      {"feedforward/down_proj/kernel", P("tp", "fsdp")},
      {"feedforward/gate_proj/kernel", P("fsdp", "tp")},
      {"input_layernorm/scale", P(nullptr)},
      {"post_attention_layernorm/scale", P(nullptr)},
      {"transformer/ln_f/kernel", P(nullptr)},
      {"lm_head/kernel", P("fsdp", "tp")},
      {".*", P(nullptr)},
  });
}

Tree<TensorSpec> easylm_llama_tree(int layers, std::int64_t vocab, std::int64_t hidden,
                                   std::int64_t inter) {
  const DType dt = DType::kF32;
  std::vector<Tree<TensorSpec>> blocks;
  for (int l = 0; l < layers; ++l) {
    auto attn = Tree<TensorSpec>::dict({
        {"q_proj", Tree<TensorSpec>::dict({{"kernel", TensorSpec{Shape{hidden, hidden}, dt}}})},
        {"k_proj", Tree<TensorSpec>::dict({{"kernel", TensorSpec{Shape{hidden, hidden}, dt}}})},
        {"v_proj", Tree<TensorSpec>::dict({{"kernel", TensorSpec{Shape{hidden, hidden}, dt}}})},
        {"o_proj", Tree<TensorSpec>::dict({{"kernel", TensorSpec{Shape{hidden, hidden}, dt}}})},
    });
    auto ff = Tree<TensorSpec>::dict({
        {"gate_proj", Tree<TensorSpec>::dict({{"kernel", TensorSpec{Shape{hidden, inter}, dt}}})},
        {"up_proj", Tree<TensorSpec>::dict({{"kernel", TensorSpec{Shape{hidden, inter}, dt}}})},
        {"down_proj", Tree<TensorSpec>::dict({{"kernel", TensorSpec{Shape{inter, hidden}, dt}}})},
    });
    blocks.push_back(Tree<TensorSpec>::dict({
        {"self_attention", attn},
        {"feedforward", ff},
        {"input_layernorm", Tree<TensorSpec>::dict({{"scale", TensorSpec{Shape{hidden}, dt}}})},
        {"post_attention_layernorm",
         Tree<TensorSpec>::dict({{"scale", TensorSpec{Shape{hidden}, dt}}})},
    }));
  }
  return Tree<TensorSpec>::dict(
      {{"params",
        Tree<TensorSpec>::dict({
            {"transformer",
             Tree<TensorSpec>::dict({
                 {"wte",
                  Tree<TensorSpec>::dict({{"embedding", TensorSpec{Shape{vocab, hidden}, dt}}})},
                 {"h", Tree<TensorSpec>::list(std::move(blocks))},
                 {"ln_f", Tree<TensorSpec>::dict({{"kernel", TensorSpec{Shape{hidden}, dt}}})},
             })},
            {"lm_head", Tree<TensorSpec>::dict({{"kernel", TensorSpec{Shape{hidden, vocab}, dt}}})},
        })}});
}

TEST(ScalaxLlamaFsdpTp, EveryMatrixIsShardedOverBothAxes) {
  const auto tree = easylm_llama_tree(4, 32000, 4096, 11008);
  const MeshShardingHelper helper(Mesh::parse("fsdp:-1,tp:2", 8));
  const PlanReport report = helper.plan(RuleTree(RulePtr(easylm_llama_rule())), tree);
  ASSERT_EQ(report.leaves.size(), 2u + 4u * 9u + 1u);
  int matrices = 0;
  for (const LeafPlan& leaf : report.leaves) {
    ASSERT_TRUE(leaf.spec.has_value()) << leaf.path;
    // Expected from the table by hand: which kind of tensor the path names.
    const std::string& p = leaf.path;
    PartitionSpec want = P(nullptr);
    if (p.ends_with("wte/embedding")) {
      want = P("tp", "fsdp");
    } else if (p.find("self_attention/o_proj") != std::string::npos ||
               p.find("feedforward/down_proj") != std::string::npos) {
      want = P("tp", "fsdp");
    } else if (p.find("self_attention/") != std::string::npos ||
               p.find("feedforward/") != std::string::npos || p.ends_with("lm_head/kernel")) {
      want = P("fsdp", "tp");
    }
    EXPECT_EQ(*leaf.spec, want) << p;
    if (leaf.tensor.shape.rank() == 2) {
      ++matrices;
      EXPECT_EQ(leaf.bytes_per_device * 8, leaf.tensor.bytes()) << p;
      EXPECT_FALSE(leaf.fell_through) << p;
    } else {
      EXPECT_EQ(leaf.bytes_per_device, leaf.tensor.bytes()) << p;
    }
  }
  EXPECT_EQ(matrices, 2 + 4 * 7);
  // ln_f/kernel matched its own entry; the catch-all decided nothing, so it is reported unmatched.
  ASSERT_EQ(report.unmatched_rules.size(), 1u);
  EXPECT_EQ(report.unmatched_rules[0].label, ".*");
}

TEST(ScalaxLlamaFsdpTp, CatchAllLeavesAreReportedAsFellThrough) {
  auto tree = easylm_llama_tree(1, 256, 64, 128);
  // An extra tensor that only the catch-all matches.
  auto params = tree.at("params");
  std::vector<Tree<TensorSpec>::DictEntry> entries;
  for (std::size_t i = 0; i < params.size(); ++i)
    entries.emplace_back(params.keys()[i], params.children()[i]);
  entries.emplace_back("rope_cache", TensorSpec{Shape{64, 32}, DType::kF32});
  tree = Tree<TensorSpec>::dict({{"params", Tree<TensorSpec>::dict(std::move(entries))}});
  const MeshShardingHelper helper(Mesh::parse("fsdp:-1,tp:2", 8));
  const PlanReport report = helper.plan(RuleTree(RulePtr(easylm_llama_rule())), tree);
  const auto fell = report.fell_through();
  ASSERT_EQ(fell.size(), 1u);
  EXPECT_EQ(report.leaves[fell[0]].path, "params/rope_cache");
  EXPECT_EQ(report.leaves[fell[0]].entry, 10);
}

}  // namespace
}  // namespace shardplan
