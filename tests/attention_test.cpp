// dot_product_attention (fused, include/shardplan/ops.hpp) against the decomposed attention
// written with the other ops (softmax(Q K^T * scale + bias, masked) V): values and gradients in
// f32, f64 and bf16, eager and under sjit; sharded over 8 devices bitwise equal to one device;
// the compiled program's peak holds no [T, S] scores; bad input named.
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "attention_test.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"
#include "torch_reference.hpp"

namespace shardplan {
namespace {

using namespace test;

// Broadcast k/v [B, S, K, H] to the query heads [B, N, S, H] (head n uses kv head n / (N / K)).
Array heads_of(const Array& kv, std::int64_t n) {
  const Shape& s = kv.shape();
  const std::int64_t g = n / s[2];
  const Array t = transpose(kv, {0, 2, 1, 3});  // [B, K, S, H]
  const Array b = broadcast_in_dim(t, Shape{s[0], s[2], g, s[1], s[3]}, {0, 1, 3, 4});
  return reshape(b, Shape{s[0], n, s[1], s[3]});
}

// The decomposed attention: every score held, as the model steps compute it today.
Array decomposed(const Array& q, const Array& k, const Array& v, const AttentionOptions& o) {
  const std::int64_t n = q.shape()[2], h = q.shape()[3];
  const Array qt = transpose(q, {0, 2, 1, 3});  // [B, N, T, H]
  const double scale = o.scale ? *o.scale : 1 / std::sqrt(static_cast<double>(h));
  Array s = matmul(qt, transpose(heads_of(k, n), {0, 1, 3, 2})) * scale;  // [B, N, T, S]
  if (o.bias) s = s + *o.bias;
  if (o.mask) s = where(*o.mask, s, full_like(s, -1e30));
  if (o.is_causal) s = where(less_equal(iota_like(s, 3), iota_like(s, 2)), s, full_like(s, -1e30));
  return transpose(matmul(softmax(s, -1), heads_of(v, n)), {0, 2, 1, 3});
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    m = std::max(m, std::abs(a.get(i) - b.get(i)) / (1 + std::abs(b.get(i))));
  }
  return m;
}

struct Config {
  const char* name;
  std::int64_t b, t, n, s, k, h;
  bool causal, mask, bias;
  std::optional<double> scale;
};

const Config kConfigs[] = {
    {"plain", 1, 16, 2, 16, 2, 8, false, false, false, {}},
    {"causal", 2, 16, 2, 16, 2, 8, true, false, false, {}},
    {"gqa_causal_blocks", 2, 67, 8, 131, 2, 16, true, false, false, {}},
    {"mask_bias_scale", 2, 67, 8, 131, 2, 16, false, true, true, 0.3},
    {"causal_mask_bias", 1, 70, 4, 70, 4, 8, true, true, true, {}},
};

Inputs inputs(const One& one, const Config& c, DType dtype) {
  Inputs in{one.put(values(Shape{c.b, c.t, c.n, c.h}, dtype, 1)),
            one.put(values(Shape{c.b, c.s, c.k, c.h}, dtype, 2)),
            one.put(values(Shape{c.b, c.s, c.k, c.h}, dtype, 3)),
            {}};
  in.o.is_causal = c.causal;
  in.o.scale = c.scale;
  if (c.mask) {
    // Every query keeps key 0 (a row with no key is checked separately); others drop one in 3.
    Tensor m(Shape{c.t, c.s}, DType::kI32);
    for (std::int64_t i = 0; i < m.numel(); ++i) m.set(i, (i % c.s) == 0 || (i * 7) % 3 != 0);
    in.o.mask = astype(one.put(m), DType::kBool);
  }
  if (c.bias) in.o.bias = one.put(values(Shape{c.b, c.n, 1, c.s}, dtype, 4));
  return in;
}

TEST(Attention, FusedEqualsDecomposedInF32AndF64) {
  One one;
  for (const Config& c : kConfigs) {
    for (const DType dtype : {DType::kF32, DType::kF64}) {
      SCOPED_TRACE(std::string(c.name) + " " + std::string(name(dtype)));
      const Inputs in = inputs(one, c, dtype);
      const Array fused = dot_product_attention(in.q, in.k, in.v, in.o);
      EXPECT_EQ(fused.dtype(), dtype);
      EXPECT_EQ(fused.shape(), in.q.shape());
      const double diff =
          max_rel_diff(fused.to_host(), decomposed(in.q, in.k, in.v, in.o).to_host());
      EXPECT_LT(diff, dtype == DType::kF64 ? 1e-12 : 2e-6);
    }
  }
}

TEST(Attention, Bf16ComputesInF32) {
  One one;
  const Config& c = kConfigs[2];
  const Inputs in = inputs(one, c, DType::kBF16);
  const Array fused = dot_product_attention(in.q, in.k, in.v, in.o);
  EXPECT_EQ(fused.dtype(), DType::kBF16);
  // The decomposed attention in f32 on the same (bf16) values, rounded once to bf16.
  AttentionOptions o = in.o;
  const Array want = decomposed(astype(in.q, DType::kF32), astype(in.k, DType::kF32),
                                astype(in.v, DType::kF32), o);
  EXPECT_LT(max_rel_diff(fused.to_host(), astype(want, DType::kBF16).to_host()), 8e-3);
}

// d/d(q, k, v, bias) of sum(attention * w) for a fixed w.
Tree<Array> gradients(bool fused, const Inputs& in, const Array& w) {
  Tree<Array> params = Tree<Array>::dict({{"q", in.q}, {"k", in.k}, {"v", in.v}});
  if (in.o.bias)
    params = Tree<Array>::dict({{"q", in.q}, {"k", in.k}, {"v", in.v}, {"b", *in.o.bias}});
  const AttentionOptions base = in.o;
  return value_and_grad([&](const Tree<Array>& p) {
           AttentionOptions o = base;
           if (o.bias) o.bias = p.at("b").leaf();
           const Array& q = p.at("q").leaf();
           const Array& k = p.at("k").leaf();
           const Array& v = p.at("v").leaf();
           const Array y = fused ? dot_product_attention(q, k, v, o) : decomposed(q, k, v, o);
           return sum(y * w);
         })(params)
      .second;
}

TEST(Attention, GradientsEqualTheDecomposedOnes) {
  One one;
  for (const Config& c : kConfigs) {
    for (const DType dtype : {DType::kF32, DType::kF64}) {
      SCOPED_TRACE(std::string(c.name) + " " + std::string(name(dtype)));
      const Inputs in = inputs(one, c, dtype);
      const Array w = one.put(values(in.q.shape(), dtype, 9));
      const Tree<Array> got = gradients(true, in, w);
      const Tree<Array> want = gradients(false, in, w);
      for (const char* key : {"q", "k", "v", "b"}) {
        if (std::string(key) == "b" && !in.o.bias) continue;
        SCOPED_TRACE(key);
        const double diff =
            max_rel_diff(got.at(key).leaf().to_host(), want.at(key).leaf().to_host());
        EXPECT_LT(diff, dtype == DType::kF64 ? 1e-11 : 2e-5);
      }
    }
  }
}

// ---- Against PyTorch (tests/data/attention_reference.txt, scripts/gen_attention_reference.py) --

TEST(Attention, EqualsPyTorchInF64AndF32) {
  One one;
  const auto ref = test::read_torch_reference("attention_reference.txt");
  ASSERT_EQ(ref.size(), 2u);
  const std::int64_t b = 2, t = 5, n = 4, s = 7, kv = 2, h = 3;
  for (const DType dtype : {DType::kF64, DType::kF32}) {
    for (const auto& [name, want] : ref) {
      SCOPED_TRACE(name + " " + std::string(shardplan::name(dtype)));
      const bool masked = name == "mask_bias_scale";
      Inputs in{one.put(test::formula(Shape{b, t, n, h}, dtype, 0.37, 0.11)),
                one.put(test::formula(Shape{b, s, kv, h}, dtype, 0.53, -0.2)),
                one.put(test::formula(Shape{b, s, kv, h}, dtype, 0.71, 0.3)),
                {}};
      in.o.is_causal = !masked;
      if (masked) {
        in.o.scale = 0.4;
        in.o.bias = one.put(test::formula(Shape{1, n, t, s}, dtype, 0.23, 0.05));
        Tensor m(Shape{t, s}, DType::kI32);
        for (std::int64_t i = 0; i < m.numel(); ++i) m.set(i, i % s == 0 || (i * 7) % 3 != 0);
        in.o.mask = astype(one.put(m), DType::kBool);
      }
      Tensor w(in.q.shape(), dtype);
      for (std::int64_t i = 0; i < w.numel(); ++i)
        w.set(i, std::cos(0.29 * static_cast<double>(i)));
      const Tree<Array> g = gradients(true, in, one.put(w));
      const double tol = dtype == DType::kF64 ? 1e-12 : 1e-5;
      const auto check = [&](const Tensor& got, const std::string& key) {
        const test::RefTensor& r = want.at(key);
        ASSERT_EQ(got.numel(), static_cast<std::int64_t>(r.v.size())) << key;
        for (std::int64_t i = 0; i < got.numel(); ++i) {
          const double x = r.v[static_cast<std::size_t>(i)];
          ASSERT_NEAR(got.get(i), x, tol * (1 + std::abs(x))) << key << " element " << i;
        }
      };
      check(dot_product_attention(in.q, in.k, in.v, in.o).to_host(), "o");
      check(g.at("q").leaf().to_host(), "dq");
      check(g.at("k").leaf().to_host(), "dk");
      check(g.at("v").leaf().to_host(), "dv");
      if (masked) check(g.at("b").leaf().to_host(), "dbias");
    }
  }
}

TEST(Attention, ARowWithNoAllowedKeyGivesZero) {
  One one;
  const Array q = one.put(values(Shape{1, 4, 2, 8}, DType::kF32, 1));
  const Array k = one.put(values(Shape{1, 5, 2, 8}, DType::kF32, 2));
  Tensor m(Shape{4, 5}, DType::kI32);
  for (std::int64_t i = 0; i < m.numel(); ++i) m.set(i, i / 5 != 2);  // query 2 sees nothing
  AttentionOptions o;
  o.mask = astype(one.put(m), DType::kBool);
  const Tensor y = dot_product_attention(q, k, k, o).to_host();
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const bool row2 = (i / 16) == 2;
    if (row2) {
      EXPECT_EQ(y.get(i), 0.0);
    } else {
      EXPECT_TRUE(std::isfinite(y.get(i)));
    }
  }
  // Its gradients are finite (zero from that row).
  const Array w = one.put(values(Shape{1, 4, 2, 8}, DType::kF32, 5));
  const Array dq =
      value_and_grad([&](const Array& x) { return sum(dot_product_attention(x, k, k, o) * w); })(q)
          .second;
  const Tensor g = dq.to_host();
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    EXPECT_TRUE(std::isfinite(g.get(i)));
    if ((i / 16) == 2) {
      EXPECT_EQ(g.get(i), 0.0);
    }
  }
}

TEST(Attention, ShardedOverEightDevicesIsBitwiseOneDevice) {
  One one;
  const Config c{"gqa", 2, 67, 8, 67, 4, 16, true, false, false, {}};
  const Inputs in = inputs(one, c, DType::kF32);
  const Tensor w = values(in.q.shape(), DType::kF32, 9);
  Executor eight(8);
  const std::vector<Tensor> ref = sharded_step(Mesh::parse("data:1", 1), one.exec, in, w, P(), P());
  // Batch over data, heads over model.
  std::string heads_text, seq_text;
  const std::vector<Tensor> heads =
      sharded_step(Mesh::parse("data:2,model:4", 8), eight, in, w, P("data", nullptr, "model"),
                   P("data", nullptr, "model"), &heads_text);
  // Each device runs its batch and kv head (of 2 query heads): nothing gathered.
  EXPECT_THAT(heads_text, ::testing::HasSubstr("attention on blocks [1, 67, 1, 2, 17]"));
  EXPECT_THAT(heads_text, ::testing::HasSubstr("attention_grad_kv on blocks [1, 67, 1, 2, 16]"));
  // The query sequence over all eight (k and v replicated).
  const Inputs in2 =
      inputs(one, Config{"seq", 1, 128, 4, 128, 2, 16, true, false, false, {}}, DType::kF32);
  const Tensor w2 = values(in2.q.shape(), DType::kF32, 8);
  const std::vector<Tensor> ref2 =
      sharded_step(Mesh::parse("data:1", 1), one.exec, in2, w2, P(), P());
  const std::vector<Tensor> seq =
      sharded_step(Mesh::parse("seq:8", 8), eight, in2, w2, P(nullptr, "seq"), P(), &seq_text);
  EXPECT_THAT(seq_text, ::testing::HasSubstr("attention on blocks [1, 16, 2, 2, 17]"));
  EXPECT_THAT(seq_text, ::testing::HasSubstr("attention_grad_q on blocks [1, 16, 2, 2, 16]"));
  const char* what[] = {"output", "dq", "dk", "dv"};
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(heads[i] == ref[i]) << what[i] << " with heads sharded";
    EXPECT_TRUE(seq[i] == ref2[i]) << what[i] << " with the query sequence sharded";
  }
}

TEST(Attention, GroupedQueryHeadsShardedFinerThanKvHeads) {
  // 8 query heads of 2 kv heads over model:4: q's heads split 4 ways, so each kv head's group
  // is split over 2 devices; k and v are split over data only. The output and dq are bitwise one
  // device's; dk and dv sum the group's halves on two devices (another order of the same sum).
  One one;
  const Inputs in =
      inputs(one, Config{"gqa", 2, 67, 8, 67, 2, 16, true, false, false, {}}, DType::kF32);
  const Tensor w = values(in.q.shape(), DType::kF32, 9);
  Executor eight(8);
  const std::vector<Tensor> ref = sharded_step(Mesh::parse("data:1", 1), one.exec, in, w, P(), P());
  const std::vector<Tensor> got = sharded_step(Mesh::parse("data:2,model:4", 8), eight, in, w,
                                               P("data", nullptr, "model"), P("data"));
  EXPECT_TRUE(got[0] == ref[0]) << "output";
  EXPECT_TRUE(got[1] == ref[1]) << "dq";
  EXPECT_LT(max_rel_diff(got[2], ref[2]), 1e-6) << "dk";
  EXPECT_LT(max_rel_diff(got[3], ref[3]), 1e-6) << "dv";
}

TEST(Attention, CompiledPeakHoldsNoScoreArray) {
  One one;
  const std::int64_t t = 1024, n = 2, h = 16;
  const Shape qs{1, t, n, h};
  const TensorSpec spec(qs, DType::kF32);
  const auto loss = [](bool fused) {
    return [fused](const Array& q, const Array& k, const Array& v) {
      AttentionOptions o;
      o.is_causal = true;
      return value_and_grad([&](const Array& x) {
               return sum(fused ? dot_product_attention(x, k, v, o) : decomposed(x, k, v, o));
             })(q)
          .second;
    };
  };
  const std::int64_t scores = t * t * 4;  // one head's [T, S] scores in f32
  auto fused = sjit(one.mesh, loss(true), {.executor = one.exec});
  auto naive = sjit(one.mesh, loss(false), {.executor = one.exec});
  const std::int64_t peak = fused.lower(spec, spec, spec).cost().peak_bytes.at(0);
  const std::int64_t naive_peak = naive.lower(spec, spec, spec).cost().peak_bytes.at(0);
  // What the program holds is a dozen arrays the size of q (inputs, the packed result, the
  // cotangent, the gradient): O(T), far below one head's scores.
  EXPECT_LT(peak, 12 * t * n * h * 4) << fused.lower(spec, spec, spec).text();
  EXPECT_LT(peak, scores / 2);
  EXPECT_GT(naive_peak, n * scores) << "the decomposed attention holds every head's scores";
}

// What the backward pass keeps is FlashAttention-2's: the output in q's dtype (bf16) and the f32
// log-sum-exp per query row (flash_attn's FlashAttnFunc saves out and softmax_lse), not the
// kernel's packed f32 [b, t, n, h + 1] result, which is freed within the forward pass. Counted
// by hand at the backward pass's first step, for a loss whose own backward keeps nothing.
TEST(Attention, BackwardKeepsTheBf16OutputAndTheLogSumExp) {
  One one;
  const std::int64_t b = 2, t = 64, n = 4, h = 16;
  const TensorSpec spec(Shape{b, t, n, h}, DType::kBF16);
  auto f = sjit(
      one.mesh,
      [](const Array& q, const Array& k, const Array& v) {
        return value_and_grad([&](const Array& x) {
                 return sum(astype(dot_product_attention(x, k, v, {.is_causal = true}), DType::kF32));
               })(q)
            .second;
      },
      {.executor = one.exec});
  const Lowered low = f.lower(spec, spec, spec);
  const MemoryTimeline& m = low.cost().timeline;
  ASSERT_EQ(m.phases.size(), 2u);
  ASSERT_EQ(m.phases[1].phase, StepPhase::kBackward);
  const std::int64_t rows = b * t * n, bf16 = rows * h * 2;
  const std::int64_t inputs = 3 * bf16;
  const std::int64_t grouped_q = bf16;  // q as [b, t, kv, group, h], read by the backward kernels
  const std::int64_t kept = bf16 + rows * 4;  // the bf16 output and the f32 log-sum-exp
  const std::int64_t seed = 4;                // the loss's cotangent, one f32
  EXPECT_EQ(m.start_bytes, inputs);
  EXPECT_EQ(m.live_bytes.at(m.phases[1].step), inputs + grouped_q + kept + seed) << low.text();
  // The packed f32 result (4 (h + 1) bytes a row) is not held: it would be 2.1x the kept bytes.
  EXPECT_LT(m.live_bytes.at(m.phases[1].step), inputs + grouped_q + rows * (h + 1) * 4);
}

TEST(Attention, BadInputIsNamed) {
  One one;
  const auto a = [&](Shape s, DType d = DType::kF32) { return one.put(values(s, d, 1)); };
  const Array q = a(Shape{2, 8, 4, 16}), k = a(Shape{2, 6, 2, 16});
  EXPECT_THROW_WITH(dot_product_attention(a(Shape{8, 4, 16}), k, k), SpecError,
                    "[dot_product_attention]", "f32[8, 4, 16]", "needs q [B, T, N, H]");
  EXPECT_THROW_WITH(dot_product_attention(q, a(Shape{3, 6, 2, 16}), a(Shape{3, 6, 2, 16})),
                    SpecError, "differ in batch");
  EXPECT_THROW_WITH(dot_product_attention(q, a(Shape{2, 6, 2, 8}), a(Shape{2, 6, 2, 8})), SpecError,
                    "differ in head size");
  EXPECT_THROW_WITH(dot_product_attention(q, k, a(Shape{2, 7, 2, 16})), SpecError,
                    "k and v differ in shape", "f32[2, 7, 2, 16]");
  EXPECT_THROW_WITH(dot_product_attention(q, a(Shape{2, 6, 3, 16}), a(Shape{2, 6, 3, 16})),
                    SpecError, "query heads 4 are not a multiple of kv heads 3");
  EXPECT_THROW_WITH(dot_product_attention(q, k, a(Shape{2, 6, 2, 16}, DType::kF64)), SpecError,
                    "differ in dtype");
  EXPECT_THROW_WITH(
      dot_product_attention(a(Shape{2, 8, 4, 16}, DType::kI32), a(Shape{2, 6, 2, 16}, DType::kI32),
                            a(Shape{2, 6, 2, 16}, DType::kI32)),
      SpecError, "must be float");
  AttentionOptions bad_mask;
  bad_mask.mask = astype(a(Shape{8, 5}), DType::kBool);
  EXPECT_THROW_WITH(dot_product_attention(q, k, k, bad_mask), SpecError, "the mask bool[8, 5]",
                    "does not broadcast to [2, 4, 8, 6]");
  AttentionOptions float_mask;
  float_mask.mask = a(Shape{8, 6});
  EXPECT_THROW_WITH(dot_product_attention(q, k, k, float_mask), SpecError,
                    "the mask f32[8, 6] is not bool");
  AttentionOptions int_bias;
  int_bias.bias = a(Shape{8, 6}, DType::kI32);
  EXPECT_THROW_WITH(dot_product_attention(q, k, k, int_bias), SpecError,
                    "the bias i32[8, 6] is not of q's dtype");
  AttentionOptions deep_bias;
  deep_bias.bias = a(Shape{1, 2, 4, 8, 6});
  EXPECT_THROW_WITH(dot_product_attention(q, k, k, deep_bias), SpecError,
                    "has more than 4 dimensions");
}

TEST(Attention, TracedEqualsEager) {
  One one;
  const Inputs in = inputs(one, kConfigs[3], DType::kF32);
  const AttentionOptions o = in.o;
  auto f = sjit(one.mesh, [o](const Array& q, const Array& k, const Array& v) {
    return dot_product_attention(q, k, v, o);
  });
  EXPECT_TRUE(f(in.q, in.k, in.v).to_host() ==
              dot_product_attention(in.q, in.k, in.v, o).to_host());
}

}  // namespace
}  // namespace shardplan

namespace shardplan {
namespace {

// A second derivative through the fused attention (the gradient of a function of its gradient)
// is refused by name: the backward kernels have no VJP, and a silent zero would be wrong.
TEST(Attention, SecondDerivativeIsRefusedNotZero) {
  One one;
  const Shape s{1, 4, 2, 3};
  const Array q = one.put(values(s, DType::kF64, 1)), k = one.put(values(s, DType::kF64, 2)),
              v = one.put(values(s, DType::kF64, 3));
  const auto inner = [&](const Array& qq) {
    return sum(dot_product_attention(qq, k, v, AttentionOptions{.is_causal = true}));
  };
  // The first derivative is fine.
  EXPECT_EQ(grad(inner)(q).shape(), s);
  const auto outer = [&](const Array& qq) { return sum(grad(inner)(qq)); };
  EXPECT_THROW_WITH(grad(outer)(q), SpecError, "second derivative", "not supported");
}

}  // namespace
}  // namespace shardplan
