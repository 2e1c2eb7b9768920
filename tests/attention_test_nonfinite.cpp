// dot_product_attention with non-finite values (NaN, +-inf in q, k, v, bias and the scale):
// each row of the table in docs/sjit.md, eager, sharded and traced.
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attention_test.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "test_util.hpp"

// ---- Non-finite values: each row of the table in docs/sjit.md ("Non-finite values") ----------
// Expectations by hand from PyTorch's scaled_dot_product_attention (its math: softmax of the
// masked scores, a fully masked row 0 as its safe softmax gives): a row reads the pairs its mask
// and the causal order allow; a NaN among them makes the row NaN; whatever a masked pair holds
// has no effect, so every other row is the run without the NaN.

namespace shardplan {
namespace {

using namespace test;

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
