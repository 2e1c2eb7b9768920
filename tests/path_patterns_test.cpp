// PathPatterns: the rule tables' pattern dialect for code that selects leaves by path (the
// optimizer's weight-decay mask). The dialect itself is tested in path_matcher_test.cpp and
// python_re_test.cpp.
#include "shardplan/rules/path_patterns.hpp"

#include "test_util.hpp"

namespace shardplan {
namespace {

TEST(PathPatterns, FirstPatternFoundWins) {
  const PathPatterns p({"^embed", "(?<=mlp/)up", "up"});
  EXPECT_EQ(p.size(), 3u);
  EXPECT_EQ(p.first_match("mlp/up/w"), 1);
  EXPECT_EQ(p.first_match("attn/up"), 2);
  EXPECT_EQ(p.first_match("embed/up"), 0);
  EXPECT_EQ(p.first_match("norm/scale"), -1);
  const PathPatterns copy = p;
  EXPECT_EQ(copy.first_match("mlp/up/w"), 1);
}

TEST(PathPatterns, BadPatternNamesItsIndexAndPosition) {
  try {
    const PathPatterns p({"ok", "a(b"});
    ADD_FAILURE() << "no PathPatternError";
  } catch (const PathPatternError& e) {
    EXPECT_EQ(e.index(), 1u);
    EXPECT_EQ(e.position(), 1u);
    EXPECT_FALSE(e.reason().empty());
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("pattern 1 'a(b'"));
  }
}

TEST(PathPatterns, GivingUpOnTheEmptyPathIsABudgetError) {
  std::string slow;  // 2^26 ways to match the empty groups, then a lookahead that never passes
  for (int k = 0; k < 26; ++k) slow += "(?:|)";
  slow += "(?!)";
  try {
    const PathPatterns p({"ok", slow});
    ADD_FAILURE() << "no PathPatternBudgetError";
  } catch (const PathPatternBudgetError& e) {
    EXPECT_EQ(e.index(), 1u);
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("backtracking steps"));
  }
}

}  // namespace
}  // namespace shardplan
