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

TEST(Tree, NestedInitializerListsBuildDictsOfListsOfDicts) {
  const auto t = IntTree::dict(
      {{"h", IntTree::list({IntTree::dict({{"w", 1}}), IntTree::dict({{"w", 2}, {"b", 3}})})},
       {"emb", 0}});
  EXPECT_EQ(t.paths(), (std::vector<std::string>{"emb", "h/0/w", "h/1/b", "h/1/w"}));
  EXPECT_EQ(t.leaves(), (std::vector<int>{0, 1, 3, 2}));
  EXPECT_EQ(t.at("h").at(1).at("b").leaf(), 3);
  EXPECT_TRUE(t.at("h").is_list());
  EXPECT_EQ(t.num_leaves(), 4u);
}

TEST(Tree, EmptyDictAndListHoldNoLeaves) {
  const auto t = IntTree::dict({{"a", IntTree::dict({})}, {"b", IntTree::list({})}});
  EXPECT_TRUE(t.flatten().empty());
  EXPECT_TRUE(t.at("a").is_dict());
  EXPECT_TRUE(t.at("b").is_list());
  EXPECT_FALSE(
      t.same_structure(IntTree::dict({{"a", IntTree::list({})}, {"b", IntTree::list({})}})));
}

TEST(Tree, LeafAccessOnANonLeafNamesTheKind) {
  EXPECT_THROW_WITH(sample().leaf(), TreeError, "dict", "not a leaf");
  EXPECT_THROW_WITH(IntTree::none().leaf(), TreeError, "none");
}

TEST(Tree, AtPathRejectsHugeAndNonNumericListIndices) {
  EXPECT_THROW_WITH(sample().at_path("layers/99999999999999999999999"), TreeError,
                    "99999999999999999999999", "size 2");
  EXPECT_THROW_WITH(sample().at_path("layers/x"), TreeError, "'x'", "layers/x");
  EXPECT_THROW_WITH(sample().at_path("layers/-1"), TreeError, "'-1'");
}

TEST(Tree, AtWithMissingKeyListsTheKeysPresent) {
  EXPECT_THROW_WITH(sample().at("q"), TreeError, "'q'", "'b'", "'layers'", "'w'");
  EXPECT_THROW_WITH(sample().at(9), TreeError, "9", "size 3");
}

TEST(Tree, MapWithPathSeesEscapedKeysAndPrefix) {
  const auto t = IntTree::dict({{"a/b", IntTree::list({1})}, {"c", 2}});
  const auto paths = t.map_with_path([](const std::string& p, int) { return p; }, "root");
  EXPECT_EQ(paths.leaves(), (std::vector<std::string>{"root/a~1b/0", "root/c"}));
  // The escaped path leads back to the leaf.
  EXPECT_EQ(t.at_path(t.paths()[0]).leaf(), 1);
}

TEST(Tree, UnflattenToAnotherTypeKeepsStructureAndOrder) {
  const auto t = sample();
  const auto s = t.unflatten(std::vector<std::string>{"x", "y", "z"});
  EXPECT_TRUE(s.same_structure(t));
  EXPECT_EQ(s.at_path("layers/0").leaf(), "x");
  EXPECT_EQ(s.at_path("w").leaf(), "z");
  EXPECT_TRUE(s.at("b").is_none());
}

TEST(Tree, SameStructureComparesKindsAndListLengths) {
  EXPECT_FALSE(IntTree::list({1, 2}).same_structure(IntTree::list({1})));
  EXPECT_FALSE(IntTree::list({1}).same_structure(IntTree::dict({{"0", 1}})));
  EXPECT_FALSE(IntTree(1).same_structure(IntTree::none()));
  EXPECT_TRUE(IntTree::none().same_structure(Tree<double>::none()));
}

TEST(Tree, EqualityComparesLeafValues) {
  EXPECT_EQ(sample(), sample());
  EXPECT_NE(sample(), sample().map([](int x) { return x + 1; }));
}

TEST(Tree, PrefixLeafOrNoneCoversAnySubtree) {
  const auto full = IntTree::dict({{"a", IntTree::dict({{"x", 1}})}, {"b", IntTree::list({2})}});
  EXPECT_EQ(prefix_mismatch(Tree<char>('r'), full), "");
  EXPECT_EQ(prefix_mismatch(Tree<char>::dict({{"a", Tree<char>::none()}, {"b", 'r'}}), full), "");
}

TEST(Tree, PrefixMismatchNamesTheDeepestDifferingPath) {
  const auto full =
      IntTree::dict({{"a", IntTree::dict({{"b", IntTree::dict({{"x", 1}, {"y", 2}})}})}, {"c", 3}});
  const auto bad = Tree<char>::dict(
      {{"a", Tree<char>::dict({{"b", Tree<char>::dict({{"x", 'r'}, {"z", 'r'}})}})}, {"c", 'r'}});
  const std::string m = prefix_mismatch(bad, full);
  EXPECT_THAT(m, ::testing::HasSubstr("'a/b'"));
  EXPECT_THAT(m, ::testing::HasSubstr("keys [x, z]"));
  EXPECT_THAT(m, ::testing::HasSubstr("keys [x, y]"));
  EXPECT_THROW_WITH(
      (map_prefix<int>(bad, full,
                       [](const std::string&, const char*, const IntTree& t) { return t; })),
      TreeError, "not a prefix", "'a/b'", "keys [x, z]", "keys [x, y]");
}

TEST(Tree, PrefixMismatchNamesListLengths) {
  const auto full = IntTree::dict({{"h", IntTree::list({1, 2, 3})}});
  const auto bad = Tree<char>::dict({{"h", Tree<char>::list({'r', 'r'})}});
  const std::string m = prefix_mismatch(bad, full);
  EXPECT_THAT(m, ::testing::HasSubstr("'h'"));
  EXPECT_THAT(m, ::testing::HasSubstr("list of length 2"));
  EXPECT_THAT(m, ::testing::HasSubstr("list of length 3"));
}

TEST(Tree, PrefixMismatchAtTheRootSaysSo) {
  EXPECT_THAT(prefix_mismatch(Tree<char>::list({'r'}), IntTree::dict({{"a", 1}})),
              ::testing::HasSubstr("the root"));
}

TEST(Tree, MapPrefixGivesEachPrefixLeafItsSubtreeAndPath) {
  const auto full = IntTree::dict(
      {{"h", IntTree::list({IntTree::dict({{"w", 1}}), IntTree::dict({{"w", 2}})})}, {"e", 5}});
  const auto prefix =
      Tree<char>::dict({{"h", Tree<char>::list({'a', Tree<char>::none()})}, {"e", 'b'}});
  std::vector<std::string> seen;
  const auto out = map_prefix<int>(
      prefix, full, [&](const std::string& path, const char* p, const IntTree& sub) {
        seen.push_back(path + "=" + (p ? std::string(1, *p) : std::string("none")));
        return sub.map([&](int x) { return p ? x * 10 : -x; });
      });
  EXPECT_EQ(seen, (std::vector<std::string>{"e=b", "h/0=a", "h/1=none"}));
  EXPECT_TRUE(out.same_structure(full));
  EXPECT_EQ(out.flatten(),
            (std::vector<std::pair<std::string, int>>{{"e", 50}, {"h/0/w", 10}, {"h/1/w", -2}}));
}

TEST(Tree, JoinAndSplitPathRoundTripEscapedKeys) {
  EXPECT_EQ(join_path("", "a"), "a");
  EXPECT_EQ(join_path("a", escape_key("b/c")), "a/b~1c");
  EXPECT_EQ(split_path(""), std::vector<std::string>{});
  EXPECT_EQ(split_path(join_path("a", escape_key("b/c"))), (std::vector<std::string>{"a", "b/c"}));
  EXPECT_THROW_WITH(split_path("a/b~"), TreeError, "b~");
}

TEST(Tree, CopiesShareBranchesUntilOneIsChanged) {
  IntTree a = sample();
  IntTree b = a;
  EXPECT_TRUE(a.shares_branch_with(b));
  b.children()[1].children()[0] = IntTree(20);  // layers/0 of the copy only
  EXPECT_FALSE(a.shares_branch_with(b));
  EXPECT_EQ(a.at_path("layers/0").leaf(), 2);
  EXPECT_EQ(b.at_path("layers/0").leaf(), 20);
  EXPECT_EQ(b.at_path("layers/1").leaf(), 3);
  EXPECT_NE(a, b);
}

TEST(Tree, LeavesAndNoneNeverShareABranch) {
  const IntTree leaf(1);
  const IntTree none;
  EXPECT_FALSE(leaf.shares_branch_with(leaf));
  EXPECT_FALSE(none.shares_branch_with(none));
}

TEST(Tree, ShareEqualSubtreesMergesEqualSubtreesOnly) {
  auto block = [](int w, int b) { return IntTree::dict({{"w", w}, {"b", b}}); };
  const IntTree t = IntTree::dict({
      {"layers", IntTree::list({block(1, 2), block(1, 2), block(1, 3), block(1, 2)})},
      {"other", IntTree::dict({{"w", 1}, {"b", 2}})},  // equal to layers/0, elsewhere
      {"as_list", IntTree::list({2, 1})},              // same leaves, another kind
      {"empty_dict", IntTree::dict({})},
      {"empty_list", IntTree::list({})},
  });
  const IntTree s = t.share_equal_subtrees();
  EXPECT_EQ(s, t);
  EXPECT_EQ(s.flatten(), t.flatten());
  const auto& layers = s.at("layers").children();
  EXPECT_TRUE(layers[0].shares_branch_with(layers[1]));
  EXPECT_TRUE(layers[0].shares_branch_with(layers[3]));
  EXPECT_FALSE(layers[0].shares_branch_with(layers[2]));  // b differs
  EXPECT_TRUE(layers[0].shares_branch_with(s.at("other")));
  EXPECT_FALSE(s.at("as_list").shares_branch_with(layers[0]));
  EXPECT_FALSE(s.at("empty_dict").shares_branch_with(s.at("empty_list")));
  // The source tree is left as it was: nothing in it was merged.
  EXPECT_FALSE(t.at("layers").children()[0].shares_branch_with(t.at("layers").children()[1]));
}

TEST(Tree, ChangingAMergedSubtreeLeavesItsTwinsAlone) {
  const IntTree t = IntTree::list({IntTree::dict({{"w", 1}}), IntTree::dict({{"w", 1}})});
  IntTree s = t.share_equal_subtrees();
  ASSERT_TRUE(s.children()[0].shares_branch_with(s.children()[1]));
  s.children()[1].children()[0] = IntTree(5);
  EXPECT_EQ(s.at_path("0/w").leaf(), 1);
  EXPECT_EQ(s.at_path("1/w").leaf(), 5);
}

TEST(Tree, ShareEqualSubtreesUsesTheGivenLeafHash) {
  // A hash that sends every leaf to one bucket still gives a correct result (equality decides).
  const IntTree t =
      IntTree::list({IntTree::list({1, 2}), IntTree::list({2, 1}), IntTree::list({1, 2})});
  const IntTree s = t.share_equal_subtrees([](int) { return std::size_t{7}; });
  EXPECT_EQ(s, t);
  EXPECT_TRUE(s.children()[0].shares_branch_with(s.children()[2]));
  EXPECT_FALSE(s.children()[0].shares_branch_with(s.children()[1]));
}

TEST(Tree, TensorSpecsHashByShapeDtypeAndAxes) {
  const std::hash<TensorSpec> h;
  const TensorSpec a{Shape{4, 8}, DType::kBF16};
  EXPECT_EQ(h(a), h(TensorSpec{Shape{4, 8}, DType::kBF16}));
  EXPECT_NE(h(a), h(TensorSpec{Shape{8, 4}, DType::kBF16}));
  EXPECT_NE(h(a), h(TensorSpec{Shape{4, 8}, DType::kF32}));
  EXPECT_NE(h(a), h(TensorSpec{Shape{4, 8}, DType::kBF16, {"embed", "mlp"}}));
}

TEST(Tree, NodeKindPrints) {
  std::ostringstream os;
  os << NodeKind::kList << " " << IntTree::none();
  EXPECT_EQ(os.str(), "list None");
}

}  // namespace
}  // namespace shardplan
