#include "shardplan/model_loader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "input_file.hpp"
#include "json_impl.hpp"
#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/safetensors.hpp"

namespace shardplan {
namespace {

namespace json = detail::json;

/// A tensor name of more parts is rejected: trees are walked recursively, and real names have
/// fewer than 20.
constexpr std::size_t kMaxNameParts = 256;

/// A node of the name tree while it is built: nodes live in one vector, children are linked
/// in insertion order and found through one hash map keyed by (parent, key), so building is
/// linear in the total length of the names.
struct Node {
  std::string_view key;
  std::int32_t parent = -1;
  std::int32_t first_child = -1;
  std::int32_t last_child = -1;
  std::int32_t next_sibling = -1;
  std::int32_t leaf = -1;  // index of the tensor, for a leaf
  std::int32_t children = 0;
};

/// The index of a list element: a key "0".."n-1" without leading zeros, or -1.
std::int64_t list_index(std::string_view key, std::size_t n) {
  if (key.empty() || key.size() > 9 || (key.size() > 1 && key[0] == '0')) return -1;
  std::size_t v = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + static_cast<std::size_t>(c - '0');
  }
  return v < n ? static_cast<std::int64_t>(v) : -1;
}

class TreeBuilder {
 public:
  TreeBuilder(const std::vector<std::pair<std::string, TensorSpec>>& named, char separator)
      : named_(named), separator_(separator) {
    nodes_.reserve(named.size() * 2 + 1);
    nodes_.emplace_back();
  }

  /// Adds every name, checking that none is empty in a part, repeated, or a prefix of another.
  void add_all() {
    for (std::size_t i = 0; i < named_.size(); ++i) add(static_cast<std::int32_t>(i));
  }

  /// The tree, built bottom-up (no recursion: a name may have many parts), with equal subtrees
  /// sharing one stored branch (as Tree::share_equal_subtrees makes them): each node is looked up
  /// by its keys and its children's identities before a branch is made for it, so a model of
  /// 58 equal layers of 256 equal experts stores one expert.
  Tree<TensorSpec> build() {
    // A node's identity: 2 * index into leaves or branches, + 1 for a leaf.
    std::vector<std::int64_t> id(nodes_.size());
    std::unordered_map<TensorSpec, std::int64_t> leaf_ids;
    std::vector<const TensorSpec*> leaves;
    std::vector<std::int32_t> kids;
    for (std::size_t n = nodes_.size(); n-- > 0;) {
      const Node& node = nodes_[n];
      if (node.leaf >= 0) {
        const TensorSpec& spec = named_[static_cast<std::size_t>(node.leaf)].second;
        auto [it, inserted] = leaf_ids.try_emplace(spec, static_cast<std::int64_t>(leaves.size()));
        if (inserted) leaves.push_back(&spec);
        id[n] = 2 * it->second + 1;
        continue;
      }
      kids.clear();
      for (std::int32_t c = node.first_child; c >= 0;
           c = nodes_[static_cast<std::size_t>(c)].next_sibling) {
        kids.push_back(c);
      }
      const bool list = order_children(kids);
      id[n] = 2 * branch_id(kids, list, id, leaves);
    }
    return branches_[static_cast<std::size_t>(id[0] / 2)].tree;
  }

 private:
  struct Branch {
    bool list;
    std::vector<std::pair<std::string_view, std::int64_t>> children;  // key ("" in a list), id
    Tree<TensorSpec> tree;
  };

  /// Puts `kids` in the tree's order; true when they are a list (keys exactly "0".."n-1", no
  /// leading zeros: layers flatten in numeric order), else they are sorted by key.
  bool order_children(std::vector<std::int32_t>& kids) {
    std::vector<std::int32_t>& slots = slots_scratch_;
    slots.assign(kids.size(), -1);
    bool list = !kids.empty();
    for (std::int32_t c : kids) {
      const std::int64_t v = list_index(nodes_[static_cast<std::size_t>(c)].key, kids.size());
      if (v < 0 || slots[static_cast<std::size_t>(v)] >= 0) {
        list = false;
        break;
      }
      slots[static_cast<std::size_t>(v)] = c;
    }
    if (list) {
      kids.swap(slots);
    } else {
      std::sort(kids.begin(), kids.end(), [&](std::int32_t a, std::int32_t b) {
        return nodes_[static_cast<std::size_t>(a)].key < nodes_[static_cast<std::size_t>(b)].key;
      });
    }
    return list;
  }

  /// The index in branches_ of the branch with these children, made if new.
  std::int64_t branch_id(const std::vector<std::int32_t>& kids, bool list,
                         const std::vector<std::int64_t>& id,
                         const std::vector<const TensorSpec*>& leaves) {
    std::vector<std::pair<std::string_view, std::int64_t>>& sig = sig_;
    sig.clear();
    std::uint64_t h = list ? 0x9E3779B97F4A7C15ull : 0xC2B2AE3D27D4EB4Full;
    for (std::int32_t c : kids) {
      const std::string_view key =
          list ? std::string_view() : nodes_[static_cast<std::size_t>(c)].key;
      const std::int64_t cid = id[static_cast<std::size_t>(c)];
      sig.emplace_back(key, cid);
      h = (h ^ std::hash<std::string_view>()(key)) * 0x100000001B3ull;
      h = (h ^ static_cast<std::uint64_t>(cid)) * 0x100000001B3ull;
    }
    auto& bucket = branch_table_[h];
    for (std::int64_t b : bucket) {
      const Branch& other = branches_[static_cast<std::size_t>(b)];
      if (other.list == list && other.children == sig) return b;
    }
    auto child_tree = [&](std::int64_t cid) {
      return cid % 2 ? Tree<TensorSpec>(*leaves[static_cast<std::size_t>(cid / 2)])
                     : branches_[static_cast<std::size_t>(cid / 2)].tree;
    };
    Tree<TensorSpec> tree;
    if (list) {
      std::vector<Tree<TensorSpec>> items;
      items.reserve(sig.size());
      for (const auto& [key, cid] : sig) items.push_back(child_tree(cid));
      tree = Tree<TensorSpec>::list(std::move(items));
    } else {
      std::vector<Tree<TensorSpec>::DictEntry> entries;
      entries.reserve(sig.size());
      for (const auto& [key, cid] : sig) entries.emplace_back(std::string(key), child_tree(cid));
      tree = Tree<TensorSpec>::dict(std::move(entries));
    }
    const auto b = static_cast<std::int64_t>(branches_.size());
    branches_.push_back(Branch{list, sig, std::move(tree)});
    bucket.push_back(b);
    return b;
  }

  /// The full name of the tensors under node `n`, for messages: its first leaf's name.
  std::string some_name_under(std::int32_t n) const {
    while (nodes_[static_cast<std::size_t>(n)].leaf < 0)
      n = nodes_[static_cast<std::size_t>(n)].first_child;
    return named_[static_cast<std::size_t>(nodes_[static_cast<std::size_t>(n)].leaf)].first;
  }

  void add(std::int32_t tensor) {
    const std::string& name = named_[static_cast<std::size_t>(tensor)].first;
    std::int32_t node = 0;
    std::size_t start = 0;
    std::size_t depth = 0;
    // Checkpoints list names in a mostly sorted order: the parts shared with the previous name
    // lead to the nodes found for it, without a lookup.
    bool shared = true;
    while (true) {
      const std::size_t stop = name.find(separator_, start);
      const std::string_view key = std::string_view(name).substr(
          start, stop == std::string::npos ? std::string::npos : stop - start);
      if (key.empty()) {
        throw IoError(fmt::format("[model] tensor name '{}' has an empty part", name));
      }
      if (++depth > kMaxNameParts) {
        throw IoError(fmt::format("[model] tensor name '{}' has more than {} parts",
                                  name.substr(0, 200) + (name.size() > 200 ? "..." : ""),
                                  kMaxNameParts));
      }
      if (nodes_[static_cast<std::size_t>(node)].leaf >= 0) {
        throw IoError(fmt::format(
            "[model] '{}' is both a tensor and a prefix of '{}'",
            named_[static_cast<std::size_t>(nodes_[static_cast<std::size_t>(node)].leaf)].first,
            name));
      }
      const std::size_t d = depth - 1;
      if (shared && d < prev_keys_.size() && prev_keys_[d] == key) {
        node = prev_nodes_[d];
      } else {
        shared = false;
        node = child(node, key);
        prev_keys_.resize(d);
        prev_nodes_.resize(d);
        prev_keys_.push_back(key);
        prev_nodes_.push_back(node);
      }
      if (stop == std::string::npos) break;
      start = stop + 1;
    }
    Node& n = nodes_[static_cast<std::size_t>(node)];
    if (n.leaf >= 0) throw IoError(fmt::format("[model] tensor '{}' appears twice", name));
    if (n.first_child >= 0) {
      throw IoError(fmt::format("[model] '{}' is both a tensor and a prefix of '{}'", name,
                                some_name_under(n.first_child)));
    }
    n.leaf = tensor;
  }

  /// The child `key` of `parent`, made if new. The (parent, key) -> node table is open
  /// addressing in one array.
  std::int32_t child(std::int32_t parent, std::string_view key) {
    const std::uint64_t h = hash(parent, key);
    if (2 * (nodes_.size() + 1) > slots_.size()) grow();
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = static_cast<std::size_t>(h ^ (h >> 29)) & mask;
    for (; slots_[i] >= 0; i = (i + 1) & mask) {
      const Node& n = nodes_[static_cast<std::size_t>(slots_[i])];
      if (n.parent == parent && n.key == key) return slots_[i];
    }
    const auto id = static_cast<std::int32_t>(nodes_.size());
    slots_[i] = id;
    Node fresh;
    fresh.key = key;
    fresh.parent = parent;
    nodes_.push_back(fresh);
    Node& p = nodes_[static_cast<std::size_t>(parent)];
    if (p.last_child >= 0) {
      nodes_[static_cast<std::size_t>(p.last_child)].next_sibling = id;
    } else {
      p.first_child = id;
    }
    p.last_child = id;
    ++p.children;
    return id;
  }

  static std::uint64_t hash(std::int32_t parent, std::string_view key) {
    return std::hash<std::string_view>()(key) ^
           static_cast<std::uint64_t>(parent) * 0x9E3779B97F4A7C15ull;
  }

  void grow() {
    std::vector<std::int32_t> slots(std::max<std::size_t>(64, slots_.size() * 2), -1);
    const std::size_t mask = slots.size() - 1;
    for (std::size_t n = 1; n < nodes_.size(); ++n) {
      const std::uint64_t h = hash(nodes_[n].parent, nodes_[n].key);
      std::size_t i = static_cast<std::size_t>(h ^ (h >> 29)) & mask;
      while (slots[i] >= 0) i = (i + 1) & mask;
      slots[i] = static_cast<std::int32_t>(n);
    }
    slots_ = std::move(slots);
  }

  const std::vector<std::pair<std::string, TensorSpec>>& named_;
  char separator_;
  std::vector<Node> nodes_;
  std::vector<std::int32_t> slots_;  // node ids by hash of (parent, key); -1 free
  std::vector<Branch> branches_;     // distinct branches, children before parents
  std::vector<std::pair<std::string_view, std::int64_t>> sig_;  // scratch: a node's children
  std::vector<std::int32_t> slots_scratch_;                     // scratch: order_children
  std::unordered_map<std::uint64_t, std::vector<std::int64_t>> branch_table_;  // by hash
  std::vector<std::string_view> prev_keys_;  // the parts of the previous name
  std::vector<std::int32_t> prev_nodes_;     // and their nodes
};

std::string read_file(const std::filesystem::path& file, std::string_view what) {
  return detail::read_input_file(file, what);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

/// Parses JSON text, naming the source and the byte of a syntax error.
json::Document parse_json(std::string_view text, std::string_view source) {
  try {
    return json::Document(text);
  } catch (const json::SyntaxError& e) {
    throw IoError(
        fmt::format("[model] {}: not valid JSON (at byte {}): {}", source, e.byte, e.what()));
  }
}

/// A shard file named by an index must lie in the index's directory or below it: a relative
/// path without ".." parts. The check is on the name only; symbolic links are followed, as in
/// the Hugging Face cache, whose snapshot files link to its blobs folder.
void check_shard_name(std::string_view source, std::string_view tensor, std::string_view shard) {
  const std::filesystem::path p{std::string(shard)};
  auto bad = [&](std::string_view why) {
    // A NUL shown as \x00: in the message it would end the text there.
    std::string name;
    for (const char c : shard) name += c == '\0' ? std::string("\\x00") : std::string(1, c);
    return IoError(
        fmt::format("[model] {}: tensor '{}' is mapped to shard file '{}', {}; shard "
                    "files must be relative paths inside the index's directory",
                    source, tensor, name, why));
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
    throw IoError(
        fmt::format("[model] {}: expected an object with a 'weight_map' object of "
                    "tensor name -> shard file",
                    source));
  }
  const auto dir = file.parent_path();
  // shard file -> its tensors
  std::unordered_map<std::string_view, std::unordered_map<std::string, TensorSpec>> shards;
  json::KeySet seen(weight_map->size());
  std::vector<std::pair<std::string, TensorSpec>> out;
  out.reserve(weight_map->size());
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    const std::string_view name = it.key();
    if (!it.value().is_string()) {
      throw IoError(fmt::format("[model] {}: weight_map entry '{}' must name a shard file, got {}",
                                source, name, it.value().type_name()));
    }
    if (!seen.insert(name)) {
      throw IoError(
          fmt::format("[model] {}: tensor '{}' appears twice in weight_map", source, name));
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
      throw IoError(
          fmt::format("[model] {}: tensor '{}' is mapped to shard '{}', which does not "
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
  if (named.empty()) return Tree<TensorSpec>::dict({});
  TreeBuilder builder(named, separator);
  builder.add_all();
  // Equal subtrees (every expert of a layer, every layer of a kind) share one stored branch, so
  // the planner decides each once at the cost of a pointer comparison.
  return builder.build();
}

namespace {

/// One member of a model description as a tensor (the checks of parse_model_description).
/// `dtypes` caches the dtype texts seen (a checkpoint names few), `dims` is scratch.
TensorSpec tensor_of(json::Value::Iterator it, std::string_view source,
                     std::vector<std::pair<std::string_view, DType>>& dtypes,
                     std::vector<std::int64_t>& dims) {
  const std::string_view name = it.key();
  auto bad = [&](const std::string& what) {
    return IoError(fmt::format("[model] {}: tensor '{}': {}", source, name, what));
  };
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
  dims.clear();
  for (auto d = shape->begin(); d != shape->end(); ++d) {
    if (!(*d).is_uint() || (*d).as_uint() > static_cast<std::uint64_t>(INT64_MAX)) {
      throw bad(
          fmt::format("shape {} is not a list of non-negative integers", shape->source_text()));
    }
    dims.push_back(static_cast<std::int64_t>((*d).as_uint()));
  }
  if (!dtype || !dtype->is_string()) {
    throw bad("'dtype' must be a string such as \"BF16\" or \"F32\"");
  }
  TensorSpec spec;
  try {  // an element count past int64 is a SpecError naming the shape
    spec.shape = Shape(dims);
  } catch (const SpecError& e) {
    throw bad(e.what());
  }
  // A checkpoint names few dtypes: each distinct text is parsed once (looked up by value).
  auto known = std::find_if(dtypes.begin(), dtypes.end(),
                            [&](const auto& d) { return d.first == dtype->str(); });
  if (known == dtypes.end()) {
    try {
      known = dtypes.emplace(dtypes.end(), dtype->str(), parse_dtype(dtype->str()));
    } catch (const SpecError& e) {
      throw bad(e.what());
    }
  }
  spec.dtype = known->second;
  try {  // and so is a byte size past int64
    spec.bytes();
  } catch (const SpecError& e) {
    throw bad(e.what());
  }
  if (logical_axes) {
    const json::Value& la = *logical_axes;
    if (!la.is_array() || la.size() != static_cast<std::size_t>(spec.shape.rank())) {
      throw bad(
          fmt::format("'logical_axes' must be a list of {} names (one per dimension of "
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
  return spec;
}

}  // namespace

std::vector<std::pair<std::string, TensorSpec>> parse_model_description(std::string_view text,
                                                                        std::string_view source) {
  const json::Document doc = parse_json(text, source);
  const json::Value root = doc.root();
  if (!root.is_object()) {
    throw IoError(
        fmt::format("[model] {}: expected an object of tensor name -> {{\"shape\": [..], "
                    "\"dtype\": \"BF16\"}}, got {}",
                    source, root.type_name()));
  }
  // The members in order (without __metadata__), and the first that repeats a name.
  std::vector<json::Value::Iterator> members;
  members.reserve(root.size());
  json::KeySet seen(root.size());
  std::size_t first_repeat = SIZE_MAX;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string_view name = it.key();
    if (name == "__metadata__") continue;
    if (!seen.insert(name) && first_repeat == SIZE_MAX) first_repeat = members.size();
    members.push_back(it);
  }
  // Each member converted on its own (two threads share a large description); the error
  // reported is the one the serial loop would meet first: the first member that repeats a
  // name or fails a check, a repeat before a failed check of the same member.
  const std::size_t n = std::min(members.size(), first_repeat);
  std::vector<std::pair<std::string, TensorSpec>> out(n);
  struct Part {
    std::size_t begin, end;
    std::size_t failed = SIZE_MAX;  // the first member that failed, and why
    std::exception_ptr error;
  };
  auto convert = [&](Part& part) {
    std::vector<std::pair<std::string_view, DType>> dtypes;
    std::vector<std::int64_t> dims;
    for (std::size_t k = part.begin; k < part.end; ++k) {
      try {
        out[k].second = tensor_of(members[k], source, dtypes, dims);
        out[k].first = std::string(members[k].key());
      } catch (...) {
        part.failed = k;
        part.error = std::current_exception();
        return;
      }
    }
  };
  constexpr std::size_t kParallelFrom = 16384;  // members; fewer are converted on one thread
  Part parts[2] = {{0, n, SIZE_MAX, nullptr}, {n, n, SIZE_MAX, nullptr}};
  if (n >= kParallelFrom && std::thread::hardware_concurrency() >= 2) {
    parts[0].end = parts[1].begin = n / 2;
    std::thread second([&] { convert(parts[1]); });
    convert(parts[0]);
    second.join();
  } else {
    convert(parts[0]);
  }
  for (const Part& part : parts) {
    if (part.error) std::rethrow_exception(part.error);  // parts[0] holds the earlier members
  }
  if (first_repeat != SIZE_MAX) {
    throw IoError(
        fmt::format("[model] {}: tensor '{}' appears twice", source, members[first_repeat].key()));
  }
  return out;
}

std::vector<std::pair<std::string, TensorSpec>> load_model_tensors(
    const std::filesystem::path& file) {
  const std::string name = file.filename().string();
  std::error_code ec;  // (a link loop or a permission error: the reader below names it)
  if (!std::filesystem::exists(file, ec) && !ec) {
    throw IoError(fmt::format("[model] {}: no such file", file.string()));
  }
  if (ends_with(name, ".safetensors")) {
    std::vector<std::pair<std::string, TensorSpec>> out;
    for (auto& e : read_safetensors_header(file).tensors)
      out.emplace_back(std::move(e.name), std::move(e.spec));
    return out;
  }
  if (ends_with(name, ".safetensors.index.json")) return load_index(file);
  if (ends_with(name, ".json"))
    return parse_model_description(read_file(file, "model"), file.string());
  throw IoError(
      fmt::format("[model] {}: unknown model file type (expected .safetensors, "
                  ".safetensors.index.json or .json)",
                  file.string()));
}

Tree<TensorSpec> load_model(const std::filesystem::path& file) {
  const auto named = load_model_tensors(file);
  try {
    return tree_from_names(named);
  } catch (const IoError& e) {  // the names' conflict, with the file that has them
    std::string_view what = e.what();
    if (what.starts_with("[model] ")) what.remove_prefix(8);
    throw IoError(fmt::format("[model] {}: {}", file.string(), what));
  }
}

}  // namespace shardplan
