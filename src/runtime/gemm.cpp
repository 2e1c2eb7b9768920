#include "gemm.hpp"

#include <array>
#include <cstdlib>
#include <string>

#include "shardplan/error.hpp"

namespace shardplan::detail {

// The variants CMakeLists.txt built (SHARDPLAN_GEMM_AVX2/AVX512 say which), each compiled from
// gemm/variant.cpp with its own instruction set.
#define SHARDPLAN_DECLARE_GEMM(fn)                                                                 \
  void fn(bool, bool, std::int64_t, std::int64_t, std::int64_t, const float*, const float*,        \
          float*);                                                                                 \
  void fn(bool, bool, std::int64_t, std::int64_t, std::int64_t, const double*, const double*,      \
          double*);                                                                                \
  void fn(bool, bool, std::int64_t, std::int64_t, const float*, std::span<const GemmRows<float>>); \
  void fn(bool, bool, std::int64_t, std::int64_t, const double*,                                   \
          std::span<const GemmRows<double>>);                                                      \
  void fn(float*, std::int64_t, float, float);                                                     \
  void fn(double*, std::int64_t, double, double);
SHARDPLAN_DECLARE_GEMM(gemm_generic)
#if defined(SHARDPLAN_GEMM_AVX2)
SHARDPLAN_DECLARE_GEMM(gemm_avx2)
#endif
#if defined(SHARDPLAN_GEMM_AVX512)
SHARDPLAN_DECLARE_GEMM(gemm_avx512)
#endif
#undef SHARDPLAN_DECLARE_GEMM

namespace {

bool cpu_runs(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kGeneric:
      return true;
    case GemmIsa::kAvx2:
#if defined(__x86_64__) && defined(__GNUC__)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
    case GemmIsa::kAvx512:
#if defined(__x86_64__) && defined(__GNUC__)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
  }
  return false;
}

struct Supported {
  std::array<GemmIsa, 3> isas{};
  std::size_t count = 0;
};

Supported find_supported() {
  Supported s;
  for (const GemmIsa isa : {
         GemmIsa::kGeneric,
#if defined(SHARDPLAN_GEMM_AVX2)
             GemmIsa::kAvx2,
#endif
#if defined(SHARDPLAN_GEMM_AVX512)
             GemmIsa::kAvx512
#endif
       }) {
    if (cpu_runs(isa)) s.isas[s.count++] = isa;
  }
  return s;
}

}  // namespace

GemmIsa choose_gemm_isa(const char* forced) {
  const std::span<const GemmIsa> supported = gemm_isas();
  if (forced == nullptr || *forced == '\0') return supported.back();
  std::string names;
  for (const GemmIsa isa : supported) {
    if (name(isa) == forced) return isa;
    names += names.empty() ? "" : ", ";
    names += name(isa);
  }
  throw Error("[gemm] SHARDPLAN_GEMM=" + std::string(forced) +
              " is not a GEMM variant this build has and this CPU runs (it runs: " + names + ")");
}

std::string_view name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kGeneric:
      return "generic";
    case GemmIsa::kAvx2:
      return "avx2";
    case GemmIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

std::span<const GemmIsa> gemm_isas() {
  static const Supported supported = find_supported();
  return {supported.isas.data(), supported.count};
}

GemmIsa gemm_isa() {
  static const GemmIsa chosen = choose_gemm_isa(std::getenv("SHARDPLAN_GEMM"));
  return chosen;
}

namespace {
template <class T>
void run(GemmIsa isa, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
         const T* b, T* y) {
  switch (isa) {
#if defined(SHARDPLAN_GEMM_AVX512)
    case GemmIsa::kAvx512:
      return gemm_avx512(ta, tb, m, n, k, a, b, y);
#endif
#if defined(SHARDPLAN_GEMM_AVX2)
    case GemmIsa::kAvx2:
      return gemm_avx2(ta, tb, m, n, k, a, b, y);
#endif
    case GemmIsa::kGeneric:
      return gemm_generic(ta, tb, m, n, k, a, b, y);
    default:
      throw Error("[gemm] the " + std::string(name(isa)) + " variant is not in this build");
  }
}
template <class T>
void run_shared_b(GemmIsa isa, bool ta, bool tb, std::int64_t n, std::int64_t k, const T* b,
                  std::span<const GemmRows<T>> parts) {
  switch (isa) {
#if defined(SHARDPLAN_GEMM_AVX512)
    case GemmIsa::kAvx512:
      return gemm_avx512(ta, tb, n, k, b, parts);
#endif
#if defined(SHARDPLAN_GEMM_AVX2)
    case GemmIsa::kAvx2:
      return gemm_avx2(ta, tb, n, k, b, parts);
#endif
    case GemmIsa::kGeneric:
      return gemm_generic(ta, tb, n, k, b, parts);
    default:
      throw Error("[gemm] the " + std::string(name(isa)) + " variant is not in this build");
  }
}
template <class T>
void run_exp(GemmIsa isa, T* x, std::int64_t n, T m, T lowest) {
  switch (isa) {
#if defined(SHARDPLAN_GEMM_AVX512)
    case GemmIsa::kAvx512:
      return gemm_avx512(x, n, m, lowest);
#endif
#if defined(SHARDPLAN_GEMM_AVX2)
    case GemmIsa::kAvx2:
      return gemm_avx2(x, n, m, lowest);
#endif
    case GemmIsa::kGeneric:
      return gemm_generic(x, n, m, lowest);
    default:
      throw Error("[gemm] the " + std::string(name(isa)) + " variant is not in this build");
  }
}
}  // namespace

void exp_shifted(GemmIsa isa, float* x, std::int64_t n, float m, float lowest) {
  run_exp(isa, x, n, m, lowest);
}
void exp_shifted(GemmIsa isa, double* x, std::int64_t n, double m, double lowest) {
  run_exp(isa, x, n, m, lowest);
}

void gemm_shared_b(GemmIsa isa, bool ta, bool tb, std::int64_t n, std::int64_t k, const float* b,
                   std::span<const GemmRows<float>> parts) {
  run_shared_b(isa, ta, tb, n, k, b, parts);
}
void gemm_shared_b(GemmIsa isa, bool ta, bool tb, std::int64_t n, std::int64_t k, const double* b,
                   std::span<const GemmRows<double>> parts) {
  run_shared_b(isa, ta, tb, n, k, b, parts);
}

void gemm(GemmIsa isa, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
          const float* a, const float* b, float* y) {
  run(isa, ta, tb, m, n, k, a, b, y);
}
void gemm(GemmIsa isa, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
          const double* a, const double* b, double* y) {
  run(isa, ta, tb, m, n, k, a, b, y);
}

}  // namespace shardplan::detail
