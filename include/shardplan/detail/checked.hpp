#pragma once
// Checked int64 arithmetic for sizes (element counts, bytes, sums of bytes): the one place where
// shardplan decides whether a size fits. Callers turn `false` into an error naming the shape.

#include <cstddef>
#include <cstdint>
#include <limits>

namespace shardplan::detail {

/// *out = a * b; returns false (leaving *out unspecified) when the exact product does not fit in
/// int64.
inline bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t* out) noexcept {
  return !__builtin_mul_overflow(a, b, out);
}

/// *out = a + b; returns false when the exact sum does not fit in int64.
inline bool checked_add(std::int64_t a, std::int64_t b, std::int64_t* out) noexcept {
  return !__builtin_add_overflow(a, b, out);
}

/// The product of the non-zero values of [first, last) times `scale` (> 0), in *out; false when
/// it does not fit in int64. Zero values are skipped, as NumPy does when it checks an array's
/// size, so that every row-major stride (in elements or, with scale = element size, in bytes) of
/// a shape that passes fits as well, even when the shape holds no elements.
inline bool checked_nonzero_product(const std::int64_t* first, const std::int64_t* last,
                                    std::int64_t scale, std::int64_t* out) noexcept {
  std::int64_t n = scale;
  for (; first != last; ++first) {
    if (*first != 0 && __builtin_mul_overflow(n, *first, &n)) return false;
  }
  *out = n;
  return true;
}

/// An element size (bytes) as int64; every dtype's size fits.
inline std::int64_t as_i64(std::size_t element_size) noexcept {
  return element_size > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max())
             ? std::numeric_limits<std::int64_t>::max()
             : static_cast<std::int64_t>(element_size);
}

}  // namespace shardplan::detail
