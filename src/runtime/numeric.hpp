#pragma once
// The scalar numeric policy, defined once for everything that computes values: the per-device
// kernels (src/program/primitives/), the ordered cross-device reductions (reduce.cpp) and host
// tensors (tensor.cpp). A sharded result can then differ from the unsharded one only by the order
// of float additions, never by how NaN, -0.0 or integer overflow are treated.
// docs/runtime.md, "Numeric policy", states the same rules for users.

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "shardplan/tensor.hpp"  // bf16: its float conversions are the one bf16 rounding

namespace shardplan::detail {

// ---- Types ------------------------------------------------------------------------------------

/// The type an element computes in: float for bf16 (rounded once, when stored), else itself.
template <class T>
using Calc = std::conditional_t<std::is_same_v<T, bf16>, float, T>;

/// The accumulator of a sum (and a mean): float for bf16 and f32, double for f64, int64 for
/// integers (wrapping, see add).
template <class T>
using SumAcc = std::conditional_t<std::is_integral_v<T>, std::int64_t,
                                  std::conditional_t<std::is_same_v<T, double>, double, float>>;

/// x in its compute type.
template <class T>
Calc<T> widen(T x) {
  return static_cast<Calc<T>>(x);
}

/// A compute value stored as T: bf16 rounds to nearest even (NaN stays NaN); an integer
/// accumulator is reduced modulo 2^bits (two's complement, as C++20 defines the conversion).
template <class T, class A>
T narrow(A x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16(static_cast<float>(x));
  } else {
    return static_cast<T>(x);
  }
}

// ---- Integer arithmetic wraps ----------------------------------------------------------------
// Modulo 2^bits, as XLA and PyTorch do for int32/int64; done on the unsigned type, so it is never
// undefined behaviour. Floats follow IEEE 754.

template <class T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class T>
T sub(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <class T>
T mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}
template <class T>
T negate(T x) {
  if constexpr (std::is_integral_v<T>) {
    return sub(T{0}, x);
  } else {
    return -x;
  }
}
/// Integer division truncates toward zero; x / 0 gives -1 and MIN / -1 gives MIN (XLA's values)
/// rather than trapping.
template <class T>
T divide(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return T{-1};
    if (b == -1) return negate(a);
  }
  return a / b;
}

// ---- max and min -----------------------------------------------------------------------------
// IEEE 754-2019 maximum / minimum: a NaN operand gives NaN (as jnp.max and torch.max), and -0.0
// orders below +0.0. Both are then commutative and associative, so a reduction gives the same
// value in any order and over any split into shards.

template <class T>
T maximum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
    if (a == b) return std::signbit(a) ? b : a;  // +0 over -0
  }
  return a < b ? b : a;
}
template <class T>
T minimum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
    if (a == b) return std::signbit(a) ? a : b;  // -0 under +0
  }
  return b < a ? b : a;
}

/// The identity of maximum / minimum in the compute type: -inf / +inf for floats, the lowest /
/// highest value for integers.
template <class C>
constexpr C max_identity() {
  return std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                              : std::numeric_limits<C>::lowest();
}
template <class C>
constexpr C min_identity() {
  return std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity()
                                              : std::numeric_limits<C>::max();
}

// ---- Conversions -----------------------------------------------------------------------------

/// Float to integer truncates toward zero and saturates (NaN gives 0), as XLA's convert does: a
/// plain cast of an out-of-range value would be undefined.
template <class I>
I saturate(double x) {
  constexpr auto lo = std::numeric_limits<I>::min();
  constexpr auto hi = std::numeric_limits<I>::max();
  if (std::isnan(x)) return 0;
  if (x <= static_cast<double>(lo)) return lo;
  if (x >= static_cast<double>(hi)) return hi;
  return static_cast<I>(x);
}

/// A double stored as T (f32, f64, bf16, i32, i64): floats round to nearest even (bf16 through
/// float, as jnp.asarray(x, bfloat16) of a float64 does), integers as saturate.
template <class T>
T from_double(double v) {
  if constexpr (std::is_integral_v<T>) {
    return saturate<T>(v);
  } else {
    return narrow<T>(v);
  }
}

/// x as a double, exactly (every f32, bf16, i32 value is a double; i64 rounds past 2^53).
template <class T>
double to_double(T x) {
  return static_cast<double>(widen(x));
}

// ---- f16 ---------------------------------------------------------------------------------------

/// An IEEE 754 half's value (its bits) as a float, exactly: every half is a float. Inf and NaN
/// stay so (the NaN's payload kept), subnormals are normalised. (Checkpoints widen f16 tensors to
/// f32 with it: the runtime computes in f32, bf16, ...)
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits = 0;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {        // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace shardplan::detail
