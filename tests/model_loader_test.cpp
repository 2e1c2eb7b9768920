// Model loading: names to trees, model descriptions, sharded checkpoints.
#include "shardplan/model_loader.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/safetensors.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures

namespace fs = std::filesystem;

TEST(ModelLoader, DottedNamesBecomePathsAndNumericDictsBecomeLists) {
  std::vector<std::pair<std::string, TensorSpec>> named;
  for (int l = 0; l < 11; ++l) {
    named.push_back(
        {"model.layers." + std::to_string(l) + ".mlp.up_proj.weight", {Shape{8, 4}, DType::kBF16}});
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

TEST(ModelLoader, TreePathOfNameIsThePathTheTreeGivesTheTensor) {
  // Segments with '/' and '~' are escaped as the tree escapes its keys: a plain '.'-to-'/'
  // replace would name another (missing) leaf.
  const std::vector<std::string> names = {"h.0.attn.c_attn.bias", "a/b.~w", "x"};
  std::vector<std::pair<std::string, TensorSpec>> named;
  for (const auto& n : names) named.push_back({n, {Shape{2}, DType::kF32}});
  const auto tree = tree_from_names(named);
  for (const auto& n : names) {
    EXPECT_EQ(tree.at_path(tree_path_of_name(n)).leaf().shape, Shape({2})) << n;
  }
  EXPECT_EQ(tree_path_of_name("a/b.~w"), "a~1b/~0w");
  EXPECT_EQ(tree_path_of_name("h/0", '/'), "h/0");
}

TEST(ModelLoader, ConflictingNamesAreErrors) {
  EXPECT_THROW_WITH(
      tree_from_names({{"a.b", {Shape{2}, DType::kF32}}, {"a.b.c", {Shape{2}, DType::kF32}}}),
      IoError, "'a.b'", "prefix");
  EXPECT_THROW_WITH(
      tree_from_names({{"a.b.c", {Shape{2}, DType::kF32}}, {"a.b", {Shape{2}, DType::kF32}}}),
      IoError, "'a.b'", "prefix");
  EXPECT_THROW_WITH(
      tree_from_names({{"a", {Shape{2}, DType::kF32}}, {"a", {Shape{2}, DType::kF32}}}), IoError,
      "'a'", "twice");
  EXPECT_THROW_WITH(tree_from_names({{"a..b", {Shape{2}, DType::kF32}}}), IoError, "'a..b'",
                    "empty");
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
  EXPECT_THROW_WITH(
      parse_model_description(R"({"w": {"shape": [4], "dtype": "F32", "logical_axes": []}})"),
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

  std::ofstream(index)
      << R"({"weight_map": {"model.layers.9.w": "model-00002-of-00002.safetensors"}})";
  EXPECT_THROW_WITH(load_model(index), IoError, "'model.layers.9.w'", "model-00002-of-00002");
  EXPECT_THROW_WITH(load_model(dir.path() / "model.bin"), IoError, "model.bin");
}

}  // namespace
TEST(ModelLoader, LargeModelDescriptionsParseInLinearTime) {
  // 100,000 tensors: an object that looks each key up by scanning (the old reader) would do
  // 5*10^9 string comparisons here and not finish in minutes; the reader does one pass.
  constexpr int kTensors = 100'000;
  std::string text = "{";
  text.reserve(std::size_t{kTensors} * 48);
  for (int i = 0; i < kTensors; ++i) {
    text += i ? ",\"layers." : "\"layers.";
    text += std::to_string(i);
    text += ".w\": {\"shape\": [";
    text += std::to_string(i % 7 + 1);
    text += "], \"dtype\": \"F32\"}";
  }
  text += "}";
  const auto named = parse_model_description(text, "big.json");
  ASSERT_EQ(named.size(), static_cast<std::size_t>(kTensors));
  // File order is kept.
  EXPECT_EQ(named[0].first, "layers.0.w");
  EXPECT_EQ(named[12'345].first, "layers.12345.w");
  EXPECT_EQ(named[12'345].second.shape, Shape({12'345 % 7 + 1}));
  const auto tree = tree_from_names(named);
  ASSERT_TRUE(tree.at("layers").is_list());
  EXPECT_EQ(tree.at("layers").size(), static_cast<std::size_t>(kTensors));
  EXPECT_EQ(tree.at_path("layers/99999/w").leaf().shape, Shape({99'999 % 7 + 1}));
}

/// A description of `n` tensors "t<i>" of shape [i % 5 + 1], with some members replaced.
std::string description(int n, const std::map<int, std::string>& replaced) {
  std::string text = "{";
  for (int i = 0; i < n; ++i) {
    if (i) text += ",";
    auto r = replaced.find(i);
    text += r != replaced.end()
                ? r->second
                : fmt::format(R"("t{}": {{"shape": [{}], "dtype": "F32"}})", i, i % 5 + 1);
  }
  return text + "}";
}

TEST(ModelLoader, LargeDescriptionsReportTheErrorTheSerialReadingMeetsFirst) {
  // Past 16,384 tensors the members are converted on two threads, each taking half; whichever
  // finishes first, the error is the one of the earliest member, and a repeated name comes
  // before a bad field of the same member, as when reading one member after another.
  constexpr int kN = 40'000;
  const std::string bad_shape_late = R"("late": {"shape": [-1], "dtype": "F32"})";
  const std::string bad_dtype_early = R"("early": {"shape": [1], "dtype": "F33"})";
  // A bad member in each half: the first half's.
  EXPECT_THROW_WITH(
      parse_model_description(description(kN, {{100, bad_dtype_early}, {30'000, bad_shape_late}}),
                              "m.json"),
      IoError, "'early'", "F33");
  // Only the second half's.
  EXPECT_THROW_WITH(parse_model_description(description(kN, {{30'000, bad_shape_late}}), "m.json"),
                    IoError, "'late'", "[-1]");
  // A repeated name before a bad member: the repeat.
  const std::string repeat_of_7 = R"("t7": {"shape": [1], "dtype": "F32"})";
  EXPECT_THROW_WITH(
      parse_model_description(description(kN, {{25'000, repeat_of_7}, {30'000, bad_shape_late}}),
                              "m.json"),
      IoError, "'t7'", "twice");
  // A bad member before a repeated name: the bad member.
  EXPECT_THROW_WITH(
      parse_model_description(description(kN, {{20'000, bad_shape_late}, {25'000, repeat_of_7}}),
                              "m.json"),
      IoError, "'late'", "[-1]");
  // A member that repeats a name and is bad too: the repeat.
  EXPECT_THROW_WITH(
      parse_model_description(
          description(kN, {{30'000, R"("t7": {"shape": [-1], "dtype": "F32"})"}}), "m.json"),
      IoError, "'t7'", "twice");
  // Without errors, every member in file order, from both halves.
  const auto named = parse_model_description(description(kN, {}), "m.json");
  ASSERT_EQ(named.size(), static_cast<std::size_t>(kN));
  for (int i : {0, kN / 2 - 1, kN / 2, kN - 1}) {
    EXPECT_EQ(named[static_cast<std::size_t>(i)].first, fmt::format("t{}", i));
    EXPECT_EQ(named[static_cast<std::size_t>(i)].second.shape, Shape({i % 5 + 1}));
  }
}

TEST(ModelLoader, EqualSubtreesShareTheirBranchAsShareEqualSubtreesMakesThem) {
  std::vector<std::pair<std::string, TensorSpec>> named;
  for (int l = 0; l < 4; ++l) {
    for (int e = 0; e < 3; ++e) {
      named.push_back({fmt::format("layers.{}.experts.{}.w", l, e), {Shape{8, 4}, DType::kBF16}});
      named.push_back({fmt::format("layers.{}.experts.{}.b", l, e), {Shape{8}, DType::kF32}});
    }
    // Layer 3's norm differs: its layer is stored apart, its experts are still shared.
    named.push_back({fmt::format("layers.{}.norm", l), {Shape{l == 3 ? 16 : 8}, DType::kF32}});
  }
  const auto tree = tree_from_names(named);
  // The same tree built node by node, then shared by Tree::share_equal_subtrees.
  std::vector<Tree<TensorSpec>> layers;
  for (int l = 0; l < 4; ++l) {
    std::vector<Tree<TensorSpec>> experts;
    for (int e = 0; e < 3; ++e) {
      experts.push_back(Tree<TensorSpec>::dict({{"w", TensorSpec{Shape{8, 4}, DType::kBF16}},
                                                {"b", TensorSpec{Shape{8}, DType::kF32}}}));
    }
    layers.push_back(
        Tree<TensorSpec>::dict({{"experts", Tree<TensorSpec>::list(experts)},
                                {"norm", TensorSpec{Shape{l == 3 ? 16 : 8}, DType::kF32}}}));
  }
  const auto expected = Tree<TensorSpec>::dict({{"layers", Tree<TensorSpec>::list(layers)}});
  EXPECT_EQ(tree, expected);
  const auto& got = tree.at("layers").children();
  EXPECT_TRUE(got[0].shares_branch_with(got[1]));
  EXPECT_TRUE(got[0].shares_branch_with(got[2]));
  EXPECT_FALSE(got[0].shares_branch_with(got[3]));
  EXPECT_TRUE(
      got[0].at("experts").children()[0].shares_branch_with(got[3].at("experts").children()[2]));
  const auto shared = expected.share_equal_subtrees();
  const auto& want = shared.at("layers").children();
  EXPECT_TRUE(want[0].shares_branch_with(want[1]));
  EXPECT_FALSE(want[0].shares_branch_with(want[3]));
}

TEST(ModelLoader, NamesOfTooManyPartsAreErrors) {
  std::string name = "w";
  for (int i = 0; i < 300; ++i) name += ".w";
  EXPECT_THROW_WITH(tree_from_names({{name, {Shape{2}, DType::kF32}}}), IoError,
                    "more than 256 parts", "'w.w.w");
  std::string ok = "w";
  for (int i = 0; i < 255; ++i) ok += ".w";
  EXPECT_EQ(tree_from_names({{ok, {Shape{2}, DType::kF32}}}).num_leaves(), 1u);
}

TEST(ModelLoader, DeepNestingIsAClearErrorNotACrash) {
  // 65,536 levels in a shape, and at the top: the reader is iterative and stops at 256.
  const std::string deep = std::string(65'536, '[') + std::string(65'536, ']');
  EXPECT_THROW_WITH(
      parse_model_description(R"({"w": {"dtype": "F32", "shape": )" + deep + "}}", "m.json"),
      IoError, "m.json", "nesting deeper than 256 levels");
  EXPECT_THROW_WITH(parse_model_description(deep, "m.json"), IoError, "m.json",
                    "nesting deeper than 256 levels", "at byte 256");
  // Unclosed, as a fuzzer would write it.
  EXPECT_THROW_WITH(parse_model_description(std::string(65'536, '['), "m.json"), IoError,
                    "nesting deeper than 256 levels");
  std::string objects;
  for (int i = 0; i < 65'536; ++i) objects += "{\"a\":";
  EXPECT_THROW_WITH(parse_model_description(objects, "m.json"), IoError,
                    "nesting deeper than 256 levels");
  // 255 levels inside the top-level object are fine as JSON (and then not a shape).
  const std::string ok = std::string(254, '[') + "1" + std::string(254, ']');
  EXPECT_THROW_WITH(
      parse_model_description(R"({"w": {"dtype": "F32", "shape": )" + ok + "}}", "m.json"), IoError,
      "'w'", "not a list of non-negative integers");
}

TEST(ModelLoader, RejectsWhatIsNotJson) {
  auto bad = [](const std::string& text, const char* what) {
    EXPECT_THROW_WITH(parse_model_description(text, "m.json"), IoError, "m.json", "not valid JSON",
                      what);
  };
  bad(R"({"w": {"shape": [1,], "dtype": "F32"}})", "expected a value");
  bad(R"({"w": {"shape": [01], "dtype": "F32"}})", "expected ',' or ']'");
  bad(R"({"w": 1} x)", "after the value");
  bad("{\"w\x01\": 1}", "control character");
  bad("{\"w\xff\": 1}", "invalid UTF-8");
  bad("{\"w\xc0\xaf\": 1}", "invalid UTF-8");  // an overlong '/'
  bad(R"({"\ud800": 1})", "surrogate");
  bad(R"({"\x": 1})", "invalid escape");
  bad(R"({"w": tru})", "expected a value");
  bad("", "end of input");
}

TEST(ModelLoader, DecodesEscapedNames) {
  const auto named = parse_model_description(
      R"({"caf\u00e9.\ud83d\ude00.a\"b\\c\/d": {"shape": [], "dtype": "F32"}})");
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].first, "caf\xc3\xa9.\xf0\x9f\x98\x80.a\"b\\c/d");
}

TEST(ModelLoader, RepeatedNamesAndFieldsAreErrors) {
  EXPECT_THROW_WITH(parse_model_description(R"({"a": {"shape": [1], "dtype": "F32"},
                                                "a": {"shape": [2], "dtype": "F32"}})",
                                            "m.json"),
                    IoError, "m.json", "'a'", "twice");
  EXPECT_THROW_WITH(
      parse_model_description(R"({"a": {"shape": [1], "shape": [2], "dtype": "F32"}})", "m.json"),
      IoError, "'a'", "'shape'", "twice");
}

TEST(ModelLoader, NumbersThatAreNotDimensionsAreNamed) {
  for (const char* shape :
       {"[99999999999999999999]", "[1.5]", "[-1]", "[1e3]", "[9223372036854775808]"}) {
    EXPECT_THROW_WITH(
        parse_model_description(fmt::format(R"({{"w": {{"shape": {}, "dtype": "F32"}}}})", shape),
                                "m.json"),
        IoError, "'w'", shape, "not a list of non-negative integers");
  }
  const auto named =
      parse_model_description(R"({"w": {"shape": [9223372036854775807, 0], "dtype": "U8"}})");
  EXPECT_EQ(named[0].second.shape, Shape({INT64_MAX, 0}));
}

TEST(ModelLoader, IndexShardFilesStayInTheIndexDirectory) {
  TempDir dir;
  fs::create_directories(dir.path() / "sub");
  write_safetensors_skeleton(dir.path() / "sub" / "part.safetensors",
                             {{"w", {Shape{4}, DType::kBF16}}});
  const fs::path index = dir.path() / "model.safetensors.index.json";
  // A subfolder is fine.
  std::ofstream(index) << R"({"weight_map": {"w": "sub/part.safetensors"}})";
  EXPECT_EQ(load_model(index).at("w").leaf().shape, Shape({4}));
  auto rejects = [&](const std::string& shard, const char* why) {
    std::ofstream(index) << nlohmann::json{{"weight_map", {{"w", shard}}}}.dump();
    EXPECT_THROW_WITH(load_model(index), IoError, index.string(), std::string("'w'"),
                      "'" + shard + "'", std::string(why),
                      std::string("inside the index's directory"));
  };
  rejects((dir.path() / "sub" / "part.safetensors").string(), "absolute");
  rejects("../part.safetensors", "'..'");
  rejects("sub/../../x/part.safetensors", "'..'");
  rejects("sub/..", "'..'");
  rejects("", "empty");
  // A NUL is shown as \x00 (before, the message ended at it: "... shard file 'sub/part").
  std::ofstream(index) << R"({"weight_map": {"w": "sub/part\u0000.safetensors"}})";
  EXPECT_THROW_WITH(load_model(index), IoError, "'sub/part\\x00.safetensors', which holds a NUL",
                    "inside the index's directory");
}

TEST(ModelLoader, IndexErrors) {
  TempDir dir;
  write_safetensors_skeleton(dir.path() / "a.safetensors", {{"w", {Shape{4}, DType::kBF16}}});
  const fs::path index = dir.path() / "model.safetensors.index.json";
  std::ofstream(index) << R"({"weight_map": {"w": "a.safetensors", "w": "a.safetensors"}})";
  EXPECT_THROW_WITH(load_model(index), IoError, "'w'", "twice");
  std::ofstream(index) << R"({"weight_map": {"w": 3}})";
  EXPECT_THROW_WITH(load_model(index), IoError, "'w'", "must name a shard file", "number");
  std::ofstream(index) << R"({"weights": {}})";
  EXPECT_THROW_WITH(load_model(index), IoError, "weight_map");
  std::ofstream(index) << R"({"weight_map": )" + std::string(65'536, '[');
  EXPECT_THROW_WITH(load_model(index), IoError, index.string(),
                    std::string("nesting deeper than 256 levels"));
}

TEST(ModelLoader, FilesThatAreNotRegularAreErrorsNamingThemAtOnce) {
  // A FIFO would wait for a writer, /dev/zero never end, a directory read as empty text.
  TempDir dir;
  for (const char* name : {"m.json", "model.safetensors.index.json", "m.safetensors"}) {
    const fs::path fifo = dir.path() / "fifo" / name;
    fs::create_directories(fifo.parent_path());
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    EXPECT_THROW_WITH(load_model(fifo), IoError, fifo.string(), std::string("FIFO"));
    const fs::path zero = dir.path() / "zero" / name;
    fs::create_directories(zero.parent_path());
    fs::create_symlink("/dev/zero", zero);
    EXPECT_THROW_WITH(load_model(zero), IoError, zero.string(), std::string("character device"));
    const fs::path sub = dir.path() / "dir" / name;
    fs::create_directories(sub);
    EXPECT_THROW_WITH(load_model(sub), IoError, sub.string(), std::string("directory"));
  }
  // A shard named by an index.
  const fs::path index = dir.path() / "shards" / "model.safetensors.index.json";
  fs::create_directories(index.parent_path());
  std::ofstream(index) << R"({"weight_map": {"w": "a.safetensors"}})";
  const fs::path shard = index.parent_path() / "a.safetensors";
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  EXPECT_THROW_WITH(load_model(index), IoError, shard.string(), std::string("FIFO"));
}

}  // namespace shardplan
