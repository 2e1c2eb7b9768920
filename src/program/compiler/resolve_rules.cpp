#include "resolve_rules.hpp"

#include "../../core/error_context.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {

std::vector<MaybeSharding> resolve_rules(const Mesh& mesh, const RuleTree& rules,
                                         const Tree<TensorSpec>& specs, std::string_view context,
                                         Uneven uneven) {
  try {
    return MeshShardingHelper(mesh, uneven).match(rules, specs).leaves();
  } catch (const Error&) {
    if (context.empty()) throw;
    rethrow_with_context(context);
  }
}

std::vector<MaybeSharding> resolve_rules(const Mesh& mesh, const RuleTree& rules,
                                         const Tree<Array>& arrays, std::string_view context,
                                         Uneven uneven) {
  const Tree<TensorSpec> specs = arrays.map([](const Array& a) {
    return TensorSpec{a.shape(), a.dtype()};
  });
  return resolve_rules(mesh, rules, specs, context, uneven);
}

}  // namespace shardplan::detail
