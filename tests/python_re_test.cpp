// Rule patterns against python3's own `re`: scripts/py_re_corpus.py generates (seeded) thousands
// of patterns and paths, ASCII and not, with newlines and invalid UTF-8, records what
// re.search (and re.compile's errors) say, and the pattern engine must agree on every one.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "path_matcher.hpp"
#include "py_regex.hpp"
#include "test_util.hpp"

namespace shardplan::detail {
namespace {

std::string unhex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

/// Python-like repr of a string for messages: escapes control characters.
std::string show(const std::string& s) {
  std::string out = "'";
  for (unsigned char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out + "'";
}

struct Corpus {
  std::vector<nlohmann::json> records;
};

const Corpus& corpus() {
  static const Corpus c = [] {
    const auto out = std::filesystem::temp_directory_path() /
                     fmt::format("shardplan_py_re_corpus_{}.jsonl", ::getpid());
    // SHARDPLAN_PY_RE_ARGS (e.g. "--seed 7 --patterns 5000") runs a larger or other corpus.
    const char* extra = std::getenv("SHARDPLAN_PY_RE_ARGS");
    const std::string cmd = fmt::format("python3 '{}/scripts/py_re_corpus.py' '{}' {}",
                                        SHARDPLAN_SOURCE_DIR, out.string(), extra ? extra : "");
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
    Corpus corpus;
    std::ifstream in(out);
    std::string line;
    while (std::getline(in, line)) corpus.records.push_back(nlohmann::json::parse(line));
    std::filesystem::remove(out);
    return corpus;
  }();
  return c;
}

TEST(PythonRe, CorpusIsLargeAndCoversBothKinds) {
  std::size_t matches = 0, errors = 0, found = 0;
  for (const auto& r : corpus().records) {
    if (r["k"] == "m")
      ++matches, found += r["r"].get<int>() >= 0;
    else
      ++errors;
  }
  EXPECT_GT(matches, 4000u);
  EXPECT_GT(found, 1000u);
  EXPECT_GT(matches - found, 1000u);
  EXPECT_GT(errors, 40u);
}

TEST(PythonRe, SearchAgreesWithPythonOnEveryPair) {
  std::vector<std::string> disagreements;
  std::size_t checked = 0;
  std::optional<PatternTable> table_of;
  std::vector<std::string> last_patterns;
  for (const auto& r : corpus().records) {
    if (r["k"] != "m") continue;
    std::vector<std::string> patterns;
    for (const auto& p : r["p"]) patterns.push_back(unhex(p.get<std::string>()));
    const std::string path = unhex(r["s"].get<std::string>());
    const int want = r["r"].get<int>();
    std::string table;
    for (const auto& p : patterns) table += show(p) + " ";
    try {
      // Consecutive records share their table: compile it once.
      if (!table_of || last_patterns != patterns) {
        table_of.reset();
        last_patterns = patterns;
        table_of.emplace(patterns);
      }
      const int got = table_of->first_match(path);
      ++checked;
      if (got != want)
        disagreements.push_back(fmt::format("patterns {}path {}: python {}, shardplan {}", table,
                                            show(path), want, got));
    } catch (const TablePatternError& e) {
      disagreements.push_back(
          fmt::format("patterns {}: python accepts, shardplan rejects: {} at {}", table,
                      e.error.message, e.error.position));
    }
    if (disagreements.size() >= 20) break;
  }
  EXPECT_TRUE(disagreements.empty()) << ::testing::PrintToString(disagreements);
  EXPECT_GT(checked, 4000u);
}

// The backtracker is the fallback for what the DFA cannot do; it must decide exactly as the DFA
// and Python do on every pattern, not only on those that need it: run it alone on the corpus.
TEST(PythonRe, TheBacktrackerAloneAgreesWithPythonOnEveryPair) {
  std::vector<std::string> disagreements;
  std::size_t checked = 0;
  std::vector<std::string> last_patterns;
  std::vector<Backtracker> matchers;
  for (const auto& r : corpus().records) {
    if (r["k"] != "m") continue;
    std::vector<std::string> patterns;
    for (const auto& p : r["p"]) patterns.push_back(unhex(p.get<std::string>()));
    if (patterns != last_patterns) {
      last_patterns = patterns;
      matchers.clear();
      for (const auto& p : patterns) matchers.emplace_back(parse_py_regex(p));
    }
    const std::string path = unhex(r["s"].get<std::string>());
    const std::u32string text = decode_utf8(path);
    int got = -1;
    for (std::size_t i = 0; i < matchers.size() && got < 0; ++i) {
      if (matchers[i].search(text, Backtracker::kDefaultBudget)) got = static_cast<int>(i);
    }
    ++checked;
    const int want = r["r"].get<int>();
    if (got != want) {
      std::string table;
      for (const auto& p : patterns) table += show(p) + " ";
      disagreements.push_back(fmt::format("patterns {}path {}: python {}, backtracker {}", table,
                                          show(path), want, got));
    }
    if (disagreements.size() >= 20) break;
  }
  EXPECT_TRUE(disagreements.empty()) << ::testing::PrintToString(disagreements);
  EXPECT_GT(checked, 4000u);
}

TEST(PythonRe, RejectsWhatPythonRejectsAtTheSamePosition) {
  std::vector<std::string> disagreements;
  for (const auto& r : corpus().records) {
    if (r["k"] != "e") continue;
    const std::string p = unhex(r["p"].get<std::string>());
    try {
      const PatternTable t({p});
      disagreements.push_back(fmt::format("{}: python rejects ({}), shardplan accepts", show(p),
                                          r["msg"].get<std::string>()));
    } catch (const TablePatternError& e) {
      if (!r["pos"].is_null() && r["pos"].get<std::size_t>() != e.error.position)
        disagreements.push_back(fmt::format(
            "{}: python '{}' at {}, shardplan '{}' at {}", show(p), r["msg"].get<std::string>(),
            r["pos"].get<std::size_t>(), e.error.message, e.error.position));
    }
  }
  EXPECT_TRUE(disagreements.empty()) << ::testing::PrintToString(disagreements);
}

}  // namespace
}  // namespace shardplan::detail
