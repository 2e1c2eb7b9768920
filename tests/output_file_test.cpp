// OutputFiles (src/formats/output_file.hpp): a command's outputs appear together or not at all.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../src/formats/input_file.hpp"
#include "../src/formats/output_file.hpp"
#include "test_util.hpp"

namespace shardplan::detail {
namespace {

namespace fs = std::filesystem;

class OutputFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardplan_output_files_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string text_of(const fs::path& f) {
    std::stringstream ss;
    ss << std::ifstream(f).rdbuf();
    return ss.str();
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

// The second rename fails (its destination became a directory after the check): the first
// output, already renamed, is undone and the file it replaced put back; no temporary is left.
TEST_F(OutputFilesTest, AFailedRenameUndoesTheOnesBefore) {
  std::ofstream(dir_ / "a.html") << "old page";
  OutputFiles out({{"--html", dir_ / "a.html"}, {"--json", dir_ / "b.json"}});
  out[0].write("new page");
  out[1].write("{}");
  fs::create_directories(dir_ / "b.json" / "inside");
  EXPECT_THROW_WITH(out.commit(), IoError, std::string("[--json]"),
                    (dir_ / "b.json").string(), std::string("no output of this command was written"));
  EXPECT_EQ(text_of(dir_ / "a.html"), "old page");
  EXPECT_EQ(names(), (std::vector<std::string>{"a.html", "b.json"}));

  // A new file is removed again.
  fs::remove(dir_ / "a.html");
  fs::remove_all(dir_ / "b.json");
  OutputFiles again({{"--html", dir_ / "a.html"}, {"--json", dir_ / "b.json"}});
  again[0].write("page");
  fs::create_directories(dir_ / "b.json" / "inside");
  EXPECT_THROW(again.commit(), IoError);
  EXPECT_EQ(names(), (std::vector<std::string>{"b.json"}));
}

TEST_F(OutputFilesTest, BothWrittenAndNothingElseLeft) {
  std::ofstream(dir_ / "a.html") << "old page";
  OutputFiles out({{"--html", dir_ / "a.html"}, {"--json", dir_ / "b.json"}});
  out[0].write("new page");
  out[1].write("{}");
  out.commit();
  EXPECT_EQ(text_of(dir_ / "a.html"), "new page");
  EXPECT_EQ(text_of(dir_ / "b.json"), "{}");
  EXPECT_EQ(names(), (std::vector<std::string>{"a.html", "b.json"}));
}

// The inputs are those read while an InputRecord lives; without one nothing is refused.
TEST_F(OutputFilesTest, AnInputIsRefusedOnlyWhileInputsAreRecorded) {
  std::ofstream(dir_ / "in.json") << "{}";
  (void)read_input_file(dir_ / "in.json", "trace");
  EXPECT_NO_THROW(OutputFiles({{"--json", dir_ / "in.json"}}));
  {
    const InputRecord record;
    (void)read_input_file(dir_ / "in.json", "trace");
    EXPECT_THROW_WITH(OutputFiles({{"--json", dir_ / "in.json"}}), OutputPathError, "--json '",
                      "is an input of this command (the trace ", "an output may not be an input");
  }
  EXPECT_NO_THROW(OutputFiles({{"--json", dir_ / "in.json"}}));
  EXPECT_THROW_WITH(OutputFile(dir_ / "d/", "html"), IoError, "names a directory");
}

}  // namespace
}  // namespace shardplan::detail
