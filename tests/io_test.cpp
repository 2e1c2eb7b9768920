// safetensors headers, model descriptions, checkpoints, rule files and the rule-table rule.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/safetensors.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("shardplan_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

/// A safetensors file's bytes: the 8-byte little-endian length, then the header text, then
/// `data` zero bytes.
std::string st_bytes(const std::string& header, std::size_t data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data, '\0');
}

SafetensorsHeader parse(const std::string& header, std::size_t data) {
  const std::string bytes = st_bytes(header, data);
  return parse_safetensors_header(bytes, static_cast<std::int64_t>(bytes.size()), "m.safetensors");
}

TEST(Safetensors, ParsesEntriesInHeaderOrderWithMetadata) {
  const auto h = parse(R"({"__metadata__":{"format":"pt"},)"
                       R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
                       R"("a":{"dtype":"F32","shape":[],"data_offsets":[12,16]}})",
                       16);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "b");
  EXPECT_EQ(h.tensors[0].spec.shape, Shape({2, 3}));
  EXPECT_EQ(h.tensors[0].spec.dtype, DType::kBF16);
  EXPECT_EQ(h.tensors[1].end, 16);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.data_size, 16);
}

TEST(Safetensors, CorruptHeadersAreClearErrors) {
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  EXPECT_THROW_WITH(parse_safetensors_header("abc", 3, "m.st"), IoError, "m.st", "3 bytes");
  {
    std::string b = st_bytes("{}", 0);
    b[0] = static_cast<char>(0x40);  // length 64, file has 2 bytes of header
    EXPECT_THROW_WITH(parse_safetensors_header(b, static_cast<std::int64_t>(b.size()), "m.st"),
                      IoError, "header length 64", "past the end");
  }
  {
    std::string b = st_bytes("{}", 0);
    b[7] = static_cast<char>(0x01);  // an absurd length
    EXPECT_THROW_WITH(parse_safetensors_header(b, std::int64_t{1} << 60, "m.st"), IoError,
                      "limit");
  }
  EXPECT_THROW_WITH(parse("{\"w\": [", 0), IoError, "m.safetensors", "not valid JSON", "byte");
  EXPECT_THROW_WITH(parse("[1, 2]", 0), IoError, "must be a JSON object", "array");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", 8), IoError,
                    "'w'", "'F12'");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), IoError,
                    "'w'", "[-2]");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), IoError,
                    "'w'", "[8, 0]", "begin after end");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4), IoError,
                    "'w'", "past the data section", "4 bytes");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), IoError,
                    "'w'", "8 bytes", "[3]", "needs 12");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[2]}})", 8), IoError, "'w'",
                    "data_offsets");
  EXPECT_THROW_WITH(parse("{" + ok_entry + R"(,"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                    IoError, "'w'", "'v'", "overlap");
  EXPECT_THROW_WITH(parse(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", 8),
                    IoError, "'w'", "2^63");
  EXPECT_THROW_WITH(parse(R"({"__metadata__":{"a":1}})", 0), IoError, "__metadata__");
}

TEST(Safetensors, SkeletonWriterRoundTripsAndIsSparse) {
  TempDir dir;
  const fs::path file = dir.path() / "model.safetensors";
  const std::vector<std::pair<std::string, TensorSpec>> tensors = {
      {"model.embed_tokens.weight", {Shape{32000, 4096}, DType::kBF16}},
      {"model.norm.weight", {Shape{4096}, DType::kF32}},
  };
  write_safetensors_skeleton(file, tensors, {{"format", "pt"}});
  const auto h = read_safetensors_header(file);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(h.tensors[0].spec, tensors[0].second);
  EXPECT_EQ(h.tensors[1].begin, 32000LL * 4096 * 2);
  EXPECT_EQ(h.header_size % 8, 0);
  EXPECT_EQ(static_cast<std::int64_t>(fs::file_size(file)), 8 + h.header_size + h.data_size);
  EXPECT_EQ(h.data_size, 32000LL * 4096 * 2 + 4096 * 4);
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(Safetensors, ReadingATruncatedFileIsAnErrorNamingIt) {
  TempDir dir;
  const fs::path file = dir.path() / "cut.safetensors";
  write_safetensors_skeleton(file, {{"w", {Shape{1024}, DType::kF32}}});
  fs::resize_file(file, 100);
  EXPECT_THROW_WITH(read_safetensors_header(file), IoError, "cut.safetensors");
  EXPECT_THROW_WITH(read_safetensors_header(dir.path() / "missing.safetensors"), IoError,
                    "missing.safetensors");
}

TEST(ModelLoader, DottedNamesBecomePathsAndNumericDictsBecomeLists) {
  std::vector<std::pair<std::string, TensorSpec>> named;
  for (int l = 0; l < 11; ++l) {
    named.push_back({"model.layers." + std::to_string(l) + ".mlp.up_proj.weight", {Shape{8, 4}, DType::kBF16}});
  }
  named.push_back({"lm_head.weight", {Shape{4, 8}, DType::kBF16}});
  const auto tree = tree_from_names(named);
  EXPECT_TRUE(tree.at("model").at("layers").is_list());
  const auto paths = tree.paths();
  EXPECT_EQ(paths.front(), "lm_head/weight");
  EXPECT_EQ(paths[3], "model/layers/2/mlp/up_proj/weight");
  EXPECT_EQ(paths.back(), "model/layers/10/mlp/up_proj/weight");
}

TEST(ModelLoader, KeysWithSlashesAreEscapedAndGapsStayDicts) {
  const auto tree = tree_from_names({{"a/b.w", {Shape{2}, DType::kF32}},
                                     {"layers.0.w", {Shape{2}, DType::kF32}},
                                     {"layers.2.w", {Shape{2}, DType::kF32}}});
  EXPECT_EQ(tree.paths(), (std::vector<std::string>{"a~1b/w", "layers/0/w", "layers/2/w"}));
  EXPECT_TRUE(tree.at("layers").is_dict());
}

TEST(ModelLoader, ConflictingNamesAreErrors) {
  EXPECT_THROW_WITH(tree_from_names({{"a.b", {Shape{2}, DType::kF32}}, {"a.b.c", {Shape{2}, DType::kF32}}}),
                    IoError, "'a.b'", "prefix");
  EXPECT_THROW_WITH(tree_from_names({{"a.b.c", {Shape{2}, DType::kF32}}, {"a.b", {Shape{2}, DType::kF32}}}),
                    IoError, "'a.b'", "prefix");
  EXPECT_THROW_WITH(tree_from_names({{"a", {Shape{2}, DType::kF32}}, {"a", {Shape{2}, DType::kF32}}}),
                    IoError, "'a'", "twice");
  EXPECT_THROW_WITH(tree_from_names({{"a..b", {Shape{2}, DType::kF32}}}), IoError, "'a..b'", "empty");
}

TEST(ModelLoader, ParsesModelDescriptions) {
  const auto t = parse_model_description(
      R"({"__metadata__": {"x": "y"}, "w": {"shape": [4, 8], "dtype": "BF16"},)"
      R"( "act": {"shape": [2, 3], "dtype": "F32", "logical_axes": ["batch", null]}})");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].first, "w");
  EXPECT_EQ(t[0].second.shape, Shape({4, 8}));
  EXPECT_EQ(t[1].second.logical_axes, (std::vector<std::string>{"batch", ""}));
  EXPECT_THROW_WITH(parse_model_description(R"({"w": {"shape": [4], "dtype": "Q4"}})", "m.json"),
                    IoError, "m.json", "'w'", "Q4");
  EXPECT_THROW_WITH(parse_model_description(R"({"w": {"shape": "4", "dtype": "F32"}})", "m.json"),
                    IoError, "'w'", "shape");
  EXPECT_THROW_WITH(parse_model_description(R"({"w": {"shape": [4], "dtype": "F32", "logical_axes": []}})"),
                    IoError, "'w'", "logical_axes");
  EXPECT_THROW_WITH(parse_model_description(R"({"w": {"shape": [4], "dtype": "F32", "bogus": 1}})"),
                    IoError, "'w'", "'bogus'");
  EXPECT_THROW_WITH(parse_model_description("[1]", "m.json"), IoError, "m.json", "array");
  EXPECT_THROW_WITH(parse_model_description("{", "m.json"), IoError, "m.json", "not valid JSON");
}

TEST(ModelLoader, LoadsShardedCheckpointsThroughTheIndex) {
  TempDir dir;
  write_safetensors_skeleton(dir.path() / "model-00001-of-00002.safetensors",
                             {{"model.layers.0.w", {Shape{4, 4}, DType::kBF16}},
                              {"model.embed.weight", {Shape{16, 4}, DType::kBF16}}});
  write_safetensors_skeleton(dir.path() / "model-00002-of-00002.safetensors",
                             {{"model.layers.1.w", {Shape{4, 4}, DType::kBF16}}});
  const fs::path index = dir.path() / "model.safetensors.index.json";
  std::ofstream(index) << R"({"metadata": {"total_size": 1},
    "weight_map": {"model.layers.0.w": "model-00001-of-00002.safetensors",
                   "model.embed.weight": "model-00001-of-00002.safetensors",
                   "model.layers.1.w": "model-00002-of-00002.safetensors"}})";
  const auto tree = load_model(index);
  EXPECT_EQ(tree.num_leaves(), 3u);
  EXPECT_EQ(tree.at_path("model/embed/weight").leaf().shape, Shape({16, 4}));
  EXPECT_TRUE(tree.at_path("model/layers").is_list());

  std::ofstream(index) << R"({"weight_map": {"model.layers.9.w": "model-00002-of-00002.safetensors"}})";
  EXPECT_THROW_WITH(load_model(index), IoError, "'model.layers.9.w'", "model-00002-of-00002");
  EXPECT_THROW_WITH(load_model(dir.path() / "model.bin"), IoError, "model.bin");
}

// ---- rule files ----

constexpr const char* kRules = R"(# a comment
mesh: "fsdp:-1,tp:2"
strict: false
rules:
  - {match: "attn/(q|k|v)/w$", spec: [tp, fsdp]}
  - match: "mlp/up"
    spec: [[fsdp, tp], null]
  - {match: "norm", spec: []}
fsdp_fallback: {axis: fsdp, min_size: 64}
logical_axes: {batch: data, mlp: tp, embed: null, heads: [tp]}
)";

TEST(RuleFile, ParsesEveryField) {
  const RuleFile f = parse_rule_file(kRules, "r.yaml");
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
  EXPECT_THROW_WITH(parse_rule_file("rules: []\nrules: []\n", "r.yaml"), IoError, "duplicate key 'rules'");
  EXPECT_THROW_WITH(parse_rule_file("rules: []\nlogical_axes: {a: {b: c}}\n", "r.yaml"), IoError,
                    "logical axis 'a'");
  EXPECT_THROW_WITH(load_rule_file("/nonexistent/r.yaml"), IoError, "/nonexistent/r.yaml");
}

TEST(RuleFile, BadRegexNamesTheFileLineAndPosition) {
  const RuleFile f = parse_rule_file("rules:\n  - {match: ok, spec: []}\n  - {match: 'a(b', spec: []}\n", "r.yaml");
  EXPECT_THROW_WITH(f.make_rule(), RuleError, "r.yaml:3", "'a(b'", "position");
}

TEST(RuleTable, RegexThenFallbackThenLogicalAxes) {
  const RulePtr rule = parse_rule_file(kRules, "r.yaml").make_rule();
  const Mesh mesh = Mesh::parse("data:2,fsdp:2,tp:2", 8);
  auto decide = [&](std::string_view path, TensorSpec t) { return rule->apply(RuleInput{path, t, mesh}); };
  EXPECT_EQ(decide("l/attn/q/w", {Shape{8, 8}, DType::kF32}).spec, P("tp", "fsdp"));
  const auto fb = decide("l/other", {Shape{4, 64}, DType::kF32});
  EXPECT_EQ(fb.spec, P(nullptr, "fsdp"));
  EXPECT_TRUE(fb.fell_through);
  EXPECT_EQ(fb.entry, 3);
  const auto small = decide("l/tiny", {Shape{4, 4}, DType::kF32});
  EXPECT_EQ(small.spec, P());
  EXPECT_EQ(decide("act", {Shape{8, 16}, DType::kF32, {"batch", "mlp"}}).spec, P("data", "tp"));
  EXPECT_EQ(rule->entry_labels().size(), 3u + 1u + 4u);
  EXPECT_EQ(rule->entry_labels()[3], "fsdp_fallback");
}

TEST(RuleTable, StrictWithoutFallbackFailsNamingTheFileAndPath) {
  const RulePtr rule = parse_rule_file("rules:\n  - {match: attn, spec: []}\n", "r.yaml").make_rule();
  const Mesh mesh = Mesh::parse("x:2", 2);
  EXPECT_THROW_WITH(rule->apply(RuleInput{"mlp/w", {Shape{4, 4}, DType::kF32}, mesh}), RuleError,
                    "r.yaml", "'mlp/w'", "[4, 4]");
  const auto steps = rule->explain(RuleInput{"mlp/w", {Shape{4, 4}, DType::kF32}, mesh});
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_FALSE(steps.back().decided);
}

}  // namespace
}  // namespace shardplan
