// Ring attention (context parallelism, shard_map.hpp): equal to dot_product_attention over the
// whole sequence (causal in the load-balanced order, and not causal), values and gradients,
// eagerly and under sjit, grouped-query heads; over processes bitwise equal to one process of 8
// devices; bad input named.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/profiler.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sjit.hpp"
#include "ring_attention_test.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace ring_test;  // NOLINT: the suite's shared helpers

TEST(RingAttention, CausalLoadBalancedEqualsWholeSequenceAttention) {
  const Inputs in;
  const Results want = reference(in, true);
  Executor exec{4};
  expect_close(by_ring(in, true, exec, 4, false), want, 2e-5, "eager, cp:4");
  expect_close(by_ring(in, true, exec, 4, true), want, 2e-5, "sjit, cp:4");
  const Executor two = Executor::process_local(2);
  expect_close(by_ring(in, true, two, 2, true), want, 2e-5, "sjit, cp:2");
}

TEST(RingAttention, NotCausalEqualsWholeSequenceAttention) {
  const Inputs in;
  Executor exec{4};
  expect_close(by_ring(in, false, exec, 4, true), reference(in, false), 2e-5, "sjit, cp:4");
}

// The blocks read from one all-gather are the blocks the ring passes on, met in the same steps:
// the same values and gradients bit for bit, eagerly and under sjit, causal or not.
TEST(RingAttention, AllGatherRotationIsThePermutingRingBitForBit) {
  const Inputs in;
  Executor exec{4};
  for (const bool causal : {true, false}) {
    for (const bool jit : {false, true}) {
      const std::string what = std::string(causal ? "causal" : "not causal") + (jit ? ", sjit" : ", eager");
      const Results gathered = by_ring(in, causal, exec, 4, jit, RingRotate::kAllGather);
      expect_bitwise(gathered, by_ring(in, causal, exec, 4, jit), what);
      expect_close(gathered, reference(in, causal), 2e-5, what);
    }
  }
}

// What each rotation sends, counted by hand for n = 4 devices, forward and backward: permuting,
// 3 steps forward, 3 backward with the blocks and 3 with their gradients, and 1 sending the
// gradients home (10 ppermutes); gathering, one all-gather each way and the gradients' 3 + 1.
TEST(RingAttention, AllGatherRotationGathersOnceEachWayAndSendsTheGradientsRound) {
  const Inputs in;
  Executor exec{4};
  const Mesh m = Mesh::parse("cp:4", 4);
  const PartitionSpec spec = P(nullptr, "cp");
  const auto put = [&](const Tensor& t) { return device_put(t, NamedSharding(m, spec), exec); };
  const Array q = put(in.q), k = put(in.k), v = put(in.v);
  for (const RingRotate rotate : {RingRotate::kPermute, RingRotate::kAllGather}) {
    auto f = sjit(m, [&](const Array& qq, const Array& kk, const Array& vv) {
      return value_and_grad([&](const Array& x) {
               return sum(context_parallel_attention(qq, x, vv, m, spec, "cp", true, std::nullopt,
                                                     rotate));
             })(kk)
          .second;
    });
    int gathers = 0, permutes = 0;
    for (const LoweredOp& op : f.lower(q, k, v).ops()) {
      if (op.composite != composite::kRingAttention) continue;
      gathers += op.primitive == "pall_gather" ? 1 : 0;
      permutes += op.primitive == "ppermute" ? 1 : 0;
    }
    const bool gather = rotate == RingRotate::kAllGather;
    EXPECT_EQ(gathers, gather ? 2 : 0) << (gather ? "all-gather" : "permute");
    EXPECT_EQ(permutes, gather ? 4 : 10) << (gather ? "all-gather" : "permute");
  }
}

TEST(RingAttention, LoadBalancedOrderGivesEachDeviceTwoMirroredChunks) {
  // 16 tokens over 4 devices: chunks of 2; device d holds chunks d and 7 - d.
  EXPECT_EQ(load_balanced_positions(16, 4),
            (std::vector<std::int64_t>{0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9}));
  EXPECT_THROW_WITH(load_balanced_positions(12, 4), SpecError, "12 tokens", "2 x 4");
}

// Over processes (mpirun -np 2 and 4: the 8 devices span them), bitwise the values of one
// process holding all 8 devices.
TEST(RingAttention, OverProcessesBitwiseOneProcessOfEightDevices) {
  const Inputs in;
  Executor global{8};
  const Executor local = Executor::process_local(8);
  const Results a = by_ring(in, true, global, 8, true);
  const Results b = by_ring(in, true, local, 8, true);
  expect_bitwise(a, b, "8 devices over the processes and in one");
  expect_close(a, reference(in, true), 2e-5, "cp:8");
}

TEST(RingAttention, BadInputIsNamed) {
  Executor exec{4};
  const Mesh m = Mesh::parse("cp:4", 4);
  const auto put = [&](Shape s) {
    return device_put(Tensor::uniform(std::move(s), DType::kF32, 1, -1, 1),
                      NamedSharding(m, P(nullptr, "cp")), exec);
  };
  const Array q = put(Shape{1, 8, 3, 4}), k = put(Shape{1, 8, 2, 4});
  EXPECT_THROW_WITH(context_parallel_attention(q, k, k, m, P(nullptr, "cp"), "cp", true), SpecError,
                    "ring_attention", "multiple of kv heads");
  const Array odd = put(Shape{1, 4, 2, 4});  // blocks of 1 token: not two chunks
  EXPECT_THROW_WITH(context_parallel_attention(odd, odd, odd, m, P(nullptr, "cp"), "cp", true),
                    SpecError, "even");
  EXPECT_THROW_WITH(context_parallel_attention(k, k, k, m, P("cp"), "cp", true), SpecError,
                    "dimension 1");
}

// ---- Non-finite values (docs/sjit.md "Non-finite values") ------------------------------------

Tensor poked(Tensor t, const std::vector<std::int64_t>& at, double x) {
  std::int64_t flat = 0;
  for (int d = 0; d < t.shape().rank(); ++d) flat = flat * t.shape()[d] + at[static_cast<std::size_t>(d)];
  t.set(flat, x);
  return t;
}

// Row (b, t, n) of y [B, T, N, H] is NaN in every element when nan(b, t, n), else within tol of
// `clean`'s (finite).
void expect_nan_rows(const Tensor& y, const Tensor& clean,
                     const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& nan,
                     const std::string& what) {
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const std::int64_t n = i / kH % kN, t = i / (kH * kN) % kT, b = i / (kH * kN * kT);
    if (nan(b, t, n)) {
      EXPECT_TRUE(std::isnan(y.get(i))) << what << " row " << b << ", " << t << ", head " << n;
    } else {
      ASSERT_TRUE(std::isfinite(clean.get(i)));
      EXPECT_NEAR(y.get(i), clean.get(i), 2e-5) << what << " row " << b << ", " << t << ", head " << n;
    }
  }
}

// NaN where `want` is NaN, within tol elsewhere.
void expect_same_nans(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape());
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    if (std::isnan(want.get(i))) {
      EXPECT_TRUE(std::isnan(got.get(i))) << what << " element " << i;
    } else {
      EXPECT_NEAR(got.get(i), want.get(i), 2e-5) << what << " element " << i;
    }
  }
}

void expect_same_nans(const Results& got, const Results& want, const std::string& what) {
  expect_same_nans(got.out, want.out, what + " output");
  expect_same_nans(got.dq, want.dq, what + " dq");
  expect_same_nans(got.dk, want.dk, what + " dk");
  expect_same_nans(got.dv, want.dv, what + " dv");
}

// One NaN key on one device (position 40 of 64: on cp:4 it lies on device 2, causal or not):
// every row that reads it (unmasked) is NaN, every other row is the run's without it; the
// gradients have NaN where whole-sequence attention has them.
TEST(RingAttention, NanKeyGivesNanInTheRowsThatReadItAlone) {
  Executor exec{4};
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    Inputs in;
    const Results clean = by_ring(in, causal, exec, 4, true);
    in.k = poked(in.k, {0, 40, 0, 3}, std::numeric_limits<double>::quiet_NaN());  // kv head 0
    const auto reads = [causal](std::int64_t b, std::int64_t t, std::int64_t n) {
      return b == 0 && n < 2 && (!causal || t >= 40);
    };
    const Results want = reference(in, causal);
    for (const bool jit : {true, false}) {
      const Results got = by_ring(in, causal, exec, 4, jit);
      expect_nan_rows(got.out, clean.out, reads, jit ? "sjit" : "eager");
      expect_same_nans(got, want, jit ? "sjit" : "eager");
    }
  }
}

TEST(RingAttention, NanQueryGivesANanRow) {
  Executor exec{4};
  Inputs in;
  const Results clean = by_ring(in, true, exec, 4, true);
  in.q = poked(in.q, {1, 10, 3, 0}, std::numeric_limits<double>::quiet_NaN());
  const Results got = by_ring(in, true, exec, 4, true);
  const auto row = [](std::int64_t b, std::int64_t t, std::int64_t n) {
    return b == 1 && t == 10 && n == 3;
  };
  expect_nan_rows(got.out, clean.out, row, "output");
  expect_nan_rows(got.dq, clean.dq, row, "dq");
  expect_same_nans(got, reference(in, true), "against whole-sequence attention");
}

TEST(RingAttention, ScaleNotFiniteOrNotPositiveIsNamed) {
  Executor exec{4};
  const Mesh m = Mesh::parse("cp:4", 4);
  const Array q = device_put(Inputs{}.q, NamedSharding(m, P(nullptr, "cp")), exec);
  EXPECT_THROW_WITH(context_parallel_attention(q, q, q, m, P(nullptr, "cp"), "cp", true,
                                               std::numeric_limits<double>::quiet_NaN()),
                    SpecError, "[context_parallel_attention] scale nan", "finite and positive");
  const auto ring = [&](double scale) {
    return shard_map(
        [scale](const Array& a) { return ring_attention(a, a, a, "cp", false, scale); }, m,
        {P(nullptr, "cp")}, {P(nullptr, "cp")})(q);
  };
  EXPECT_THROW_WITH(ring(0), SpecError, "[ring_attention] scale 0 ", "finite and positive");
  EXPECT_THROW_WITH(ring(-std::numeric_limits<double>::infinity()), SpecError,
                    "[ring_attention] scale -inf");
}

// A program says it holds ring attention by the composite its definition declares on its ops
// (forward and backward), not from any ppermute: a user's own ppermute in a shard_map is no
// ring attention (train-plan's "context parallel" reads this: src/train/step_trace.cpp).
TEST(RingAttention, ItsOpsAreTheCompositesAndAUsersPpermuteIsNot) {
  const Inputs in;
  Executor exec{4};
  const Mesh m = Mesh::parse("cp:4", 4);
  const PartitionSpec spec = P(nullptr, "cp");
  const auto put = [&](const Tensor& t) { return device_put(t, NamedSharding(m, spec), exec); };
  const Array q = put(in.q), k = put(in.k), v = put(in.v);
  auto ring = sjit(m, [&](const Array& qq, const Array& kk, const Array& vv) {
    return value_and_grad([&](const Array& x) {
             return sum(context_parallel_attention(x, kk, vv, m, spec, "cp", false));
           })(qq)
        .second;
  });
  int ring_ppermutes = 0, other_ppermutes = 0;
  for (const LoweredOp& op : ring.lower(q, k, v).ops()) {
    if (op.primitive != "ppermute") continue;
    (op.composite == composite::kRingAttention ? ring_ppermutes : other_ppermutes) += 1;
  }
  EXPECT_GT(ring_ppermutes, 0);
  EXPECT_EQ(other_ppermutes, 0);  // the backward pass's sends are the ring's too
  // A user's ppermute, even under a scope named after the ring.
  auto shift = sjit(m, [&](const Array& x) {
    const NamedScope scope("ring_attention");
    return shard_map(
        [](const Array& b) { return lax::ppermute(b, "cp", {{0, 1}, {1, 2}, {2, 3}, {3, 0}}); }, m,
        {spec}, {spec})(x);
  });
  int ppermutes = 0;
  for (const LoweredOp& op : shift.lower(q).ops()) {
    if (op.primitive != "ppermute") continue;
    ++ppermutes;
    EXPECT_EQ(op.composite, "");
    EXPECT_EQ(op.scope, "ring_attention");
  }
  EXPECT_EQ(ppermutes, 1);
}

}  // namespace
}  // namespace shardplan
