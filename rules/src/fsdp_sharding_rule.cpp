#include "shardplan/rules/fsdp_sharding_rule.hpp"

#include <fmt/format.h>

#include <utility>

#include "shardplan/error.hpp"

namespace shardplan {
namespace {

/// The largest power of two dividing n (n > 0).
std::int64_t largest_pow2_divisor(std::int64_t n) { return n & -n; }

}  // namespace

FSDPShardingRule::FSDPShardingRule(Options options) : options_(std::move(options)) {
  const Options& o = options_;
  if (o.axis.empty()) throw RuleError("[rule] FSDPShardingRule: the axis name is empty");
  if (o.min_size < 0) {
    throw RuleError(fmt::format("[rule] FSDPShardingRule(axis={}): min_size {} is negative", o.axis,
                                o.min_size));
  }
  if (o.axis_size <= 0 && o.axis_size != -1) {
    throw RuleError(fmt::format(
        "[rule] FSDPShardingRule(axis={}): axis_size {} is not positive (or -1 for the mesh's)",
        o.axis, o.axis_size));
  }
}

RuleDecision FSDPShardingRule::apply(const RuleInput& in) const {
  const Shape& shape = in.tensor.shape;
  RuleDecision d;
  if (shape.rank() == 0) {
    d.reason = "scalar";
    return d;
  }
  const std::int64_t numel = shape.numel();
  const std::string& axis = options_.axis;
  if (numel < options_.min_size) {
    d.reason = fmt::format("below min_size {}", options_.min_size);
    return d;
  }
  int best = -1;
  if (options_.mode == Mode::kPowerOfTwo) {
    std::int64_t best_div = 0;
    for (int i = 0; i < shape.rank(); ++i) {
      if (shape[i] <= 1) continue;
      const std::int64_t div = largest_pow2_divisor(shape[i]);
      if (div > best_div) {
        best_div = div;
        best = i;
      }
    }
    if (best < 0) {
      d.reason = "no dimension larger than 1";
      return d;
    }
    d.reason = fmt::format("dim {} ({}) has the largest power-of-two divisor ({})", best,
                           shape[best], best_div);
  } else {
    std::int64_t size = 0;
    if (options_.axis_size > 0) {
      size = options_.axis_size;
    } else {
      if (!in.mesh.has_axis(axis)) {
        throw RuleError(fmt::format(
            "[rule] FSDPShardingRule: axis '{}' is not in the mesh {} (needed for '{}', shape {})",
            axis, in.mesh.to_string(), in.path, shape.to_string()));
      }
      size = in.mesh.axis_size(axis);
    }
    for (int i = 0; i < shape.rank(); ++i) {
      if (shape[i] % size != 0) continue;
      if (best < 0 || shape[i] > shape[best]) best = i;
    }
    if (best < 0) {
      d.reason = fmt::format("no dimension of {} is divisible by '{}' ({})", shape.to_string(),
                             axis, size);
      return d;
    }
    d.reason = fmt::format("dim {} ({}) divisible by '{}' ({})", best, shape[best], axis, size);
  }
  std::vector<AxisNames> dims(static_cast<std::size_t>(shape.rank()));
  dims[static_cast<std::size_t>(best)] = AxisNames{axis};
  d.spec = PartitionSpec(std::move(dims));
  return d;
}

std::string FSDPShardingRule::name() const {
  return fmt::format(
      "FSDPShardingRule(axis={}{}, min_size={}{})", options_.axis,
      options_.axis_size > 0 ? fmt::format(", axis_size={}", options_.axis_size) : std::string(),
      options_.min_size, options_.mode == Mode::kPowerOfTwo ? ", power_of_two" : "");
}

}  // namespace shardplan
