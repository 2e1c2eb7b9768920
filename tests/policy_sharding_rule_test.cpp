// PolicyShardingRule: the callable and its errors.

#include "shardplan/rules/policy_sharding_rule.hpp"

#include <stdexcept>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/rules/fsdp_sharding_rule.hpp"
#include "shardplan/rules/logical_axis_rule.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures
// ---- Policy ----

TEST(PolicyRule, ExceptionIsWrappedWithThePath) {
  const PolicyShardingRule rule(
      [](std::string_view, const TensorSpec&) -> PartitionSpec {
        throw std::runtime_error("boom");
      },
      "mine");
  EXPECT_THROW_WITH(decide(rule, "params/w", {Shape{4, 4}, DType::kF32}, fsdp_tp_mesh()), RuleError,
                    "policy 'mine'", "'params/w'", "[4, 4]", "boom");
}

TEST(PolicyRule, EmptyCallableIsAnError) {
  EXPECT_THROW_WITH(PolicyShardingRule(nullptr), RuleError, "empty callable");
}

}  // namespace
}  // namespace shardplan
