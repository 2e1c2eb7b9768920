#include "shardplan/model_loader.hpp"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/safetensors.hpp"
#include "json_impl.hpp"

namespace shardplan {
namespace {

namespace json = detail::json;

struct Node {
  std::optional<TensorSpec> leaf;
  std::string name;  // the full name of the tensor at this node, for messages
  std::map<std::string, std::unique_ptr<Node>> children;
};

/// Keys exactly "0".."n-1" (no leading zeros): the node is a list.
bool is_list(const Node& node) {
  if (node.children.empty()) return false;
  std::vector<bool> seen(node.children.size(), false);
  for (const auto& [key, child] : node.children) {
    if (key.empty() || key.size() > 9 || (key.size() > 1 && key[0] == '0')) return false;
    std::size_t v = 0;
    for (char c : key) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<std::size_t>(c - '0');
    }
    if (v >= seen.size() || seen[v]) return false;
    seen[v] = true;
  }
  return true;
}

Tree<TensorSpec> to_tree(Node& node) {
  if (node.leaf) return Tree<TensorSpec>(std::move(*node.leaf));
  if (is_list(node)) {
    std::vector<Tree<TensorSpec>> items(node.children.size());
    for (auto& [key, child] : node.children) items[std::stoul(key)] = to_tree(*child);
    return Tree<TensorSpec>::list(std::move(items));
  }
  std::vector<Tree<TensorSpec>::DictEntry> entries;
  entries.reserve(node.children.size());
  for (auto& [key, child] : node.children) entries.emplace_back(key, to_tree(*child));
  return Tree<TensorSpec>::dict(std::move(entries));
}

std::string read_file(const std::filesystem::path& file, std::string_view what) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IoError(fmt::format("[{}] {}: cannot open for reading", what, file.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

/// Parses JSON text, naming the source and the byte of a syntax error.
json::Document parse_json(std::string_view text, std::string_view source) {
  try {
    return json::Document(text);
  } catch (const json::SyntaxError& e) {
    throw IoError(fmt::format("[model] {}: not valid JSON (at byte {}): {}", source, e.byte,
                              e.what()));
  }
}

/// A shard file named by an index must lie in the index's directory or below it: a relative
/// path without ".." parts. The check is on the name only; symbolic links are followed, as in
/// the Hugging Face cache, whose snapshot files link to its blobs folder.
void check_shard_name(std::string_view source, std::string_view tensor, std::string_view shard) {
  const std::filesystem::path p{std::string(shard)};
  auto bad = [&](std::string_view why) {
    return IoError(fmt::format("[model] {}: tensor '{}' is mapped to shard file '{}', {}; shard "
                               "files must be relative paths inside the index's directory",
                               source, tensor, shard, why));
  };
  if (shard.empty()) throw bad("an empty name");
  if (p.has_root_path()) throw bad("an absolute path");
  for (const auto& part : p) {
    if (part == "..") throw bad("which has a '..' part");
  }
  if (shard.find('\0') != std::string_view::npos) throw bad("which holds a NUL byte");
}

std::vector<std::pair<std::string, TensorSpec>> load_index(const std::filesystem::path& file) {
  const std::string source = file.string();
  const std::string text = read_file(file, "model");
  const json::Document doc = parse_json(text, source);
  std::optional<json::Value> weight_map;
  if (doc.root().is_object()) {
    for (auto it = doc.root().begin(); it != doc.root().end(); ++it) {
      if (it.key() == "weight_map") weight_map = it.value();
    }
  }
  if (!weight_map || !weight_map->is_object()) {
    throw IoError(fmt::format("[model] {}: expected an object with a 'weight_map' object of "
                              "tensor name -> shard file",
                              source));
  }
  const auto dir = file.parent_path();
  // shard file -> its tensors
  std::unordered_map<std::string_view, std::unordered_map<std::string, TensorSpec>> shards;
  std::unordered_set<std::string_view> seen;
  seen.reserve(weight_map->size());
  std::vector<std::pair<std::string, TensorSpec>> out;
  out.reserve(weight_map->size());
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    const std::string_view name = it.key();
    if (!it.value().is_string()) {
      throw IoError(fmt::format("[model] {}: weight_map entry '{}' must name a shard file, got {}",
                                source, name, it.value().type_name()));
    }
    if (!seen.insert(name).second) {
      throw IoError(fmt::format("[model] {}: tensor '{}' appears twice in weight_map", source,
                                name));
    }
    const std::string_view shard = it.value().str();
    auto found = shards.find(shard);
    if (found == shards.end()) {
      check_shard_name(source, name, shard);
      std::unordered_map<std::string, TensorSpec> tensors;
      for (auto& e : read_safetensors_header(dir / std::string(shard)).tensors) {
        tensors.emplace(std::move(e.name), std::move(e.spec));
      }
      found = shards.emplace(shard, std::move(tensors)).first;
    }
    auto t = found->second.find(std::string(name));
    if (t == found->second.end()) {
      throw IoError(fmt::format("[model] {}: tensor '{}' is mapped to shard '{}', which does not "
                                "hold it",
                                source, name, shard));
    }
    out.emplace_back(std::string(name), t->second);
  }
  return out;
}

}  // namespace

Tree<TensorSpec> tree_from_names(const std::vector<std::pair<std::string, TensorSpec>>& named,
                                 char separator) {
  Node root;
  for (const auto& [name, spec] : named) {
    Node* node = &root;
    std::size_t start = 0;
    while (true) {
      const std::size_t stop = name.find(separator, start);
      const std::string key =
          name.substr(start, stop == std::string::npos ? std::string::npos : stop - start);
      if (key.empty()) {
        throw IoError(fmt::format("[model] tensor name '{}' has an empty part", name));
      }
      if (node->leaf) {
        throw IoError(fmt::format("[model] '{}' is both a tensor and a prefix of '{}'", node->name,
                                  name));
      }
      auto& child = node->children[key];
      if (!child) child = std::make_unique<Node>();
      node = child.get();
      if (stop == std::string::npos) break;
      start = stop + 1;
    }
    if (node->leaf) throw IoError(fmt::format("[model] tensor '{}' appears twice", name));
    if (!node->children.empty()) {
      throw IoError(fmt::format("[model] '{}' is both a tensor and a prefix of '{}'", name,
                                node->children.begin()->second->name.empty()
                                    ? name + separator + node->children.begin()->first
                                    : node->children.begin()->second->name));
    }
    node->leaf = spec;
    node->name = name;
  }
  if (named.empty()) return Tree<TensorSpec>::dict({});
  // Equal subtrees (every expert of a layer, every layer of a kind) share one stored branch, so
  // the planner decides each once at the cost of a pointer comparison.
  return to_tree(root).share_equal_subtrees();
}

std::vector<std::pair<std::string, TensorSpec>> parse_model_description(std::string_view text,
                                                                        std::string_view source) {
  const json::Document doc = parse_json(text, source);
  const json::Value root = doc.root();
  if (!root.is_object()) {
    throw IoError(fmt::format("[model] {}: expected an object of tensor name -> {{\"shape\": [..], "
                              "\"dtype\": \"BF16\"}}, got {}",
                              source, root.type_name()));
  }
  std::vector<std::pair<std::string, TensorSpec>> out;
  out.reserve(root.size());
  std::unordered_set<std::string_view> seen;
  seen.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string_view name = it.key();
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& what) {
      return IoError(fmt::format("[model] {}: tensor '{}': {}", source, name, what));
    };
    if (!seen.insert(name).second) {
      throw IoError(fmt::format("[model] {}: tensor '{}' appears twice", source, name));
    }
    const json::Value v = it.value();
    if (!v.is_object()) {
      throw bad(fmt::format("expected an object with shape and dtype, got {}", v.type_name()));
    }
    std::optional<json::Value> shape, dtype, logical_axes;
    for (auto f = v.begin(); f != v.end(); ++f) {
      std::optional<json::Value>* slot = f.key() == "shape"          ? &shape
                                         : f.key() == "dtype"        ? &dtype
                                         : f.key() == "logical_axes" ? &logical_axes
                                                                     : nullptr;
      if (slot == nullptr && f.key() != "data_offsets") {
        throw bad(fmt::format("unknown field '{}' (expected shape, dtype, logical_axes)", f.key()));
      }
      if (slot == nullptr) continue;
      if (*slot) throw bad(fmt::format("field '{}' appears twice", f.key()));
      *slot = f.value();
    }
    if (!shape || !shape->is_array()) throw bad("'shape' must be a list of non-negative integers");
    std::vector<std::int64_t> dims;
    dims.reserve(shape->size());
    for (auto d = shape->begin(); d != shape->end(); ++d) {
      if (!(*d).is_uint() || (*d).as_uint() > static_cast<std::uint64_t>(INT64_MAX)) {
        throw bad(fmt::format("shape {} is not a list of non-negative integers",
                              shape->source_text()));
      }
      dims.push_back(static_cast<std::int64_t>((*d).as_uint()));
    }
    if (!dtype || !dtype->is_string()) {
      throw bad("'dtype' must be a string such as \"BF16\" or \"F32\"");
    }
    TensorSpec spec;
    spec.shape = Shape(std::move(dims));
    try {
      spec.dtype = parse_dtype(dtype->str());
    } catch (const SpecError& e) {
      throw bad(e.what());
    }
    if (logical_axes) {
      const json::Value& la = *logical_axes;
      if (!la.is_array() || la.size() != static_cast<std::size_t>(spec.shape.rank())) {
        throw bad(fmt::format("'logical_axes' must be a list of {} names (one per dimension of "
                              "shape {})",
                              spec.shape.rank(), spec.shape.to_string()));
      }
      for (auto n = la.begin(); n != la.end(); ++n) {
        if ((*n).is_null()) {
          spec.logical_axes.emplace_back();
        } else if ((*n).is_string()) {
          spec.logical_axes.emplace_back(std::string((*n).str()));
        } else {
          throw bad(fmt::format("logical axis {} is not a string or null", (*n).source_text()));
        }
      }
    }
    out.emplace_back(std::string(name), std::move(spec));
  }
  return out;
}

std::vector<std::pair<std::string, TensorSpec>> load_model_tensors(const std::filesystem::path& file) {
  const std::string name = file.filename().string();
  if (!std::filesystem::exists(file)) {
    throw IoError(fmt::format("[model] {}: no such file", file.string()));
  }
  if (ends_with(name, ".safetensors")) {
    std::vector<std::pair<std::string, TensorSpec>> out;
    for (auto& e : read_safetensors_header(file).tensors) out.emplace_back(std::move(e.name), std::move(e.spec));
    return out;
  }
  if (ends_with(name, ".safetensors.index.json")) return load_index(file);
  if (ends_with(name, ".json")) return parse_model_description(read_file(file, "model"), file.string());
  throw IoError(fmt::format("[model] {}: unknown model file type (expected .safetensors, "
                            ".safetensors.index.json or .json)",
                            file.string()));
}

Tree<TensorSpec> load_model(const std::filesystem::path& file) {
  return tree_from_names(load_model_tensors(file));
}

}  // namespace shardplan
