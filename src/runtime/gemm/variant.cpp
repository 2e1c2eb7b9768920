// One instruction-set variant of the GEMM (see ../gemm.hpp). CMakeLists.txt compiles this file
// once per variant with that instruction set's -m flags, SHARDPLAN_GEMM_FN set to the variant's
// function name (gemm_generic, gemm_avx2, ...) and `Eigen` defined to a namespace of the
// variant's own (shardplan_eigen_avx2, ...): every Eigen template instantiated here then has a
// name no other object file uses, so the linker cannot pick this copy, built for AVX2, where the
// rest of the library (or a user's program) instantiated the same template for plain x86-64. The
// test gemm.variant_symbols_are_private checks that every symbol this file defines carries the
// variant's name.
#if !defined(SHARDPLAN_GEMM_FN)
#error "compiled only by CMakeLists.txt, once per instruction set"
#endif

#include <Eigen/Core>
#include <cstdint>

namespace shardplan::detail {

namespace {

template <class T>
void product(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
             const T* b, T* y) {
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using In = Eigen::Map<const Matrix>;
  Eigen::Map<Matrix> out(y, m, n);
  if (k == 0) {
    out.setZero();
    return;
  }
  const In lhs(a, trans_a ? k : m, trans_a ? m : k);
  const In rhs(b, trans_b ? n : k, trans_b ? k : n);
  if (!trans_a && !trans_b) {
    out.noalias() = lhs * rhs;
  } else if (!trans_a) {
    out.noalias() = lhs * rhs.transpose();
  } else if (!trans_b) {
    out.noalias() = lhs.transpose() * rhs;
  } else {
    out.noalias() = lhs.transpose() * rhs.transpose();
  }
}

}  // namespace

void SHARDPLAN_GEMM_FN(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, const float* b, float* y) {
  product(trans_a, trans_b, m, n, k, a, b, y);
}
void SHARDPLAN_GEMM_FN(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       const double* a, const double* b, double* y) {
  product(trans_a, trans_b, m, n, k, a, b, y);
}

}  // namespace shardplan::detail
