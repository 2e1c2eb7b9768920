#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "shardplan/sharding_rule.hpp"

namespace shardplan {

/// Fully-sharded data parallelism, as scalax's FSDPShardingRule: a leaf with fewer than
/// `min_size` elements is replicated; otherwise exactly one dimension is sharded over `axis`.
///
/// kLargestDivisible (default): the axis size is taken from `axis_size` or else the mesh; the
/// largest dimension divisible by it is sharded (ties to the lower index); none divides ->
/// replicated. kPowerOfTwo (scalax's guess when it has no axis size): the dimension with the
/// largest power-of-two divisor (ties to the lower index, size-1 dims skipped). Scalars are never
/// sharded. Throws RuleError when the axis size is needed but the axis is not in the mesh.
class FSDPShardingRule : public ShardingRule {
 public:
  enum class Mode { kLargestDivisible, kPowerOfTwo };

  explicit FSDPShardingRule(std::string axis = "fsdp", std::int64_t min_size = std::int64_t{1} << 20,
                            std::optional<std::int64_t> axis_size = std::nullopt,
                            Mode mode = Mode::kLargestDivisible);

  RuleDecision apply(const RuleInput& in) const override;
  std::string name() const override;

  const std::string& axis() const { return axis_; }
  std::int64_t min_size() const { return min_size_; }

 private:
  std::string axis_;
  std::int64_t min_size_;
  std::optional<std::int64_t> axis_size_;
  Mode mode_;
};

}  // namespace shardplan
