#include "shardplan/rules/fsdp_sharding_rule.hpp"

#include <fmt/format.h>

#include <utility>

#include "shardplan/error.hpp"

namespace shardplan {
namespace {

/// The largest power of two dividing n (n > 0).
std::int64_t largest_pow2_divisor(std::int64_t n) { return n & -n; }

}  // namespace

FSDPShardingRule::FSDPShardingRule(std::string axis, std::int64_t min_size,
                                   std::optional<std::int64_t> axis_size, Mode mode)
    : axis_(std::move(axis)), min_size_(min_size), axis_size_(axis_size), mode_(mode) {
  if (axis_.empty()) throw RuleError("[rule] FSDPShardingRule: the axis name is empty");
  if (min_size_ < 0) {
    throw RuleError(fmt::format("[rule] FSDPShardingRule(axis={}): min_size {} is negative", axis_,
                                min_size_));
  }
  if (axis_size_ && *axis_size_ <= 0) {
    throw RuleError(fmt::format("[rule] FSDPShardingRule(axis={}): axis_size {} is not positive",
                                axis_, *axis_size_));
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
  if (numel < min_size_) {
    d.reason = fmt::format("below min_size {}", min_size_);
    return d;
  }
  int best = -1;
  if (mode_ == Mode::kPowerOfTwo) {
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
    if (axis_size_) {
      size = *axis_size_;
    } else {
      if (!in.mesh.has_axis(axis_)) {
        throw RuleError(fmt::format(
            "[rule] FSDPShardingRule: axis '{}' is not in the mesh {} (needed for '{}', shape {})",
            axis_, in.mesh.to_string(), in.path, shape.to_string()));
      }
      size = in.mesh.axis_size(axis_);
    }
    for (int i = 0; i < shape.rank(); ++i) {
      if (shape[i] % size != 0) continue;
      if (best < 0 || shape[i] > shape[best]) best = i;
    }
    if (best < 0) {
      d.reason = fmt::format("no dimension of {} is divisible by '{}' ({})", shape.to_string(),
                             axis_, size);
      return d;
    }
    d.reason = fmt::format("dim {} ({}) divisible by '{}' ({})", best, shape[best], axis_, size);
  }
  std::vector<AxisNames> dims(static_cast<std::size_t>(shape.rank()));
  dims[static_cast<std::size_t>(best)] = AxisNames{axis_};
  d.spec = PartitionSpec(std::move(dims));
  return d;
}

std::string FSDPShardingRule::name() const {
  return fmt::format("FSDPShardingRule(axis={}, min_size={}{})", axis_, min_size_,
                     mode_ == Mode::kPowerOfTwo ? ", power_of_two" : "");
}

}  // namespace shardplan
