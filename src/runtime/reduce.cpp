#include "reduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "numeric.hpp"
#include "shardplan/error.hpp"
#include "shardplan/tensor.hpp"

namespace shardplan::detail {
namespace {

template <class T>
void reduce_typed(ReduceOp op, const std::vector<const std::byte*>& parts, std::byte* out_bytes,
                  std::int64_t count, std::int64_t begin) {
  // Sums and means accumulate in SumAcc<T>; max and min compare in the same type (exact for
  // every element type: bf16 and f32 widen to float, integers to int64).
  using A = SumAcc<T>;
  std::vector<const T*> p;
  p.reserve(parts.size());
  for (const std::byte* b : parts) p.push_back(reinterpret_cast<const T*>(b));
  T* out = reinterpret_cast<T*>(out_bytes);
  const std::size_t n = p.size();
  // Blocks of elements, so each part is streamed once per block.
  constexpr std::int64_t kBlock = 1024;
  A acc[kBlock];
  for (std::int64_t lo = begin; lo < begin + count; lo += kBlock) {
    const std::int64_t m = std::min(kBlock, begin + count - lo);
    for (std::int64_t j = 0; j < m; ++j) acc[j] = static_cast<A>(widen(p[0][lo + j]));
    for (std::size_t k = 1; k < n; ++k) {
      const T* src = p[k] + lo;
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMean:
          for (std::int64_t j = 0; j < m; ++j) acc[j] = add(acc[j], static_cast<A>(widen(src[j])));
          break;
        case ReduceOp::kMax:
          for (std::int64_t j = 0; j < m; ++j) {
            acc[j] = maximum(acc[j], static_cast<A>(widen(src[j])));
          }
          break;
        case ReduceOp::kMin:
          for (std::int64_t j = 0; j < m; ++j) {
            acc[j] = minimum(acc[j], static_cast<A>(widen(src[j])));
          }
          break;
      }
    }
    if (op == ReduceOp::kMean) {
      for (std::int64_t j = 0; j < m; ++j) acc[j] = static_cast<A>(acc[j] / static_cast<A>(n));
    }
    for (std::int64_t j = 0; j < m; ++j) out[lo + j] = narrow<T>(acc[j]);
  }
}

}  // namespace

void reduce_into(DType dtype, ReduceOp op, const std::vector<const std::byte*>& parts,
                 std::byte* out, std::int64_t count, std::int64_t begin) {
  if (parts.empty() || count <= 0) return;
  switch (dtype) {
    case DType::kF32:
      return reduce_typed<float>(op, parts, out, count, begin);
    case DType::kF64:
      return reduce_typed<double>(op, parts, out, count, begin);
    case DType::kBF16:
      return reduce_typed<bf16>(op, parts, out, count, begin);
    case DType::kI32:
      return reduce_typed<std::int32_t>(op, parts, out, count, begin);
    case DType::kI64:
      return reduce_typed<std::int64_t>(op, parts, out, count, begin);
    default:
      throw SpecError(
          fmt::format("[reduce] cannot reduce {} values (f32, f64, bf16, i32, i64)", name(dtype)));
  }
}

}  // namespace shardplan::detail
