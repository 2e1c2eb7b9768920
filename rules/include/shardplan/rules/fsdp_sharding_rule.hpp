#pragma once

#include <cstdint>
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
///
/// Options are given by name, so that no two same-typed numbers can be swapped:
///
///   FSDPShardingRule rule({.axis = "fsdp", .axis_size = 8, .min_size = 2048});
class FSDPShardingRule : public ShardingRule {
 public:
  enum class Mode { kLargestDivisible, kPowerOfTwo };

  /// The rule's options. Their order is scalax's positional order (fsdp_axis_name,
  /// fsdp_axis_size, min_fsdp_size), so even a positional {"fsdp", 8, 2048} means what
  /// FSDPShardingRule('fsdp', 8, 2048) means in scalax; name them all the same.
  struct Options {
    /// The mesh axis to shard over (scalax's fsdp_axis_name).
    std::string axis = "fsdp";
    /// The axis size to divide by (scalax's fsdp_axis_size); -1: the mesh axis's size.
    std::int64_t axis_size = -1;
    /// Tensors with fewer elements (not bytes) are replicated (scalax's min_fsdp_size).
    std::int64_t min_size = std::int64_t{1} << 20;
    /// Which dimension to shard (see the class comment).
    Mode mode = Mode::kLargestDivisible;
  };

  /// axis "fsdp", the mesh's axis size, min_size 2^20 elements, kLargestDivisible.
  FSDPShardingRule() : FSDPShardingRule(Options{}) {}
  /// Throws RuleError for an empty axis name, a negative min_size, or an axis_size that is
  /// neither positive nor -1, naming the value.
  explicit FSDPShardingRule(Options options);

  RuleDecision apply(const RuleInput& in) const override;
  std::string name() const override;

  const Options& options() const { return options_; }
  const std::string& axis() const { return options_.axis; }
  std::int64_t min_size() const { return options_.min_size; }

 private:
  Options options_;
};

}  // namespace shardplan
