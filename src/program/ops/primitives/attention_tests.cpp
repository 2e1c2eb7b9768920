// The test declarations of the fused attention primitives (primitive_tests.hpp): cases, and a
// naive reference in double that forms every score of a row at once (no blocks, no online
// softmax), written apart from the kernels.
#include <cmath>
#include <limits>

#include "../../ir/primitive_tests.hpp"
#include "attention.hpp"

namespace shardplan::detail {
namespace {

DType accumulator_of(DType d) { return d == DType::kF64 ? DType::kF64 : DType::kF32; }

// q [B, T, K, G, H], k/v [B, S, K, H] and the mask and bias shapes of a case.
struct CaseShape {
  std::int64_t b, t, k, g, h, s;
  AttentionAttrs attrs;
  std::optional<Shape> mask, bias;
};

std::vector<CaseShape> case_shapes() {
  return {
      // causal, T == S, two kv heads of two query heads each
      {2, 8, 2, 2, 4, 8, {.scale = 0.5, .causal = true}, {}, {}},
      // a mask shared by batch and heads, a bias per head, T != S
      {2,
       8,
       2,
       2,
       3,
       12,
       {.scale = 0.6, .has_mask = true, .has_bias = true},
       Shape{1, 1, 1, 8, 12},
       Shape{1, 2, 2, 8, 12}},
      // causal with a bias per batch and key, more keys than queries, one kv head of three
      {1,
       6,
       1,
       3,
       4,
       10,
       {.scale = 0.7, .causal = true, .has_bias = true},
       {},
       Shape{1, 1, 1, 1, 10}},
  };
}

std::vector<TestCase> cases_of(DType t, bool backward) {
  std::vector<TestCase> cases;
  for (const CaseShape& c : case_shapes()) {
    TestCase tc{.attrs = c.attrs, .operands = {}};
    tc.operands.push_back({{Shape{c.b, c.t, c.k, c.g, c.h}, t}});
    tc.operands.push_back({{Shape{c.b, c.s, c.k, c.h}, t}});
    tc.operands.push_back({{Shape{c.b, c.s, c.k, c.h}, t}});
    if (backward) {
      const TensorType packed{Shape{c.b, c.t, c.k, c.g, c.h + 1}, accumulator_of(t)};
      // The log-sum-exp column of the packed result (and the output beside it) large enough that
      // P = exp(score - lse) stays below a few: random rows of a real softmax.
      tc.operands.push_back({packed, Domain{.low = 4, .high = 8}});
      tc.operands.push_back({packed});
    }
    if (c.mask) tc.operands.push_back({{*c.mask, DType::kBool}});
    if (c.bias) tc.operands.push_back({{*c.bias, t}});
    cases.push_back(std::move(tc));
  }
  return cases;
}

std::vector<TestCase> forward_cases(const Primitive&, DType t) { return cases_of(t, false); }
std::vector<TestCase> backward_cases(const Primitive&, DType t) { return cases_of(t, true); }

// The operands of a node in double, indexed by name.
struct Naive {
  std::span<const HostValues> in;
  AttentionAttrs a;
  int first;
  std::int64_t B, T, K, G, H, S;

  Naive(const Node& n, std::span<const HostValues> x, int first_extra)
      : in(x), a(n.attr<AttentionAttrs>()), first(first_extra) {
    const Shape& q = x[0].shape;
    B = q[0], T = q[1], K = q[2], G = q[3], H = q[4], S = x[1].shape[1];
  }
  double q(std::int64_t b, std::int64_t t, std::int64_t k, std::int64_t g, std::int64_t h) const {
    return in[0].v[static_cast<std::size_t>((((b * T + t) * K + k) * G + g) * H + h)];
  }
  double kv(int which, std::int64_t b, std::int64_t s, std::int64_t k, std::int64_t h) const {
    return in[static_cast<std::size_t>(which)]
        .v[static_cast<std::size_t>(((b * S + s) * K + k) * H + h)];
  }
  double packed(int which, std::int64_t b, std::int64_t t, std::int64_t k, std::int64_t g,
                std::int64_t h) const {
    return in[static_cast<std::size_t>(which)]
        .v[static_cast<std::size_t>((((b * T + t) * K + k) * G + g) * (H + 1) + h)];
  }
  // Element [b, k, g, t, s] of a broadcast operand.
  double broadcast(int at, std::array<std::int64_t, 5> i) const {
    const HostValues& x = in[static_cast<std::size_t>(at)];
    std::int64_t off = 0;
    for (int d = 0; d < 5; ++d)
      off = off * x.shape[d] + (x.shape[d] == 1 ? 0 : i[static_cast<std::size_t>(d)]);
    return x.v[static_cast<std::size_t>(off)];
  }
  // The score of query (b, t, k, g) and key s, or nothing when masked (by the mask, the causal
  // order or a score of -inf).
  std::optional<double> score(std::int64_t b, std::int64_t t, std::int64_t k, std::int64_t g,
                              std::int64_t s) const {
    if (a.causal && s > t) return std::nullopt;
    if (a.has_mask && broadcast(mask_operand(a, first), {b, k, g, t, s}) == 0) return std::nullopt;
    double x = 0;
    for (std::int64_t h = 0; h < H; ++h) x += q(b, t, k, g, h) * kv(1, b, s, k, h);
    x *= a.scale;
    if (a.has_bias) x += broadcast(bias_operand(a, first), {b, k, g, t, s});
    if (x == -std::numeric_limits<double>::infinity()) return std::nullopt;  // masked by its value
    return x;
  }
};

std::vector<double> forward_reference(const Node& n, std::span<const HostValues> in) {
  const Naive w(n, in, 3);
  std::vector<double> y;
  for (std::int64_t b = 0; b < w.B; ++b) {
    for (std::int64_t t = 0; t < w.T; ++t) {
      for (std::int64_t k = 0; k < w.K; ++k) {
        for (std::int64_t g = 0; g < w.G; ++g) {
          // PyTorch's softmax: a NaN score not masked makes the row NaN; a row with every pair
          // masked (or -inf) gives 0 and a log-sum-exp of -inf.
          std::vector<std::optional<double>> s(static_cast<std::size_t>(w.S));
          double mx = -std::numeric_limits<double>::infinity();
          for (std::int64_t j = 0; j < w.S; ++j) {
            s[static_cast<std::size_t>(j)] = w.score(b, t, k, g, j);
            const auto& x = s[static_cast<std::size_t>(j)];
            if (x && (std::isnan(*x) || *x > mx)) mx = std::isnan(mx) ? mx : *x;
          }
          const bool none = mx == -std::numeric_limits<double>::infinity();
          double total = 0;
          std::vector<double> o(static_cast<std::size_t>(w.H), 0.0);
          for (std::int64_t j = 0; j < w.S; ++j) {
            if (!s[static_cast<std::size_t>(j)] || none) continue;
            const double p = std::exp(*s[static_cast<std::size_t>(j)] - mx);
            total += p;
            for (std::int64_t h = 0; h < w.H; ++h)
              o[static_cast<std::size_t>(h)] += p * w.kv(2, b, j, k, h);
          }
          for (const double x : o) y.push_back(none ? 0.0 : x / total);
          y.push_back(none ? mx : mx + std::log(total));
        }
      }
    }
  }
  return y;
}

// dq [B, T, K, G, H] or dk and dv [B, S, K, 2, H] from the packed result and its cotangent.
std::vector<double> backward_reference(const Node& n, std::span<const HostValues> in, bool kv) {
  const Naive w(n, in, 5);
  std::vector<double> dq(static_cast<std::size_t>(w.B * w.T * w.K * w.G * w.H), 0.0);
  std::vector<double> dkv(static_cast<std::size_t>(w.B * w.S * w.K * 2 * w.H), 0.0);
  for (std::int64_t b = 0; b < w.B; ++b) {
    for (std::int64_t t = 0; t < w.T; ++t) {
      for (std::int64_t k = 0; k < w.K; ++k) {
        for (std::int64_t g = 0; g < w.G; ++g) {
          const double lse = w.packed(3, b, t, k, g, w.H);
          double d = -w.packed(4, b, t, k, g, w.H);
          for (std::int64_t h = 0; h < w.H; ++h)
            d += w.packed(4, b, t, k, g, h) * w.packed(3, b, t, k, g, h);
          for (std::int64_t j = 0; j < w.S; ++j) {
            const auto s = w.score(b, t, k, g, j);
            if (!s || lse == -std::numeric_limits<double>::infinity()) continue;
            const double p = std::exp(*s - lse);
            double dp = 0;
            for (std::int64_t h = 0; h < w.H; ++h)
              dp += w.packed(4, b, t, k, g, h) * w.kv(2, b, j, k, h);
            const double ds = p * (dp - d);
            for (std::int64_t h = 0; h < w.H; ++h) {
              dq[static_cast<std::size_t>((((b * w.T + t) * w.K + k) * w.G + g) * w.H + h)] +=
                  ds * w.kv(1, b, j, k, h) * w.a.scale;
              const std::int64_t at = (((b * w.S + j) * w.K + k) * 2) * w.H + h;
              dkv[static_cast<std::size_t>(at)] += ds * w.q(b, t, k, g, h) * w.a.scale;
              dkv[static_cast<std::size_t>(at + w.H)] += p * w.packed(4, b, t, k, g, h);
            }
          }
        }
      }
    }
  }
  return kv ? dkv : dq;
}

std::vector<double> grad_q_reference(const Node& n, std::span<const HostValues> in) {
  return backward_reference(n, in, false);
}
std::vector<double> grad_kv_reference(const Node& n, std::span<const HostValues> in) {
  return backward_reference(n, in, true);
}

}  // namespace

constinit const PrimitiveTests kAttentionTests{.public_ops = "dot_product_attention",
                                               .dtypes = kFloatTypes,
                                               .cases = forward_cases,
                                               .reference = forward_reference,
                                               .gradient = true};
constinit const PrimitiveTests kAttentionGradQTests{.public_ops = "dot_product_attention",
                                                    .dtypes = kFloatTypes,
                                                    .cases = backward_cases,
                                                    .reference = grad_q_reference,
                                                    .gradient_refused = true};
constinit const PrimitiveTests kAttentionGradKvTests{.public_ops = "dot_product_attention",
                                                     .dtypes = kFloatTypes,
                                                     .cases = backward_cases,
                                                     .reference = grad_kv_reference,
                                                     .gradient_refused = true};

}  // namespace shardplan::detail
