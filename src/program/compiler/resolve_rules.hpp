#pragma once
// The one place the program layer resolves a rule tree against the leaves it shards: sjit's
// in_shardings, args_sharding_constraint and out_shardings, and with_sharding_constraint /
// with_sharding_annotation on trees.

#include <string_view>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/mesh_sharding_helper.hpp"

namespace shardplan::detail {

/// The sharding `rules` (a prefix of `specs`) gives each leaf of `specs`, in leaf order; nullopt
/// where unspecified. Errors keep their type (TreeError for a structure mismatch, RuleError,
/// SpecError, ...) with "{context}: " before their message (`context` empty: unchanged).
/// `uneven`: the shardings' policy (MeshShardingHelper's).
std::vector<MaybeSharding> resolve_rules(const Mesh& mesh, const RuleTree& rules,
                                         const Tree<TensorSpec>& specs, std::string_view context,
                                         Uneven uneven = Uneven::kRefuse);
/// As above, for the shapes and dtypes of `arrays` (tracers or concrete arrays).
std::vector<MaybeSharding> resolve_rules(const Mesh& mesh, const RuleTree& rules,
                                         const Tree<Array>& arrays, std::string_view context,
                                         Uneven uneven = Uneven::kRefuse);

}  // namespace shardplan::detail
