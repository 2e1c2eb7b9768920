// YAML rule files: every field and every error.
#include "shardplan/rule_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/safetensors.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures

TEST(RuleFile, ParsesEveryField) {
  const RuleFile f = parse_rule_file(kSampleRules, "r.yaml");
  EXPECT_EQ(f.mesh, "fsdp:-1,tp:2");
  EXPECT_FALSE(f.strict);
  ASSERT_EQ(f.rules.size(), 3u);
  EXPECT_EQ(f.rules[0].match, "attn/(q|k|v)/w$");
  EXPECT_EQ(f.rules[0].spec, P("tp", "fsdp"));
  EXPECT_EQ(f.rules[1].spec, P(AxisNames{"fsdp", "tp"}, nullptr));
  EXPECT_EQ(f.rules[1].line, 6);
  EXPECT_EQ(f.rules[2].spec, P());
  ASSERT_TRUE(f.fsdp_fallback.has_value());
  EXPECT_EQ(f.fsdp_fallback->min_size, 64);
  ASSERT_EQ(f.logical_axes.size(), 4u);
  EXPECT_EQ(f.logical_axes[0].first, "batch");
  EXPECT_EQ(f.logical_axes[2].second, std::nullopt);
  EXPECT_EQ(f.logical_axes[3].second, AxisNames{"tp"});
}

TEST(RuleFile, ErrorsNameFileLineAndWhatWasExpected) {
  EXPECT_THROW_WITH(parse_rule_file("rules: [", "r.yaml"), IoError, "r.yaml", "not valid YAML");
  EXPECT_THROW_WITH(parse_rule_file("- 1", "r.yaml"), IoError, "r.yaml:1", "expected a mapping");
  EXPECT_THROW_WITH(parse_rule_file("rules: []\nmesh_: x\n", "r.yaml"), IoError, "r.yaml:2",
                    "unknown key 'mesh_'", "rules");
  EXPECT_THROW_WITH(parse_rule_file("strict: maybe\nrules: []\n", "r.yaml"), IoError, "r.yaml:1",
                    "'strict'", "true or false", "'maybe'");
  EXPECT_THROW_WITH(parse_rule_file("mesh: x\n", "r.yaml"), IoError, "missing 'rules'");
  EXPECT_THROW_WITH(parse_rule_file("rules:\n  - {match: a}\n", "r.yaml"), IoError, "r.yaml:2",
                    "missing 'spec'");
  EXPECT_THROW_WITH(parse_rule_file("rules:\n  - {match: a, spec: tp}\n", "r.yaml"), IoError,
                    "r.yaml:2", "expected a spec", "'tp'");
  EXPECT_THROW_WITH(parse_rule_file("rules:\n  - {match: a, spec: [{x: 1}]}\n", "r.yaml"), IoError,
                    "r.yaml:2", "spec entry");
  EXPECT_THROW_WITH(parse_rule_file("rules:\n  - {match: a, spec: [], extra: 1}\n", "r.yaml"),
                    IoError, "unknown key 'extra'");
  EXPECT_THROW_WITH(parse_rule_file("rules: []\nfsdp_fallback: {min_size: -3}\n", "r.yaml"),
                    IoError, "r.yaml:2", "'min_size'", "positive", "'-3'");
  EXPECT_THROW_WITH(parse_rule_file("rules: []\nrules: []\n", "r.yaml"), IoError,
                    "duplicate key 'rules'");
  EXPECT_THROW_WITH(parse_rule_file("rules: []\nlogical_axes: {a: {b: c}}\n", "r.yaml"), IoError,
                    "logical axis 'a'");
  EXPECT_THROW_WITH(load_rule_file("/nonexistent/r.yaml"), IoError, "/nonexistent/r.yaml");
}

TEST(RuleFile, BadRegexNamesTheFileLineAndPosition) {
  const RuleFile f = parse_rule_file(
      "rules:\n  - {match: ok, spec: []}\n  - {match: 'a(b', spec: []}\n", "r.yaml");
  EXPECT_THROW_WITH(f.make_rule(), RuleError, "r.yaml:3", "'a(b'", "position");
}

TEST(RuleFile, DeepNestingIsAClearErrorNotACrash) {
  // yaml-cpp recurses once per level: 65,536 levels are rejected before it parses.
  const std::string flow =
      "rules:\n  - {match: a, spec: " + std::string(65'536, '[') + std::string(65'536, ']') + "}\n";
  EXPECT_THROW_WITH(parse_rule_file(flow, "deep.yaml"), IoError, "deep.yaml:2",
                    "nesting deeper than 128 levels");
  std::string block = "rules:\n  ";
  for (int i = 0; i < 65'536; ++i) block += "- ";
  block += "x\n";
  EXPECT_THROW_WITH(parse_rule_file(block, "deep.yaml"), IoError, "deep.yaml:2",
                    "nesting deeper than 128 levels");
  // Brackets inside quoted patterns and comments do not count.
  const std::string quoted =
      "rules:  # [[[[[[[[\n  - {match: \"" + std::string(300, '[') + "\", spec: [x]}\n";
  const RuleFile f = parse_rule_file(quoted, "q.yaml");
  ASSERT_EQ(f.rules.size(), 1u);
  EXPECT_EQ(f.rules[0].match, std::string(300, '['));
}

TEST(RuleFile, FilesThatAreNotRegularAreErrorsNamingThemAtOnce) {
  TempDir dir;
  const std::filesystem::path fifo = dir.path() / "rules.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW_WITH(load_rule_file(fifo), IoError, fifo.string(), std::string("FIFO"));
  EXPECT_THROW_WITH(load_rule_file(dir.path()), IoError, dir.path().string(),
                    std::string("directory"));
  EXPECT_THROW_WITH(load_rule_file("/dev/zero"), IoError, "/dev/zero", "character device");
}

}  // namespace
}  // namespace shardplan
