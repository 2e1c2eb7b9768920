#pragma once
// Eigen views of host tensors and device buffers (no copies): what per-device kernels compute
// with. Separate from tensor.hpp so that only code that computes pulls in Eigen.

#include <Eigen/Core>
#include <cstdint>
#include <type_traits>

#include "shardplan/tensor.hpp"

namespace shardplan {

/// The Eigen scalar for an element type: Eigen::bfloat16 for bf16 (the same 16 bits).
template <class T>
using EigenScalar = std::conditional_t<std::is_same_v<T, bf16>, Eigen::bfloat16, T>;

template <class T>
using MatrixMap =
    Eigen::Map<Eigen::Matrix<EigenScalar<T>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
               Eigen::Aligned64>;
template <class T>
using ConstMatrixMap =
    Eigen::Map<const Eigen::Matrix<EigenScalar<T>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
               Eigen::Aligned64>;
template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<EigenScalar<T>, Eigen::Dynamic, 1>, Eigen::Aligned64>;
template <class T>
using ConstArrayMap =
    Eigen::Map<const Eigen::Array<EigenScalar<T>, Eigen::Dynamic, 1>, Eigen::Aligned64>;

namespace detail {
// Rows x columns of a row-major tensor seen as a matrix: the last dimension is the columns and
// the others multiply into rows (a vector is one row, a scalar 1 x 1).
inline std::pair<std::int64_t, std::int64_t> matrix_dims(const Shape& s) {
  if (s.rank() == 0) return {1, 1};
  const std::int64_t cols = s[s.rank() - 1];
  return {cols == 0 ? 0 : s.numel() / cols, cols};
}
}  // namespace detail

/// The tensor as a row-major matrix (leading dimensions folded into rows). Throws SpecError when
/// T is not the tensor's dtype.
template <class T>
MatrixMap<T> as_matrix(Tensor& t) {
  const auto [r, c] = detail::matrix_dims(t.shape());
  return MatrixMap<T>(reinterpret_cast<EigenScalar<T>*>(t.template data<T>()), r, c);
}
template <class T>
ConstMatrixMap<T> as_matrix(const Tensor& t) {
  const auto [r, c] = detail::matrix_dims(t.shape());
  return ConstMatrixMap<T>(reinterpret_cast<const EigenScalar<T>*>(t.template data<T>()), r, c);
}
/// The tensor's elements as a flat Eigen array (for elementwise kernels).
template <class T>
ArrayMap<T> as_array(Tensor& t) {
  return ArrayMap<T>(reinterpret_cast<EigenScalar<T>*>(t.template data<T>()), t.numel());
}
template <class T>
ConstArrayMap<T> as_array(const Tensor& t) {
  return ConstArrayMap<T>(reinterpret_cast<const EigenScalar<T>*>(t.template data<T>()), t.numel());
}

template <class T>
using UnalignedMatrixMap =
    Eigen::Map<Eigen::Matrix<EigenScalar<T>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <class T>
using ConstUnalignedMatrixMap = Eigen::Map<
    const Eigen::Matrix<EigenScalar<T>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

/// Memory (a device buffer, or a place inside one) as a rows x cols row-major matrix of T; the
/// caller vouches for the element type and that rows * cols elements fit. No alignment assumed.
template <class T>
UnalignedMatrixMap<T> as_matrix(std::byte* data, std::int64_t rows, std::int64_t cols) {
  return UnalignedMatrixMap<T>(reinterpret_cast<EigenScalar<T>*>(data), rows, cols);
}
template <class T>
ConstUnalignedMatrixMap<T> as_matrix(const std::byte* data, std::int64_t rows, std::int64_t cols) {
  return ConstUnalignedMatrixMap<T>(reinterpret_cast<const EigenScalar<T>*>(data), rows, cols);
}

}  // namespace shardplan
