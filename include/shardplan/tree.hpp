#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shardplan/detail/hash.hpp"
#include "shardplan/error.hpp"

namespace shardplan {

/// The four kinds of tree node.
enum class NodeKind { kNone, kLeaf, kDict, kList };

/// "none", "leaf", "dict" or "list".
std::string_view to_string(NodeKind kind);
/// Prints to_string(kind).
inline std::ostream& operator<<(std::ostream& os, NodeKind kind) { return os << to_string(kind); }

/// Escapes one key for use in a path: `~` becomes `~0` and `/` becomes `~1` (as in JSON Pointer,
/// RFC 6901), so a key that holds `/` never splits. Thread-safe.
std::string escape_key(std::string_view key);
/// Reverses escape_key. Throws TreeError on a `~` not followed by `0` or `1`.
std::string unescape_key(std::string_view escaped);
/// Joins a path and an already escaped segment with `/` (an empty prefix gives the segment).
std::string join_path(std::string_view prefix, std::string_view escaped_segment);
/// Splits a path at `/` into its unescaped keys; "" gives no keys.
std::vector<std::string> split_path(std::string_view path);
/// The path of a tensor called `name` in the tree its names make (tree_from_names,
/// model_loader.hpp): its segments between separators, each escaped (escape_key), joined with
/// '/' ("h.0.attn" -> "h/0/attn", "a/b.~w" -> "a~1b/~0w"). Thread-safe.
std::string tree_path_of_name(std::string_view name, char separator = '.');

/// A pytree: a leaf holding a T, a dict with string keys, a list, or none (empty).
///
/// Dicts keep their keys sorted (as jax.tree_util does), so flatten order is: dict entries in key
/// order, list elements in index order, depth first; none nodes hold no leaves. Paths join
/// escaped keys and list indices with `/`. A plain value type: copyable, comparable with `==`.
///
///   auto params = Tree<int>::dict({{"w", 1}, {"layers", Tree<int>::list({2, 3})}});
///   params.flatten();  // {"layers/0", 2}, {"layers/1", 3}, {"w", 1}
template <class T>
class Tree {
 public:
  using value_type = T;
  using DictEntry = std::pair<std::string, Tree>;

  /// A none node.
  Tree() = default;
  /// A leaf.
  Tree(T value) : kind_(NodeKind::kLeaf), leaf_(std::move(value)) {}  // NOLINT: implicit
  /// A leaf from anything T is constructible from (a rule pointer, a spec).
  template <class U>
  requires(!std::is_same_v<std::remove_cvref_t<U>, Tree> &&
           !std::is_same_v<std::remove_cvref_t<U>, T> && std::is_constructible_v<T, U&&>)
      Tree(U&& value)  // NOLINT: implicit
      : kind_(NodeKind::kLeaf), leaf_(T(std::forward<U>(value))) {}

  /// A none node.
  static Tree none() { return Tree(); }
  /// A dict; keys are sorted. Throws TreeError on a duplicate key.
  static Tree dict(std::initializer_list<DictEntry> entries) {
    return dict(std::vector<DictEntry>(entries));
  }
  /// A dict from a vector of entries; keys are sorted. Throws TreeError on a duplicate key.
  static Tree dict(std::vector<DictEntry> entries) {
    std::stable_sort(entries.begin(), entries.end(),
                     [](const DictEntry& a, const DictEntry& b) { return a.first < b.first; });
    Tree t;
    t.kind_ = NodeKind::kDict;
    auto b = std::make_shared<Branch>();
    b->keys.reserve(entries.size());
    b->children.reserve(entries.size());
    for (auto& [key, child] : entries) {
      if (!b->keys.empty() && b->keys.back() == key) {
        throw TreeError("[tree] duplicate dict key '" + key + "'");
      }
      b->keys.push_back(std::move(key));
      b->children.push_back(std::move(child));
    }
    t.branch_ = std::move(b);
    return t;
  }
  /// A list.
  static Tree list(std::initializer_list<Tree> items) { return list(std::vector<Tree>(items)); }
  /// A list from a vector.
  static Tree list(std::vector<Tree> items) {
    Tree t;
    t.kind_ = NodeKind::kList;
    t.branch_ = std::make_shared<Branch>();
    t.branch_->children = std::move(items);
    return t;
  }

  NodeKind kind() const { return kind_; }
  bool is_none() const { return kind_ == NodeKind::kNone; }
  bool is_leaf() const { return kind_ == NodeKind::kLeaf; }
  bool is_dict() const { return kind_ == NodeKind::kDict; }
  bool is_list() const { return kind_ == NodeKind::kList; }

  /// The leaf value. Throws TreeError if this node is not a leaf.
  const T& leaf() const {
    if (!is_leaf())
      throw TreeError("[tree] node is a " + std::string(to_string(kind_)) + ", not a leaf");
    return *leaf_;
  }
  T& leaf() {
    if (!is_leaf())
      throw TreeError("[tree] node is a " + std::string(to_string(kind_)) + ", not a leaf");
    return *leaf_;
  }

  /// The leaf value, or nullptr if this node is not a leaf (no throw, for hot loops).
  const T* leaf_ptr() const { return leaf_ ? &*leaf_ : nullptr; }

  /// Number of children of a dict or list (0 for leaves and none).
  std::size_t size() const { return branch_ ? branch_->children.size() : 0; }
  /// Keys of a dict, sorted (empty for other kinds).
  const std::vector<std::string>& keys() const { return branch_ ? branch_->keys : no_keys(); }
  /// Children in flatten order.
  const std::vector<Tree>& children() const { return branch_ ? branch_->children : no_children(); }
  /// Children in flatten order, for changing them: copies of a tree share their branches until
  /// one of them is changed (copy on write), so this first makes the branch this tree's own.
  std::vector<Tree>& children() {
    if (!branch_) {
      branch_ = std::make_shared<Branch>();
    } else if (branch_.use_count() > 1) {
      branch_ = std::make_shared<Branch>(*branch_);
    }
    return branch_->children;
  }

  /// True when this node and `other` are dicts or lists that share one stored branch (a copy, or
  /// equal subtrees merged by share_equal_subtrees), and therefore equal without looking below.
  bool shares_branch_with(const Tree& other) const {
    return branch_ != nullptr && branch_ == other.branch_;
  }

  /// The address of this node's stored branch (shared by copies and merged equal subtrees),
  /// nullptr for leaves and none: a key for memo tables.
  const void* branch_identity() const noexcept { return branch_.get(); }

  /// A tree equal to this one in which equal subtrees share one stored branch (hash-consing), so
  /// that comparing them (as the planner does to decide a repeated subtree once) costs a pointer
  /// comparison. `leaf_hash` hashes a leaf value; leaves compare with `==`. Costs one pass.
  template <class Hash = std::hash<T>>
  Tree share_equal_subtrees(const Hash& leaf_hash = Hash()) const {
    Tree out = *this;
    std::unordered_map<std::size_t, std::vector<std::shared_ptr<Branch>>> table;
    out.intern(table, leaf_hash);
    return out;
  }

  /// The child of a dict under `key`, or nullptr.
  const Tree* find(std::string_view key) const {
    if (!is_dict()) return nullptr;
    auto it = std::lower_bound(keys().begin(), keys().end(), key,
                               [](const std::string& a, std::string_view b) {
                                 return a.compare(0, a.size(), b.data(), b.size()) < 0;
                               });
    if (it == keys().end() || *it != key) return nullptr;
    return &children()[static_cast<std::size_t>(it - keys().begin())];
  }
  /// The child of a dict under `key`. Throws TreeError naming the key and the keys present.
  const Tree& at(std::string_view key) const {
    if (const Tree* c = find(key)) return *c;
    std::string known;
    for (const auto& k : keys()) known += (known.empty() ? "'" : ", '") + k + "'";
    throw TreeError("[tree] no key '" + std::string(key) + "' in " + std::string(to_string(kind_)) +
                    (is_dict() ? " with keys " + known : ""));
  }
  /// The i-th child of a list or dict. Throws TreeError when out of range.
  const Tree& at(std::size_t i) const {
    if (i >= size()) {
      throw TreeError("[tree] index " + std::to_string(i) + " out of range for " +
                      std::string(to_string(kind_)) + " of size " + std::to_string(size()));
    }
    return children()[i];
  }
  /// The child under a path of `/`-joined escaped keys and indices. Throws TreeError.
  const Tree& at_path(std::string_view path) const {
    const Tree* node = this;
    for (const std::string& key : split_path(path)) {
      if (node->is_list()) {
        std::size_t idx = 0;
        bool ok = !key.empty() &&
                  std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
        // Longer digit strings cannot index any list (and would overflow std::stoul).
        ok = ok && key.size() <= 18;
        if (ok) idx = static_cast<std::size_t>(std::stoull(key));
        if (!ok || idx >= node->size()) {
          throw TreeError("[tree] no element '" + key + "' in list of size " +
                          std::to_string(node->size()) + " at path '" + std::string(path) + "'");
        }
        node = &node->children()[idx];
      } else {
        node = &node->at(key);
      }
    }
    return *node;
  }

  /// The path segment of child i: its escaped key in a dict, its index in a list.
  std::string segment(std::size_t i) const {
    return is_dict() ? escape_key(keys()[i]) : std::to_string(i);
  }

  /// Number of leaves below this node.
  std::size_t num_leaves() const {
    if (is_leaf()) return 1;
    std::size_t n = 0;
    for (const auto& c : children()) n += c.num_leaves();
    return n;
  }

  /// Calls f(path, leaf) on every leaf in flatten order; paths start at `prefix`.
  template <class F>
  void for_each_leaf(F&& f, std::string_view prefix = {}) const {
    std::string path(prefix);
    visit_leaves(f, path);
  }

  /// The leaves in flatten order.
  std::vector<T> leaves() const {
    std::vector<T> out;
    out.reserve(num_leaves());
    for_each_leaf([&](const std::string&, const T& v) { out.push_back(v); });
    return out;
  }
  /// (path, leaf) pairs in flatten order.
  std::vector<std::pair<std::string, T>> flatten() const {
    std::vector<std::pair<std::string, T>> out;
    out.reserve(num_leaves());
    for_each_leaf([&](const std::string& p, const T& v) { out.emplace_back(p, v); });
    return out;
  }
  /// Leaf paths in flatten order.
  std::vector<std::string> paths() const {
    std::vector<std::string> out;
    out.reserve(num_leaves());
    for_each_leaf([&](const std::string& p, const T&) { out.push_back(p); });
    return out;
  }

  /// A tree of the same structure with f(leaf) at each leaf.
  template <class F>
  auto map(F&& f) const -> Tree<std::invoke_result_t<F&, const T&>> {
    using R = std::invoke_result_t<F&, const T&>;
    return map_impl<R>([&](const std::string&, const T& v) { return f(v); }, nullptr);
  }
  /// A tree of the same structure with f(path, leaf) at each leaf.
  template <class F>
  auto map_with_path(F&& f, std::string_view prefix = {}) const
      -> Tree<std::invoke_result_t<F&, const std::string&, const T&>> {
    using R = std::invoke_result_t<F&, const std::string&, const T&>;
    std::string path(prefix);
    return map_impl<R>(f, &path);
  }

  /// A tree with this structure whose leaves are taken, in flatten order, from `leaves`.
  /// Throws TreeError when the count differs.
  template <class U>
  Tree<U> unflatten(std::vector<U> leaves) const {
    if (leaves.size() != num_leaves()) {
      throw TreeError("[tree] unflatten got " + std::to_string(leaves.size()) +
                      " leaves for a structure with " + std::to_string(num_leaves()));
    }
    std::size_t next = 0;
    return map_impl<U>([&](const std::string&, const T&) { return std::move(leaves[next++]); },
                       nullptr);
  }

  /// True when both trees have the same kinds, keys and list lengths (leaf values ignored).
  template <class U>
  bool same_structure(const Tree<U>& other) const {
    if (kind() != other.kind() || size() != other.size()) return false;
    if (is_dict() && keys() != other.keys()) return false;
    for (std::size_t i = 0; i < size(); ++i) {
      if (!children()[i].same_structure(other.children()[i])) return false;
    }
    return true;
  }

  /// Leaves and structure equal.
  friend bool operator==(const Tree& a, const Tree& b) {
    if (a.kind_ != b.kind_) return false;
    if (a.is_leaf()) return *a.leaf_ == *b.leaf_;
    return a.branch_ == b.branch_ || (a.keys() == b.keys() && a.children() == b.children());
  }

  /// Prints `{a: 1, b: [2, 3]}`, `None` for none nodes; leaves use their operator<<.
  friend std::ostream& operator<<(std::ostream& os, const Tree& t) {
    switch (t.kind_) {
      case NodeKind::kNone:
        return os << "None";
      case NodeKind::kLeaf:
        return os << *t.leaf_;
      case NodeKind::kDict:
        os << "{";
        for (std::size_t i = 0; i < t.size(); ++i) {
          os << (i ? ", " : "") << t.keys()[i] << ": " << t.children()[i];
        }
        return os << "}";
      case NodeKind::kList:
        os << "[";
        for (std::size_t i = 0; i < t.size(); ++i) os << (i ? ", " : "") << t.children()[i];
        return os << "]";
    }
    return os;
  }

 private:
  template <class U>
  friend class Tree;

  template <class F>
  void visit_leaves(F& f, std::string& path) const {
    if (is_leaf()) {
      f(static_cast<const std::string&>(path), *leaf_);
      return;
    }
    const std::size_t base = path.size();
    for (std::size_t i = 0; i < size(); ++i) {
      if (base) path += '/';
      path += segment(i);
      children()[i].visit_leaves(f, path);
      path.resize(base);
    }
  }

  // `path` is null when the callback ignores paths, which saves building them.
  template <class R, class F>
  Tree<R> map_impl(F&& f, std::string* path) const {
    Tree<R> out;
    out.kind_ = kind_;
    if (is_leaf()) {
      static const std::string kEmpty;
      out.leaf_.emplace(f(path ? *path : kEmpty, *leaf_));
      return out;
    }
    if (!branch_) return out;
    out.branch_ = std::make_shared<typename Tree<R>::Branch>();
    out.branch_->keys = branch_->keys;
    auto& out_children = out.branch_->children;
    out_children.reserve(size());
    const std::size_t base = path ? path->size() : 0;
    for (std::size_t i = 0; i < size(); ++i) {
      if (path) {
        if (base) *path += '/';
        *path += segment(i);
      }
      out_children.push_back(children()[i].template map_impl<R>(f, path));
      if (path) path->resize(base);
    }
    return out;
  }

  // A dict's or list's keys and children, shared between copies (copy on write).
  struct Branch {
    std::vector<std::string> keys;  // dicts only
    std::vector<Tree> children;
  };

  static const std::vector<std::string>& no_keys() {
    static const std::vector<std::string> empty;
    return empty;
  }
  static const std::vector<Tree>& no_children() {
    static const std::vector<Tree> empty;
    return empty;
  }

  // Replaces this node's branch by an equal one already in `table` (children first); returns
  // the node's structural hash.
  template <class Hash>
  std::size_t intern(std::unordered_map<std::size_t, std::vector<std::shared_ptr<Branch>>>& table,
                     const Hash& leaf_hash) {
    if (is_none()) return 0x51ed270b27a1c3d5ULL;
    if (is_leaf()) return detail::hash_combine(0x2545f4914f6cdd1dULL, leaf_hash(*leaf_));
    std::size_t h = detail::hash_combine(static_cast<std::size_t>(kind_), size());
    std::vector<Tree>& kids = children();
    for (std::size_t i = 0; i < kids.size(); ++i) {
      if (is_dict()) h = detail::hash_combine(h, std::hash<std::string>()(branch_->keys[i]));
      h = detail::hash_combine(h, kids[i].intern(table, leaf_hash));
    }
    auto& bucket = table[h];
    for (const auto& candidate : bucket) {
      if (candidate->keys == branch_->keys && same_children(candidate->children, kids)) {
        branch_ = candidate;
        return h;
      }
    }
    bucket.push_back(branch_);
    return h;
  }

  // Children already interned: equal subtrees share their branch.
  static bool same_children(const std::vector<Tree>& a, const std::vector<Tree>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i].kind_ != b[i].kind_) return false;
      if (a[i].is_leaf() ? !(*a[i].leaf_ == *b[i].leaf_) : a[i].branch_ != b[i].branch_) {
        return false;
      }
    }
    return true;
  }

  NodeKind kind_ = NodeKind::kNone;
  std::optional<T> leaf_;
  std::shared_ptr<Branch> branch_;  // dicts and lists
};

/// Describes, for the first place where `prefix` is not a prefix of `full`, the path and what each
/// side has there; empty when it is a prefix. A leaf or none node of `prefix` covers any subtree.
template <class P, class T>
std::string prefix_mismatch(const Tree<P>& prefix, const Tree<T>& full, std::string path = {}) {
  if (prefix.is_leaf() || prefix.is_none()) return {};
  auto where = [&] { return path.empty() ? std::string("the root") : "'" + path + "'"; };
  auto describe = [](const auto& t) {
    std::string s(to_string(t.kind()));
    if (t.is_dict()) {
      s += " with keys [";
      for (std::size_t i = 0; i < t.keys().size(); ++i) s += (i ? ", " : "") + t.keys()[i];
      s += "]";
    } else if (t.is_list()) {
      s += " of length " + std::to_string(t.size());
    }
    return s;
  };
  if (prefix.kind() != full.kind() || prefix.size() != full.size() ||
      (prefix.is_dict() && prefix.keys() != full.keys())) {
    return "at " + where() + " the prefix tree has a " + describe(prefix) + " but the tree has a " +
           describe(full);
  }
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    std::string child = path.empty() ? prefix.segment(i) : path + "/" + prefix.segment(i);
    std::string m = prefix_mismatch(prefix.children()[i], full.children()[i], child);
    if (!m.empty()) return m;
  }
  return {};
}

/// Maps a prefix tree over a full tree: at each leaf (or none node) p of `prefix`, at path `path`,
/// calls f(path, p_or_null, subtree_of_full) which returns the Tree<R> that replaces that subtree.
/// `p_or_null` is nullptr for a none node of the prefix. Throws TreeError (naming the first path
/// where the structures differ and what each side has there) when `prefix` is not a prefix.
template <class R, class P, class T, class F>
Tree<R> map_prefix(const Tree<P>& prefix, const Tree<T>& full, F&& f, std::string path = {}) {
  if (prefix.is_leaf()) return f(path, &prefix.leaf(), full);
  if (prefix.is_none()) return f(path, static_cast<const P*>(nullptr), full);
  // Only this level is compared here (the recursion checks the levels below, in flatten order),
  // so a deep rule tree costs one pass rather than one pass per level.
  if (prefix.kind() != full.kind() || prefix.size() != full.size() ||
      (prefix.is_dict() && prefix.keys() != full.keys())) {
    throw TreeError("[tree] not a prefix: " + prefix_mismatch(prefix, full, path));
  }
  std::vector<Tree<R>> kids;
  kids.reserve(full.size());
  for (std::size_t i = 0; i < full.size(); ++i) {
    std::string child = path.empty() ? full.segment(i) : path + "/" + full.segment(i);
    kids.push_back(map_prefix<R>(prefix.children()[i], full.children()[i], f, std::move(child)));
  }
  if (full.is_list()) return Tree<R>::list(std::move(kids));
  std::vector<typename Tree<R>::DictEntry> entries;
  entries.reserve(kids.size());
  for (std::size_t i = 0; i < kids.size(); ++i)
    entries.emplace_back(full.keys()[i], std::move(kids[i]));
  return Tree<R>::dict(std::move(entries));
}

}  // namespace shardplan
