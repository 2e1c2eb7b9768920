#include "shardplan/tree.hpp"

#include <gtest/gtest.h>

#include "shardplan/tree_struct.hpp"

namespace shardplan {
namespace {
TEST(Tree, FlattenOrderIsSortedKeysThenIndices) {
  auto t = Tree<int>::dict({{"w", 1}, {"layers", Tree<int>::list({2, 3})}});
  auto flat = t.flatten();
  ASSERT_EQ(flat.size(), 3u);
  EXPECT_EQ(flat[0].first, "layers/0");
  EXPECT_EQ(flat[1].first, "layers/1");
  EXPECT_EQ(flat[2].first, "w");
}
}  // namespace
}  // namespace shardplan
