// The GEMM variants (src/runtime/gemm.hpp): each one this CPU runs against a product computed
// here in long double, for every transpose combination and awkward sizes, and against each other.
#include "gemm.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "shardplan/error.hpp"
#include "test_util.hpp"

namespace shardplan::detail {
namespace {

template <class T>
std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// op(a) * op(b) by definition, in long double.
template <class T>
std::vector<long double> reference(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                                   const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<long double> y(static_cast<std::size_t>(m * n), 0.0L);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      long double acc = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const T av =
            ta ? a[static_cast<std::size_t>(p * m + i)] : a[static_cast<std::size_t>(i * k + p)];
        const T bv =
            tb ? b[static_cast<std::size_t>(j * k + p)] : b[static_cast<std::size_t>(p * n + j)];
        acc += static_cast<long double>(av) * static_cast<long double>(bv);
      }
      y[static_cast<std::size_t>(i * n + j)] = acc;
    }
  }
  return y;
}

struct Size {
  std::int64_t m, n, k;
};
// Sizes around the kernels' register and cache blocks, a row, a column and an empty contraction.
const std::vector<Size> kSizes = {{1, 1, 1},   {3, 5, 7},   {16, 16, 16},  {17, 33, 65},
                                  {1, 200, 9}, {97, 1, 40}, {64, 48, 300}, {5, 6, 0}};

template <class T>
void check_every_variant(double tolerance) {
  for (const GemmIsa isa : gemm_isas()) {
    for (const Size& s : kSizes) {
      for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
          SCOPED_TRACE(
              fmt::format("{} m={} n={} k={} ta={} tb={}", name(isa), s.m, s.n, s.k, ta, tb));
          const auto a = random_values<T>(static_cast<std::size_t>(s.m * s.k), 1);
          const auto b = random_values<T>(static_cast<std::size_t>(s.k * s.n), 2);
          std::vector<T> y(static_cast<std::size_t>(s.m * s.n), T(12345));  // overwritten
          gemm(isa, ta, tb, s.m, s.n, s.k, a.data(), b.data(), y.data());
          const auto want = reference(ta, tb, s.m, s.n, s.k, a, b);
          for (std::size_t i = 0; i < y.size(); ++i) {
            // Each term is at most 1 in magnitude: the error is bounded by k roundings.
            ASSERT_NEAR(static_cast<double>(y[i]), static_cast<double>(want[i]),
                        tolerance * static_cast<double>(std::max<std::int64_t>(s.k, 1)))
                << "element " << i;
          }
        }
      }
    }
  }
}

TEST(Gemm, EveryVariantThisCpuRunsComputesTheProduct) {
  ASSERT_FALSE(gemm_isas().empty());
  EXPECT_EQ(gemm_isas().front(), GemmIsa::kGeneric);
  check_every_variant<float>(1e-6);
  check_every_variant<double>(1e-14);
}

TEST(Gemm, VariantsAgreeAndEachIsBitwiseDeterministic) {
  const std::int64_t m = 130, n = 70, k = 257;
  const auto a = random_values<float>(static_cast<std::size_t>(m * k), 3);
  const auto b = random_values<float>(static_cast<std::size_t>(k * n), 4);
  std::vector<float> generic(static_cast<std::size_t>(m * n));
  gemm(GemmIsa::kGeneric, false, false, m, n, k, a.data(), b.data(), generic.data());
  for (const GemmIsa isa : gemm_isas()) {
    SCOPED_TRACE(std::string(name(isa)));
    std::vector<float> first(generic.size()), second(generic.size());
    gemm(isa, false, false, m, n, k, a.data(), b.data(), first.data());
    gemm(isa, false, false, m, n, k, a.data(), b.data(), second.data());
    EXPECT_EQ(first, second);
    for (std::size_t i = 0; i < first.size(); ++i) ASSERT_NEAR(first[i], generic[i], 1e-4) << i;
  }
}

// 64-byte aligned storage, as device buffers are.
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  explicit AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64));
  }
  void deallocate(T* p, std::size_t) { std::free(p); }
  friend bool operator==(const AlignedAllocator&, const AlignedAllocator&) { return true; }
};

// gemm_shared_b (one packing of b for several parts) gives each part bitwise what gemm() gives
// it alone, in every variant and transpose combination: sizes past Eigen's depth and row blocks
// (k = 700, n = 600), parts smaller than a register block, the shapes Eigen multiplies another
// way (a row, a column, the small coefficient-wise product, an empty contraction) and parts of
// unequal rows (run one by one).
template <class T>
void check_shared_b() {
  struct Case {
    std::vector<std::int64_t> rows;
    std::int64_t n, k;
  };
  const std::vector<Case> cases = {{{64, 64, 64, 64}, 600, 700},
                                   {{7, 7, 7}, 33, 65},
                                   {{256, 256}, 48, 300},
                                   {{1, 1}, 40, 30},
                                   {{5, 5}, 1, 40},
                                   {{3, 3}, 4, 5},
                                   {{9, 9}, 6, 0},
                                   {{12, 40, 12}, 50, 70}};
  for (const GemmIsa isa : gemm_isas()) {
    for (const Case& c : cases) {
      for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
          SCOPED_TRACE(fmt::format("{} rows={} n={} k={} ta={} tb={}", name(isa),
                                   fmt::join(c.rows, ","), c.n, c.k, ta, tb));
          // Device buffers are 64-byte aligned (Executor::allocate), and Eigen's small
          // coefficient-wise product vectorizes by the result's alignment: aligned here too.
          const auto b = random_values<T>(static_cast<std::size_t>(c.k * c.n), 7);
          std::vector<std::vector<T, AlignedAllocator<T>>> alone, shared;
          std::vector<std::vector<T>> as;
          std::vector<GemmRows<T>> parts;
          for (std::size_t p = 0; p < c.rows.size(); ++p) {
            const auto m = static_cast<std::size_t>(c.rows[p]);
            as.push_back(
                random_values<T>(m * static_cast<std::size_t>(c.k), static_cast<unsigned>(10 + p)));
            alone.emplace_back(m * static_cast<std::size_t>(c.n));
            shared.emplace_back(m * static_cast<std::size_t>(c.n), T(12345));  // overwritten
          }
          for (std::size_t p = 0; p < c.rows.size(); ++p) {
            gemm(isa, ta, tb, c.rows[p], c.n, c.k, as[p].data(), b.data(), alone[p].data());
            parts.push_back({c.rows[p], as[p].data(), shared[p].data()});
          }
          gemm_shared_b(isa, ta, tb, c.n, c.k, b.data(), std::span<const GemmRows<T>>(parts));
          for (std::size_t p = 0; p < c.rows.size(); ++p) EXPECT_EQ(shared[p], alone[p]) << p;
        }
      }
    }
  }
}

TEST(Gemm, ASharedRightOperandGivesEachPartItsOwnProductBitwise) {
  check_shared_b<float>();
  check_shared_b<double>();
}

// exp_shifted (the attention kernels' softmax): near std::exp in every variant, the argument
// raised to `lowest`, and each element's value independent of where it lies in the array.
template <class T>
void check_exp(GemmIsa isa, double tol) {
  const std::vector<T> x = random_values<T>(203, 7);
  for (const std::int64_t n : {1, 5, 64, 203}) {
    std::vector<T> y(x.begin(), x.begin() + n);
    exp_shifted(isa, y.data(), n, T(0.25), T(-0.5));
    for (std::int64_t i = 0; i < n; ++i) {
      const double want = std::exp(std::max(static_cast<double>(x[i]) - 0.25, -0.5));
      EXPECT_NEAR(y[i], want, tol * want) << name(isa) << " element " << i << " of " << n;
    }
    // The same values one element further on: bitwise the same results.
    std::vector<T> z(static_cast<std::size_t>(n) + 1);
    std::copy(x.begin(), x.begin() + n, z.begin() + 1);
    exp_shifted(isa, z.data() + 1, n, T(0.25), T(-0.5));
    for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], z[i + 1]) << name(isa) << " at " << i;
  }
}

TEST(Gemm, ExpShiftedIsExpInEveryVariantWhereverTheElementLies) {
  for (const GemmIsa isa : gemm_isas()) {
    check_exp<float>(isa, 4e-7);
    check_exp<double>(isa, 1e-15);
  }
}

TEST(Gemm, TheVariantIsChosenByTheCpuOrByName) {
  EXPECT_EQ(choose_gemm_isa(nullptr), gemm_isas().back());
  EXPECT_EQ(choose_gemm_isa(""), gemm_isas().back());
  for (const GemmIsa isa : gemm_isas()) {
    EXPECT_EQ(choose_gemm_isa(std::string(name(isa)).c_str()), isa);
  }
  EXPECT_THROW_WITH(choose_gemm_isa("sse9"), Error, "SHARDPLAN_GEMM=sse9", "generic");
  // A variant this CPU cannot run is refused by name, not run (it would fault).
  if (gemm_isas().back() != GemmIsa::kAvx512) {
    EXPECT_THROW_WITH(choose_gemm_isa("avx512"), Error, "SHARDPLAN_GEMM=avx512");
  }
}

}  // namespace
}  // namespace shardplan::detail
