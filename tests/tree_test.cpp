#include "shardplan/tree.hpp"

#include <sstream>

#include "shardplan/error.hpp"
#include "shardplan/tensor_spec.hpp"
#include "test_util.hpp"

namespace shardplan {

namespace {

using IntTree = Tree<int>;

IntTree sample() {
  return IntTree::dict({{"w", 1}, {"layers", IntTree::list({2, 3})}, {"b", IntTree::none()}});
}

TEST(Tree, FlattenOrderIsSortedKeysThenIndices) {
  auto t = IntTree::dict({{"w", 1}, {"layers", IntTree::list({2, 3})}});
  auto flat = t.flatten();
  ASSERT_EQ(flat.size(), 3u);
  EXPECT_EQ(flat[0], (std::pair<std::string, int>{"layers/0", 2}));
  EXPECT_EQ(flat[1], (std::pair<std::string, int>{"layers/1", 3}));
  EXPECT_EQ(flat[2], (std::pair<std::string, int>{"w", 1}));
}

TEST(Tree, ListIndicesFlattenNumericallyNotAsText) {
  std::vector<IntTree> items;
  for (int i = 0; i < 12; ++i) items.emplace_back(i);
  const auto paths = IntTree::list(items).paths();
  EXPECT_EQ(paths[2], "2");
  EXPECT_EQ(paths[10], "10");
  EXPECT_EQ(IntTree::list(items).leaves()[11], 11);
}

TEST(Tree, NoneNodesHaveNoLeaves) {
  EXPECT_EQ(sample().num_leaves(), 3u);
  EXPECT_TRUE(sample().at("b").is_none());
}

TEST(Tree, DuplicateKeyIsAnError) {
  EXPECT_THROW_WITH(IntTree::dict({{"a", 1}, {"a", 2}}), TreeError, "duplicate", "'a'");
}

TEST(Tree, KeysHoldingSlashAreEscaped) {
  auto t = IntTree::dict({{"a/b", 1}, {"c~d", 2}});
  EXPECT_EQ(t.paths(), (std::vector<std::string>{"a~1b", "c~0d"}));
  EXPECT_EQ(t.at_path("a~1b").leaf(), 1);
  EXPECT_EQ(escape_key("x/~"), "x~1~0");
  EXPECT_EQ(unescape_key("x~1~0"), "x/~");
  EXPECT_EQ(split_path("a~1b/0/c"), (std::vector<std::string>{"a/b", "0", "c"}));
}

TEST(Tree, BadEscapeIsAnError) { EXPECT_THROW_WITH(unescape_key("a~2"), TreeError, "a~2"); }

TEST(Tree, AtPathFindsNestedLeavesAndNamesMissingKeys) {
  EXPECT_EQ(sample().at_path("layers/1").leaf(), 3);
  EXPECT_THROW_WITH(sample().at_path("layers/7"), TreeError, "7");
  EXPECT_THROW_WITH(sample().at_path("nope"), TreeError, "'nope'");
}

TEST(Tree, MapKeepsStructure) {
  auto doubled = sample().map([](int x) { return 2 * x; });
  EXPECT_EQ(doubled.leaves(), (std::vector<int>{4, 6, 2}));
  EXPECT_TRUE(doubled.same_structure(sample()));
}

TEST(Tree, MapWithPathSeesFullPaths) {
  auto t = sample().map_with_path([](const std::string& p, int) { return p; });
  EXPECT_EQ(t.leaves(), (std::vector<std::string>{"layers/0", "layers/1", "w"}));
}

TEST(Tree, UnflattenRoundTripsAndChecksCount) {
  const auto t = sample();
  EXPECT_EQ(t.unflatten(t.leaves()), t);
  EXPECT_THROW_WITH(t.unflatten(std::vector<int>{1, 2}), TreeError, "3", "2");
}

TEST(Tree, SameStructureIgnoresLeafValuesButNotKeys) {
  EXPECT_TRUE(sample().same_structure(sample().map([](int) { return 0.5; })));
  EXPECT_FALSE(sample().same_structure(IntTree::dict({{"w", 1}})));
}

TEST(Tree, PrefixMismatchNamesThePathAndBothSides) {
  const auto full = IntTree::dict({{"a", IntTree::dict({{"x", 1}, {"y", 2}})}, {"b", 3}});
  const auto ok = Tree<char>::dict({{"a", 'r'}, {"b", 'r'}});
  EXPECT_EQ(prefix_mismatch(ok, full), "");
  const auto bad =
      Tree<char>::dict({{"a", Tree<char>::dict({{"x", 'r'}, {"z", 'r'}})}, {"b", 'r'}});
  const std::string m = prefix_mismatch(bad, full);
  EXPECT_THAT(m, ::testing::HasSubstr("'a'"));
  EXPECT_THAT(m, ::testing::HasSubstr("z"));
  EXPECT_THAT(m, ::testing::HasSubstr("y"));
  const auto list_vs_dict = Tree<char>::list({'r'});
  EXPECT_THAT(prefix_mismatch(list_vs_dict, full), ::testing::HasSubstr("list"));
}

TEST(Tree, MapPrefixThrowsTreeErrorWhenNotAPrefix) {
  const auto full = IntTree::dict({{"a", 1}});
  const auto bad = Tree<char>::dict({{"q", 'r'}});
  EXPECT_THROW_WITH(
      (map_prefix<int>(bad, full,
                       [](const std::string&, const char*, const IntTree& t) { return t; })),
      TreeError, "not a prefix", "q");
}

TEST(Tree, PrintsReadably) {
  std::ostringstream os;
  os << IntTree::dict({{"a", 1}, {"b", IntTree::list({2})}});
  EXPECT_EQ(os.str(), "{a: 1, b: [2]}");
}

}  // namespace
}  // namespace shardplan
