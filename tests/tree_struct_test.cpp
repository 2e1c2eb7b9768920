// SHARDPLAN_TREE_STRUCT: user structs as trees.
#include "shardplan/tree_struct.hpp"

#include "shardplan/error.hpp"
#include "shardplan/tree.hpp"
#include "test_util.hpp"

namespace shardplan {

struct TrainState {
  int step = 0;
  Tree<int> params;
  Tree<int> opt_state;
};
SHARDPLAN_TREE_STRUCT(TrainState, step, params, opt_state)

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

}  // namespace
}  // namespace shardplan
