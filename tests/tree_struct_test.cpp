// SHARDPLAN_TREE_STRUCT: user structs as trees.
#include "shardplan/tree_struct.hpp"

#include "shardplan/error.hpp"
#include "shardplan/tensor_spec.hpp"
#include "shardplan/tree.hpp"
#include "test_util.hpp"

namespace shardplan {

struct TrainState {
  int step = 0;
  Tree<int> params;
  Tree<int> opt_state;
};
SHARDPLAN_TREE_STRUCT(TrainState, step, params, opt_state)

/// The example: a TrainState of tensor specs.
struct SpecState {
  TensorSpec step;
  Tree<TensorSpec> params;
  Tree<TensorSpec> opt_state;
};
SHARDPLAN_TREE_STRUCT(SpecState, step, params, opt_state)

/// A registered struct inside another.
struct Outer {
  TrainState state;
  int extra = 0;
};
SHARDPLAN_TREE_STRUCT(Outer, state, extra)

namespace {

using IntTree = Tree<int>;

TEST(TreeStruct, RegisteredStructYieldsMemberPaths) {
  TrainState s{7, IntTree::dict({{"w", 1}}), IntTree::dict({{"mu", IntTree::dict({{"w", 0}})}})};
  const auto t = to_tree<int>(s);
  EXPECT_EQ(t.paths(), (std::vector<std::string>{"opt_state/mu/w", "params/w", "step"}));
  EXPECT_EQ(t.at_path("step").leaf(), 7);
  const auto back = from_tree<TrainState>(t);
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.params, s.params);
  EXPECT_EQ(back.opt_state, s.opt_state);
}

TEST(TreeStruct, MissingMemberIsAnErrorNamingIt) {
  const auto t = IntTree::dict({{"step", 1}, {"params", IntTree::dict({})}});
  EXPECT_THROW_WITH(from_tree<TrainState>(t), TreeError, "opt_state");
}

TEST(TreeStruct, TensorSpecTrainStateYieldsStepParamsAndOptStatePaths) {
  const TensorSpec w{Shape{8, 4}, DType::kBF16};
  const SpecState s{TensorSpec{Shape{}, DType::kI32},
                    Tree<TensorSpec>::dict({{"h", Tree<TensorSpec>::list({w, w})}}),
                    Tree<TensorSpec>::dict({{"mu", Tree<TensorSpec>::dict({{"h", w}})}})};
  const auto t = to_tree<TensorSpec>(s);
  EXPECT_EQ(t.paths(),
            (std::vector<std::string>{"opt_state/mu/h", "params/h/0", "params/h/1", "step"}));
  EXPECT_EQ(t.at_path("step").leaf().dtype, DType::kI32);
  EXPECT_EQ(t.at_path("params/h/1").leaf(), w);
}

TEST(TreeStruct, NestedRegisteredStructsNestTheirPaths) {
  const Outer o{TrainState{3, IntTree::dict({{"w", 1}}), IntTree::none()}, 9};
  const auto t = to_tree<int>(o);
  EXPECT_EQ(t.paths(), (std::vector<std::string>{"extra", "state/params/w", "state/step"}));
  const auto back = from_tree<Outer>(t);
  EXPECT_EQ(back.extra, 9);
  EXPECT_EQ(back.state.step, 3);
  EXPECT_EQ(back.state.params, o.state.params);
  EXPECT_TRUE(back.state.opt_state.is_none());
}

TEST(TreeStruct, LeafMemberGivenASubtreeIsAnErrorNamingTheMemberPath) {
  const auto t = IntTree::dict(
      {{"extra", 1},
       {"state", IntTree::dict({{"step", IntTree::list({1})}, {"params", 1}, {"opt_state", 1}})}});
  EXPECT_THROW_WITH(from_tree<Outer>(t), TreeError, "'state/step'", "list");
}

TEST(TreeStruct, NonDictTreeIsAnError) {
  EXPECT_THROW_WITH(from_tree<TrainState>(IntTree::list({1})), TreeError, "dict", "list");
}

TEST(TreeStruct, StructTreesWorkWithTreeAlgorithms) {
  const TrainState s{1, IntTree::dict({{"w", 2}}), IntTree::dict({{"w", 3}})};
  const auto doubled = to_tree<int>(s).map([](int x) { return 2 * x; });
  const auto back = from_tree<TrainState>(doubled);
  EXPECT_EQ(back.step, 2);
  EXPECT_EQ(back.params.at("w").leaf(), 4);
  EXPECT_EQ(back.opt_state.at("w").leaf(), 6);
}

}  // namespace
}  // namespace shardplan
