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
#include <algorithm>
#include <cstdint>
#include <span>

#include "../gemm.hpp"

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

// y_p = op(a_p) * op(b) for every part p, each part exactly as product() computes it alone, with
// each block of b packed once for all the parts instead of once per part.
//
// product() writes a row-major y, which Eigen computes as the column-major y^T = op(b)^T op(a)^T:
// op(b)^T is the left operand of its blocked GEMM (packed per (row block, depth block)) and each
// op(a_p)^T a right operand. This runs the loop of Eigen's sequential GEMM
// (general_matrix_matrix_product) with the parts' loop inside the depth-block loop, after the
// left block is packed: every gebp call is one the part's own product makes (same blocking, the
// same packed blocks, depth blocks accumulated in the same order into a zeroed result), so each
// part's result is bitwise its own product's. Only parts that product() would run through this
// GEMM path, with one blocking for all, come here (the caller checks).
template <class T, int BOrder, int AOrder>
void shared_b_blocked(std::int64_t n, std::int64_t k, const T* b, std::int64_t b_stride,
                      std::int64_t m, std::span<const GemmRows<T>> parts) {
  namespace in = Eigen::internal;
  using Index = Eigen::Index;
  using Traits = in::gebp_traits<T, T>;
  using LhsMapper = in::const_blas_data_mapper<T, Index, BOrder>;
  using RhsMapper = in::const_blas_data_mapper<T, Index, AOrder>;
  using ResMapper = in::blas_data_mapper<T, Index, Eigen::ColMajor, Eigen::Unaligned, 1>;
  // The blocking product() gets for one part: Eigen's for a row-major m x n result of depth k.
  in::gemm_blocking_space<Eigen::RowMajor, T, T, Eigen::Dynamic, Eigen::Dynamic, Eigen::Dynamic>
      blocking(m, n, k, 1, true);
  const Index kc = blocking.kc();
  const Index mc = std::min<Index>(n, blocking.mc());
  const Index nc = std::min<Index>(m, blocking.nc());
  in::gemm_pack_lhs<T, Index, LhsMapper, Traits::mr, Traits::LhsProgress,
                    typename Traits::LhsPacket4Packing, BOrder>
      pack_lhs;
  in::gemm_pack_rhs<T, Index, RhsMapper, Traits::nr, AOrder> pack_rhs;
  in::gebp_kernel<T, T, Index, ResMapper, Traits::mr, Traits::nr, false, false> gebp;
  using Buffer = Eigen::Matrix<T, Eigen::Dynamic, 1>;  // aligned as Eigen's kernels need
  Buffer block_a(kc * mc), block_b(kc * nc);
  const LhsMapper lhs(b, b_stride);
  for (const GemmRows<T>& p : parts) Eigen::Map<Buffer>(p.y, m * n).setZero();
  for (Index i2 = 0; i2 < n; i2 += mc) {
    const Index actual_mc = std::min(i2 + mc, n) - i2;
    for (Index k2 = 0; k2 < k; k2 += kc) {
      const Index actual_kc = std::min(k2 + kc, k) - k2;
      pack_lhs(block_a.data(), lhs.getSubMapper(i2, k2), actual_kc, actual_mc);
      for (const GemmRows<T>& p : parts) {
        const RhsMapper rhs(p.a, AOrder == Eigen::ColMajor ? k : m);
        const ResMapper res(p.y, n);
        for (Index j2 = 0; j2 < m; j2 += nc) {
          const Index actual_nc = std::min(j2 + nc, m) - j2;
          pack_rhs(block_b.data(), rhs.getSubMapper(k2, j2), actual_kc, actual_nc);
          gebp(res.getSubMapper(i2, j2), block_a.data(), block_b.data(), actual_mc, actual_kc,
               actual_nc, T(1));
        }
      }
    }
  }
}

}  // namespace

// The exported single products (defined below), declared here for the fallback.
void SHARDPLAN_GEMM_FN(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, const float* b, float* y);
void SHARDPLAN_GEMM_FN(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       const double* a, const double* b, double* y);

namespace {

template <class T>
void shared_b(bool trans_a, bool trans_b, std::int64_t n, std::int64_t k, const T* b,
              std::span<const GemmRows<T>> parts) {
  const std::int64_t m = parts.empty() ? 0 : parts.front().m;
  const bool one_blocking =
      std::all_of(parts.begin(), parts.end(), [&](const GemmRows<T>& p) { return p.m == m; });
  // Eigen's product takes another path for these (empty, a matrix-vector product, the small
  // coefficient-wise product), and unequal parts would have blockings of their own: each part
  // alone, as before.
  if (parts.size() < 2 || !one_blocking || k == 0 || m < 2 || n < 2 || k + m + n < 20) {
    // Through the exported function, not product() inlined here: the compiler may contract the
    // small product's multiply-adds differently in another inlining context, changing bits.
    for (const GemmRows<T>& p : parts) SHARDPLAN_GEMM_FN(trans_a, trans_b, p.m, n, k, p.a, b, p.y);
    return;
  }
  // Eigen's operands: op(b)^T (n x k) is b read column-major (b stored [k, n] row-major) or
  // row-major (b stored [n, k], trans_b); op(a)^T (k x m) likewise from a stored [m, k] or [k, m].
  constexpr int kCol = Eigen::ColMajor, kRow = Eigen::RowMajor;
  if (!trans_b && !trans_a) return shared_b_blocked<T, kCol, kCol>(n, k, b, n, m, parts);
  if (!trans_b && trans_a) return shared_b_blocked<T, kCol, kRow>(n, k, b, n, m, parts);
  if (trans_b && !trans_a) return shared_b_blocked<T, kRow, kCol>(n, k, b, k, m, parts);
  return shared_b_blocked<T, kRow, kRow>(n, k, b, k, m, parts);
}

}  // namespace

void SHARDPLAN_GEMM_FN(bool trans_a, bool trans_b, std::int64_t n, std::int64_t k, const float* b,
                       std::span<const GemmRows<float>> parts) {
  shared_b(trans_a, trans_b, n, k, b, parts);
}
void SHARDPLAN_GEMM_FN(bool trans_a, bool trans_b, std::int64_t n, std::int64_t k, const double* b,
                       std::span<const GemmRows<double>> parts) {
  shared_b(trans_a, trans_b, n, k, b, parts);
}

// exp_shifted (../gemm.hpp): chunks of a fixed size through an aligned buffer, so that Eigen
// runs every element through its packet exp.
namespace {
template <class T>
void exp_chunks(T* x, std::int64_t n, T m, T lowest) {
  constexpr int kChunk = 64;
  alignas(64) T buf[kChunk];
  Eigen::Map<Eigen::Array<T, kChunk, 1>, Eigen::Aligned64> a(buf);
  for (std::int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int len = static_cast<int>(std::min<std::int64_t>(kChunk, n - i0));
    std::copy(x + i0, x + i0 + len, buf);
    std::fill(buf + len, buf + kChunk, m);
    a = (a - m).max(lowest).exp();
    std::copy(buf, buf + len, x + i0);
  }
}
}  // namespace

void SHARDPLAN_GEMM_FN(float* x, std::int64_t n, float m, float lowest) {
  exp_chunks(x, n, m, lowest);
}
void SHARDPLAN_GEMM_FN(double* x, std::int64_t n, double m, double lowest) {
  exp_chunks(x, n, m, lowest);
}

void SHARDPLAN_GEMM_FN(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       const float* a, const float* b, float* y) {
  product(trans_a, trans_b, m, n, k, a, b, y);
}
void SHARDPLAN_GEMM_FN(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       const double* a, const double* b, double* y) {
  product(trans_a, trans_b, m, n, k, a, b, y);
}

}  // namespace shardplan::detail
