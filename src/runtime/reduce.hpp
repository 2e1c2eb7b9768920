#pragma once
// Elementwise reduction of several equally shaped buffers, in the order given (so a result is
// bitwise the same from run to run). The scalar rules (accumulator types, wrapping integer sums,
// NaN-propagating max/min) are numeric.hpp's, shared with the per-device kernels; mean divides
// the sum by the count (truncating toward zero for integers).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/dtype.hpp"

namespace shardplan::detail {

/// out[i] = op(parts[0][i], parts[1][i], ...) for i in [begin, end). `out` may be one of `parts`.
void reduce_into(DType dtype, ReduceOp op, const std::vector<const std::byte*>& parts,
                 std::byte* out, std::int64_t count, std::int64_t begin = 0);

}  // namespace shardplan::detail
