#include "shardplan/mesh_sharding_helper.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <deque>
#include <exception>
#include <unordered_map>

#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"
#include "shardplan/tree.hpp"

namespace shardplan {
namespace {

// One rule-tree leaf while planning: what it is and how often each of its entries decided.
struct RuleSlot {
  int index = -1;
  std::string path;
  const RuleLeaf* leaf = nullptr;  // null for a none node of the rule tree
  std::string name;
  std::vector<std::string> labels;
  std::vector<std::int64_t> entry_hits;
  std::vector<int> activation_entries;  // the rule's ShardingRule::activation_entries()
  std::int64_t leaves = 0;
  const PathAutomaton* automaton = nullptr;  // the rule's, when it has one
};

// Short keys ("weight", "0", "experts") dominate model trees: compare them inline rather than
// through a memcmp call.
inline bool same_key(const std::string& a, const std::string& b) {
  const std::size_t n = a.size();
  if (n != b.size()) return false;
  const char* x = a.data();
  const char* y = b.data();
  if (n > 24) return std::memcmp(x, y, n) == 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (x[i] != y[i]) return false;
  }
  return true;
}

inline bool same_spec(const TensorSpec& a, const TensorSpec& b) {
  if (a.dtype != b.dtype || !(a.shape == b.shape)) return false;
  if (a.logical_axes.empty() && b.logical_axes.empty()) return true;
  return a.logical_axes == b.logical_axes;
}

/// True when two subtrees have the same kinds, keys and leaf specs: a rule that exposes a
/// PathAutomaton decides them alike when reached in the same state. Subtrees that share their
/// branch (Tree::share_equal_subtrees, as the model loaders build them) are equal at once;
/// others are compared node by node, which is then most of what resolve() costs on a large
/// model, so it is written for speed.
bool same_subtree(const Tree<TensorSpec>& a, const Tree<TensorSpec>& b) {
  if (&a == &b || a.shares_branch_with(b)) return true;
  if (a.kind() != b.kind()) return false;
  if (a.is_leaf()) return same_spec(*a.leaf_ptr(), *b.leaf_ptr());
  const std::size_t n = a.size();
  if (n != b.size()) return false;
  if (a.is_dict()) {
    const std::string* ka = a.keys().data();
    const std::string* kb = b.keys().data();
    for (std::size_t i = 0; i < n; ++i) {
      if (!same_key(ka[i], kb[i])) return false;
    }
  }
  const Tree<TensorSpec>* ca = a.children().data();
  const Tree<TensorSpec>* cb = b.children().data();
  // The walk is bound by memory latency (each dict holds its keys and children in two heap
  // blocks): ask for the children's blocks before comparing the first of them.
  for (std::size_t i = 0; i < n; ++i) {
    __builtin_prefetch(cb[i].keys().data());
    __builtin_prefetch(cb[i].children().data());
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (!same_subtree(ca[i], cb[i])) return false;
  }
  return true;
}

std::string rule_name(const RuleLeaf* leaf) {
  if (leaf == nullptr) return "None";
  if (const auto* r = std::get_if<RulePtr>(leaf)) return *r ? (*r)->name() : "null rule";
  if (std::holds_alternative<PartitionSpec>(*leaf)) return "PartitionSpec";
  if (std::holds_alternative<Replicated>(*leaf)) return "Replicated";
  return "Unspecified";
}

/// Appends child i's path segment (escaped key or index) without a temporary string.
void append_segment(std::string& path, const Tree<TensorSpec>& node, std::size_t i) {
  if (!path.empty()) path += '/';
  if (node.is_dict()) {
    const std::string& key = node.keys()[i];
    bool plain = true;
    for (const char c : key) plain &= (c != '~') & (c != '/');
    if (plain) {
      path += key;
    } else {
      path += escape_key(key);
    }
  } else {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, i);
    path.append(buf, r.ptr);
  }
}

// A spec seen while planning, with its sharding and the last shape it was applied to: leaves
// repeat a few specs and shapes many times (every expert of every layer), so the checks and the
// shard shape are computed once per change.
struct SpecEntry {
  SpecEntry(int i, PartitionSpec s, NamedSharding ns)
      : index(i), spec(std::move(s)), sharding(std::move(ns)) {}
  int index = 0;  // position in the planner's cache
  PartitionSpec spec;
  NamedSharding sharding;
  std::uint64_t validated_ranks = 0;  // bit r: validated for rank r
  // The shard shapes of the last few global shapes seen with this spec (a spec often serves a
  // weight and its scale, alternately), replaced round robin.
  struct Seen {
    Shape global;
    Shape shard;
    std::int64_t shard_numel = 0;
  };
  static constexpr std::size_t kSeen = 4;
  std::array<Seen, kSeen> seen{};
  std::size_t num_seen = 0;
  std::size_t next_slot = 0;

  const Seen& shard_of(const Shape& global, std::string_view path) {
    for (std::size_t i = 0; i < num_seen; ++i) {
      if (seen[i].global == global) return seen[i];
    }
    Seen s{global, sharding.shard_shape(global, path), 0};
    s.shard_numel = s.shard.numel();
    const std::size_t slot = num_seen < kSeen ? num_seen++ : next_slot++ % kSeen;
    seen[slot] = std::move(s);
    return seen[slot];
  }
};

/// Runs a rule's apply() or explain(), which may be a user's code. An exception of any type
/// comes out as a RuleError (a SpecError stays a SpecError) naming the leaf, its shape and the
/// rule (`where()`, built only for the message), with the original nested in it
/// (std::rethrow_if_nested).
template <class F, class Where>
auto call_rule(F&& f, std::string_view leaf, const Shape& shape, const Where& where)
    -> decltype(f()) {
  try {
    return f();
  } catch (const RuleError& e) {
    const std::string rule = where();
    std::throw_with_nested(RuleError(fmt::format("{} (leaf '{}', {})", e.what(), leaf, rule)));
  } catch (const SpecError& e) {
    const std::string rule = where();
    std::throw_with_nested(SpecError(fmt::format("{} (leaf '{}', {})", e.what(), leaf, rule)));
  } catch (const std::exception& e) {
    const std::string rule = where();
    std::throw_with_nested(RuleError(fmt::format("[plan] {} failed on leaf '{}' (shape {}): {}",
                                                 rule, leaf, shape.to_string(), e.what())));
  } catch (...) {
    const std::string rule = where();
    std::throw_with_nested(RuleError(
        fmt::format("[plan] {} failed on leaf '{}' (shape {}): it threw an exception that is not "
                    "a std::exception",
                    rule, leaf, shape.to_string())));
  }
}

class Planner {
 public:
  /// What to produce per leaf: a report row (plan), or only the index of the leaf's distinct
  /// sharding (resolve, match).
  enum class Output { kReport, kIndices };
  Planner(const Mesh& mesh, Uneven uneven, Output output)
      : mesh_(mesh),
        uneven_(uneven),
        fill_report_(output == Output::kReport),
        indices_only_(output == Output::kIndices),
        memo_enabled_(output == Output::kIndices) {}

  void walk(const RuleTree& rules, const Tree<TensorSpec>& data) {
    if (std::string m = prefix_mismatch(rules, data); !m.empty()) {
      throw TreeError("[plan] the rule tree is not a prefix of the data tree: " + m);
    }
    if (fill_report_) leaves.reserve(data.num_leaves());
    std::string path;
    path.reserve(256);
    walk_rules(rules, data, path);
  }

  std::vector<LeafPlan> leaves;
  std::vector<std::int32_t> indices;
  std::vector<RuleSlot> slots;

  std::vector<NamedSharding> distinct_shardings() const {
    std::vector<NamedSharding> out;
    for (const auto& e : cache_) out.push_back(e.sharding);
    return out;
  }

 private:
  void walk_rules(const RuleTree& rules, const Tree<TensorSpec>& data, std::string& path) {
    if (rules.is_leaf() || rules.is_none()) {
      RuleSlot slot;
      slot.index = rules.is_leaf() ? next_rule_index_++ : -1;
      slot.path = path;
      slot.leaf = rules.is_leaf() ? &rules.leaf() : nullptr;
      slot.name = rule_name(slot.leaf);
      if (slot.leaf) {
        if (const auto* r = std::get_if<RulePtr>(slot.leaf); r && *r) {
          slot.labels = (*r)->entry_labels();
          slot.activation_entries = (*r)->activation_entries();
          slot.automaton = (*r)->path_automaton();
        }
      }
      slot.entry_hits.assign(slot.labels.size(), 0);
      slots.push_back(std::move(slot));
      const std::size_t rel_start = path.empty() ? 0 : path.size() + 1;
      RuleSlot& sl = slots.back();
      const PathAutomaton::State start =
          sl.automaton && memo_enabled_ ? sl.automaton->start() : PathAutomaton::kUnknown;
      walk_data(sl, slots.size() - 1, data, path, rel_start, start);
      return;
    }
    const std::size_t base = path.size();
    for (std::size_t i = 0; i < rules.size(); ++i) {
      append_segment(path, data, i);
      walk_rules(rules.children()[i], data.children()[i], path);
      path.resize(base);
    }
  }

  // `state` is the rule's automaton state after the leaf-relative path so far, or kUnknown.
  void walk_data(RuleSlot& slot, std::size_t slot_id, const Tree<TensorSpec>& data,
                 std::string& path, std::size_t rel_start, PathAutomaton::State state) {
    if (data.is_leaf()) {
      const std::string_view full(path);
      const std::string_view rel =
          full.size() >= rel_start ? full.substr(rel_start) : std::string_view();
      decide(slot, full, rel, data.leaf());
      return;
    }
    // A subtree equal to one already decided in the same state gets the same decisions.
    std::vector<MemoEntry>* candidates = nullptr;
    if (state != PathAutomaton::kUnknown && data.size() > 0) {
      candidates = &memo_[(static_cast<std::uint64_t>(slot_id) << 32) | state];
      for (const MemoEntry& c : *candidates) {
        if (same_subtree(*c.node, data)) {
          repeat_outputs(c.begin, c.count);
          slot.leaves += static_cast<std::int64_t>(c.count);
          return;
        }
      }
    }
    const std::size_t begin = output_size();
    const std::size_t base = path.size();
    for (std::size_t i = 0; i < data.size(); ++i) {
      append_segment(path, data, i);
      PathAutomaton::State child = PathAutomaton::kUnknown;
      if (state != PathAutomaton::kUnknown) {
        // The bytes just appended, without the '/' that joins the rule's own path.
        std::string_view added = std::string_view(path).substr(base);
        if (base + 1 == rel_start && !added.empty() && added.front() == '/') added.remove_prefix(1);
        child = slot.automaton->advance(state, added);
      }
      walk_data(slot, slot_id, data.children()[i], path, rel_start, child);
      path.resize(base);
    }
    if (candidates != nullptr) {
      // Found again: the recursion may have rehashed the map.
      auto& list = memo_[(static_cast<std::uint64_t>(slot_id) << 32) | state];
      if (list.size() < kMaxCandidates)
        list.push_back(MemoEntry{&data, begin, output_size() - begin});
    }
  }

  struct MemoEntry {
    const Tree<TensorSpec>* node;
    std::size_t begin;  // first output of the subtree
    std::size_t count;
  };
  static constexpr std::size_t kMaxCandidates = 4;

  std::size_t output_size() const { return indices_only_ ? indices.size() : leaves.size(); }

  void repeat_outputs(std::size_t begin, std::size_t count) {
    // resize, not reserve: reserve(size + count) would reallocate on every repeat.
    const std::size_t end = indices.size();
    indices.resize(end + count);
    std::copy_n(indices.begin() + static_cast<std::ptrdiff_t>(begin), count,
                indices.begin() + static_cast<std::ptrdiff_t>(end));
  }

  std::string where(const RuleSlot& slot) const {
    return fmt::format("rule {} {}{}", slot.index, slot.name,
                       slot.path.empty() ? "" : fmt::format(" at '{}'", slot.path));
  }

  static void count_hit(RuleSlot& slot, int entry) {
    if (entry >= 0 && static_cast<std::size_t>(entry) < slot.entry_hits.size()) {
      ++slot.entry_hits[static_cast<std::size_t>(entry)];
    }
  }

  void decide(RuleSlot& slot, std::string_view full, std::string_view rel, const TensorSpec& t) {
    RuleDecision d;
    bool unspecified = false;
    if (slot.leaf == nullptr) {
      d.reason = "None: replicated";  // None means replicated, as in JAX and scalax
    } else if (std::holds_alternative<Unspecified>(*slot.leaf)) {
      unspecified = true;
      d.reason = "unspecified";
    } else if (const auto* r = std::get_if<RulePtr>(slot.leaf)) {
      if (!*r) throw RuleError(fmt::format("[plan] {} is a null rule pointer", where(slot)));
      d = call_rule(
          [&] {
            return (*r)->apply(RuleInput{rel, t, mesh_});
          },
          full, t.shape, [&] { return where(slot); });
      count_hit(slot, d.entry);
      for (const int e : d.also_decided) count_hit(slot, e);
    } else if (const auto* p = std::get_if<PartitionSpec>(slot.leaf)) {
      d.spec = *p;
      d.reason = "spec";
    } else {
      d.reason = "replicated";
    }
    ++slot.leaves;

    if (unspecified) {
      if (indices_only_) {
        indices.push_back(-1);
      } else {
        push_leaf(slot, full, t, d, std::nullopt, t.shape, 0);
      }
      return;
    }
    SpecEntry& e = entry_for(d, slot, full);
    const int rank = t.shape.rank();
    const SpecEntry::Seen* seen = nullptr;
    try {
      if (rank >= 64 || !(e.validated_ranks >> rank & 1)) {
        try {
          d.spec.validate(mesh_, rank, full);
        } catch (const SpecError& err) {
          throw SpecError(fmt::format("{} (shape {})", err.what(), t.shape.to_string()));
        }
        if (rank < 64) e.validated_ranks |= std::uint64_t{1} << rank;
      }
      seen = &e.shard_of(t.shape, full);
    } catch (const SpecError& err) {
      throw SpecError(fmt::format("{}; {}{}", err.what(), where(slot),
                                  d.reason.empty() ? "" : fmt::format(" ({})", d.reason)));
    }
    if (indices_only_) {
      indices.push_back(e.index);
      return;
    }
    push_leaf(slot, full, t, d, d.spec, seen->shard, shard_bytes(full, t, seen->shard));
  }

  // The bytes of a device's shard; the tensor's own bytes are checked first, so that a spec
  // past int64 is named with its path even where its shard would fit.
  static std::int64_t shard_bytes(std::string_view full, const TensorSpec& t, const Shape& shard) {
    try {
      t.bytes();
      return byte_size(shard, t.dtype);
    } catch (const SpecError& err) {
      throw SpecError(fmt::format("[plan] '{}': {}", full, err.what()));
    }
  }

  void push_leaf(const RuleSlot& slot, std::string_view full, const TensorSpec& t, RuleDecision& d,
                 std::optional<PartitionSpec> spec, const Shape& shard, std::int64_t bytes) {
    LeafPlan& lp = leaves.emplace_back();
    lp.path = full;
    lp.tensor = t;
    lp.spec = std::move(spec);
    lp.shard_shape = shard;
    lp.bytes_per_device = bytes;
    lp.rule_index = slot.index;
    lp.entry = d.entry;
    lp.reason = std::move(d.reason);
    lp.fell_through = d.fell_through;
  }

  // The entry for a decision's spec: first by identity (copies of one rule entry's spec share
  // it), then by value; a new spec is checked against the mesh once.
  SpecEntry& entry_for(const RuleDecision& d, const RuleSlot& slot, std::string_view full) {
    for (auto& e : cache_) {
      if (e.spec.same_instance(d.spec)) return e;
    }
    for (auto& e : cache_) {
      if (e.spec == d.spec) return e;
    }
    try {
      NamedSharding ns(mesh_, d.spec, uneven_);
      cache_.emplace_back(static_cast<int>(cache_.size()), d.spec, std::move(ns));
    } catch (const SpecError& e) {
      throw SpecError(fmt::format("{} (leaf '{}', {})", e.what(), full, where(slot)));
    }
    return cache_.back();
  }

  const Mesh& mesh_;
  Uneven uneven_;
  bool fill_report_;
  bool indices_only_;
  // Reports need every leaf's path and per-entry counts, so they decide every leaf.
  bool memo_enabled_;
  std::unordered_map<std::uint64_t, std::vector<MemoEntry>> memo_;
  int next_rule_index_ = 0;
  std::deque<SpecEntry> cache_;
};

// Builds match()'s tree from resolve()'s answer. A data subtree that shares its branch with one
// built before and got the same sharding indices gets that subtree's output (sharing its
// branch too), so a model of repeated layers costs one output layer, not one per layer.
class ShardingTreeBuilder {
 public:
  ShardingTreeBuilder(const std::vector<NamedSharding>& distinct,
                      const std::vector<std::int32_t>& indices)
      : distinct_(distinct), indices_(indices) {}

  Tree<MaybeSharding> build(const Tree<TensorSpec>& node) {
    if (node.is_none()) return Tree<MaybeSharding>();
    if (node.is_leaf()) {
      const std::int32_t k = indices_[next_++];
      return k < 0 ? Tree<MaybeSharding>(MaybeSharding())
                   : Tree<MaybeSharding>(MaybeSharding(distinct_[static_cast<std::size_t>(k)]));
    }
    const void* id = node.branch_identity();
    auto& seen = built_[id];
    for (const Built& b : seen) {
      if (next_ + b.count <= indices_.size() &&
          std::equal(indices_.begin() + static_cast<std::ptrdiff_t>(b.begin),
                     indices_.begin() + static_cast<std::ptrdiff_t>(b.begin + b.count),
                     indices_.begin() + static_cast<std::ptrdiff_t>(next_))) {
        next_ += b.count;
        return b.tree;
      }
    }
    const std::size_t begin = next_;
    std::vector<Tree<MaybeSharding>> kids;
    kids.reserve(node.size());
    for (const auto& c : node.children()) kids.push_back(build(c));
    Tree<MaybeSharding> out;
    if (node.is_list()) {
      out = Tree<MaybeSharding>::list(std::move(kids));
    } else {
      std::vector<Tree<MaybeSharding>::DictEntry> entries;
      entries.reserve(kids.size());
      for (std::size_t i = 0; i < kids.size(); ++i) {
        entries.emplace_back(node.keys()[i], std::move(kids[i]));
      }
      out = Tree<MaybeSharding>::dict(std::move(entries));
    }
    // The map may have rehashed while building the children.
    auto& list = built_[id];
    if (list.size() < kMaxCandidates) list.push_back(Built{begin, next_ - begin, out});
    return out;
  }

 private:
  struct Built {
    std::size_t begin;
    std::size_t count;
    Tree<MaybeSharding> tree;
  };
  static constexpr std::size_t kMaxCandidates = 4;
  const std::vector<NamedSharding>& distinct_;
  const std::vector<std::int32_t>& indices_;
  std::size_t next_ = 0;
  std::unordered_map<const void*, std::vector<Built>> built_;
};

}  // namespace

Tree<MaybeSharding> MeshShardingHelper::match(const RuleTree& rules,
                                              const Tree<TensorSpec>& data) const {
  Planner p(mesh_, uneven_, Planner::Output::kIndices);
  p.walk(rules, data);
  const std::vector<NamedSharding> distinct = p.distinct_shardings();
  return ShardingTreeBuilder(distinct, p.indices).build(data);
}

std::ostream& operator<<(std::ostream& os, const ShardingAssignment& a) {
  os << "ShardingAssignment(" << a.leaf_sharding.size() << " leaves, " << a.shardings.size()
     << " shardings";
  for (std::size_t i = 0; i < a.shardings.size(); ++i) {
    os << (i ? ", " : ": ") << a.shardings[i].spec().to_string();
  }
  return os << ")";
}

ShardingAssignment MeshShardingHelper::resolve(const RuleTree& rules,
                                               const Tree<TensorSpec>& data) const {
  Planner p(mesh_, uneven_, Planner::Output::kIndices);
  p.walk(rules, data);
  return ShardingAssignment{p.distinct_shardings(), std::move(p.indices)};
}

PlanReport MeshShardingHelper::plan(const RuleTree& rules, const Tree<TensorSpec>& data) const {
  Planner p(mesh_, uneven_, Planner::Output::kReport);
  p.walk(rules, data);
  PlanReport report{mesh_, std::move(p.leaves), {}, 0, {}, {}};
  std::int64_t per_device = 0;
  for (const auto& l : report.leaves) {
    const std::int64_t bytes = l.tensor.bytes();  // checked when the leaf was planned
    if (!detail::checked_add(per_device, l.bytes_per_device, &per_device) ||
        !detail::checked_add(report.total_bytes, bytes, &report.total_bytes)) {
      throw SpecError(fmt::format(
          "[plan] the tree's total bytes overflow int64 at '{}' ({}{}, {} bytes, {} per device)",
          l.path, name(l.tensor.dtype), l.tensor.shape.to_string(), bytes, l.bytes_per_device));
    }
  }
  report.device_bytes.assign(static_cast<std::size_t>(mesh_.size()), per_device);
  for (const auto& s : p.slots) {
    if (s.index >= 0) report.rules.push_back({s.index, s.path, s.name, s.labels});
  }
  for (const auto& s : p.slots) {
    if (s.leaves == 0) {
      report.unmatched_rules.push_back({s.index, s.path, s.name, -1, "covers no leaf"});
      continue;
    }
    for (std::size_t e = 0; e < s.entry_hits.size(); ++e) {
      if (s.entry_hits[e] == 0) {
        const int entry = static_cast<int>(e);
        const bool activation =
            std::find(s.activation_entries.begin(), s.activation_entries.end(), entry) !=
            s.activation_entries.end();
        report.unmatched_rules.push_back({s.index, s.path, s.name, entry, s.labels[e], activation});
      }
    }
  }
  return report;
}

std::ostream& operator<<(std::ostream& os, const ExplainStep& step) {
  return os << (step.step.decided ? "=> " : "   ") << step.step.description;
}

std::vector<ExplainStep> MeshShardingHelper::explain(const RuleTree& rules,
                                                     const Tree<TensorSpec>& data,
                                                     std::string_view path) const {
  try {
    return explain_path(rules, data, path);
  } catch (const TreeError& e) {
    // A checkpoint's own name ("h.0.attn.c_attn.bias"): the tree path load_model made of it.
    if (path.find('.') == std::string_view::npos || path.find('/') != std::string_view::npos) {
      throw;
    }
    const std::string as_path = tree_path_of_name(path);
    try {
      return explain_path(rules, data, as_path);
    } catch (const TreeError&) {
      throw TreeError(fmt::format("{} (nor as the tree path '{}')", e.what(), as_path));
    }
  }
}

std::vector<ExplainStep> MeshShardingHelper::explain_path(const RuleTree& rules,
                                                          const Tree<TensorSpec>& data,
                                                          std::string_view path) const {
  if (std::string m = prefix_mismatch(rules, data); !m.empty()) {
    throw TreeError("[explain] the rule tree is not a prefix of the data tree: " + m);
  }
  // Descend the rule tree along the path to the rule leaf that covers it.
  const RuleTree* r = &rules;
  const Tree<TensorSpec>* d = &data;
  std::string rule_path;
  std::vector<std::string> keys = split_path(path);
  std::size_t k = 0;
  int rule_index = 0;
  // The rule index is the count of rule leaves before the covering one in flatten order.
  auto count_leaves_before = [](const RuleTree& node, std::size_t child) {
    int n = 0;
    for (std::size_t i = 0; i < child; ++i) n += static_cast<int>(node.children()[i].num_leaves());
    return n;
  };
  while (!(r->is_leaf() || r->is_none())) {
    if (k >= keys.size()) {
      throw TreeError(fmt::format("[explain] '{}' is not a leaf of the tree", path));
    }
    std::size_t idx = 0;
    if (d->is_list()) {
      // Only a plain decimal index names an element ("1x" or "-1" must not find element 1).
      const std::string& key = keys[k];
      const bool digits =
          !key.empty() && key.size() <= 18 &&
          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      idx = digits ? static_cast<std::size_t>(std::stoull(key)) : d->size();
    } else {
      auto it = std::find(d->keys().begin(), d->keys().end(), keys[k]);
      idx = static_cast<std::size_t>(it - d->keys().begin());
    }
    if (idx >= d->size()) throw TreeError(fmt::format("[explain] no leaf '{}' in the tree", path));
    rule_index += count_leaves_before(*r, idx);
    rule_path = join_path(rule_path, d->segment(idx));
    r = &r->children()[idx];
    d = &d->children()[idx];
    ++k;
  }
  std::string rel;
  for (std::size_t i = k; i < keys.size(); ++i) rel = join_path(rel, escape_key(keys[i]));
  const Tree<TensorSpec>* found = nullptr;
  try {
    found = &d->at_path(rel);
  } catch (const TreeError& e) {
    throw TreeError(fmt::format("[explain] no leaf '{}' in the tree: {}", path, e.what()));
  }
  const Tree<TensorSpec>& leaf = *found;
  if (!leaf.is_leaf())
    throw TreeError(fmt::format("[explain] '{}' is not a leaf of the tree", path));
  const RuleLeaf* rl = r->is_leaf() ? &r->leaf() : nullptr;
  std::string name = rule_name(rl);
  if (!r->is_leaf()) rule_index = -1;
  std::vector<ExplainStep> out;
  if (rl != nullptr) {
    if (const auto* rule = std::get_if<RulePtr>(rl); rule && *rule) {
      auto steps = call_rule(
          [&] {
            return (*rule)->explain(RuleInput{rel, leaf.leaf(), mesh_});
          },
          path, leaf.leaf().shape, [&] { return fmt::format("rule {} {}", rule_index, name); });
      for (auto& s : steps) {
        out.push_back({rule_index, name, std::move(s)});
      }
      return out;
    }
  }
  std::string what = rl == nullptr ? "None: replicated" : name;
  if (rl) {
    if (const auto* p = std::get_if<PartitionSpec>(rl)) what = "spec " + p->to_string();
  }
  out.push_back({rule_index, name, RuleStep{-1, what, true}});
  return out;
}

}  // namespace shardplan
