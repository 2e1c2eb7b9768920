#include "kernels.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <string>
#include <type_traits>

#include "../runtime/box_copy.hpp"
#include "../runtime/numeric.hpp"
#include "shardplan/eigen.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Element types

template <class T>
struct Tag {};

// bool as stored: one byte, 0 or 1 (reading other bytes as C++ bool would be undefined).
struct Bool {
  std::uint8_t v;
};

template <class T>
const T* elems(const ConstBlock& b) {
  return reinterpret_cast<const T*>(b.data);
}
template <class T>
T* elems(const MutBlock& b) {
  return reinterpret_cast<T*>(b.data);
}

// ---------------------------------------------------------------------------------------------
// Errors and dispatch

// What a kernel was asked to do; error messages describe it.
struct Call {
  const Node& node;
  const std::vector<ConstBlock>& in;
  const MutBlock& out;
  const std::vector<std::int64_t>& out_offset;
};

std::string describe(DType dtype, const Shape& shape) {
  return fmt::format("{}{}", name(dtype), shape.to_string());
}

[[noreturn]] void unsupported(const Call& c, DType dtype) {
  std::string operands;
  for (const ConstBlock& b : c.in) {
    operands += (operands.empty() ? "" : ", ") + describe(b.dtype, b.shape);
  }
  throw SpecError(fmt::format("[kernel] {} does not support dtype {} (operands ({}), result {})",
                              name(c.node.op), name(dtype), operands,
                              describe(c.out.dtype, c.out.shape)));
}

// Calls f(Tag<T>{}) for the element type of a computable dtype.
template <class F>
void dispatch(const Call& c, DType dtype, F&& f) {
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
    default:
      unsupported(c, dtype);
  }
}

// As dispatch, plus bool.
template <class F>
void dispatch_with_bool(const Call& c, DType dtype, F&& f) {
  if (dtype == DType::kBool) return f(Tag<Bool>{});
  dispatch(c, dtype, f);
}

// Data movement depends only on the element size: calls f(Tag<U>{}) with U of that size.
template <class F>
void dispatch_bits(const Call& c, DType dtype, F&& f) {
  switch (size_of(dtype)) {
    case 1:
      return f(Tag<std::uint8_t>{});
    case 2:
      return f(Tag<std::uint16_t>{});
    case 4:
      return f(Tag<std::uint32_t>{});
    case 8:
      return f(Tag<std::uint64_t>{});
    default:
      unsupported(c, dtype);
  }
}

// ---------------------------------------------------------------------------------------------
// Index helpers

std::vector<std::int64_t> row_major_strides(const Shape& s) {
  std::vector<std::int64_t> strides(static_cast<std::size_t>(s.rank()), 1);
  for (int d = s.rank() - 2; d >= 0; --d) strides[d] = strides[d + 1] * s[d + 1];
  return strides;
}

// Calls f(offset) for each index of `dims` in row-major order, where offset is the sum of
// index[d] * strides[d] (a stride of 0 repeats).
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

// out[i] = in[offset i], the offsets walking the result in row-major order with one operand
// stride per result dimension: transpose and broadcast.
void gather(const Call& c, const std::vector<std::int64_t>& strides) {
  dispatch_bits(c, c.out.dtype, [&]<class U>(Tag<U>) {
    const U* x = elems<U>(c.in[0]);
    U* y = elems<U>(c.out);
    for_each_offset(c.out.shape.dims(), strides, [&](std::int64_t off) { *y++ = x[off]; });
  });
}

// ---------------------------------------------------------------------------------------------
// Elementwise

template <class T>
void unary(const Call& c) {
  using C = Calc<T>;
  const auto map = [&](auto f) {
    const T* x = elems<T>(c.in[0]);
    T* y = elems<T>(c.out);
    const std::int64_t n = c.out.shape.numel();
    for (std::int64_t i = 0; i < n; ++i) y[i] = narrow<T>(f(widen(x[i])));
  };
  switch (c.node.op) {
    case Op::kNeg:
      return map([](C x) { return negate(x); });
    case Op::kAbs:
      return map([](C x) {
        if constexpr (std::is_integral_v<C>) {
          return x < 0 ? negate(x) : x;
        } else {
          return std::abs(x);  // |-0| is +0
        }
      });
    case Op::kRelu:
      return map([](C x) { return maximum(x, C(0)); });
    default:
      break;
  }
  if constexpr (std::is_integral_v<T>) {
    unsupported(c, c.in[0].dtype);
  } else {
    switch (c.node.op) {
      case Op::kExp:
        return map([](C x) { return std::exp(x); });
      case Op::kLog:
        return map([](C x) { return std::log(x); });
      case Op::kSqrt:
        return map([](C x) { return std::sqrt(x); });
      case Op::kRsqrt:
        return map([](C x) { return C(1) / std::sqrt(x); });
      case Op::kSin:
        return map([](C x) { return std::sin(x); });
      case Op::kCos:
        return map([](C x) { return std::cos(x); });
      case Op::kTanh:
        return map([](C x) { return std::tanh(x); });
      case Op::kGelu:  // the tanh approximation, jax.nn.gelu's default
        return map([](C x) {
          const C k = std::sqrt(C(2) / std::numbers::pi_v<C>);
          return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
        });
      case Op::kSigmoid:
        return map([](C x) { return C(1) / (C(1) + std::exp(-x)); });
      default:
        break;
    }
  }
}

template <class T>
void binary(const Call& c) {
  using C = Calc<T>;
  const T* a = elems<T>(c.in[0]);
  const T* b = elems<T>(c.in[1]);
  const std::int64_t n = c.out.shape.numel();
  const auto arith = [&](auto f) {
    T* y = elems<T>(c.out);
    for (std::int64_t i = 0; i < n; ++i) y[i] = narrow<T>(f(widen(a[i]), widen(b[i])));
  };
  const auto compare = [&](auto f) {
    std::uint8_t* y = elems<std::uint8_t>(c.out);
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(widen(a[i]), widen(b[i])) ? 1 : 0;
  };
  switch (c.node.op) {
    case Op::kAdd:
      return arith(add<C>);
    case Op::kSub:
      return arith(sub<C>);
    case Op::kMul:
      return arith(mul<C>);
    case Op::kDiv:
      return arith(divide<C>);
    case Op::kMax:
      return arith(maximum<C>);
    case Op::kMin:
      return arith(minimum<C>);
    case Op::kPow:
      if constexpr (std::is_integral_v<T>) {
        unsupported(c, c.in[0].dtype);
      } else {
        return arith([](C x, C e) { return std::pow(x, e); });
      }
    case Op::kEq:
      return compare(std::equal_to<C>{});
    case Op::kNe:
      return compare(std::not_equal_to<C>{});
    case Op::kLt:
      return compare(std::less<C>{});
    case Op::kLe:
      return compare(std::less_equal<C>{});
    case Op::kGt:
      return compare(std::greater<C>{});
    case Op::kGe:
      return compare(std::greater_equal<C>{});
    default:
      break;
  }
}

void select(const Call& c) {
  dispatch_bits(c, c.out.dtype, [&]<class U>(Tag<U>) {
    const std::uint8_t* pred = elems<std::uint8_t>(c.in[0]);
    const U* a = elems<U>(c.in[1]);
    const U* b = elems<U>(c.in[2]);
    U* y = elems<U>(c.out);
    const std::int64_t n = c.out.shape.numel();
    for (std::int64_t i = 0; i < n; ++i) y[i] = pred[i] != 0 ? a[i] : b[i];
  });
}

// ---------------------------------------------------------------------------------------------
// Convert: every source value fits exactly in a double (floats) or an int64 (integers, bool),
// and is converted from there.

template <class T>
auto exact(T x) {
  if constexpr (std::is_same_v<T, Bool>) {
    return std::int64_t{x.v != 0};
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<std::int64_t>(x);
  } else {
    return static_cast<double>(static_cast<Calc<T>>(x));
  }
}

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

void convert(const Call& c) {
  dispatch_with_bool(c, c.in[0].dtype, [&]<class From>(Tag<From>) {
    dispatch_with_bool(c, c.out.dtype, [&]<class To>(Tag<To>) {
      const From* x = elems<From>(c.in[0]);
      To* y = elems<To>(c.out);
      const std::int64_t n = c.out.shape.numel();
      for (std::int64_t i = 0; i < n; ++i) y[i] = convert_one<To>(exact(x[i]));
    });
  });
}

// ---------------------------------------------------------------------------------------------
// dot_general: each operand is seen as [batch, free, contract] (batch and contracting dims in the
// order of their pairs), so that out[b] = lhs[b] (m x k) * rhs[b]^T (k x n).

struct DotLayout {
  std::vector<int> lhs_perm, rhs_perm;  // the operand dims in [batch, free, contract] order
  std::int64_t batch = 1, m = 1, n = 1, k = 1;
};

std::vector<int> arranged_dims(int rank, const std::vector<int>& batch,
                               const std::vector<int>& contract) {
  std::vector<int> perm = batch;
  for (int d = 0; d < rank; ++d) {
    const bool paired = std::find(batch.begin(), batch.end(), d) != batch.end() ||
                        std::find(contract.begin(), contract.end(), d) != contract.end();
    if (!paired) perm.push_back(d);
  }
  perm.insert(perm.end(), contract.begin(), contract.end());
  return perm;
}

DotLayout dot_layout(const DotDims& dims, const Shape& lhs, const Shape& rhs) {
  DotLayout l;
  l.lhs_perm = arranged_dims(lhs.rank(), dims.lhs_batch, dims.lhs_contract);
  l.rhs_perm = arranged_dims(rhs.rank(), dims.rhs_batch, dims.rhs_contract);
  const std::size_t nb = dims.lhs_batch.size();
  const std::size_t lhs_free_end = l.lhs_perm.size() - dims.lhs_contract.size();
  const std::size_t rhs_free_end = l.rhs_perm.size() - dims.rhs_contract.size();
  for (std::size_t i = 0; i < l.lhs_perm.size(); ++i) {
    std::int64_t& part = i < nb ? l.batch : (i < lhs_free_end ? l.m : l.k);
    part *= lhs[l.lhs_perm[i]];
  }
  for (std::size_t i = nb; i < rhs_free_end; ++i) l.n *= rhs[l.rhs_perm[i]];
  return l;
}

bool is_identity(const std::vector<int>& perm) {
  for (std::size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int>(i)) return false;
  }
  return true;
}

// The operand's elements as Calc<T> in the dimension order `perm`: the block itself when that is
// already its layout and type, else a copy into `storage`.
template <class T>
const Calc<T>* arrange(const ConstBlock& b, const std::vector<int>& perm,
                       std::vector<Calc<T>>& storage) {
  if (is_identity(perm) && std::is_same_v<T, Calc<T>>) {
    return reinterpret_cast<const Calc<T>*>(b.data);
  }
  const std::vector<std::int64_t> strides = row_major_strides(b.shape);
  std::vector<std::int64_t> dims, perm_strides;
  for (int d : perm) {
    dims.push_back(b.shape[d]);
    perm_strides.push_back(strides[d]);
  }
  storage.resize(static_cast<std::size_t>(b.shape.numel()));
  const T* x = elems<T>(b);
  Calc<T>* y = storage.data();
  for_each_offset(dims, perm_strides, [&](std::int64_t off) { *y++ = widen(x[off]); });
  return storage.data();
}

// y[b] = l[b] * r[b]^T for each batch; l is [batch, m, k], r is [batch, n, k], y is [batch, m, n].
template <class C>
void batched_matmul(const C* l, const C* r, C* y, const DotLayout& d) {
  if (d.k == 0) {
    std::fill(y, y + d.batch * d.m * d.n, C(0));
    return;
  }
  for (std::int64_t b = 0; b < d.batch; ++b) {
    const C* lb = l + b * d.m * d.k;
    const C* rb = r + b * d.n * d.k;
    C* yb = y + b * d.m * d.n;
    if constexpr (std::is_floating_point_v<C>) {
      const auto as_bytes = [](const C* p) { return reinterpret_cast<const std::byte*>(p); };
      as_matrix<C>(reinterpret_cast<std::byte*>(yb), d.m, d.n).noalias() =
          as_matrix<C>(as_bytes(lb), d.m, d.k) * as_matrix<C>(as_bytes(rb), d.n, d.k).transpose();
    } else {
      for (std::int64_t i = 0; i < d.m; ++i) {
        for (std::int64_t j = 0; j < d.n; ++j) {
          C acc = 0;
          for (std::int64_t p = 0; p < d.k; ++p)
            acc = add(acc, mul(lb[i * d.k + p], rb[j * d.k + p]));
          yb[i * d.n + j] = acc;
        }
      }
    }
  }
}

// [batch, contract, free] order: the layout of a plain x @ w right operand ([k, n]).
std::vector<int> contract_first_dims(int rank, const std::vector<int>& batch,
                                     const std::vector<int>& contract) {
  std::vector<int> perm = batch;
  perm.insert(perm.end(), contract.begin(), contract.end());
  for (int d = 0; d < rank; ++d) {
    const bool paired = std::find(batch.begin(), batch.end(), d) != batch.end() ||
                        std::find(contract.begin(), contract.end(), d) != contract.end();
    if (!paired) perm.push_back(d);
  }
  return perm;
}

// f32/f64 operands already laid out as [batch, m, k] / [batch, k, n] (or [batch, k, m] /
// [batch, n, k]) are multiplied in place, with Eigen told which ones are transposed, instead of
// being copied into [batch, free, contract] first: x @ w never copies w.
template <class T>
bool dot_in_place(const Call& c, const DotLayout& d) {
  const DotDims& dims = c.node.dot;
  const bool l_mk = is_identity(d.lhs_perm);
  const bool l_km =
      is_identity(contract_first_dims(c.in[0].shape.rank(), dims.lhs_batch, dims.lhs_contract));
  const bool r_nk = is_identity(d.rhs_perm);
  const bool r_kn =
      is_identity(contract_first_dims(c.in[1].shape.rank(), dims.rhs_batch, dims.rhs_contract));
  if (!(l_mk || l_km) || !(r_nk || r_kn) || d.k == 0) return false;
  const auto* l = c.in[0].data;
  const auto* r = c.in[1].data;
  auto* y = c.out.data;
  const auto step = static_cast<std::int64_t>(sizeof(T));
  for (std::int64_t b = 0; b < d.batch; ++b) {
    const std::byte* lb = l + b * d.m * d.k * step;
    const std::byte* rb = r + b * d.n * d.k * step;
    auto out = as_matrix<T>(y + b * d.m * d.n * step, d.m, d.n);
    if (l_mk && r_kn) {
      out.noalias() = as_matrix<T>(lb, d.m, d.k) * as_matrix<T>(rb, d.k, d.n);
    } else if (l_mk) {
      out.noalias() = as_matrix<T>(lb, d.m, d.k) * as_matrix<T>(rb, d.n, d.k).transpose();
    } else if (r_kn) {
      out.noalias() = as_matrix<T>(lb, d.k, d.m).transpose() * as_matrix<T>(rb, d.k, d.n);
    } else {
      out.noalias() =
          as_matrix<T>(lb, d.k, d.m).transpose() * as_matrix<T>(rb, d.n, d.k).transpose();
    }
  }
  return true;
}

template <class T>
void dot(const Call& c) {
  const DotLayout d = dot_layout(c.node.dot, c.in[0].shape, c.in[1].shape);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (dot_in_place<T>(c, d)) return;
  }
  std::vector<Calc<T>> lhs_storage, rhs_storage;
  const Calc<T>* lhs = arrange<T>(c.in[0], d.lhs_perm, lhs_storage);
  const Calc<T>* rhs = arrange<T>(c.in[1], d.rhs_perm, rhs_storage);
  if constexpr (std::is_same_v<T, Calc<T>>) {
    batched_matmul(lhs, rhs, elems<T>(c.out), d);
  } else {
    std::vector<Calc<T>> result(static_cast<std::size_t>(c.out.shape.numel()));
    batched_matmul(lhs, rhs, result.data(), d);
    std::transform(result.begin(), result.end(), elems<T>(c.out), narrow<T, Calc<T>>);
  }
}

// ---------------------------------------------------------------------------------------------
// Reductions

// Operand offsets of the kept and of the reduced elements, each in row-major order: result
// element o folds operand elements kept[o] + reduced[r] for r = 0, 1, ...
struct ReduceLayout {
  std::vector<std::int64_t> kept, reduced;
};

ReduceLayout reduce_layout(const Shape& s, const std::vector<int>& axes) {
  const std::vector<std::int64_t> strides = row_major_strides(s);
  std::vector<std::int64_t> kept_dims, kept_strides, reduced_dims, reduced_strides;
  for (int d = 0; d < s.rank(); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    (reduced ? reduced_dims : kept_dims).push_back(s[d]);
    (reduced ? reduced_strides : kept_strides).push_back(strides[d]);
  }
  ReduceLayout l;
  for_each_offset(kept_dims, kept_strides, [&](std::int64_t off) { l.kept.push_back(off); });
  for_each_offset(reduced_dims, reduced_strides,
                  [&](std::int64_t off) { l.reduced.push_back(off); });
  return l;
}

template <class T>
void reduce(const Call& c) {
  const ReduceLayout l = reduce_layout(c.in[0].shape, c.node.axes);
  const T* x = elems<T>(c.in[0]);
  T* y = elems<T>(c.out);
  const auto fold = [&]<class A>(A init, auto f) {
    for (std::size_t o = 0; o < l.kept.size(); ++o) {
      A acc = init;
      for (std::int64_t r : l.reduced) acc = f(acc, static_cast<A>(widen(x[l.kept[o] + r])));
      y[o] = narrow<T>(acc);
    }
  };
  using C = Calc<T>;
  switch (c.node.op) {
    case Op::kReduceSum:
      return fold(SumAcc<T>(0), add<SumAcc<T>>);
    case Op::kReduceMax:
      return fold(max_identity<C>(), maximum<C>);
    case Op::kReduceMin:
      return fold(min_identity<C>(), minimum<C>);
    default:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Data movement

void copy(const Call& c) {
  const auto bytes = static_cast<std::size_t>(c.out.shape.numel()) * size_of(c.out.dtype);
  if (bytes > 0) std::memcpy(c.out.data, c.in[0].data, bytes);
}

void transpose(const Call& c) {
  const std::vector<std::int64_t> in_strides = row_major_strides(c.in[0].shape);
  std::vector<std::int64_t> strides;
  for (int d : c.node.axes) strides.push_back(in_strides[d]);
  gather(c, strides);
}

void broadcast(const Call& c) {
  const Shape& in = c.in[0].shape;
  const std::vector<std::int64_t> in_strides = row_major_strides(in);
  std::vector<std::int64_t> strides(static_cast<std::size_t>(c.out.shape.rank()), 0);
  for (int d = 0; d < in.rank(); ++d) {
    const int to = c.node.axes[d];
    if (in[d] == c.out.shape[to]) strides[to] = in_strides[d];  // else size 1: repeated
  }
  gather(c, strides);
}

void slice(const Call& c) {
  const Shape& in = c.in[0].shape;
  const std::vector<std::int64_t> zeros(static_cast<std::size_t>(in.rank()), 0);
  copy_box(c.in[0].data, in.begin(), c.node.starts.data(), c.out.data, c.out.shape.begin(),
           zeros.data(), c.out.shape.begin(), in.rank(), size_of(c.out.dtype));
}

void concat(const Call& c) {
  const int rank = c.out.shape.rank();
  std::vector<std::int64_t> zeros(static_cast<std::size_t>(rank), 0);
  std::vector<std::int64_t> at = zeros;
  for (const ConstBlock& b : c.in) {
    copy_box(b.data, b.shape.begin(), zeros.data(), c.out.data, c.out.shape.begin(), at.data(),
             b.shape.begin(), rank, size_of(c.out.dtype));
    at[c.node.axis] += b.shape[c.node.axis];
  }
}

// Out-of-range indices are clamped into [0, size - 1]: a gather on a device cannot fail. This is
// jnp.take(mode="clip") and what XLA's Gather does with its start indices; jnp.take's default
// mode="fill" would give NaN (or the dtype's fill value) instead.
void take(const Call& c) {
  const Shape& x_shape = c.in[0].shape;
  const int axis = c.node.axis;
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x_shape[d];
  for (int d = axis + 1; d < x_shape.rank(); ++d) inner *= x_shape[d];
  const std::int64_t size = x_shape[axis];
  const std::int64_t count = c.in[1].shape.numel();
  if (size == 0 && c.out.shape.numel() > 0) {
    throw SpecError(fmt::format("[kernel] take: axis {} of {} is empty; nothing to take", axis,
                                describe(c.in[0].dtype, x_shape)));
  }
  const std::size_t elem = size_of(c.out.dtype);
  const auto run = static_cast<std::size_t>(inner) * elem;
  dispatch(c, c.in[1].dtype, [&]<class I>(Tag<I>) {
    if constexpr (!std::is_integral_v<I>) {
      unsupported(c, c.in[1].dtype);
    } else {
      const I* indices = elems<I>(c.in[1]);
      for (std::int64_t o = 0; o < outer; ++o) {
        for (std::int64_t j = 0; j < count; ++j) {
          const std::int64_t k = std::clamp<std::int64_t>(indices[j], 0, size - 1);
          std::memcpy(c.out.data + static_cast<std::size_t>(o * count + j) * run,
                      c.in[0].data + static_cast<std::size_t>(o * size + k) * run, run);
        }
      }
    }
  });
}

template <class T>
void iota(const Call& c) {
  const Shape& s = c.out.shape;
  const int axis = c.node.axis;
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  const std::int64_t start = c.out_offset[axis];
  T* y = elems<T>(c.out);
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t j = 0; j < s[axis]; ++j) {
      y = std::fill_n(y, inner, convert_one<T>(start + j));
    }
  }
}

// Each element from the generator at its global row-major index: the global shape is in
// node.limits (the partitioner keeps it there), the block's place in out_offset.
void random(const Call& c) {
  const Shape& s = c.out.shape;
  const std::vector<std::int64_t>& global = c.node.limits;
  const int rank = s.rank();
  const std::int64_t n = s.numel();
  if (n == 0) return;
  std::vector<std::int64_t> stride(static_cast<std::size_t>(rank), 1);
  for (int k = rank - 2; k >= 0; --k) {
    stride[static_cast<std::size_t>(k)] =
        stride[static_cast<std::size_t>(k + 1)] * global[static_cast<std::size_t>(k + 1)];
  }
  const std::int64_t inner = rank == 0 ? 1 : s[rank - 1];
  const auto elem = static_cast<std::int64_t>(size_of(c.out.dtype));
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rank), 0);
  for (std::int64_t done = 0; done < n; done += inner) {
    std::int64_t base = 0;
    for (int k = 0; k < rank; ++k) {
      base += (c.out_offset[static_cast<std::size_t>(k)] + idx[static_cast<std::size_t>(k)]) *
              stride[static_cast<std::size_t>(k)];
    }
    generate_into(c.out.dtype, c.out.data + done * elem, inner, static_cast<std::uint64_t>(base),
                  c.node.generator);
    for (int k = rank - 2; k >= 0; --k) {
      if (++idx[static_cast<std::size_t>(k)] < s[k]) break;
      idx[static_cast<std::size_t>(k)] = 0;
    }
  }
}

void constant(const Call& c) {
  const Tensor& t = *c.node.constant;
  if (t.dtype() != c.out.dtype) {
    throw SpecError(fmt::format("[kernel] constant: the host tensor is {}, the result {}",
                                describe(t.dtype(), t.shape()),
                                describe(c.out.dtype, c.out.shape)));
  }
  const std::vector<std::int64_t> zeros(static_cast<std::size_t>(t.shape().rank()), 0);
  copy_box(t.bytes(), t.shape().begin(), c.out_offset.data(), c.out.data, c.out.shape.begin(),
           zeros.data(), c.out.shape.begin(), t.shape().rank(), size_of(t.dtype()));
}

}  // namespace

void run_kernel(const Node& node, const std::vector<ConstBlock>& in, const MutBlock& out,
                const std::vector<std::int64_t>& out_offset) {
  const Call c{node, in, out, out_offset};
  switch (node.op) {
    case Op::kNeg:
    case Op::kExp:
    case Op::kLog:
    case Op::kSqrt:
    case Op::kRsqrt:
    case Op::kSin:
    case Op::kCos:
    case Op::kTanh:
    case Op::kRelu:
    case Op::kGelu:
    case Op::kSigmoid:
    case Op::kAbs:
      return dispatch(c, in[0].dtype, [&]<class T>(Tag<T>) { unary<T>(c); });
    case Op::kAdd:
    case Op::kSub:
    case Op::kMul:
    case Op::kDiv:
    case Op::kMax:
    case Op::kMin:
    case Op::kPow:
    case Op::kEq:
    case Op::kNe:
    case Op::kLt:
    case Op::kLe:
    case Op::kGt:
    case Op::kGe:
      return dispatch(c, in[0].dtype, [&]<class T>(Tag<T>) { binary<T>(c); });
    case Op::kSelect:
      return select(c);
    case Op::kConvert:
      return convert(c);
    case Op::kDot:
      return dispatch(c, in[0].dtype, [&]<class T>(Tag<T>) { dot<T>(c); });
    case Op::kReduceSum:
    case Op::kReduceMax:
    case Op::kReduceMin:
      return dispatch(c, in[0].dtype, [&]<class T>(Tag<T>) { reduce<T>(c); });
    case Op::kReshape:
    case Op::kConstraint:
    case Op::kAnnotation:
      return copy(c);
    case Op::kTranspose:
      return transpose(c);
    case Op::kBroadcast:
      return broadcast(c);
    case Op::kSlice:
      return slice(c);
    case Op::kConcat:
      return concat(c);
    case Op::kTake:
      return take(c);
    case Op::kIota:
      return dispatch(c, out.dtype, [&]<class T>(Tag<T>) { iota<T>(c); });
    case Op::kConstant:
      return constant(c);
    case Op::kRandom:
      return random(c);
    case Op::kInput:
      break;
  }
  throw Error(
      fmt::format("[kernel] {} has no kernel (inputs are bound, not computed)", name(node.op)));
}

double kernel_flops(const Node& node, const std::vector<Shape>& in_shapes, const Shape& out_shape) {
  const Op op = node.op;
  if (op == Op::kDot) {
    const DotLayout d = dot_layout(node.dot, in_shapes[0], in_shapes[1]);
    return 2.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) *
           static_cast<double>(d.n) * static_cast<double>(d.k);
  }
  if (op >= Op::kNeg && op <= Op::kSelect) return static_cast<double>(out_shape.numel());
  if (op >= Op::kReduceSum && op <= Op::kReduceMin) {
    return static_cast<double>(in_shapes[0].numel());
  }
  return 0;
}

}  // namespace shardplan::detail
