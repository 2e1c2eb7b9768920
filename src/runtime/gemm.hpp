#pragma once
// Dense matrix products for the per-device kernels, in the best instruction set the CPU runs.
//
// The library is built for plain x86-64 (SSE2) so that one binary runs anywhere, but a GEMM that
// only uses SSE2 runs at a third of the speed AVX2+FMA gives on the same core. So the GEMM is
// compiled once per instruction set (gemm/variant.cpp, with Eigen renamed in each copy so that
// the linker never mixes one copy's code into another) and the best one the CPU supports is
// chosen once, at first use. docs/design.md ("Kernels that use the CPU") has the measurements.

#include <cstdint>
#include <span>
#include <string_view>

namespace shardplan::detail {

/// The instruction sets a GEMM variant is built for, from the plainest.
enum class GemmIsa : std::uint8_t {
  kGeneric,  // what the compiler targets by default (x86-64: SSE2)
  kAvx2,     // x86-64-v3: AVX2 and FMA
  kAvx512,   // x86-64-v4: AVX-512 F/VL/DQ/BW
};

std::string_view name(GemmIsa isa);

/// The variants this build has that this CPU can run, plainest first.
std::span<const GemmIsa> gemm_isas();

/// The variant gemm() uses: the last of gemm_isas(), or the one named by the environment variable
/// SHARDPLAN_GEMM (generic, avx2, avx512) when this CPU runs it. Decided once per process; an
/// unknown or unsupported name is an error (ConfigError), not a silent fallback.
GemmIsa gemm_isa();

/// What gemm_isa() decides for a value of SHARDPLAN_GEMM (null or empty: the best variant).
GemmIsa choose_gemm_isa(const char* requested);

/// y = op(a) * op(b), all row-major and contiguous: op(a) is m x k (a is stored k x m when
/// `trans_a`), op(b) is k x n (b is stored n x k when `trans_b`), y is m x n and is overwritten
/// (zeros when k == 0). Single-threaded: each device runs its own on its own thread. `isa` must be
/// one of gemm_isas() (a variant this build lacks is an Error; one the CPU lacks would fault).
void gemm(GemmIsa isa, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          const float* a, const float* b, float* y);
void gemm(GemmIsa isa, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          const double* a, const double* b, double* y);

/// One part of a product with a shared right operand: y (m x n) = op(a) (m x k) * op(b).
template <class T>
struct GemmRows {
  std::int64_t m = 0;
  const T* a = nullptr;
  T* y = nullptr;
};

/// gemm(isa, trans_a, trans_b, part.m, n, k, part.a, b, part.y) for every part, bitwise, with b's
/// blocks packed once for all the parts where each part's own product would pack them again: the
/// devices of a data-parallel step that share a core and a replicated weight. Parts of unequal m
/// (or shapes Eigen multiplies another way) are run one by one.
void gemm_shared_b(GemmIsa isa, bool trans_a, bool trans_b, std::int64_t n, std::int64_t k,
                   const float* b, std::span<const GemmRows<float>> parts);
void gemm_shared_b(GemmIsa isa, bool trans_a, bool trans_b, std::int64_t n, std::int64_t k,
                   const double* b, std::span<const GemmRows<double>> parts);

/// x[i] = exp(max(x[i] - m, lowest)) for i < n, vectorised in the variant's instruction set
/// (Eigen's exp, within a few ulps): the softmax of the fused attention kernels. Every element
/// takes the same vector code whatever its position or address (no scalar head or tail), so a
/// row's result never depends on where it lies.
void exp_shifted(GemmIsa isa, float* x, std::int64_t n, float m, float lowest);
void exp_shifted(GemmIsa isa, double* x, std::int64_t n, double m, double lowest);

template <class T>
void exp_shifted(T* x, std::int64_t n, T m, T lowest) {
  exp_shifted(gemm_isa(), x, n, m, lowest);
}

template <class T>
void gemm_shared_b(bool trans_a, bool trans_b, std::int64_t n, std::int64_t k, const T* b,
                   std::span<const GemmRows<T>> parts) {
  gemm_shared_b(gemm_isa(), trans_a, trans_b, n, k, b, parts);
}

template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
          const T* b, T* y) {
  gemm(gemm_isa(), trans_a, trans_b, m, n, k, a, b, y);
}

}  // namespace shardplan::detail
