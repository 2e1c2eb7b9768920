#include "reduce.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "shardplan/error.hpp"
#include "shardplan/tensor.hpp"

namespace shardplan::detail {
namespace {

template <class T>
struct Acc {
  using type = std::conditional_t<std::is_integral_v<T>, std::int64_t,
                                  std::conditional_t<std::is_same_v<T, double>, double, float>>;
};
template <>
struct Acc<bf16> {
  using type = float;
};

template <class T>
typename Acc<T>::type up(T v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return static_cast<float>(v);
  } else {
    return static_cast<typename Acc<T>::type>(v);
  }
}
template <class T, class A>
T down(A v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
void reduce_typed(ReduceOp op, const std::vector<const std::byte*>& parts, std::byte* out_bytes,
                  std::int64_t count, std::int64_t begin) {
  using A = typename Acc<T>::type;
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
    for (std::int64_t j = 0; j < m; ++j) acc[j] = up(p[0][lo + j]);
    for (std::size_t k = 1; k < n; ++k) {
      const T* src = p[k] + lo;
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMean:
          for (std::int64_t j = 0; j < m; ++j) acc[j] += up(src[j]);
          break;
        case ReduceOp::kMax:
          for (std::int64_t j = 0; j < m; ++j) acc[j] = std::max(acc[j], up(src[j]));
          break;
        case ReduceOp::kMin:
          for (std::int64_t j = 0; j < m; ++j) acc[j] = std::min(acc[j], up(src[j]));
          break;
      }
    }
    if (op == ReduceOp::kMean) {
      for (std::int64_t j = 0; j < m; ++j) acc[j] = static_cast<A>(acc[j] / static_cast<A>(n));
    }
    for (std::int64_t j = 0; j < m; ++j) out[lo + j] = down<T>(acc[j]);
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
