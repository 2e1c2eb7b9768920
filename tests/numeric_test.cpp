// The numeric policy (src/runtime/numeric.hpp, docs/runtime.md "Numeric policy"): the scalar rules
// by themselves, then the property they exist for: a reduction over a sharded axis (per-device
// kernels, then the ordered cross-device reduction) gives exactly the unsharded result for NaN,
// signed zeros and wrapping integers, on 1, 2, 4 and 8 devices. Run under the asan preset,
// UBSan checks that no integer overflow is signed.
#include "numeric.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "shardplan/collectives.hpp"
#include "shardplan/ops.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::int32_t kI32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int32_t kI32Min = std::numeric_limits<std::int32_t>::min();
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();

TEST(NumericPolicy, MaxAndMinPropagateNaNFromEitherSide) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(detail::maximum(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(detail::maximum(1.0f, nan)));
  EXPECT_TRUE(std::isnan(detail::minimum(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(detail::minimum(1.0f, nan)));
  EXPECT_EQ(detail::maximum(2.0, 3.0), 3.0);
  EXPECT_EQ(detail::minimum(2.0, 3.0), 2.0);
  EXPECT_EQ(detail::maximum(kI32Min, kI32Max), kI32Max);
}

TEST(NumericPolicy, PositiveZeroIsAboveNegativeZeroInEitherOrder) {
  EXPECT_FALSE(std::signbit(detail::maximum(-0.0, 0.0)));
  EXPECT_FALSE(std::signbit(detail::maximum(0.0, -0.0)));
  EXPECT_TRUE(std::signbit(detail::minimum(-0.0f, 0.0f)));
  EXPECT_TRUE(std::signbit(detail::minimum(0.0f, -0.0f)));
}

TEST(NumericPolicy, IntegerArithmeticWrapsModuloTwoToTheBits) {
  EXPECT_EQ(detail::add(kI32Max, std::int32_t{1}), kI32Min);
  EXPECT_EQ(detail::sub(kI32Min, std::int32_t{1}), kI32Max);
  EXPECT_EQ(detail::mul(std::int32_t{65536}, std::int32_t{65536}), 0);  // 2^32
  EXPECT_EQ(detail::negate(kI32Min), kI32Min);
  EXPECT_EQ(detail::add(kI64Max, std::int64_t{2}), std::numeric_limits<std::int64_t>::min() + 1);
  EXPECT_EQ(detail::divide(std::int32_t{7}, std::int32_t{0}), -1);
  EXPECT_EQ(detail::divide(kI32Min, std::int32_t{-1}), kI32Min);
  EXPECT_EQ(detail::divide(std::int32_t{-7}, std::int32_t{2}), -3);  // toward zero
  // An int64 accumulator narrows to int32 modulo 2^32: 2^32 + 5 -> 5, 2^31 -> INT32_MIN.
  EXPECT_EQ((detail::narrow<std::int32_t>(std::int64_t{4294967301})), 5);
  EXPECT_EQ((detail::narrow<std::int32_t>(std::int64_t{2147483648})), kI32Min);
}

TEST(NumericPolicy, DoublesStoreSaturatedIntoIntegersAndRoundedIntoBf16) {
  EXPECT_EQ(detail::from_double<std::int32_t>(1e20), kI32Max);
  EXPECT_EQ(detail::from_double<std::int32_t>(-1e20), kI32Min);
  EXPECT_EQ(detail::from_double<std::int32_t>(kNaN), 0);
  EXPECT_EQ(detail::from_double<std::int32_t>(-3.9), -3);
  EXPECT_EQ(detail::from_double<std::int64_t>(1e19), kI64Max);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even gives 1.
  EXPECT_EQ(detail::from_double<bf16>(1.0 + 1.0 / 256).bits, 0x3f80);
  EXPECT_EQ(detail::from_double<bf16>(1.0 + 3.0 / 256).bits, 0x3f82);  // tie, up to even
  EXPECT_TRUE(std::isnan(detail::to_double(detail::from_double<bf16>(kNaN))));
  // The host tensor's store_value is the same rule (it was an undefined cast out of range).
  Tensor t(Shape{2}, DType::kI32);
  t.set(0, 1e20);
  t.set(1, kNaN);
  EXPECT_EQ(t.get(0), kI32Max);
  EXPECT_EQ(t.get(1), 0);
}

TEST(NumericPolicy, HalvesDecodeExactlyIncludingSubnormalsInfAndNaN) {
  EXPECT_EQ(detail::half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(detail::half_to_float(0xc000), -2.0f);
  EXPECT_EQ(detail::half_to_float(0x7bff), 65504.0f);                 // the largest half
  EXPECT_EQ(detail::half_to_float(0x0001), std::ldexp(1.0f, -24));    // the smallest subnormal
  EXPECT_EQ(detail::half_to_float(0x03ff), std::ldexp(1023.0f, -24));  // the largest one
  EXPECT_TRUE(std::signbit(detail::half_to_float(0x8000)));
  EXPECT_EQ(detail::half_to_float(0x8000), 0.0f);
  EXPECT_EQ(detail::half_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  std::uint32_t bits = 0;
  const float nan = detail::half_to_float(0x7e01);
  std::memcpy(&bits, &nan, 4);
  EXPECT_EQ(bits, 0x7fc02000u);  // quiet NaN, payload kept
}

// Reductions of a 1-D array over its only axis, split over n devices ("x": n) or not at all.
struct Split {
  Executor exec;
  Mesh mesh;
  explicit Split(int n) : exec(n), mesh(Mesh::parse("x:" + std::to_string(n), n)) {}
  Array put(const Tensor& t, bool sharded) const {
    return device_put(t, NamedSharding(mesh, sharded ? P("x") : P()), exec);
  }
};

Tensor floats(const std::vector<double>& v) {
  Tensor t(Shape{static_cast<std::int64_t>(v.size())}, DType::kF32);
  for (std::size_t i = 0; i < v.size(); ++i) t.set(static_cast<std::int64_t>(i), v[i]);
  return t;
}

TEST(NumericPolicy, ShardedMaxMinAndSumKeepANaNInAnyShard) {
  for (const int n : {1, 2, 4, 8}) {
    const Split s(n);
    // The NaN sits in every position in turn, so that it is in the first, a middle and the
    // last shard (a reduction that keeps its first operand on ties drops a later NaN).
    for (std::int64_t at = 0; at < 8; ++at) {
      std::vector<double> v{3, -1, 7, 2, 5, -4, 6, 0};
      v[static_cast<std::size_t>(at)] = kNaN;
      const Tensor host = floats(v);
      for (const bool sharded : {false, true}) {
        const Array x = s.put(host, sharded);
        EXPECT_TRUE(std::isnan(max(x, {0}).to_host().get(0))) << n << " at " << at << sharded;
        EXPECT_TRUE(std::isnan(min(x, {0}).to_host().get(0))) << n << " at " << at << sharded;
        EXPECT_TRUE(std::isnan(sum(x, {0}).to_host().get(0))) << n << " at " << at << sharded;
      }
    }
  }
}

TEST(NumericPolicy, ShardedMaxAndMinOfSignedZerosMatchTheUnshardedOnes) {
  for (const int n : {1, 2, 4, 8}) {
    const Split s(n);
    // -0 first then +0, and +0 first then -0: every shard order must give +0 for max, -0 for min.
    for (const bool negative_first : {true, false}) {
      std::vector<double> v(8);
      for (std::size_t i = 0; i < 8; ++i) v[i] = ((i < 4) == negative_first) ? -0.0 : 0.0;
      const Tensor host = floats(v);
      for (const bool sharded : {false, true}) {
        const Array x = s.put(host, sharded);
        EXPECT_FALSE(std::signbit(max(x, {0}).to_host().get(0))) << n << negative_first << sharded;
        EXPECT_TRUE(std::signbit(min(x, {0}).to_host().get(0))) << n << negative_first << sharded;
      }
    }
  }
}

TEST(NumericPolicy, ShardedIntegerSumsWrapToTheSameBitsAsUnshardedOnes) {
  // 8 * INT32_MAX = 2^34 - 8, which is -8 modulo 2^32; 8 * INT64_MAX = 2^66 - 8, -8 modulo 2^64.
  for (const int n : {1, 2, 4, 8}) {
    const Split s(n);
    const Tensor i32 = Tensor::from<std::int32_t>(Shape{8}, std::vector<std::int32_t>(8, kI32Max));
    const Tensor i64 = Tensor::from<std::int64_t>(Shape{8}, std::vector<std::int64_t>(8, kI64Max));
    const Tensor mixed = Tensor::from<std::int32_t>(
        Shape{8}, {kI32Max, kI32Max, kI32Min, 5, kI32Max, -3, kI32Max, kI32Max});
    // mixed: 5 * (2^31 - 1) - 2^31 + 2 = 4 * 2^31 - 3 = 2^33 - 3, which is -3 modulo 2^32.
    for (const bool sharded : {false, true}) {
      EXPECT_EQ(sum(s.put(i32, sharded), {0}).to_host().data<std::int32_t>()[0], -8)
          << n << sharded;
      EXPECT_EQ(sum(s.put(i64, sharded), {0}).to_host().data<std::int64_t>()[0], -8)
          << n << sharded;
      EXPECT_EQ(sum(s.put(mixed, sharded), {0}).to_host().data<std::int32_t>()[0], -3)
          << n << sharded;
    }
  }
}

TEST(NumericPolicy, AllReduceOfPendingShardsPropagatesNaNWhereverItIs) {
  // Cross-device reduction alone (no kernel): device k's shard holds NaN at element k.
  const int n = 8;
  const Executor exec(n);
  const NamedSharding s(Mesh::parse("x:8", n), P());
  for (const ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kSum}) {
    std::vector<std::shared_ptr<Buffer>> bufs(n);
    for (int d = 0; d < n; ++d) {
      Tensor t = Tensor::from<float>(Shape{8}, std::vector<float>(8, static_cast<float>(d)));
      t.set(d, kNaN);
      bufs[static_cast<std::size_t>(d)] = std::make_shared<Buffer>(exec.allocate(d, t.nbytes()));
      std::memcpy(bufs[static_cast<std::size_t>(d)]->data(), t.bytes(),
                  static_cast<std::size_t>(t.nbytes()));
    }
    const Array x = Array::from_buffers(exec, Shape{8}, DType::kF32, s, bufs, Pending{op, {"x"}});
    const Tensor host = x.to_host();
    const Tensor reduced = all_reduce(x, {}).to_host();
    for (std::int64_t i = 0; i < 8; ++i) {
      EXPECT_TRUE(std::isnan(host.get(i))) << to_string(op) << " element " << i;
      EXPECT_TRUE(std::isnan(reduced.get(i))) << to_string(op) << " element " << i;
    }
  }
}

}  // namespace
}  // namespace shardplan
