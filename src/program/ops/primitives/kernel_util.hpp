#pragma once
// What the per-device kernels of src/program/primitives/ share: the one dtype dispatch, typed
// views of blocks, the row-major index walk, and the error for a dtype a kernel does not take.
// The scalar rules (NaN, -0.0, integer wrap, bf16 rounding, accumulators) are
// src/runtime/numeric.hpp's, shared with the collectives and host tensors.

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../../../runtime/numeric.hpp"
#include "../../ir/primitive.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {

template <class T>
struct Tag {
  using type = T;
};

/// bool as stored: one byte, 0 or 1 (reading other bytes as C++ bool would be undefined).
struct Bool {
  std::uint8_t v;
};

/// An element of a dtype no kernel computes with (f16, f8, i8, u32...): only moved, as N bytes.
template <std::size_t N>
struct Opaque {
  unsigned char b[N];
};

/// The types kernels compute with: f32, f64, bf16, i32, i64 (is_computable).
template <class T>
concept Numeric = std::is_same_v<T, float> || std::is_same_v<T, double> ||
    std::is_same_v<T, bf16> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;
template <class T>
concept Floating = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16>;

/// The unsigned integer of T's size: data movement copies elements as these.
template <class T>
using bits_t = std::conditional_t<
    sizeof(T) == 1, std::uint8_t,
    std::conditional_t<sizeof(T) == 2, std::uint16_t,
                       std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;

/// The one dtype dispatch: calls f(Tag<T>{}) with T the element type of `dtype` (Bool for bool,
/// Opaque<size> for the dtypes no kernel computes with).
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(Tag<float>{});
    case DType::kF64:
      return f(Tag<double>{});
    case DType::kBF16:
      return f(Tag<bf16>{});
    case DType::kI32:
      return f(Tag<std::int32_t>{});
    case DType::kI64:
      return f(Tag<std::int64_t>{});
    case DType::kBool:
      return f(Tag<Bool>{});
    case DType::kI8:
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return f(Tag<Opaque<1>>{});
    case DType::kI16:
    case DType::kU16:
    case DType::kF16:
      return f(Tag<Opaque<2>>{});
    case DType::kU32:
      return f(Tag<Opaque<4>>{});
    case DType::kU64:
      return f(Tag<Opaque<8>>{});
  }
  return f(Tag<Opaque<1>>{});  // not reached: every dtype is listed
}

template <class T>
const T* elems(const ConstBlock& b) {
  return reinterpret_cast<const T*>(b.data);
}
template <class T>
T* elems(const MutBlock& b) {
  return reinterpret_cast<T*>(b.data);
}

/// "f32[2, 3]".
inline std::string describe(DType dtype, const Shape& shape) {
  return fmt::format("{}{}", name(dtype), shape.to_string());
}

/// Throws SpecError "[kernel] op does not support dtype d (operands (...), result ...)".
[[noreturn]] void unsupported(const KernelArgs& k, DType dtype);

/// Calls f(Tag<T>{}) for the element type of `dtype` when it satisfies `Allowed` (a concept
/// wrapped in a constexpr predicate), else unsupported().
template <template <class> class Allowed, class F>
void dispatch_if(const KernelArgs& k, DType dtype, F&& f) {
  visit_dtype(dtype, [&]<class T>(Tag<T> t) {
    if constexpr (Allowed<T>::value) {
      f(t);
    } else {
      unsupported(k, dtype);
    }
  });
}
template <class T>
struct IsNumeric : std::bool_constant<Numeric<T>> {};
template <class T>
struct IsFloating : std::bool_constant<Floating<T>> {};
template <class T>
struct IsNumericOrBool : std::bool_constant<Numeric<T> || std::is_same_v<T, Bool>> {};
template <class T>
struct AnyType : std::true_type {};

/// The value of a float scalar block (an optimizer's rate or step count) as a double; 0 for a
/// block of another type (the op's infer refused it before any kernel runs).
inline double scalar_of(const ConstBlock& b) {
  double v = 0;
  visit_dtype(b.dtype, [&]<class T>(Tag<T>) {
    if constexpr (Floating<T>) v = static_cast<double>(widen(*elems<T>(b)));
  });
  return v;
}

/// Whether kernels compute in `d` as a float: f32, f64, bf16.
inline bool computable_float(DType d) {
  return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16;
}

/// An optimizer update's vjp (adamw_update, adamw_foreach): the update is not differentiated,
/// and a cotangent does flow mathematically, so a silent zero would be a wrong answer. SpecError
/// "[op] differentiating an optimizer's update (through THROUGH) is not supported".
[[noreturn]] inline void refuse_update_gradient(const Node& n, std::string_view through) {
  throw SpecError(fmt::format(
      "[{}] differentiating an optimizer's update (through {}) is not supported", n.op->name,
      through));
}

/// A value exactly representable as W (double for floats, int64 for integers and bool) stored
/// as To: bool is x != 0, bf16 rounds once, float to integer saturates (NaN gives 0), integer to
/// integer wraps.
template <class To, class W>
To convert_one(W x) {
  if constexpr (std::is_same_v<To, Bool>) {
    return Bool{static_cast<std::uint8_t>(x != 0)};
  } else if constexpr (std::is_same_v<To, bf16>) {
    return bf16(static_cast<float>(x));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<W>) {
    return saturate<To>(x);
  } else {
    return static_cast<To>(x);  // int to int wraps (modular since C++20)
  }
}

/// Row-major strides of a shape, in elements.
std::vector<std::int64_t> row_major_strides(const Shape& s);

/// Calls f(offset) for each index of `dims` in row-major order, where offset is the sum of
/// index[d] * strides[d] (a stride of 0 repeats).
template <class F>
void for_each_offset(const std::vector<std::int64_t>& dims,
                     const std::vector<std::int64_t>& strides, F&& f) {
  if (std::find(dims.begin(), dims.end(), 0) != dims.end()) return;
  if (dims.empty()) return f(std::int64_t{0});
  const int last = static_cast<int>(dims.size()) - 1;
  std::vector<std::int64_t> idx(dims.size(), 0);
  std::int64_t base = 0;
  while (true) {
    for (std::int64_t i = 0; i < dims[last]; ++i) f(base + i * strides[last]);
    int d = last - 1;
    for (; d >= 0; --d) {
      base += strides[d];
      if (++idx[d] < dims[d]) break;
      base -= idx[d] * strides[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

/// out[i] = in[offset i], the offsets walking the result in row-major order with one operand
/// stride per result dimension: transpose and broadcast.
void gather(const KernelArgs& k, const std::vector<std::int64_t>& strides);

/// The dimensions of a rank-`rank` operand that are in neither `a` nor `b` (dot_general's free
/// dimensions), ascending.
std::vector<int> free_dims(int rank, const std::vector<int>& a, const std::vector<int>& b);

}  // namespace shardplan::detail
