// The umbrella header: it compiles on its own and includes every public header, and nothing else.
#include "shardplan/shardplan.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>

namespace {

namespace fs = std::filesystem;

// The public headers as the install exports them: include/shardplan/*.hpp and the rules'
// rules/include/shardplan/rules/*.hpp, as "shardplan/..." include names. detail/ is not public.
std::set<std::string> public_headers() {
  const fs::path src = SHARDPLAN_SOURCE_DIR;
  std::set<std::string> names;
  for (const auto& [dir, prefix] : {std::pair{src / "include/shardplan", std::string("shardplan/")},
                                    std::pair{src / "rules/include/shardplan/rules",
                                              std::string("shardplan/rules/")}}) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file() && entry.path().extension() == ".hpp") {
        names.insert(prefix + entry.path().filename().string());
      }
    }
  }
  names.erase("shardplan/shardplan.hpp");
  return names;
}

std::set<std::string> umbrella_includes() {
  std::ifstream in(fs::path(SHARDPLAN_SOURCE_DIR) / "include/shardplan/shardplan.hpp");
  const std::regex include_line(R"(^\s*#\s*include\s*[<"]([^>"]+)[>"])");
  std::set<std::string> names;
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, include_line)) names.insert(m[1].str());
  }
  return names;
}

TEST(Umbrella, IncludesEveryPublicHeaderAndNothingElse) {
  const auto headers = public_headers();
  const auto included = umbrella_includes();
  ASSERT_GT(headers.size(), 30u);  // the folders were found
  for (const auto& h : headers) EXPECT_TRUE(included.count(h)) << h << " is not in shardplan.hpp";
  for (const auto& h : included) EXPECT_TRUE(headers.count(h)) << h << " is not a public header";
}

}  // namespace
