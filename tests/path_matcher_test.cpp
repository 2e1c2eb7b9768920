// The DFA path matcher against Boost.Regex: both must pick the same first matching pattern.
#include "../rules/src/path_matcher.hpp"

#include <boost/regex.hpp>
#include <random>

#include "test_util.hpp"

namespace shardplan::detail {
namespace {

int boost_first(const std::vector<boost::regex>& rs, const std::string& path) {
  for (std::size_t i = 0; i < rs.size(); ++i) {
    if (boost::regex_search(path, rs[i])) return static_cast<int>(i);
  }
  return -1;
}

std::vector<std::string> random_paths(std::size_t n, std::uint32_t seed) {
  static const std::vector<std::string> segments = {"model",     "layers",  "0",
                                                    "1",         "17",      "255",
                                                    "mlp",       "experts", "self_attn",
                                                    "q_proj",    "k_proj",  "v_proj",
                                                    "o_proj",    "up_proj", "down_proj",
                                                    "gate_proj", "weight",  "weight_scale_inv",
                                                    "bias",      "kernel",  "embed_tokens",
                                                    "lm_head",   "norm",    "input_layernorm",
                                                    "a",         "b",       "c",
                                                    "ab",        "",        "x y",
                                                    "a.b",       "c-d",     "w$",
                                                    "(x)",       "[1]",     "q+",
                                                    "Z9_"};
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) {
    std::string p;
    const int parts = static_cast<int>(rng() % 7);
    for (int k = 0; k < parts; ++k) {
      if (k) p += '/';
      if (rng() % 5 == 0) {
        const int len = static_cast<int>(rng() % 4);
        for (int j = 0; j < len; ++j) p += static_cast<char>(0x20 + rng() % 95);
      } else {
        p += segments[rng() % segments.size()];
      }
    }
    out.push_back(p);
  }
  return out;
}

void expect_agrees(const std::vector<std::string>& patterns, std::uint32_t seed) {
  const auto m = PathMatcher::compile(patterns);
  ASSERT_TRUE(m.has_value()) << patterns.front();
  std::vector<boost::regex> rs;
  for (const auto& p : patterns) rs.emplace_back(p, boost::regex::perl);
  for (const std::string& path : random_paths(3000, seed)) {
    ASSERT_EQ(m->first_match(path), boost_first(rs, path)) << "path '" << path << "'";
  }
}

TEST(PathMatcher, AgreesWithBoostOnRealRuleTables) {
  expect_agrees({"embed_tokens/weight$", "self_attn/(q|k|v)_proj/weight$",
                 "self_attn/o_proj/weight$", "mlp/(gate|up)_proj/weight$", "mlp/down_proj/weight$",
                 "lm_head/weight$", "norm/weight$", ".*"},
                1);
  expect_agrees({"mlp/experts/[0-9]+/(gate|up)_proj/weight$", "weight_scale_inv$",
                 "^model/norm/weight$", "layers/1[0-9]/", "(input|post_attention)_layernorm"},
                2);
}

TEST(PathMatcher, AgreesWithBoostOnAPatternZoo) {
  const std::vector<std::string> zoo = {"a",
                                        "ab|c",
                                        "^a",
                                        "b$",
                                        "^$",
                                        "a*",
                                        "(ab)+",
                                        "a{2}",
                                        "a{1,3}b",
                                        "[a-c]+/",
                                        "[^a-z]",
                                        "\\d+",
                                        "\\D",
                                        "\\w+\\s",
                                        "\\W",
                                        "\\S$",
                                        "x\\.y|a\\.b",
                                        "\\(x\\)",
                                        "\\[1\\]",
                                        "q\\+",
                                        "w\\$",
                                        "(?:ab|b)c",
                                        "a.?b",
                                        "a+?",
                                        ".*/weight",
                                        "(^|/)b$",
                                        "^(a|b)*$",
                                        "[]a]",
                                        "[a-]",
                                        "[\\d_]+",
                                        "c-d",
                                        "x y",
                                        "a{0,2}?c",
                                        "$^",
                                        "(a|)+b",
                                        "((a*)*)*",
                                        "[\\x41-\\x5a]",
                                        "^.{3}$",
                                        "o_proj|k_proj",
                                        "Z9_"};
  for (std::size_t i = 0; i < zoo.size(); ++i) {
    expect_agrees({zoo[i]}, static_cast<std::uint32_t>(10 + i));
  }
  // And all of them at once: the first of the table that matches.
  expect_agrees(zoo, 99);
}

TEST(PathMatcher, DeclinesSyntaxOutsideTheSubset) {
  for (const char* p : {"(a)\\1", "(?=a)", "(?!a)", "(?<=a)b", "\\bword", "(?i)abc", "[[:alpha:]]",
                        "a++", "\\p{L}", "(?<name>a)", "\\A", "a)", "(a", "*a"}) {
    EXPECT_FALSE(PathMatcher::compile({p}).has_value()) << p;
  }
}

TEST(PathMatcher, LeavesNonPrintableTextToBoost) {
  const auto m = PathMatcher::compile({"a"});
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->first_match(std::string("a\nb")), -2);
  EXPECT_EQ(m->first_match("caf\xc3\xa9"), -2);
  EXPECT_EQ(m->first_match("ba"), 0);
}

TEST(PathMatcher, ScanCanResumeFromAPrefixState) {
  const auto m = PathMatcher::compile({"layers/1[0-9]/mlp", "mlp/up$"});
  ASSERT_TRUE(m.has_value());
  const auto s = m->scan(m->start(), "model/layers/12/");
  EXPECT_EQ(m->first_match(m->scan(s, "mlp/up")), 0);
  const auto t = m->scan(m->start(), "model/layers/3/");
  EXPECT_EQ(m->first_match(m->scan(t, "mlp/up")), 1);
  EXPECT_EQ(m->first_match(m->scan(t, "attn")), -1);
}

}  // namespace
}  // namespace shardplan::detail
