#pragma once
// reshard() with the span of each collective it runs, for a caller that times them (the program
// layer, while the profiler records). The clock is the caller's: the runtime knows no profiler.
#include <cstdint>
#include <utility>
#include <vector>

#include "shardplan/collectives.hpp"

namespace shardplan::detail {

/// When a collective began and ended, as `clock` read them.
using StepSpan = std::pair<std::int64_t, std::int64_t>;

/// reshard(x, target), and in `spans` (cleared first) one span per step of the result, in order,
/// each from the end of the one before (the first from the call's start), read with `clock`.
ReshardResult reshard_timed(const Array& x, const NamedSharding& target, std::int64_t (*clock)(),
                            std::vector<StepSpan>& spans);

}  // namespace shardplan::detail
