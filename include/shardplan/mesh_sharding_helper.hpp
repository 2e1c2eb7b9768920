#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/mesh.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/plan_report.hpp"
#include "shardplan/sharding_rule.hpp"
#include "shardplan/tensor_spec.hpp"
#include "shardplan/tree.hpp"

namespace shardplan {

/// A sharding decided for a leaf, or nullopt when the rule tree left it Unspecified.
using MaybeSharding = std::optional<NamedSharding>;

/// The compact form of a match: the distinct shardings, and for every leaf of the data tree in
/// flatten order the index of its sharding in `shardings` (-1 where the rule tree left it
/// unspecified). What a program needs to place arrays, without a tree or a report.
struct ShardingAssignment {
  std::vector<NamedSharding> shardings;
  std::vector<std::int32_t> leaf_sharding;
  /// The sharding of leaf i, or nullopt when unspecified.
  MaybeSharding sharding_of(std::size_t leaf) const {
    const std::int32_t k = leaf_sharding.at(leaf);
    if (k < 0) return std::nullopt;
    return shardings[static_cast<std::size_t>(k)];
  }
  friend bool operator==(const ShardingAssignment&, const ShardingAssignment&) = default;
};

/// "ShardingAssignment(90427 leaves, 9 shardings: PartitionSpec(...), ...)".
std::ostream& operator<<(std::ostream& os, const ShardingAssignment& a);

/// One entry of an explanation of a leaf's sharding.
struct ExplainStep {
  int rule_index = -1;
  std::string rule;
  RuleStep step;
  friend bool operator==(const ExplainStep&, const ExplainStep&) = default;
};
/// One line of an explanation: "=> <description>" for the entry that decided, else
/// "   <description>".
std::ostream& operator<<(std::ostream& os, const ExplainStep& step);

/// A named device mesh that resolves rule trees against data trees, as scalax's
/// MeshShardingHelper. Immutable after construction; all methods are thread-safe.
///
///   MeshShardingHelper helper(Mesh::parse("fsdp:-1,tp:2", 8));
///   RuleTree rules = std::make_shared<FSDPShardingRule>();
///   PlanReport report = helper.plan(rules, params);   // params: Tree<TensorSpec>
///   std::cout << report;
class MeshShardingHelper {
 public:
  /// `uneven`: the policy of the shardings it makes (Uneven::kPad: a dimension the axes do not
  /// divide is padded, and its shard shape and bytes are the padded block's; kRefuse: an error).
  explicit MeshShardingHelper(Mesh mesh, Uneven uneven = Uneven::kRefuse)
      : mesh_(std::move(mesh)), uneven_(uneven) {}

  const Mesh& mesh() const { return mesh_; }
  Uneven uneven() const { return uneven_; }

  /// The sharding of every leaf of `data`: each leaf of `rules` (a prefix of `data`) covers the
  /// subtree below it, and a rule sees paths relative to that subtree. Throws TreeError when
  /// `rules` is not a prefix, RuleError when a rule cannot decide, SpecError when a spec names an
  /// unknown axis, has more entries than the rank, or does not divide (naming path, shape, axes).
  Tree<MaybeSharding> match(const RuleTree& rules, const Tree<TensorSpec>& data) const;

  /// As match, in the compact form: the same checks, the same errors, no per-leaf objects.
  ShardingAssignment resolve(const RuleTree& rules, const Tree<TensorSpec>& data) const;
  /// As match, with the report: every leaf's spec, shard shape, bytes and deciding rule; bytes
  /// per device; rule entries that matched nothing; leaves that fell through. Throws as match.
  PlanReport plan(const RuleTree& rules, const Tree<TensorSpec>& data) const;

  /// Every entry tried on the leaf at `path` and which one decided. `path` is a tree path
  /// ("model/layers/0/mlp/up_proj/weight") or, when no leaf has it, a checkpoint's own name of
  /// the tensor ("model.layers.0.mlp.up_proj.weight", read with '.' as the separator, as
  /// load_model builds the tree). Throws TreeError when neither names a leaf.
  std::vector<ExplainStep> explain(const RuleTree& rules, const Tree<TensorSpec>& data,
                                   std::string_view path) const;

 private:
  std::vector<ExplainStep> explain_path(const RuleTree& rules, const Tree<TensorSpec>& data,
                                        std::string_view path) const;
  Mesh mesh_;
  Uneven uneven_ = Uneven::kRefuse;
};

/// A scoped, thread-local mesh context, as scalax's `with mesh_helper:`: while it lives,
/// get_context() / get_global_mesh() return it on this thread (other threads do not see it),
/// `sjit(f, options)` without a mesh runs on its mesh, an sjit built on the same mesh takes its
/// annotation shardings for names its options do not give, and with_sharding_annotation outside
/// any sjit reshards to the sharding given for the name. Nested contexts restore the previous one
/// when they end; destroy them in reverse order of construction (keep them on the stack).
///
///   MeshContext ctx(MeshShardingHelper(Mesh::parse("data:8", 8)), {{"act", RuleTree(P("data"))}});
///   auto step = sjit(&train_step);        // on data:8
class MeshContext {
 public:
  explicit MeshContext(MeshShardingHelper helper,
                       std::map<std::string, RuleTree> annotation_shardings = {});
  explicit MeshContext(Mesh mesh, std::map<std::string, RuleTree> annotation_shardings = {})
      : MeshContext(MeshShardingHelper(std::move(mesh)), std::move(annotation_shardings)) {}
  ~MeshContext();
  MeshContext(const MeshContext&) = delete;
  MeshContext& operator=(const MeshContext&) = delete;

  const MeshShardingHelper& helper() const { return helper_; }
  const Mesh& mesh() const { return helper_.mesh(); }
  /// name -> sharding for with_sharding_annotation (scalax's global annotation shardings).
  const std::map<std::string, RuleTree>& annotation_shardings() const { return annotations_; }

 private:
  MeshShardingHelper helper_;
  std::map<std::string, RuleTree> annotations_;
  const MeshContext* previous_;
};

/// scalax's get_context(): this thread's innermost MeshContext, or nullptr when there is none.
const MeshContext* get_context();
/// scalax's get_global_mesh(): the mesh of this thread's innermost MeshContext. Throws SpecError
/// when no context is active.
const Mesh& get_global_mesh();

}  // namespace shardplan
