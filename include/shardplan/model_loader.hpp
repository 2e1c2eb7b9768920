#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardplan/tensor_spec.hpp"
#include "shardplan/tree.hpp"  // Tree, tree_path_of_name

namespace shardplan {

/// Builds a tree from dotted names ("model.layers.0.mlp.up_proj.weight" -> path
/// "model/layers/0/mlp/up_proj/weight"). A dict whose keys are exactly 0..n-1 becomes a list,
/// so layers flatten in numeric order. Throws IoError when a name is both a tensor and a prefix
/// of another, or appears twice, naming both. Equal subtrees of the result share their storage
/// (Tree::share_equal_subtrees).
Tree<TensorSpec> tree_from_names(const std::vector<std::pair<std::string, TensorSpec>>& named,
                                 char separator = '.');

/// Parses a model description: a JSON object mapping names to {"shape": [..], "dtype": "BF16"}
/// (optionally "logical_axes": [..]); a "__metadata__" key is ignored. Throws IoError naming
/// `source`, the tensor and what was expected.
std::vector<std::pair<std::string, TensorSpec>> parse_model_description(
    std::string_view json, std::string_view source = "<memory>");

/// Loads the tensors of a model, by file name: `*.safetensors` (header only),
/// `*.safetensors.index.json` (each shard's header, from `weight_map`), or any other `*.json`
/// as a model description. Throws IoError naming the file.
std::vector<std::pair<std::string, TensorSpec>> load_model_tensors(
    const std::filesystem::path& file);

/// load_model_tensors, then tree_from_names.
Tree<TensorSpec> load_model(const std::filesystem::path& file);

}  // namespace shardplan
