#include "shardplan/model_loader.hpp"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/safetensors.hpp"

namespace shardplan {
namespace {

using Json = nlohmann::ordered_json;

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

std::vector<std::pair<std::string, TensorSpec>> load_index(const std::filesystem::path& file) {
  const std::string source = file.string();
  const std::string text = read_file(file, "model");
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::exception& e) {
    throw IoError(fmt::format("[model] {}: not valid JSON: {}", source, e.what()));
  }
  if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object()) {
    throw IoError(fmt::format("[model] {}: expected an object with a 'weight_map' object of "
                              "tensor name -> shard file",
                              source));
  }
  const auto dir = file.parent_path();
  std::map<std::string, std::map<std::string, TensorSpec>> shards;  // shard file -> its tensors
  std::vector<std::pair<std::string, TensorSpec>> out;
  for (auto it = doc["weight_map"].begin(); it != doc["weight_map"].end(); ++it) {
    if (!it->is_string()) {
      throw IoError(fmt::format("[model] {}: weight_map entry '{}' must name a shard file, got {}",
                                source, it.key(), it->type_name()));
    }
    const std::string shard = it->get<std::string>();
    auto found = shards.find(shard);
    if (found == shards.end()) {
      std::map<std::string, TensorSpec> tensors;
      for (auto& e : read_safetensors_header(dir / shard).tensors) {
        tensors.emplace(std::move(e.name), std::move(e.spec));
      }
      found = shards.emplace(shard, std::move(tensors)).first;
    }
    auto t = found->second.find(it.key());
    if (t == found->second.end()) {
      throw IoError(fmt::format("[model] {}: tensor '{}' is mapped to shard '{}', which does not "
                                "hold it",
                                source, it.key(), shard));
    }
    out.emplace_back(it.key(), t->second);
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

std::vector<std::pair<std::string, TensorSpec>> parse_model_description(std::string_view json,
                                                                        std::string_view source) {
  Json doc;
  try {
    doc = Json::parse(json.begin(), json.end());
  } catch (const Json::parse_error& e) {
    throw IoError(fmt::format("[model] {}: not valid JSON (at byte {}): {}", source, e.byte, e.what()));
  } catch (const Json::exception& e) {
    throw IoError(fmt::format("[model] {}: not valid JSON: {}", source, e.what()));
  }
  if (!doc.is_object()) {
    throw IoError(fmt::format("[model] {}: expected an object of tensor name -> {{\"shape\": [..], "
                              "\"dtype\": \"BF16\"}}, got {}",
                              source, doc.type_name()));
  }
  std::vector<std::pair<std::string, TensorSpec>> out;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const Json& v = *it;
    auto bad = [&](const std::string& what) {
      return IoError(fmt::format("[model] {}: tensor '{}': {}", source, name, what));
    };
    if (!v.is_object()) throw bad(fmt::format("expected an object with shape and dtype, got {}", v.type_name()));
    if (!v.contains("shape") || !v["shape"].is_array()) {
      throw bad("'shape' must be a list of non-negative integers");
    }
    std::vector<std::int64_t> dims;
    for (const Json& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
        throw bad(fmt::format("shape {} is not a list of non-negative integers", v["shape"].dump()));
      }
      dims.push_back(d.get<std::int64_t>());
    }
    if (!v.contains("dtype") || !v["dtype"].is_string()) {
      throw bad("'dtype' must be a string such as \"BF16\" or \"F32\"");
    }
    TensorSpec spec;
    try {  // an element count or byte size past int64 is a SpecError naming the shape
      spec.shape = Shape(std::move(dims));
      spec.dtype = parse_dtype(v["dtype"].get<std::string>());
      spec.bytes();
    } catch (const SpecError& e) {
      throw bad(e.what());
    }
    if (v.contains("logical_axes")) {
      const Json& la = v["logical_axes"];
      if (!la.is_array() || la.size() != static_cast<std::size_t>(spec.shape.rank())) {
        throw bad(fmt::format("'logical_axes' must be a list of {} names (one per dimension of "
                              "shape {})",
                              spec.shape.rank(), spec.shape.to_string()));
      }
      for (const Json& n : la) {
        if (n.is_null()) {
          spec.logical_axes.emplace_back();
        } else if (n.is_string()) {
          spec.logical_axes.push_back(n.get<std::string>());
        } else {
          throw bad(fmt::format("logical axis {} is not a string or null", n.dump()));
        }
      }
    }
    for (auto f = v.begin(); f != v.end(); ++f) {
      if (f.key() != "shape" && f.key() != "dtype" && f.key() != "logical_axes" &&
          f.key() != "data_offsets") {
        throw bad(fmt::format("unknown field '{}' (expected shape, dtype, logical_axes)", f.key()));
      }
    }
    out.emplace_back(name, std::move(spec));
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
