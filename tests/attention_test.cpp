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

#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"
#include "torch_reference.hpp"

namespace shardplan {
namespace {

struct One {
  Executor exec{1};
  Mesh mesh = Mesh::parse("x:1", 1);
  Array put(const Tensor& t) const { return device_put(t, NamedSharding(mesh, P()), exec); }
};

Tensor values(const Shape& s, DType dtype, std::uint64_t seed) {
  return Tensor::normal(s, dtype, seed);
}

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

struct Inputs {
  Array q, k, v;
  AttentionOptions o;
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

// The loss and gradients under sjit over `mesh` with q, k, v sharded as given.
std::vector<Tensor> sharded_step(const Mesh& mesh, const Executor& exec, const Inputs& in,
                                 const Tensor& w, const PartitionSpec& spec_q,
                                 const PartitionSpec& spec_kv, std::string* text = nullptr) {
  const auto put = [&](const Array& a, const PartitionSpec& s) {
    return device_put(a.to_host(), NamedSharding(mesh, s), exec);
  };
  const AttentionOptions o = in.o;
  auto step = sjit(mesh, [o](const Array& q, const Array& k, const Array& v, const Array& wt) {
    const Tree<Array> p = Tree<Array>::dict({{"q", q}, {"k", k}, {"v", v}});
    auto [loss, g] = value_and_grad([&](const Tree<Array>& t) {
      return sum(dot_product_attention(t.at("q").leaf(), t.at("k").leaf(), t.at("v").leaf(), o) *
                 wt);
    })(p);
    const Array y = dot_product_attention(q, k, v, o);
    return Tree<Array>::list({y, g.at("q"), g.at("k"), g.at("v")});
  });
  const auto args = std::make_tuple(put(in.q, spec_q), put(in.k, spec_kv), put(in.v, spec_kv),
                                    device_put(w, NamedSharding(mesh, spec_q), exec));
  if (text != nullptr)
    *text = std::apply([&](const auto&... x) { return step.lower(x...); }, args).text();
  const Tree<Array> r = std::apply([&](const auto&... x) { return step(x...); }, args);
  std::vector<Tensor> out;
  for (const Array& a : r.leaves()) out.push_back(a.to_host());
  return out;
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

// ---- Non-finite values: each row of the table in docs/sjit.md ("Non-finite values") ----------
// Expectations by hand from PyTorch's scaled_dot_product_attention (its math: softmax of the
// masked scores, a fully masked row 0 as its safe softmax gives): a row reads the pairs its mask
// and the causal order allow; a NaN among them makes the row NaN; whatever a masked pair holds
// has no effect, so every other row is the run without the NaN.

namespace shardplan {
namespace {

constexpr std::int64_t kNt = 16, kNn = 4, kNk = 2, kNh = 4;  // heads 0, 1 read kv head 0
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// t with the element at multi-index `at` set to x.
Tensor poked(Tensor t, const std::vector<std::int64_t>& at, double x) {
  std::int64_t flat = 0;
  for (int d = 0; d < t.shape().rank(); ++d) flat = flat * t.shape()[d] + at[static_cast<std::size_t>(d)];
  t.set(flat, x);
  return t;
}

// One attention call on [1, T, N, H] / [1, S, K, H] (S = T) host values.
struct Attend {
  One one;
  std::int64_t t = kNt;
  Tensor q = values(Shape{1, t, kNn, kNh}, DType::kF32, 1);
  Tensor k = values(Shape{1, t, kNk, kNh}, DType::kF32, 2);
  Tensor v = values(Shape{1, t, kNk, kNh}, DType::kF32, 3);
  bool causal = false;
  std::optional<Tensor> mask;  // [T, S], i32 0 or 1
  std::optional<Tensor> bias;  // [1, N, T, S]
  std::optional<double> scale;

  AttentionOptions options() const {
    AttentionOptions o{.scale = scale, .is_causal = causal};
    if (mask) o.mask = astype(one.put(*mask), DType::kBool);
    if (bias) o.bias = one.put(*bias);
    return o;
  }
  Tensor operator()() const {
    return dot_product_attention(one.put(q), one.put(k), one.put(v), options()).to_host();
  }
  // sum(attention * w) differentiated: dq, dk, dv.
  std::vector<Tensor> grads(const Tensor& w) const {
    const AttentionOptions o = options();
    const Array wa = one.put(w);
    const Tree<Array> g =
        value_and_grad([&](const Tree<Array>& p) {
          return sum(dot_product_attention(p.at(0).leaf(), p.at(1).leaf(), p.at(2).leaf(), o) * wa);
        })(Tree<Array>::list({Tree<Array>(one.put(q)), Tree<Array>(one.put(k)),
                              Tree<Array>(one.put(v))}))
            .second;
    return {g.at(0).leaf().to_host(), g.at(1).leaf().to_host(), g.at(2).leaf().to_host()};
  }
};

enum class Row { kSame, kNan, kZero };

// Each row (i, n) of y [1, I, N, H] (queries, or keys for dk and dv) against want(i, n): NaN
// (every element, or element `only` alone when given: a NaN value element reaches that element of
// the output), all 0, or the run without the non-finite value (`clean`, finite).
void expect_rows(const Tensor& y, const Tensor& clean,
                 const std::function<Row(std::int64_t, std::int64_t)>& want, int only = -1) {
  const std::int64_t rows = y.shape()[1], heads = y.shape()[2], h = y.shape()[3];
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t n = 0; n < heads; ++n) {
      for (std::int64_t e = 0; e < h; ++e) {
        const Row r = only >= 0 && e != only && want(i, n) == Row::kNan ? Row::kSame : want(i, n);
        const std::int64_t at = (i * heads + n) * h + e;
        const double a = y.get(at), b = clean.get(at);
        SCOPED_TRACE(::testing::Message() << "row " << i << " head " << n << " element " << e);
        if (r == Row::kNan) {
          EXPECT_TRUE(std::isnan(a)) << a;
        } else if (r == Row::kZero) {
          EXPECT_EQ(a, 0.0);
        } else {
          ASSERT_TRUE(std::isfinite(b));
          EXPECT_NEAR(a, b, 1e-6 * (1 + std::abs(b)));
        }
      }
    }
  }
}

Row nan_if(bool x) { return x ? Row::kNan : Row::kSame; }

TEST(AttentionNonFinite, NanQueryGivesANanRow) {
  for (const double bad : {kNaN, kInf}) {  // +inf: scores of +-inf, softmax NaN
    Attend a;
    const Tensor clean = a();
    a.q = poked(a.q, {0, 2, 1, 3}, bad);
    expect_rows(a(), clean, [](std::int64_t t, std::int64_t n) { return nan_if(t == 2 && n == 1); });
  }
}

TEST(AttentionNonFinite, UnmaskedNanKeyOrValueGivesNanInEveryRowThatReadsIt) {
  for (const bool value : {false, true}) {
    SCOPED_TRACE(value ? "value" : "key");
    Attend a;
    const Tensor clean = a();
    (value ? a.v : a.k) = poked(value ? a.v : a.k, {0, 3, 0, 1}, kNaN);  // key 3 of kv head 0
    // Every row of heads 0 and 1 reads key 3; heads 2 and 3 read kv head 1.
    expect_rows(a(), clean, [](std::int64_t, std::int64_t n) { return nan_if(n < 2); },
                value ? 1 : -1);
  }
}

TEST(AttentionNonFinite, NanAtACausallyMaskedPositionHasNoEffect) {
  for (const std::int64_t t : {kNt, std::int64_t{70}}) {  // 70: two key blocks of the kernel
    for (const bool value : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (value ? "value" : "key") << " T=" << t);
      Attend a;
      a.t = t;
      a.q = values(Shape{1, t, kNn, kNh}, DType::kF32, 1);
      a.k = values(Shape{1, t, kNk, kNh}, DType::kF32, 2);
      a.v = values(Shape{1, t, kNk, kNh}, DType::kF32, 3);
      a.causal = true;
      const Tensor clean = a();
      const std::int64_t s = t - 3;
      (value ? a.v : a.k) = poked(value ? a.v : a.k, {0, s, 0, 1}, kNaN);
      // Rows before s never read key s.
      expect_rows(a(), clean,
                  [s](std::int64_t i, std::int64_t n) { return nan_if(n < 2 && i >= s); },
                  value ? 1 : -1);
    }
  }
}

TEST(AttentionNonFinite, NanAtAPositionTheMaskHidesHasNoEffect) {
  for (const int which : {0, 1, 2}) {  // key, value, bias
    SCOPED_TRACE(which);
    Attend a;
    Tensor m(Shape{kNt, kNt}, DType::kI32);
    for (std::int64_t i = 0; i < m.numel(); ++i) m.set(i, i % kNt != 5);  // nobody reads key 5
    a.mask = m;
    a.bias = values(Shape{1, kNn, kNt, kNt}, DType::kF32, 4);
    const Tensor clean = a();
    if (which == 0) a.k = poked(a.k, {0, 5, 0, 1}, kNaN);
    if (which == 1) a.v = poked(a.v, {0, 5, 1, 0}, kNaN);
    if (which == 2) a.bias = poked(*a.bias, {0, 1, 2, 5}, kNaN);
    expect_rows(a(), clean, [](std::int64_t, std::int64_t) { return Row::kSame; });
  }
}

TEST(AttentionNonFinite, NanBiasEntryGivesANanRowUnlessMasked) {
  Attend a;
  a.bias = values(Shape{1, kNn, kNt, kNt}, DType::kF32, 4);
  const Tensor clean = a();
  a.bias = poked(*a.bias, {0, 1, 2, 4}, kNaN);  // head 1, query 2, key 4
  expect_rows(a(), clean, [](std::int64_t t, std::int64_t n) { return nan_if(t == 2 && n == 1); });
  a.causal = true;  // key 4 after query 2: masked
  a.bias = poked(*a.bias, {0, 1, 2, 4}, 0.5);
  const Tensor causal_clean = a();
  a.bias = poked(*a.bias, {0, 1, 2, 4}, kNaN);
  expect_rows(a(), causal_clean, [](std::int64_t, std::int64_t) { return Row::kSame; });
}

TEST(AttentionNonFinite, MinusInfBiasMasksItsPair) {
  // A score of -inf weighs 0 as a masked one (PyTorch's boolean mask is a -inf bias): a NaN value
  // there is not read.
  Attend a;
  Tensor b(Shape{1, 1, 1, kNt}, DType::kF32);
  for (std::int64_t i = 0; i < kNt; ++i) b.set(i, i == 6 ? -kInf : 0.0);
  a.bias = b;
  const Tensor clean = a();
  a.v = poked(a.v, {0, 6, 0, 2}, kNaN);
  expect_rows(a(), clean, [](std::int64_t, std::int64_t) { return Row::kSame; });
}

TEST(AttentionNonFinite, FullyMaskedRowGivesZeroWhateverItHolds) {
  Attend a;
  Tensor m(Shape{kNt, kNt}, DType::kI32);
  for (std::int64_t i = 0; i < m.numel(); ++i) m.set(i, i / kNt != 2);  // query 2 sees nothing
  a.mask = m;
  const Tensor clean = a();
  expect_rows(clean, clean, [](std::int64_t t, std::int64_t) { return t == 2 ? Row::kZero : Row::kSame; });
  a.q = poked(a.q, {0, 2, 1, 0}, kNaN);  // its query NaN: still nothing read
  expect_rows(a(), clean, [](std::int64_t t, std::int64_t) { return t == 2 ? Row::kZero : Row::kSame; });
}

TEST(AttentionNonFinite, NanQueryRowGradients) {
  // Causal, query (2, head 1) NaN, loss sum(y * w): dq is NaN in that row alone (another row's
  // dq depends on its own row); dk and dv of kv head 0 are NaN at the keys row 2 reads (0..2)
  // and the run's without the NaN at the keys it does not (3..: masked for it). PyTorch's
  // decomposed autograd agrees on dq; it makes dk and dv NaN at the masked keys too (0 * NaN),
  // which this kernel's "a masked pair has no effect" does not.
  Attend a;
  a.causal = true;
  const Tensor w = values(a.q.shape(), DType::kF32, 9);
  const std::vector<Tensor> clean = a.grads(w);
  a.q = poked(a.q, {0, 2, 1, 3}, kNaN);
  const std::vector<Tensor> g = a.grads(w);
  expect_rows(g[0], clean[0], [](std::int64_t t, std::int64_t n) { return nan_if(t == 2 && n == 1); });
  for (int i : {1, 2}) {
    SCOPED_TRACE(i == 1 ? "dk" : "dv");
    expect_rows(g[static_cast<std::size_t>(i)], clean[static_cast<std::size_t>(i)],
                [](std::int64_t s, std::int64_t kv) { return nan_if(kv == 0 && s <= 2); });
  }
}

TEST(AttentionNonFinite, NanQueryRowBiasGradient) {
  // Causal with a bias [1, N, T, S], query (2, head 1) NaN: the bias's gradient is NaN at the
  // pairs that row reads (keys 0..2), 0 at its masked pairs as at every masked pair, and the
  // run's without the NaN in every other row.
  Attend a;
  a.causal = true;
  a.bias = values(Shape{1, kNn, kNt, kNt}, DType::kF32, 4);
  const Tensor w = values(a.q.shape(), DType::kF32, 9);
  const auto bias_grad = [&] {
    AttentionOptions o = a.options();
    const Array q = a.one.put(a.q), k = a.one.put(a.k), v = a.one.put(a.v), wa = a.one.put(w);
    return value_and_grad([&](const Array& b) {
             o.bias = b;
             return sum(dot_product_attention(q, k, v, o) * wa);
           })(*o.bias)
        .second.to_host();
  };
  const Tensor clean = bias_grad();
  a.q = poked(a.q, {0, 2, 1, 3}, kNaN);
  const Tensor g = bias_grad();
  for (std::int64_t n = 0; n < kNn; ++n) {
    for (std::int64_t t = 0; t < kNt; ++t) {
      for (std::int64_t s = 0; s < kNt; ++s) {
        const std::int64_t at = (n * kNt + t) * kNt + s;
        SCOPED_TRACE(::testing::Message() << "head " << n << " query " << t << " key " << s);
        if (s > t) {
          EXPECT_EQ(g.get(at), 0.0);
        } else if (n == 1 && t == 2) {
          EXPECT_TRUE(std::isnan(g.get(at)));
        } else {
          EXPECT_NEAR(g.get(at), clean.get(at), 1e-6 * (1 + std::abs(clean.get(at))));
        }
      }
    }
  }
}

TEST(AttentionNonFinite, MaskedNanValueLeavesGradientsOfRowsNotReadingIt) {
  // Causal, element 1 of value 12 of kv head 0 NaN: element 1 of rows 12.. of heads 0, 1 is NaN,
  // and their whole dq; rows before 12 and their dq are the run's without it.
  Attend a;
  a.causal = true;
  const Tensor w = values(a.q.shape(), DType::kF32, 9);
  const Tensor clean_y = a();
  const std::vector<Tensor> clean = a.grads(w);
  a.v = poked(a.v, {0, 12, 0, 1}, kNaN);
  const auto want = [](std::int64_t t, std::int64_t n) { return nan_if(n < 2 && t >= 12); };
  expect_rows(a(), clean_y, want, 1);
  expect_rows(a.grads(w)[0], clean[0], want);  // D = rowsum(dO * O) is NaN: the whole row
}

TEST(AttentionNonFinite, ShardedAndTracedAgreeWithEager) {
  // The NaN query row and the masked NaN key under sjit, the query sequence over 8 devices and
  // the heads over 2: the same NaN rows and values as one device.
  One one;
  Inputs in{one.put(poked(values(Shape{1, 16, 4, 8}, DType::kF32, 1), {0, 5, 1, 2}, kNaN)),
            one.put(poked(values(Shape{1, 16, 2, 8}, DType::kF32, 2), {0, 11, 1, 0}, kNaN)),
            one.put(values(Shape{1, 16, 2, 8}, DType::kF32, 3)),
            {}};
  in.o.is_causal = true;
  const Tensor w = values(in.q.shape(), DType::kF32, 9);
  const std::vector<Tensor> ref = sharded_step(Mesh::parse("data:1", 1), one.exec, in, w, P(), P());
  // Query 5 of head 1 and, for kv head 1 (heads 2, 3), rows 11.. are NaN.
  const Tensor y = ref[0];
  for (std::int64_t t = 0; t < 16; ++t) {
    for (std::int64_t n = 0; n < 4; ++n) {
      const bool nan = (t == 5 && n == 1) || (n >= 2 && t >= 11);
      EXPECT_EQ(std::isnan(y.get((t * 4 + n) * 8)), nan) << t << " " << n;
    }
  }
  const auto same = [](const Tensor& a, const Tensor& b) {
    if (!(a.shape() == b.shape())) return false;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      const double x = a.get(i), z = b.get(i);
      if (!(x == z || (std::isnan(x) && std::isnan(z)))) return false;
    }
    return true;
  };
  Executor eight(8), two(2);
  const std::vector<Tensor> seq =
      sharded_step(Mesh::parse("seq:8", 8), eight, in, w, P(nullptr, "seq"), P());
  const std::vector<Tensor> heads = sharded_step(Mesh::parse("model:2", 2), two, in, w,
                                                 P(nullptr, nullptr, "model"), P(nullptr, nullptr, "model"));
  const char* what[] = {"output", "dq", "dk", "dv"};
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_TRUE(same(seq[i], ref[i])) << what[i] << " with the query sequence sharded";
    EXPECT_TRUE(same(heads[i], ref[i])) << what[i] << " with the heads sharded";
  }
  EXPECT_TRUE(same(dot_product_attention(in.q, in.k, in.v, in.o).to_host(), ref[0])) << "eager";
}

TEST(AttentionNonFinite, ScaleNotFiniteOrNotPositiveIsAnError) {
  Attend a;
  const std::pair<double, const char*> bad[] = {
      {kNaN, "nan"}, {kInf, "inf"}, {-kInf, "-inf"}, {0.0, "0"}, {-1.0, "-1"}};
  for (const auto& [s, text] : bad) {
    a.scale = s;
    EXPECT_THROW_WITH(a(), SpecError, std::string("[dot_product_attention] scale ") + text + " ",
                      std::string("finite and positive"));
  }
}

}  // namespace
}  // namespace shardplan
