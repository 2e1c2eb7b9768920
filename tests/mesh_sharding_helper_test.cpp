// MeshShardingHelper: rule trees as prefixes, match, resolve, explain, errors, subtree reuse.

#include "shardplan/mesh_sharding_helper.hpp"

#include <algorithm>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/rules/fsdp_sharding_rule.hpp"
#include "shardplan/rules/policy_sharding_rule.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures
using Data = Tree<TensorSpec>;

TEST(MeshShardingHelper, PrefixRuleTreeCoversSubtreesWithRelativePaths) {
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params", RulePtr(std::make_shared<FirstDimUnderH>())},
      {"opt_state", P(nullptr, "y")},
  });
  const auto shardings = MeshShardingHelper(xy_mesh()).match(rules, small_model());
  ASSERT_TRUE(shardings.same_structure(small_model()));
  EXPECT_EQ(shardings.at_path("params/h/1/w_in").leaf()->spec(), P("x"));
  EXPECT_EQ(shardings.at_path("params/embed").leaf()->spec(), P());
  EXPECT_EQ(shardings.at_path("opt_state/mu").leaf()->spec(), P(nullptr, "y"));
  EXPECT_EQ(shardings.at_path("step").leaf()->spec(), P());
  EXPECT_EQ(shardings.at_path("step").leaf()->mesh(), xy_mesh());
}

// A helper made with Uneven::kPad makes padding shardings: a dimension the axes do not divide
// (10 over 4) plans, its shard ceil(10/4) = 3 rows and its bytes that block's; the default
// refuses it naming the path, the shape and the axis.
TEST(MeshShardingHelper, AnUnevenPolicyPadsWhatTheDefaultRefuses) {
  const Mesh mesh = Mesh::parse("x:4", 4);
  const Data data = Data::dict({{"w", TensorSpec{Shape{10, 6}, DType::kF32}}});
  const RuleTree rules(P("x"));
  const auto padded = MeshShardingHelper(mesh, Uneven::kPad).match(rules, data);
  EXPECT_EQ(*padded.at("w").leaf(), NamedSharding(mesh, P("x"), Uneven::kPad));
  EXPECT_EQ(MeshShardingHelper(mesh, Uneven::kPad).plan(rules, data).max_device_bytes(),
            3 * 6 * 4);
  EXPECT_THROW_WITH(MeshShardingHelper(mesh).match(rules, data), SpecError, "'w'",
                    "(shape [10, 6])", "'x' (size 4)");
}

TEST(MeshShardingHelper, UnspecifiedLeavesHaveNoShardingAndNoneLeavesAreReplicated) {
  const RuleTree rules = RuleTree::dict(
      {{"step", Unspecified{}}, {"params", Replicated{}}, {"opt_state", RuleTree::none()}});
  const auto shardings = MeshShardingHelper(xy_mesh()).match(rules, small_model());
  EXPECT_FALSE(shardings.at_path("step").leaf().has_value());
  EXPECT_TRUE(shardings.at_path("params/embed").leaf().has_value());
  // None means replicated, as NamedSharding(mesh, None) is PartitionSpec() in JAX and scalax.
  ASSERT_TRUE(shardings.at_path("opt_state/mu").leaf().has_value());
  EXPECT_EQ(shardings.at_path("opt_state/mu").leaf()->spec(), P());
  EXPECT_EQ(shardings.at_path("opt_state/mu").leaf()->mesh(), xy_mesh());
  // The compact form and the report agree.
  const ShardingAssignment a = MeshShardingHelper(xy_mesh()).resolve(rules, small_model());
  const auto leaves = shardings.leaves();
  ASSERT_EQ(a.leaf_sharding.size(), leaves.size());
  for (std::size_t i = 0; i < leaves.size(); ++i) EXPECT_EQ(a.sharding_of(i), leaves[i]);
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  for (const auto& l : report.leaves) {
    if (l.path.rfind("opt_state", 0) == 0) {
      ASSERT_TRUE(l.spec.has_value()) << l.path;
      EXPECT_EQ(*l.spec, P()) << l.path;
      EXPECT_EQ(l.reason, "None: replicated") << l.path;
    }
    if (l.path == "step") {
      EXPECT_FALSE(l.spec.has_value());
    }
  }
  const auto steps = MeshShardingHelper(xy_mesh()).explain(rules, small_model(), "opt_state/mu");
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].step.description, "None: replicated");
  // A whole rule tree that is None replicates everything.
  for (const auto& s :
       MeshShardingHelper(xy_mesh()).match(RuleTree::none(), small_model()).leaves()) {
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->spec(), P());
  }
}

TEST(MeshContext, IsScopedNestedAndThreadLocal) {
  EXPECT_EQ(get_context(), nullptr);
  EXPECT_THROW_WITH(get_global_mesh(), SpecError, "get_global_mesh", "no MeshContext");
  const Mesh outer_mesh = Mesh::parse("x:8", 8);
  const Mesh inner_mesh = Mesh::parse("x:4,y:2", 8);
  {
    MeshContext outer(MeshShardingHelper(outer_mesh), {{"act", RuleTree(P("x"))}});
    EXPECT_EQ(get_context(), &outer);
    EXPECT_EQ(get_global_mesh(), outer_mesh);
    {
      MeshContext inner(inner_mesh);
      EXPECT_EQ(get_context(), &inner);
      EXPECT_EQ(get_global_mesh(), inner_mesh);
      EXPECT_TRUE(inner.annotation_shardings().empty());
      // Another thread has no context of its own.
      const MeshContext* seen = &inner;
      bool threw = false;
      std::thread t([&] {
        seen = get_context();
        try {
          get_global_mesh();
        } catch (const SpecError&) {
          threw = true;
        }
      });
      t.join();
      EXPECT_EQ(seen, nullptr);
      EXPECT_TRUE(threw);
    }
    EXPECT_EQ(get_context(), &outer);  // restored
    EXPECT_EQ(get_global_mesh(), outer_mesh);
    EXPECT_EQ(outer.annotation_shardings().count("act"), 1u);
    EXPECT_EQ(outer.helper().mesh(), outer_mesh);
  }
  EXPECT_EQ(get_context(), nullptr);
}

TEST(MeshShardingHelper, RuleTreeThatIsNotAPrefixNamesThePath) {
  const RuleTree rules = RuleTree::dict({{"step", Replicated{}}, {"params", Replicated{}}});
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).match(rules, small_model()), TreeError,
                    "not a prefix", "opt_state");
}

TEST(MeshShardingHelper, RuleErrorsNameTheLeafAndTheRule) {
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params", RulePtr(std::make_shared<TreePathShardingRule>(
                     std::vector<TreePathShardingRule::Entry>{{"w_in", P("x")}}))},
      {"opt_state", Replicated{}},
  });
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).plan(rules, small_model()), RuleError,
                    "params/embed", "rule 1", "TreePathShardingRule", "at 'params'");
}

TEST(MeshShardingHelper, SpecErrorsNamePathShapeAndAxis) {
  // 64 / (4*2) = 8 divides, but 1024 rows by y then 64 by (x,y)... use a non-dividing one.
  const Data data = Data::dict({{"w", bf16({6, 64})}});
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).plan(RuleTree(P("x", nullptr)), data), SpecError,
                    "'w'", "[6, 64]", "'x'", "4");
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).plan(RuleTree(P("tp")), data), SpecError, "'tp'");
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).plan(RuleTree(P("x", "y", nullptr)), data),
                    SpecError, "'w'", "rank 2");
}

TEST(MeshShardingHelper, NonRuleExceptionsAreWrappedWithTheLeaf) {
  class Throws : public ShardingRule {
   public:
    RuleDecision apply(const RuleInput&) const override { throw std::out_of_range("oops"); }
    std::string name() const override { return "Throws"; }
  };
  EXPECT_THROW_WITH(
      MeshShardingHelper(xy_mesh()).plan(RuleTree(RulePtr(std::make_shared<Throws>())),
                                         Data::dict({{"w", bf16({4})}})),
      RuleError, "'w'", "Throws", "oops");
}

TEST(MeshShardingHelper, ExplainListsEveryEntryTried) {
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params",
       RulePtr(std::make_shared<TreePathShardingRule>(std::vector<TreePathShardingRule::Entry>{
           {"embed", P("x")}, {"w_out", P(nullptr, "x")}, {"w_in", P("x")}}))},
      {"opt_state", Replicated{}},
  });
  const auto steps =
      MeshShardingHelper(xy_mesh()).explain(rules, small_model(), "params/h/1/w_out");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].rule_index, 1);
  EXPECT_FALSE(steps[0].step.decided);
  EXPECT_TRUE(steps[1].step.decided);
  EXPECT_EQ(steps[1].step.entry, 1);
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).explain(rules, small_model(), "params/h/9/w_out"),
                    TreeError, "params/h/9/w_out");
  // A checkpoint's own name of the tensor explains the same leaf; a name that is neither says
  // which tree path it was also tried as.
  EXPECT_EQ(MeshShardingHelper(xy_mesh()).explain(rules, small_model(), "params.h.1.w_out"), steps);
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).explain(rules, small_model(), "params.h.9.w_out"),
                    TreeError, "params.h.9.w_out", "nor as the tree path 'params/h/9/w_out'");
  // Each step prints as the command shows it.
  std::ostringstream os;
  os << steps[0] << "|" << steps[1];
  EXPECT_EQ(os.str(), "   " + steps[0].step.description + "|=> " + steps[1].step.description);
}

TEST(MeshShardingHelper, ResolveAgreesWithMatchLeafByLeaf) {
  const RuleTree rules = RuleTree::dict({
      {"step", Unspecified{}},
      {"params", RulePtr(std::make_shared<FSDPShardingRule>(
                     FSDPShardingRule::Options{.axis = "x", .min_size = 1}))},
      {"opt_state", P(AxisNames{"x", "y"}, nullptr)},
  });
  const MeshShardingHelper helper(Mesh::parse("x:4,y:2", 8));
  const auto data = Tree<TensorSpec>::dict({
      {"step", TensorSpec{Shape{}, DType::kI32}},
      {"params", Tree<TensorSpec>::dict({{"a", TensorSpec{Shape{8, 16}, DType::kF32}},
                                         {"b", TensorSpec{Shape{64}, DType::kF32}}})},
      {"opt_state", Tree<TensorSpec>::dict({{"mu", TensorSpec{Shape{16, 4}, DType::kF32}}})},
  });
  const auto matched = helper.match(rules, data).leaves();
  const ShardingAssignment a = helper.resolve(rules, data);
  ASSERT_EQ(a.leaf_sharding.size(), matched.size());
  for (std::size_t i = 0; i < matched.size(); ++i) EXPECT_EQ(a.sharding_of(i), matched[i]) << i;
  EXPECT_EQ(a.leaf_sharding[3], -1);  // "step", unspecified, is last in flatten order
  // Distinct shardings only: P(None, 'x') for a, P('x') for b, P(('x','y'), None) for mu.
  EXPECT_EQ(a.shardings.size(), 3u);
  EXPECT_EQ(a, helper.resolve(rules, data));
  std::ostringstream os;
  os << a;
  // In order of first use, leaves in flatten order: opt_state/mu, params/a, params/b.
  EXPECT_EQ(os.str(),
            "ShardingAssignment(4 leaves, 3 shardings: PartitionSpec(('x', 'y'), None), "
            "PartitionSpec(None, 'x'), PartitionSpec('x'))");
  EXPECT_THROW_WITH(helper.resolve(RuleTree(P("x", "y")), data), SpecError, "'params/b'", "[64]");
}

// resolve() and match() reuse the decisions of a subtree for an equal subtree reached in the same
// automaton state; plan() decides every leaf. They must agree on trees built to trip the reuse:
// patterns that single out one layer or expert, experts that differ in one shape, and keys that
// differ only in a character the patterns look at.
TEST(MeshShardingHelper, SubtreeReuseNeverChangesADecision) {
  std::vector<Data> layers;
  for (int l = 0; l < 12; ++l) {
    std::vector<Data> experts;
    for (int e = 0; e < 6; ++e) {
      const std::int64_t rows = (l == 7 && e == 3) ? 24 : 16;  // one expert differs in shape
      experts.push_back(Data::dict({{"w_in", TensorSpec{Shape{rows, 32}, DType::kF32}},
                                    {"w_out", TensorSpec{Shape{32, 16}, DType::kF32}},
                                    {"scale", TensorSpec{Shape{1}, DType::kF32}}}));
    }
    layers.push_back(
        Data::dict({{"experts", Data::list(std::move(experts))},
                    {l == 5 ? "norm_b" : "norm_a", TensorSpec{Shape{32}, DType::kF32}}}));
  }
  // Also with equal subtrees sharing one branch (as the model loaders build trees): layers 10
  // and 11 share layer 3's branch but are reached in other automaton states.
  const Data built = Data::dict({{"layers", Data::list(std::move(layers))}});
  const Data shared = built.share_equal_subtrees();
  ASSERT_TRUE(shared.at_path("layers/3").shares_branch_with(shared.at_path("layers/10")));
  for (const Data* tree : {&built, &shared}) {
    SCOPED_TRACE(tree == &built ? "built" : "shared");
    const Data& data = *tree;
    const auto rule =
        std::make_shared<TreePathShardingRule>(std::vector<TreePathShardingRule::Entry>{
            {"layers/1[01]/experts/[0-9]+/w_in", P(nullptr, "y")},  // only layers 10 and 11
            {"experts/2/w_out$", P("y")},                           // only expert 2 of every layer
            {"experts/[0-9]+/w_in$", P("x")},
            {"experts/[0-9]+/w_out$", P(nullptr, "x")},
            {"norm_b", P("x")},
            {".*", P()},
        });
    ASSERT_NE(rule->path_automaton(), nullptr);
    const MeshShardingHelper helper(Mesh::parse("x:4,y:2", 8));
    const PlanReport report = helper.plan(RuleTree(RulePtr(rule)), data);
    const ShardingAssignment a = helper.resolve(RuleTree(RulePtr(rule)), data);
    const auto matched = helper.match(RuleTree(RulePtr(rule)), data).leaves();
    ASSERT_EQ(a.leaf_sharding.size(), report.leaves.size());
    for (std::size_t i = 0; i < report.leaves.size(); ++i) {
      const LeafPlan& l = report.leaves[i];
      EXPECT_EQ(a.sharding_of(i)->spec(), *l.spec) << l.path;
      EXPECT_EQ(matched[i]->spec(), *l.spec) << l.path;
    }
    // Spot checks against the table, by hand.
    EXPECT_EQ(*report.find("layers/10/experts/4/w_in")->spec, P(nullptr, "y"));
    EXPECT_EQ(*report.find("layers/3/experts/4/w_in")->spec, P("x"));
    EXPECT_EQ(*report.find("layers/3/experts/2/w_out")->spec, P("y"));
    EXPECT_EQ(*report.find("layers/5/norm_b")->spec, P("x"));
    EXPECT_EQ(report.find("layers/7/experts/3/w_in")->shard_shape, Shape({6, 32}));
    const auto paths = data.paths();
    const auto at = std::find(paths.begin(), paths.end(), "layers/11/experts/0/w_in");
    ASSERT_NE(at, paths.end());
    EXPECT_EQ(a.sharding_of(static_cast<std::size_t>(at - paths.begin()))->spec(), P(nullptr, "y"));
  }
}

TEST(MeshShardingHelper, SubtreeReuseStillReportsErrorsOfTheFirstSubtree) {
  std::vector<Data> experts(3, Data::dict({{"w", TensorSpec{Shape{6, 8}, DType::kF32}}}));
  const Data data = Data::dict({{"experts", Data::list(experts)}});
  const auto rule = std::make_shared<TreePathShardingRule>(
      std::vector<TreePathShardingRule::Entry>{{"w$", P("x")}});
  EXPECT_THROW_WITH(
      MeshShardingHelper(Mesh::parse("x:4", 4)).resolve(RuleTree(RulePtr(rule)), data), SpecError,
      "'experts/0/w'", "[6, 8]", "'x'");
}

/// A user's rule, written here against the public interface only: records the (relative) paths
/// it is shown, shards dim 1 over "y" for "w_out" leaves, reports "w_in" as a catch-all decision,
/// and rejects anything named "bad".
class RecordingRule : public ShardingRule {
 public:
  RuleDecision apply(const RuleInput& in) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.emplace_back(in.path);
    }
    if (in.path.find("bad") != std::string_view::npos) {
      throw RuleError("[rule] RecordingRule cannot decide '" + std::string(in.path) + "'");
    }
    RuleDecision d;
    if (in.path.ends_with("w_out")) {
      d.spec = P(nullptr, "y");
      d.entry = 0;
    } else {
      d.entry = 1;
      d.fell_through = true;
      d.reason = "catch-all";
    }
    return d;
  }
  std::string name() const override { return "RecordingRule"; }
  std::vector<std::string> entry_labels() const override { return {"w_out", "*"}; }
  std::vector<std::string> seen() const {
    std::lock_guard<std::mutex> lock(mu_);
    auto out = seen_;
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  mutable std::mutex mu_;
  mutable std::vector<std::string> seen_;
};

TEST(MeshShardingHelper, UserRuleAppliedToAListSeesPathsRelativeToIt) {
  auto rule = std::make_shared<RecordingRule>();
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params", RuleTree::dict({{"embed", P("x")}, {"h", RulePtr(rule)}})},
      {"opt_state", Unspecified{}},
  });
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  EXPECT_EQ(rule->seen(), (std::vector<std::string>{"0/w_in", "0/w_out", "1/w_in", "1/w_out"}));
  const LeafPlan* w_out = report.find("params/h/1/w_out");
  ASSERT_NE(w_out, nullptr);
  ASSERT_TRUE(w_out->spec.has_value());
  EXPECT_EQ(*w_out->spec, P(nullptr, "y"));
  EXPECT_EQ(w_out->shard_shape, Shape({256, 32}));
  EXPECT_EQ(report.rule_of(*w_out).rule_path, "params/h");
  EXPECT_EQ(report.rule_of(*w_out).rule, "RecordingRule");
  EXPECT_EQ(report.find("params/embed")->shard_shape, Shape({256, 64}));
  EXPECT_EQ(report.rule_of(*report.find("params/embed")).rule_path, "params/embed");
}

TEST(MeshShardingHelper, FellThroughLeavesAreReported) {
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params", RuleTree::dict(
                     {{"embed", Replicated{}}, {"h", RulePtr(std::make_shared<RecordingRule>())}})},
      {"opt_state", Replicated{}},
  });
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  std::vector<std::string> fell;
  for (auto i : report.fell_through()) fell.push_back(report.leaves[i].path);
  EXPECT_EQ(fell, (std::vector<std::string>{"params/h/0/w_in", "params/h/1/w_in"}));
  EXPECT_EQ(report.reason_of(*report.find("params/h/0/w_in")), "catch-all");
  const auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["fell_through"], (nlohmann::json{"params/h/0/w_in", "params/h/1/w_in"}));
  EXPECT_THAT(report.table(), ::testing::HasSubstr("fell through to a default or catch-all: 2"));
}

TEST(MeshShardingHelper, ErrorFromARuleDeepInTheTreeNamesLeafRuleIndexAndName) {
  const Data data = Data::dict(
      {{"a", bf16({4})}, {"m", Data::dict({{"bad", bf16({8, 8})}, {"w_out", bf16({8, 8})}})}});
  const RuleTree rules =
      RuleTree::dict({{"a", Replicated{}}, {"m", RulePtr(std::make_shared<RecordingRule>())}});
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).plan(rules, data), RuleError, "'m/bad'", "rule 1",
                    "RecordingRule", "at 'm'");
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).match(rules, data), RuleError, "'m/bad'",
                    "RecordingRule");
}

TEST(MeshShardingHelper, SpecFromARuleIsValidatedAgainstTheLeaf) {
  const Data data = Data::dict({{"w_out", bf16({8, 6})}});
  EXPECT_THROW_WITH(MeshShardingHelper(Mesh::parse("x:2,y:4", 8))
                        .plan(RuleTree(RulePtr(std::make_shared<RecordingRule>())), data),
                    SpecError, "'w_out'", "[8, 6]", "dim 1", "'y' (size 4)");
  EXPECT_THROW_WITH(MeshShardingHelper(Mesh::parse("x:8", 8))
                        .plan(RuleTree(RulePtr(std::make_shared<RecordingRule>())), data),
                    SpecError, "'y'", "w_out");
}

TEST(MeshShardingHelper, ExplainRejectsPathsThatAreNotLeaves) {
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params", RuleTree::dict({{"embed", P("x")}, {"h", RuleTree::list({P("x"), P("y")})}})},
      {"opt_state", Replicated{}},
  });
  const MeshShardingHelper helper(xy_mesh());
  EXPECT_THROW_WITH(helper.explain(rules, small_model(), "params/h/1x/w_in"), TreeError,
                    "'params/h/1x/w_in'");
  EXPECT_THROW_WITH(helper.explain(rules, small_model(), "params/h"), TreeError, "'params/h'",
                    "not a leaf");
  EXPECT_THROW_WITH(helper.explain(rules, small_model(), "params/h/1"), TreeError, "'params/h/1'",
                    "not a leaf");
  const auto steps = helper.explain(rules, small_model(), "params/h/1/w_in");
  ASSERT_FALSE(steps.empty());
  // Rule leaves in flatten order: opt_state (0), params/embed (1), params/h/0 (2), params/h/1 (3).
  EXPECT_EQ(steps.back().rule_index, 3);
}

TEST(MeshShardingHelper, NullRulePointerIsAnErrorNamingTheRule) {
  const RuleTree rules = RuleTree::dict({{"a", RulePtr()}});
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).plan(rules, Data::dict({{"a", bf16({4})}})),
                    RuleError, "null rule", "at 'a'");
}

TEST(MeshShardingHelper, MatchGivesNamedShardingsOnTheHelpersMesh) {
  const Mesh mesh = Mesh::parse("x:2,y:4", 8);
  const RuleTree rules =
      RuleTree::dict({{"step", Replicated{}}, {"params", P("x")}, {"opt_state", P(nullptr, "y")}});
  const auto shardings = MeshShardingHelper(mesh).match(rules, small_model());
  shardings.for_each_leaf([&](const std::string& path, const MaybeSharding& s) {
    ASSERT_TRUE(s.has_value()) << path;
    EXPECT_EQ(s->mesh(), mesh) << path;
  });
  EXPECT_EQ(*shardings.at_path("params/h/0/w_in").leaf(), NamedSharding(mesh, P("x")));
  EXPECT_EQ(*shardings.at_path("step").leaf(), NamedSharding(mesh, P()));
}

TEST(MeshShardingHelper, PlanTotalsUpToInt64MaxAreExactAndBeyondNameTheTensor) {
  const RuleTree rules = Replicated{};
  constexpr std::int64_t k62 = 4611686018427387904;  // 2^62
  // 2^62 + (2^62 - 1) = INT64_MAX: fits exactly.
  const Data fits = Data::dict(
      {{"a", TensorSpec{Shape{k62}, DType::kU8}}, {"b", TensorSpec{Shape{k62 - 1}, DType::kU8}}});
  const PlanReport r = MeshShardingHelper(xy_mesh()).plan(rules, fits);
  EXPECT_EQ(r.total_bytes, std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(r.max_device_bytes(), std::numeric_limits<std::int64_t>::max());
  // 2^62 + 2^62 does not.
  const Data over = Data::dict(
      {{"a", TensorSpec{Shape{k62}, DType::kU8}}, {"b", TensorSpec{Shape{k62}, DType::kU8}}});
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).plan(rules, over), SpecError,
                    "total bytes overflow int64 at 'b'", "u8[4611686018427387904]");
}

TEST(MeshShardingHelper, PlanNamesTheLeafWhoseBytesOverflow) {
  TensorSpec t;  // fields assigned after construction escape the constructor's check
  t.shape = Shape{2305843009213693952};
  t.dtype = DType::kF32;
  const Data data = Data::dict({{"params", Data::dict({{"w", t}})}});
  EXPECT_THROW_WITH(MeshShardingHelper(xy_mesh()).plan(RuleTree(Replicated{}), data), SpecError,
                    "[plan] 'params/w'", "byte size of f32[2305843009213693952]");
}

/// Not derived from std::exception, as a user's own error type may be.
struct NotAStdException {
  int code;
};

/// A user's rule that throws `make()` from apply() (and so from the default explain()).
template <class Make>
class ThrowingRule : public ShardingRule {
 public:
  explicit ThrowingRule(Make make) : make_(make) {}
  RuleDecision apply(const RuleInput&) const override { throw make_(); }
  std::string name() const override { return "ThrowingRule"; }

 private:
  Make make_;
};

/// Runs `stmt`, expecting a RuleError naming the leaf and `rule`, with an `Original` nested.
template <class Original, class F>
void expect_wrapped(F stmt, const std::string& rule, const std::string& what) {
  try {
    stmt();
    ADD_FAILURE() << "expected a RuleError";
  } catch (const RuleError& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("'params/w'"));
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr(rule));
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr(what));
    // Follow the nesting (a policy's RuleError nests the original, the planner's nests that)
    // down to the innermost exception: the original, of its own type.
    std::exception_ptr inner;
    try {
      std::rethrow_if_nested(e);
    } catch (...) {
      inner = std::current_exception();
    }
    ASSERT_TRUE(inner) << "nothing nested in: " << e.what();
    while (true) {
      try {
        std::rethrow_exception(inner);
      } catch (const std::nested_exception& n) {
        if (!n.nested_ptr()) break;
        inner = n.nested_ptr();
        continue;
      } catch (...) {
      }
      break;
    }
    try {
      std::rethrow_exception(inner);
    } catch (const Original&) {
    } catch (...) {
      ADD_FAILURE() << "another type nested in: " << e.what();
    }
  }
}

template <class Original, class Make>
void expect_every_call_wraps(Make make, const std::string& what) {
  const Data data = Data::dict({{"params", Data::dict({{"w", bf16({4, 2})}})}});
  const RuleTree rules =
      RuleTree::dict({{"params", RulePtr(std::make_shared<ThrowingRule<Make>>(make))}});
  const MeshShardingHelper helper(xy_mesh());
  expect_wrapped<Original>([&] { (void)helper.plan(rules, data); }, "ThrowingRule", what);
  expect_wrapped<Original>([&] { (void)helper.match(rules, data); }, "ThrowingRule", what);
  expect_wrapped<Original>([&] { (void)helper.resolve(rules, data); }, "ThrowingRule", what);
  expect_wrapped<Original>([&] { (void)helper.explain(rules, data, "params/w"); }, "ThrowingRule",
                           what);
  // The same through a PolicyShardingRule, whose label is named too.
  const RuleTree policy = RuleTree::dict(
      {{"params",
        RulePtr(std::make_shared<PolicyShardingRule>(
            [make](std::string_view, const TensorSpec&) -> PartitionSpec { throw make(); },
            "my_policy"))}});
  expect_wrapped<Original>([&] { (void)helper.plan(policy, data); }, "my_policy", what);
  expect_wrapped<Original>([&] { (void)helper.resolve(policy, data); }, "my_policy", what);
  expect_wrapped<Original>([&] { (void)helper.explain(policy, data, "params/w"); }, "my_policy",
                           what);
}

TEST(MeshShardingHelper, ExceptionsOfAnyTypeFromARuleAreWrappedWithTheOriginalNested) {
  expect_every_call_wraps<std::runtime_error>([] { return std::runtime_error("disk on fire"); },
                                              "disk on fire");
  expect_every_call_wraps<int>([] { return 42; }, "not a std::exception");
  expect_every_call_wraps<NotAStdException>([] { return NotAStdException{7}; },
                                            "not a std::exception");
  // A RuleError of the user's own keeps its text, now with the leaf and the rule.
  expect_every_call_wraps<RuleError>([] { return RuleError("[mine] no way"); }, "[mine] no way");
}

}  // namespace
}  // namespace shardplan
