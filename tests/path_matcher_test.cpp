// The pattern table (rules/src/path_matcher.*, py_regex.*): hand-computed cases of Python's re
// semantics that the DFA has to model, the UTF-8 decoding, resuming from a state, the
// backtracker's bound. tests/python_re_test.cpp compares thousands of cases with python3 itself.
#include "path_matcher.hpp"

#include "test_util.hpp"

namespace shardplan::detail {
namespace {

int first(const std::vector<std::string>& patterns, std::string_view path) {
  return PatternTable(patterns).first_match(path);
}

// Each expectation was checked with python3: re.search(p, s) is not None.
TEST(PatternTable, DollarMatchesAtTheEndOrBeforeAFinalNewline) {
  EXPECT_EQ(first({"weight$"}, "a/weight"), 0);
  EXPECT_EQ(first({"weight$"}, "a/weight\n"), 0);
  EXPECT_EQ(first({"weight$"}, "a/weight\n\n"), -1);
  EXPECT_EQ(first({"weight\\Z"}, "a/weight\n"), -1);
  EXPECT_EQ(first({"(?m)weight$"}, "a/weight\nb"), 0);
  EXPECT_EQ(first({"^b"}, "a\nb"), -1);
  EXPECT_EQ(first({"(?m)^b"}, "a\nb"), 0);
  EXPECT_EQ(first({"$\n"}, "a\n"), 0);
  EXPECT_EQ(first({"$$\n$"}, "\n"), 0);
}

TEST(PatternTable, DotAndClassesAreOnCodePoints) {
  EXPECT_EQ(first({"^caf.$"}, "caf\xc3\xa9"), 0);                 // é is one character
  EXPECT_EQ(first({"^.{2}$"}, "\xf0\x9f\x98\x80x"), 0);           // so is an astral emoji
  EXPECT_EQ(first({"^[α-ω]+$"}, "\xce\xb6\xcf\x89\xce\xb7"), 0);  // ζωη
  EXPECT_EQ(first({"^[α-ω]+$"}, "\xce\xae"), -1);                 // ή is U+03AE
  EXPECT_EQ(first({"^\\w+$"}, "e\xcc\x81"), -1);                  // a combining mark is not \w
  EXPECT_EQ(first({"^\\d$"}, "\xd9\xa3"), 0);                     // Arabic-Indic three is \d
  EXPECT_EQ(first({"^\\d$"}, "\xc2\xb2"), -1);                    // superscript two is not \d
  EXPECT_EQ(first({"^\\w$"}, "\xc2\xb2"), 0);                     // but it is \w
  EXPECT_EQ(first({"(?a)^\\w$"}, "\xc3\xa9"), -1);
  EXPECT_EQ(first({"\\s"},
                  "a\xc2\xa0"
                  "b"),
            0);  // no-break space
  EXPECT_EQ(first({"a.b"}, "a\nb"), -1);
  EXPECT_EQ(first({"(?s)a.b"}, "a\nb"), 0);
  EXPECT_EQ(first({"a.b"},
                  "a\xe2\x80\xa8"
                  "b"),
            0);  // U+2028 is not '\n'
}

TEST(PatternTable, WordBoundariesUseUnicodeWords) {
  EXPECT_EQ(first({"\\bproj\\b"}, "up_proj/w"), -1);
  EXPECT_EQ(first({"\\bproj\\b"}, "up/proj/w"), 0);
  EXPECT_EQ(first({"\\bx"}, "\xc3\xa9x"), -1);  // é is a word character
  EXPECT_EQ(first({"(?a)\\bx"}, "\xc3\xa9x"), 0);
  EXPECT_EQ(first({"\\B"}, ""), -1);
  EXPECT_EQ(first({"\\b"}, ""), -1);
  EXPECT_EQ(first({"^\\B$"}, "/"), -1);
  EXPECT_EQ(first({"\\B$"}, "/"), 0);
}

TEST(PatternTable, NamedGroupsAndRepeatsAsPythonWritesThem) {
  EXPECT_EQ(first({"layers/(?P<n>\\d+)/mlp"}, "m/layers/17/mlp/w"), 0);
  EXPECT_EQ(first({"(?P<p>[a-z]+)_(?P=p)"}, "up_up/w"), 0);
  EXPECT_EQ(first({"(?P<p>[a-z]+)_(?P=p)$"}, "up_down"), -1);
  EXPECT_EQ(first({"^a{,2}$"}, "aa"), 0);
  EXPECT_EQ(first({"^a{,2}$"}, "aaa"), -1);
  EXPECT_EQ(first({"x{}"}, "x{}"), 0);      // "{}" is literal
  EXPECT_EQ(first({"x{1,2"}, "x{1,2"), 0);  // so is an unfinished repeat
  EXPECT_EQ(first({"(?x) a b  # comment"}, "ab"), 0);
}

TEST(PatternTable, FirstEntryFoundWinsAcrossDfaAndBacktracker) {
  // Entry 1 needs the backtracker; entries 0 and 2 are in the DFA.
  const PatternTable t({"^embed", "(?<=mlp/)up", "up"});
  EXPECT_EQ(t.dfa(), nullptr);
  EXPECT_EQ(t.first_match("embed/up"), 0);
  EXPECT_EQ(t.first_match("mlp/up"), 1);
  EXPECT_EQ(t.first_match("attn/up"), 2);
  EXPECT_EQ(t.first_match("attn/down"), -1);
  EXPECT_NE(PatternTable({"^embed", "up"}).dfa(), nullptr);
}

TEST(PatternTable, EmptyMatchesAreNotMatchesOfEveryPath) {
  // The old Boost fallback took a pattern that matches the empty string for a catch-all.
  const PatternTable t({"(?!x)y", "^[^/]*$"});
  EXPECT_TRUE(t.matches_empty(1));
  EXPECT_FALSE(t.matches_empty(0));
  EXPECT_EQ(t.first_match("a/b"), -1);
  EXPECT_EQ(t.first_match("ab"), 1);
  EXPECT_EQ(t.first_match(""), 1);
}

TEST(PatternTable, InvalidUtf8IsDecodedWithSurrogateEscape) {
  // Python: b'caf\xc3'.decode('utf-8', 'surrogateescape') == 'caf\udcc3'.
  EXPECT_EQ(first({"^caf\\udcc3$"}, "caf\xc3"), 0);
  EXPECT_EQ(first({"^caf.$"}, "caf\xc3"), 0);
  EXPECT_EQ(first({"^caf\\w$"}, "caf\xc3"), -1);
  // An overlong '/' and an encoded surrogate are two and three escaped bytes.
  EXPECT_EQ(first({"^.{2}$"}, "\xc0\xaf"), 0);
  EXPECT_EQ(first({"^\\udced\\udca0\\udc80$"}, "\xed\xa0\x80"), 0);
  // A truncated sequence before an ASCII byte: each byte escaped.
  EXPECT_EQ(first({"^\\udce2\\udc82a$"},
                  "\xe2\x82"
                  "a"),
            0);
  EXPECT_EQ(decode_utf8("\xe2\x82\xac\xff"), (std::u32string{0x20ac, 0xdcff}));
}

TEST(PathMatcher, ScanResumesFromAPrefixStateAndStopsInsideACharacter) {
  const PatternTable t({"layers/1[0-9]/mlp", "mlp/up$", "é/x"});
  const PathMatcher* m = t.dfa();
  ASSERT_NE(m, nullptr);
  const auto s = m->scan(m->start(), "model/layers/12/");
  EXPECT_EQ(m->first_match(m->scan(s, "mlp/up")), 0);
  const auto u = m->scan(m->start(), "model/layers/3/");
  EXPECT_EQ(m->first_match(m->scan(u, "mlp/up")), 1);
  EXPECT_EQ(m->first_match(m->scan(u, "attn")), -1);
  EXPECT_EQ(m->scan(m->start(), "a/\xc3"), PathMatcher::kIncomplete);
  EXPECT_EQ(m->first_match(m->scan(m->scan(m->start(), "a/\xc3\xa9"), "/x")), 2);
}

TEST(PatternTable, BacktrackerGivesUpPastItsBudget) {
  const PatternTable t({"(?=(a*)*b)"}, /*budget=*/100000);
  EXPECT_EQ(t.first_match("aab"), 0);
  try {
    t.first_match(std::string(40, 'a'));
    ADD_FAILURE() << "no TableBudgetError";
  } catch (const TableBudgetError& e) {
    EXPECT_EQ(e.index, 0u);
  }
}

TEST(PatternTable, RejectsWhatPythonRejectsWithItsPosition) {
  auto error_of = [](const std::string& p) {
    try {
      PatternTable t({"ok", p});
    } catch (const TablePatternError& e) {
      EXPECT_EQ(e.index, 1u);
      return std::make_pair(e.error.message, e.error.position);
    }
    return std::make_pair(std::string("accepted"), std::size_t{0});
  };
  EXPECT_EQ(error_of("mlp/(up"),
            std::make_pair(std::string("missing ), unterminated subpattern"), std::size_t{4}));
  EXPECT_EQ(error_of("a**"), std::make_pair(std::string("multiple repeat"), std::size_t{2}));
  EXPECT_EQ(error_of("\\q"), std::make_pair(std::string("bad escape \\q"), std::size_t{0}));
  EXPECT_EQ(
      error_of("(?<=a+)b"),
      std::make_pair(std::string("look-behind requires fixed-width pattern"), std::size_t{0}));
  // Python accepts these; shardplan rejects them, documented in docs/rule-files.md.
  EXPECT_THAT(error_of("(?i)abc").first, ::testing::HasSubstr("IGNORECASE"));
  EXPECT_THAT(error_of("\\N{DIGIT ONE}").first, ::testing::HasSubstr("\\N{...}"));
  EXPECT_THAT(error_of("a{1001}").first, ::testing::HasSubstr("above 1000"));
  EXPECT_THAT(error_of("caf\xc3").first, ::testing::HasSubstr("not valid UTF-8"));
}

TEST(PatternTable, CatchAllsAreThePatternsThatMatchTheEmptyPath) {
  // Each checked with python3: re.search(p, "") is not None.
  const PatternTable t({".*", "^$", "\\b", "\\B", "(x)?", "$\\Z", "a*b", "(?=)", "(?!x)y?",
                        "(a|)+\\A"});
  const std::vector<bool> want = {true, true, false, false, true, true, false, true, true, true};
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(t.matches_empty(i), want[i]) << i;
}

TEST(PatternTable, PatternsTooLargeOrTooDeepAreRejectedByName) {
  const auto reject = [](const std::string& p, const char* part) {
    try {
      PatternTable t({p});
      ADD_FAILURE() << "accepted";
    } catch (const TablePatternError& e) {
      EXPECT_THAT(e.error.message, ::testing::HasSubstr(part));
    }
  };
  reject(std::string(201, '(') + std::string(201, ')'), "nested deeper than 200");
  reject("((a{1000}){1000}){1000}", "too large");
}

TEST(PatternTable, ABacktrackerThatGivesUpOnTheEmptyPathFailsTheTable) {
  // 2^26 ways to match the empty groups, then a lookahead that never passes.
  std::string p;
  for (int k = 0; k < 26; ++k) p += "(?:|)";
  p += "(?!)";
  try {
    PatternTable t({"ok", p});
    ADD_FAILURE() << "no TableBudgetError";
  } catch (const TableBudgetError& e) {
    EXPECT_EQ(e.index, 1u);
  }
}

}  // namespace
}  // namespace shardplan::detail
