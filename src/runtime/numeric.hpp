#pragma once
// The scalar numeric policy, defined once for everything that computes values: the per-device
// kernels (src/program/primitives/), the ordered cross-device reductions (reduce.cpp) and host
// tensors (tensor.cpp). A sharded result can then differ from the unsharded one only by the order
// of float additions, never by how NaN, -0.0 or integer overflow are treated.
// docs/runtime.md, "Numeric policy", states the same rules for users.

#include <algorithm>
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

template <class T>
struct IsF8 : std::false_type {};

/// A double stored as T (f32, f64, bf16, i32, i64, the float8 types below): floats round to
/// nearest even (bf16 through float, as jnp.asarray(x, bfloat16) of a float64 does; float8 as
/// f8_encode), integers as saturate.
template <class T>
T from_double(double v) {
  if constexpr (IsF8<T>::value) {
    return T{f8_encode(T::format, v)};
  } else if constexpr (std::is_integral_v<T>) {
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

// ---- float8 -------------------------------------------------------------------------------------
// The two formats of "FP8 Formats for Deep Learning" (Micikevicius et al. 2022), as PyTorch's
// float8_e4m3fn / float8_e5m2 and ml_dtypes' (JAX's) types of the same names:
//   e4m3 (e4m3fn): 4 exponent bits, bias 7, 3 mantissa bits; no infinities, only S.1111.111 is
//     NaN, so the largest value is S.1111.110 = 448; the smallest subnormal 2^-9.
//   e5m2: 5 exponent bits, bias 15, 2 mantissa bits, IEEE-like: S.11111.00 is inf, S.11111.xx
//     NaN; the largest value 57344, the smallest subnormal 2^-16.
// Encoding rounds to nearest, ties to even, subnormals included. Past the largest value the
// rounding goes on as if the exponent were unbounded; a result beyond the largest value is inf
// for e5m2 (IEEE overflow) and NaN for e4m3, which has no inf (PyTorch's and ml_dtypes'
// conversion: e4m3 448 < |x| < 464 gives 448, |x| >= 464 NaN; e5m2 |x| >= 61440 gives inf).
// Nothing saturates: float8_linear clamps to the largest value before casting, as torchao does.
// NaN encodes as S.1111.111 / S.11111.11 (its sign kept); -0.0 stays -0.0.

/// A float8 format's layout.
struct F8Format {
  int exp_bits, man_bits, bias;
  bool ieee;  // the all-ones exponent holds inf and NaN (e5m2); else only all-ones is NaN (e4m3)
};
inline constexpr F8Format kE4M3{4, 3, 7, false};
inline constexpr F8Format kE5M2{5, 2, 15, true};

/// The largest finite value of a format: 448 (e4m3), 57344 (e5m2).
constexpr double f8_max(F8Format f) {
  const int max_exp = (1 << f.exp_bits) - (f.ieee ? 2 : 1) - f.bias;
  const int max_man = (1 << f.man_bits) - (f.ieee ? 1 : 2);
  double v = 1.0 + static_cast<double>(max_man) / static_cast<double>(1 << f.man_bits);
  for (int i = 0; i < max_exp; ++i) v *= 2;
  return v;
}

/// The value of code `c` of format `f`, exactly (every float8 value is a float).
inline float f8_decode(F8Format f, std::uint8_t c) {
  const std::uint32_t sign = static_cast<std::uint32_t>(c & 0x80u) << 24;
  const std::uint32_t man_mask = (1u << f.man_bits) - 1;
  const std::uint32_t exp_max = (1u << f.exp_bits) - 1;
  const std::uint32_t e = (c >> f.man_bits) & exp_max;
  const std::uint32_t m = c & man_mask;
  if (e == exp_max && (f.ieee || m == man_mask)) {
    return std::bit_cast<float>(sign | 0x7f800000u | (f.ieee && m == 0 ? 0u : 0x400000u));
  }
  if (e == 0) {  // subnormal (or zero): m * 2^(1 - bias - man_bits)
    const auto scale = static_cast<std::uint32_t>(127 + 1 - f.bias - f.man_bits) << 23;
    const float v = static_cast<float>(m) * std::bit_cast<float>(scale);
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(v));
  }
  const std::uint32_t exp = e - static_cast<std::uint32_t>(f.bias) + 127;
  return std::bit_cast<float>(sign | (exp << 23) | (m << (23 - f.man_bits)));
}

/// `x` rounded to format `f` (nearest, ties to even; overflow as said above): its code.
inline std::uint8_t f8_encode(F8Format f, double x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const auto nan = static_cast<std::uint8_t>(sign | 0x7f);
  const auto inf = static_cast<std::uint8_t>(sign | (((1 << f.exp_bits) - 1) << f.man_bits));
  if (std::isnan(x)) return nan;
  const double a = std::abs(x);
  if (std::isinf(a)) return f.ieee ? inf : nan;
  if (a == 0) return sign;
  // a = r * 2^(E - man_bits) with r rounded to an integer; E is a's binade, or the subnormals'.
  int e2 = 0;
  std::frexp(a, &e2);  // a = fr * 2^e2, fr in [0.5, 1)
  const int e = std::max(e2 - 1, 1 - f.bias);
  const double n = std::ldexp(a, f.man_bits - e);  // exact: a power-of-two scaling
  double r = std::floor(n);
  const double rest = n - r;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(r, 2.0) != 0)) r += 1;
  if (std::ldexp(r, e - f.man_bits) > f8_max(f)) return f.ieee ? inf : nan;
  const auto ri = static_cast<std::uint32_t>(r);  // < 2^(man_bits + 1)
  const std::uint32_t one = 1u << f.man_bits;
  if (ri < one) return static_cast<std::uint8_t>(sign | ri);  // subnormal (e is the lowest)
  const std::uint32_t biased = ri == 2 * one ? static_cast<std::uint32_t>(e + f.bias + 1)
                                             : static_cast<std::uint32_t>(e + f.bias);
  const std::uint32_t m = ri == 2 * one ? 0 : ri - one;
  return static_cast<std::uint8_t>(sign | (biased << f.man_bits) | m);
}

/// A float8 element as stored (one byte, its code), for the kernels that convert to and from it.
template <F8Format const& F>
struct F8 {
  static constexpr const F8Format& format = F;
  std::uint8_t bits;
};
template <F8Format const& F>
struct IsF8<F8<F>> : std::true_type {};
using f8_e4m3 = F8<kE4M3>;
using f8_e5m2 = F8<kE5M2>;

template <F8Format const& F>
double to_double(F8<F> x) {
  return static_cast<double>(f8_decode(F, x.bits));
}

/// The format of a float8 dtype; nullptr for any other dtype.
constexpr const F8Format* f8_format(DType d) {
  return d == DType::kF8E4M3 ? &kE4M3 : d == DType::kF8E5M2 ? &kE5M2 : nullptr;
}

}  // namespace shardplan::detail
