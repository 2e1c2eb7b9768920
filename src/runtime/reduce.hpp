#pragma once
// Elementwise reduction of several equally shaped buffers, in the order given (so a result is
// bitwise the same from run to run). Sums accumulate in f32 for bf16 and f32, f64 for f64, and
// i64 for integers; mean divides the sum by the count.

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
