// Model loading: names to trees, model descriptions, sharded checkpoints.
#include "shardplan/model_loader.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>

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
}  // namespace shardplan
