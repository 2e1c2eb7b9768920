// float8: the two formats' codes (src/runtime/numeric.hpp) against the format definitions and a
// brute-force nearest-value search written here, apart from the encoder; conversion to and from
// them on devices (astype). PyTorch's float8 dtypes (2.1+) are not in Debian's python3-torch 1.13,
// so the reference is the search: every finite value of the format, the nearest one taken, a
// tie going to the even code, and one more value past the largest standing for overflow (the
// next code, NaN for e4m3, inf for e5m2), which is how PyTorch's and ml_dtypes' casts behave.
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "../src/program/ir/primitives.hpp"
#include "numeric.hpp"
#include "shardplan/array.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/program_cost.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using detail::F8Format;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The value of a code by the format's definition: (-1)^s 2^(e - bias) 1.m, or 2^(1 - bias) 0.m
// when e = 0; e4m3 has only S.1111.111 as NaN, e5m2 has inf and NaN at e = 31.
double spec_value(bool e4m3, int code) {
  const int eb = e4m3 ? 4 : 5, mb = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const double sign = (code & 0x80) != 0 ? -1.0 : 1.0;
  const int e = (code >> mb) & ((1 << eb) - 1);
  const int m = code & ((1 << mb) - 1);
  if (e4m3 && (code & 0x7f) == 0x7f) return kNaN;
  if (!e4m3 && e == 31) return m == 0 ? sign * kInf : kNaN;
  if (e == 0) return sign * std::ldexp(m, 1 - bias - mb);
  return sign * std::ldexp((1 << mb) + m, e - bias - mb);
}

const F8Format& format(bool e4m3) { return e4m3 ? detail::kE4M3 : detail::kE5M2; }

TEST(Float8, EveryCodeDecodesAsTheFormatDefinesIt) {
  for (const bool e4m3 : {true, false}) {
    for (int c = 0; c < 256; ++c) {
      const double want = spec_value(e4m3, c);
      const double got = detail::f8_decode(format(e4m3), static_cast<std::uint8_t>(c));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << (e4m3 ? "e4m3 " : "e5m2 ") << c;
      } else {
        EXPECT_EQ(got, want) << (e4m3 ? "e4m3 " : "e5m2 ") << c;
        EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
      }
    }
  }
}

TEST(Float8, KnownCodesByHand) {
  const F8Format& a = detail::kE4M3;
  const F8Format& b = detail::kE5M2;
  EXPECT_EQ(detail::f8_decode(a, 0x7e), 448.0f);
  EXPECT_EQ(detail::f8_decode(a, 0xfe), -448.0f);
  EXPECT_EQ(detail::f8_decode(a, 0x38), 1.0f);
  EXPECT_EQ(detail::f8_decode(a, 0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(detail::f8_decode(a, 0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(detail::f8_decode(a, 0x78), 256.0f);   // e = 15 is a normal binade in e4m3
  EXPECT_TRUE(std::isnan(detail::f8_decode(a, 0x7f)));
  EXPECT_TRUE(std::isnan(detail::f8_decode(a, 0xff)));
  EXPECT_EQ(detail::f8_decode(b, 0x7b), 57344.0f);
  EXPECT_EQ(detail::f8_decode(b, 0x3c), 1.0f);
  EXPECT_EQ(detail::f8_decode(b, 0x01), 0x1p-16f);
  EXPECT_EQ(detail::f8_decode(b, 0x7c), std::numeric_limits<float>::infinity());
  EXPECT_EQ(detail::f8_decode(b, 0xfc), -std::numeric_limits<float>::infinity());
  for (const int c : {0x7d, 0x7e, 0x7f, 0xff}) EXPECT_TRUE(std::isnan(detail::f8_decode(b, c)));
  EXPECT_EQ(detail::f8_max(a), 448.0);
  EXPECT_EQ(detail::f8_max(b), 57344.0);
}

// The code the search gives for x: the nearest finite value (a tie to the even code), or the
// overflow code when the value one step past the largest is nearer.
int nearest_code(bool e4m3, double x) {
  if (std::isnan(x)) return 0x7f | (std::signbit(x) ? 0x80 : 0);
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::abs(x);
  struct Candidate {
    double value;
    int code;
  };
  std::vector<Candidate> cands;
  for (int c = 0; c < 0x80; ++c) {
    const double v = spec_value(e4m3, c);
    if (std::isfinite(v)) cands.push_back({v, c});
  }
  // Past the largest: 480 (the code 0x7f, NaN) for e4m3, 65536 (0x7c, inf) for e5m2.
  const int over = e4m3 ? 0x7f : 0x7c;
  cands.push_back({e4m3 ? 480.0 : 65536.0, over});
  if (a >= cands.back().value) return sign | over;  // (far past it, distances round alike)
  const Candidate* best = &cands[0];
  for (const Candidate& c : cands) {
    const double d = std::abs(c.value - a), bd = std::abs(best->value - a);
    if (d < bd || (d == bd && (c.code & 1) == 0 && (best->code & 1) != 0)) best = &c;
  }
  return sign | best->code;
}

void expect_encodes(bool e4m3, double x) {
  const int want = nearest_code(e4m3, x);
  const int got = detail::f8_encode(format(e4m3), x);
  EXPECT_EQ(got, want) << (e4m3 ? "e4m3" : "e5m2") << " of " << x;
}

TEST(Float8, EncodingRoundsToTheNearestValueTiesToEven) {
  for (const bool e4m3 : {true, false}) {
    // Every value, the midpoints between neighbours and a hair either side of them.
    std::vector<double> vs;
    for (int c = 0; c < 0x80; ++c) {
      const double v = spec_value(e4m3, c);
      if (std::isfinite(v)) vs.push_back(v);
    }
    vs.push_back(e4m3 ? 480.0 : 65536.0);
    for (std::size_t i = 0; i < vs.size(); ++i) {
      for (const double s : {1.0, -1.0}) {
        expect_encodes(e4m3, s * vs[i]);
        if (i + 1 == vs.size()) continue;
        const double mid = (vs[i] + vs[i + 1]) / 2;
        for (const double x : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, kInf)}) {
          expect_encodes(e4m3, s * x);
        }
      }
    }
    // Random magnitudes from far below the smallest subnormal to far past the largest value.
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> lg(-24, 20), sign(-1, 1);
    for (int i = 0; i < 20000; ++i) {
      const double x = std::exp2(lg(rng)) * (sign(rng) < 0 ? -1 : 1);
      expect_encodes(e4m3, x);
      expect_encodes(e4m3, static_cast<double>(static_cast<float>(x)));
    }
    for (const double x : {0.0, -0.0, kInf, -kInf, kNaN, -kNaN, 1e300, -1e-300}) {
      expect_encodes(e4m3, x);
    }
  }
}

TEST(Float8, OverflowIsNaNForE4M3AndInfForE5M2) {
  EXPECT_EQ(detail::f8_encode(detail::kE4M3, 463.99), 0x7e);  // rounds down to 448
  EXPECT_EQ(detail::f8_encode(detail::kE4M3, 464.0), 0x7e);   // the tie goes to even 448
  EXPECT_EQ(detail::f8_encode(detail::kE4M3, 464.01), 0x7f);  // would be 480: NaN
  EXPECT_EQ(detail::f8_encode(detail::kE4M3, -1e6), 0xff);
  EXPECT_EQ(detail::f8_encode(detail::kE4M3, kInf), 0x7f);
  EXPECT_EQ(detail::f8_encode(detail::kE5M2, 61439.0), 0x7b);  // 57344
  EXPECT_EQ(detail::f8_encode(detail::kE5M2, 61440.0), 0x7c);  // the tie goes to even: inf
  EXPECT_EQ(detail::f8_encode(detail::kE5M2, -1e6), 0xfc);
  EXPECT_EQ(detail::f8_encode(detail::kE5M2, -0.0), 0x80);
}

TEST(Float8, EveryValueEncodesBackToItsCode) {
  for (const bool e4m3 : {true, false}) {
    for (int c = 0; c < 256; ++c) {
      const double v = spec_value(e4m3, c);
      if (std::isnan(v)) continue;
      EXPECT_EQ(detail::f8_encode(format(e4m3), v), c);
    }
  }
}

TEST(Float8, HostTensorsGetAndSetThroughTheCodes) {
  Tensor t(Shape{3}, DType::kF8E4M3);
  t.set(0, 1.0);
  t.set(1, 500.0);
  t.set(2, -0.3);
  EXPECT_EQ(t.get(0), 1.0);
  EXPECT_TRUE(std::isnan(t.get(1)));
  EXPECT_EQ(t.get(2), -0.3125);  // 1.25 * 2^-2, the nearest e4m3 value
  Tensor u(Shape{1}, DType::kF8E5M2);
  u.set(0, 1e5);
  EXPECT_EQ(u.get(0), kInf);
}

// ---- astype on devices ------------------------------------------------------------------------

Array on_one(const Tensor& t) {
  static const Executor exec(1);
  return device_put(t, NamedSharding(Mesh::parse("d:1", 1), P()), exec);
}

TEST(Float8, AstypeEncodesAsTheSearchAndDecodesExactly) {
  const std::vector<double> xs = {0,   -0.0, 1,   -1.5,  0.3,  1e-3, 2e-6, 300,
                                  460, 470,  5e4, 6.2e4, -1e9, kInf, kNaN};
  const Tensor x = Tensor::from<double>(Shape{static_cast<std::int64_t>(xs.size())}, xs);
  for (const bool e4m3 : {true, false}) {
    const DType f8 = e4m3 ? DType::kF8E4M3 : DType::kF8E5M2;
    for (const DType from : {DType::kF64, DType::kF32, DType::kBF16}) {
      const Tensor got = astype(astype(on_one(x), from), f8).to_host();
      const Tensor src = astype(on_one(x), from).to_host();
      ASSERT_EQ(got.dtype(), f8);
      for (std::int64_t i = 0; i < got.numel(); ++i) {
        EXPECT_EQ(std::to_integer<int>(got.bytes()[i]), nearest_code(e4m3, src.get(i)))
            << name(from) << " " << src.get(i) << " to " << name(f8);
      }
      // Back to every float type: the code's value, exactly.
      for (const DType to : {DType::kF64, DType::kF32, DType::kBF16}) {
        const Tensor back = astype(on_one(got), to).to_host();
        for (std::int64_t i = 0; i < got.numel(); ++i) {
          const double want = spec_value(e4m3, std::to_integer<int>(got.bytes()[i]));
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(back.get(i)));
          } else {
            EXPECT_EQ(back.get(i), want) << name(f8) << " to " << name(to);
          }
        }
      }
    }
  }
}

TEST(Float8, ScaledDotRejectsWhatItDoesNotTake) {
  const Array a = astype(on_one(Tensor::ones(Shape{2, 3}, DType::kF32)), DType::kF8E4M3);
  const Array s = on_one(Tensor::ones(Shape{}, DType::kF32));
  const DotDims mm{{}, {}, {1}, {0}};
  const Array b = astype(on_one(Tensor::ones(Shape{3, 4}, DType::kF32)), DType::kF8E5M2);
  EXPECT_EQ(scaled_dot(a, b, s, s, mm, DType::kF32).to_host().to_doubles(),
            std::vector<double>(8, 3.0));
  EXPECT_THROW_WITH(scaled_dot(astype(a, DType::kBF16), b, s, s, mm, DType::kF32), SpecError,
                    "[scaled_dot]", "bf16[2, 3]", "must be float8");
  EXPECT_THROW_WITH(scaled_dot(a, b, astype(s, DType::kBF16), s, mm, DType::kF32), SpecError,
                    "[scaled_dot]", "scale_a must be f32 of shape [] (tensorwise) or [2] (one per row of a)");
  EXPECT_THROW_WITH(scaled_dot(a, b, s, s, mm, DType::kF16), SpecError, "[scaled_dot]",
                    "out_dtype must be bf16 or f32, got f16");
  EXPECT_THROW_WITH(scaled_dot(a, b, s, s, DotDims{{}, {}, {0}, {0}}, DType::kF32), SpecError,
                    "[scaled_dot]", "contracting dimensions 0 and 0 differ (2 vs 3)");
}

// ---- float8_linear ----------------------------------------------------------------------------

// A tensor of shape `s` with values of magnitude in [lo, 1] and random signs.
Tensor values(Shape s, DType dtype, std::uint64_t seed, double lo = 0.25) {
  Tensor t(std::move(s), dtype);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mag(lo, 1.0);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, mag(rng) * (rng() % 2 ? 1 : -1));
  return t;
}

// float8_linear's cast, redone here: scale = max / amax in f32, v * scale in f32, clamped, the
// nearest code of the search, its value; and 1 / scale in f32.
struct Quantized {
  std::vector<double> q;
  double inverse;
};
Quantized quantize(const Tensor& t, bool e4m3) {
  const double fmax = e4m3 ? 448 : 57344;
  double amax = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) amax = std::max(amax, std::abs(t.get(i)));
  const float scale = static_cast<float>(fmax) / std::max(static_cast<float>(amax), 1e-12f);
  Quantized out{{}, static_cast<double>(1.0f / scale)};
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float v = static_cast<float>(t.get(i)) * scale;
    const double c = std::clamp(static_cast<double>(v), -fmax, fmax);
    out.q.push_back(spec_value(e4m3, nearest_code(e4m3, c)));
  }
  return out;
}

// x [n, k], w [m, k], c [n, m] (the cotangent of y): y = x w^T, dx = c w, dw = c^T x, each
// sum's terms' absolute sum too.
struct Linear {
  std::vector<double> y, dx, dw, y_abs, dx_abs, dw_abs;
};
Linear linear_ref(const std::vector<double>& x, const std::vector<double>& w,
                  const std::vector<double>& c, std::int64_t n, std::int64_t k, std::int64_t m) {
  Linear r;
  r.y.assign(n * m, 0), r.y_abs.assign(n * m, 0);
  r.dx.assign(n * k, 0), r.dx_abs.assign(n * k, 0);
  r.dw.assign(m * k, 0), r.dw_abs.assign(m * k, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < m; ++j) {
      for (std::int64_t p = 0; p < k; ++p) {
        r.y[i * m + j] += x[i * k + p] * w[j * k + p];
        r.y_abs[i * m + j] += std::abs(x[i * k + p] * w[j * k + p]);
        r.dx[i * k + p] += c[i * m + j] * w[j * k + p];
        r.dx_abs[i * k + p] += std::abs(c[i * m + j] * w[j * k + p]);
        r.dw[j * k + p] += c[i * m + j] * x[i * k + p];
        r.dw_abs[j * k + p] += std::abs(c[i * m + j] * x[i * k + p]);
      }
    }
  }
  return r;
}

// float8_linear's value and gradients for the loss sum(y * c).
struct Result {
  Tensor y, dx, dw;
};
Result run_linear(const Array& x, const Array& w, const Array& c) {
  const auto loss = [&](const Tree<Array>& p) {
    return sum(
        astype(float8_linear(p.children()[0].leaf(), p.children()[1].leaf()) * c, DType::kF32));
  };
  const auto [l, g] = value_and_grad(loss)(Tree<Array>::list({x, w}));
  return {float8_linear(x, w).to_host(), g.children()[0].leaf().to_host(),
          g.children()[1].leaf().to_host()};
}

void expect_within(const Tensor& got, const std::vector<double>& want,
                   const std::vector<double>& bound, const std::string& what) {
  int bad = 0;
  for (std::int64_t i = 0; i < got.numel() && bad < 3; ++i) {
    const double b = bound[static_cast<std::size_t>(i)];
    if (!(std::abs(got.get(i) - want[static_cast<std::size_t>(i)]) <= b)) {
      ++bad;
      ADD_FAILURE() << what << " element " << i << " is " << got.get(i) << ", want "
                    << want[static_cast<std::size_t>(i)] << " within " << b;
    }
  }
}

TEST(Float8Linear, EqualsItsQuantizationRedoneInDouble) {
  const std::int64_t n = 6, k = 16, m = 4;
  const Tensor x = Tensor::normal(Shape{n, k}, DType::kF32, 1);
  const Tensor w = Tensor::normal(Shape{m, k}, DType::kF32, 2, 0, 0.05);
  const Tensor c = Tensor::normal(Shape{n, m}, DType::kF32, 3);
  const Result r = run_linear(on_one(x), on_one(w), on_one(c));
  const Quantized qx = quantize(x, true), qw = quantize(w, true), qc = quantize(c, false);
  const Linear ref = linear_ref(qx.q, qw.q, qc.q, n, k, m);
  // The products of float8 values summed in f32 (the only rounding before f32's own): within
  // 2^-20 of the sum of the terms' sizes.
  const auto scaled = [](std::vector<double> v, double s) {
    for (double& e : v) e *= s;
    return v;
  };
  const auto bound = [&](const std::vector<double>& abs, double s) {
    std::vector<double> b = scaled(abs, s);
    for (double& e : b) e *= 0x1p-20;
    return b;
  };
  expect_within(r.y, scaled(ref.y, qx.inverse * qw.inverse),
                bound(ref.y_abs, qx.inverse * qw.inverse), "y");
  expect_within(r.dx, scaled(ref.dx, qc.inverse * qw.inverse),
                bound(ref.dx_abs, qc.inverse * qw.inverse), "dx");
  expect_within(r.dw, scaled(ref.dw, qc.inverse * qx.inverse),
                bound(ref.dw_abs, qc.inverse * qx.inverse), "dw");
}

// Against the plain linear: each float8 value is within half a step of the value it was cast
// from when that value is normal (all are here: magnitudes in [0.25, 1], scaled to at least a
// quarter of the largest): a relative error of 2^-4 for e4m3 (step 2^-3) and 2^-3 for e5m2
// (step 2^-2). A product of two is then within 2^-4 + 2^-4 + 2^-8 (x and w) or 2^-3 + 2^-4 +
// 2^-7 (the cotangent and x or w) of the exact one; bf16 results add one rounding, 2^-9.
TEST(Float8Linear, GradientsAreThePlainLinearsWithinTheFormatsErrors) {
  const std::int64_t n = 8, k = 32, m = 4;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const Tensor x = values(Shape{n, k}, dtype, 4), w = values(Shape{m, k}, dtype, 5);
    const Tensor c = values(Shape{n, m}, dtype, 6);
    const Result r = run_linear(on_one(x), on_one(w), on_one(c));
    ASSERT_EQ(r.y.dtype(), dtype);
    ASSERT_EQ(r.dw.dtype(), dtype);
    const Linear ref = linear_ref(x.to_doubles(), w.to_doubles(), c.to_doubles(), n, k, m);
    const double out = dtype == DType::kBF16 ? 0x1p-9 : 0x1p-23;
    const auto bound = [&](const std::vector<double>& abs, const std::vector<double>& v,
                           double rel) {
      std::vector<double> b(abs.size());
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = rel * abs[i] + out * 2 * std::abs(v[i]);
      return b;
    };
    const double e4e4 = 0x1p-4 + 0x1p-4 + 0x1p-8, e5e4 = 0x1p-3 + 0x1p-4 + 0x1p-7;
    expect_within(r.y, ref.y, bound(ref.y_abs, ref.y, e4e4), "y");
    expect_within(r.dx, ref.dx, bound(ref.dx_abs, ref.dx, e5e4), "dx");
    expect_within(r.dw, ref.dw, bound(ref.dw_abs, ref.dw, e5e4), "dw");
  }
}

TEST(Float8Linear, RejectsOperandsThatDoNotFit) {
  const Array x = on_one(Tensor::ones(Shape{2, 3}, DType::kF32));
  EXPECT_THROW_WITH(float8_linear(x, on_one(Tensor::ones(Shape{3, 4}, DType::kF32))), SpecError,
                    "[float8_linear]", "f32[2, 3]", "f32[3, 4]");
  EXPECT_THROW_WITH(
      float8_linear(astype(x, DType::kF64), on_one(Tensor::ones(Shape{4, 3}, DType::kF32))),
      SpecError, "[float8_linear]", "f64[2, 3]");
}

// FSDP-like: w sharded on its first dimension, x and the cotangent on the batch, over 4 devices;
// the same values as one device.
struct Sharded {
  Executor exec{4};
  Mesh mesh = Mesh::parse("d:4", 4);
  Tensor x = values(Shape{8, 32}, DType::kBF16, 7), w = values(Shape{12, 32}, DType::kBF16, 8);
  Tensor c = values(Shape{8, 12}, DType::kBF16, 9);
  Array put(const Tensor& t) { return device_put(t, NamedSharding(mesh, P("d")), exec); }
};

Tree<Array> step(const Tree<Array>& p, const Array& c) {
  const auto loss = [&](const Tree<Array>& q) {
    return sum(
        astype(float8_linear(q.children()[0].leaf(), q.children()[1].leaf()) * c, DType::kF32));
  };
  const auto [l, g] = value_and_grad(loss)(p);
  return Tree<Array>::dict({{"y", float8_linear(p.children()[0].leaf(), p.children()[1].leaf())},
                            {"dx", g.children()[0].leaf()},
                            {"dw", g.children()[1].leaf()}});
}

TEST(Float8Linear, ShardedOverFourDevicesEqualsOneDeviceBitwise) {
  Sharded s;
  const Result one = run_linear(on_one(s.x), on_one(s.w), on_one(s.c));
  auto jitted = sjit(s.mesh, step);
  const Tree<Array> p = Tree<Array>::list({s.put(s.x), s.put(s.w)});
  const Tree<Array> out = jitted(p, s.put(s.c));
  EXPECT_EQ(out.at("y").leaf().sharding().spec(), P("d"));
  EXPECT_EQ(out.at("dw").leaf().sharding().spec(), P("d"));  // sharded like w
  EXPECT_TRUE(out.at("y").leaf().to_host() == one.y);
  EXPECT_TRUE(out.at("dx").leaf().to_host() == one.dx);
  EXPECT_TRUE(out.at("dw").leaf().to_host() == one.dw);
  // The weight is cast on its shards and gathered in 8 bits (1 byte per element: 3/4 of
  // 12 x 32 from the other devices), never in bf16.
  const std::string text = jitted.lower(p, s.put(s.c)).text();
  EXPECT_THAT(text, ::testing::HasSubstr("f8_e4m3[12, 32]  PartitionSpec('d')"));
  EXPECT_THAT(text,
              ::testing::ContainsRegex("reshard %[0-9]+ -> PartitionSpec\\(\\): all_gather over "
                                       "'d': 288 B max per device"));
  // Every gather is of an argument as read (argument_read: through the casts and the scaling),
  // so a time model overlaps it as FSDP's; the amax all-reduces are not.
  std::int64_t of_arguments = 0;
  for (const auto& [on, bytes] : jitted.lower(p, s.put(s.c)).cost().bytes_by_axes) {
    if (on.kind != CollectiveKind::kAllGather) continue;
    EXPECT_TRUE(on.of_argument) << bytes << " B gathered of a computed value";
    if (on.of_argument) of_arguments += bytes;
  }
  EXPECT_GE(of_arguments, 288);
}

// A column-parallel weight [out, in] held split (t, d) and pinned in its tp split (t, None), as
// --tp-plan modules uses it: float8_linear casts it on its shards and gathers the 8 bits over d
// only (a [6, 16] block from the other d device: 96 B; in bf16 192 B), never over t;
// the output is one device's bitwise.
TEST(Float8Linear, APinnedWeightIsGatheredIn8BitsIntoItsSplit) {
  Sharded s;
  const Mesh mesh = Mesh::parse("d:2,t:2", 4);
  const auto pinned_step = [](const Tree<Array>& p, const Array& c) {
    const auto in_use = [](const Tree<Array>& q) {
      return Tree<Array>::list(
          {q.children()[0], Tree<Array>(detail::pin_sharding(q.children()[1].leaf(), P("t")))});
    };
    return step(in_use(p), c);
  };
  auto jitted = sjit(mesh, pinned_step);
  const Result one = run_linear(on_one(s.x), on_one(s.w), on_one(s.c));
  const auto put = [&](const Tensor& t, const PartitionSpec& spec) {
    return device_put(t, NamedSharding(mesh, spec), s.exec);
  };
  const Tree<Array> p = Tree<Array>::list({put(s.x, P("d")), put(s.w, P("t", "d"))});
  const Tree<Array> out = jitted(p, put(s.c, P("d", "t")));
  EXPECT_TRUE(out.at("y").leaf().to_host() == one.y);
  // The gradients contract over a split dimension: partial sums written in bf16 and added (as
  // the unpinned program on this mesh does), within 2^-7 of the largest value.
  for (const auto& [key, want] : {std::pair{"dx", one.dx}, std::pair{"dw", one.dw}}) {
    const auto a = out.at(key).leaf().to_host().to_doubles(), b = want.to_doubles();
    double top = 0;
    for (const double v : b) top = std::max(top, std::abs(v));
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a[i], b[i], top / 128) << key << " [" << i << "]";
    }
  }
  const Lowered low = jitted.lower(p, put(s.c, P("d", "t")));
  EXPECT_THAT(low.text(), ::testing::ContainsRegex("reshard %[0-9]+ -> PartitionSpec\\('t'\\): "
                                                   "all_gather over 'd': 96 B max per device"));
  for (const auto& [on, bytes] : low.cost().bytes_by_axes) {
    if (on.kind != CollectiveKind::kAllGather || bytes == 0) continue;
    EXPECT_EQ(on.axes, std::vector<std::string>{"d"}) << bytes << " B gathered";
  }
}

// What counts as an argument gathered: an argument scaled by a scalar or bounded by a constant
// (float8's cast) does; a value computed from two arguments does not.
TEST(Float8Linear, AGatherIsOfAnArgumentOnlyThroughScalingsAndCasts) {
  Sharded s;
  const auto gathered_of_argument = [&](auto f) {
    auto jitted = sjit(s.mesh, [f](const Array& a, const Array& b) {
      return with_sharding_constraint(f(a, b), P());
    });
    const ProgramCost cost = jitted.lower(s.put(s.w), s.put(s.w)).cost();
    std::optional<bool> of;
    for (const auto& [on, bytes] : cost.bytes_by_axes) {
      if (on.kind == CollectiveKind::kAllGather && bytes > 0) of = on.of_argument;
    }
    return of;
  };
  const auto scaled = [](const Array& a, const Array&) {
    return astype(minimum(astype(a, DType::kF32) * 2.0, full_like(astype(a, DType::kF32), 448.0)),
                  DType::kF8E4M3);
  };
  const auto summed = [](const Array& a, const Array& b) { return a + b; };
  EXPECT_EQ(gathered_of_argument(scaled), std::optional<bool>(true));
  EXPECT_EQ(gathered_of_argument(summed), std::optional<bool>(false));
}

// The bytes a device holds when the forward pass ends, beyond the arguments: what is kept for
// the backward pass. x and w are computed inside the loss (a + a, b + b: add keeps nothing), so
// only what the linear keeps holds them: float8_linear keeps them in 8 bits, 64 x 32 + 2 x 32
// bytes; a linear that kept them in bf16 would hold twice that.
std::int64_t kept_for_backward(bool float8) {
  const Executor exec(1);
  const Mesh mesh = Mesh::parse("d:1", 1);
  const auto put = [&](const Tensor& t) { return device_put(t, NamedSharding(mesh, P()), exec); };
  const Array a = put(values(Shape{64, 32}, DType::kBF16, 10));
  const Array b = put(values(Shape{2, 32}, DType::kBF16, 11));
  const Array c = put(values(Shape{64, 2}, DType::kBF16, 12));
  auto grads = sjit(mesh, [float8](const Tree<Array>& p, const Array& cot) {
    const auto loss = [&](const Tree<Array>& q) {
      const Array x = q.children()[0].leaf() + q.children()[0].leaf();
      const Array w = q.children()[1].leaf() + q.children()[1].leaf();
      const Array y = float8 ? float8_linear(x, w) : dot_general(x, w, DotDims{{}, {}, {1}, {1}});
      return sum(astype(y * cot, DType::kF32));
    };
    return value_and_grad(loss)(p).second;
  });
  const ProgramCost cost = grads.lower(Tree<Array>::list({a, b}), c).cost();
  const MemoryTimeline& t = cost.timeline;
  for (const PhaseStart& ph : t.phases) {
    if (ph.phase == StepPhase::kBackward && ph.step > 0) {
      return t.live_bytes.at(ph.step - 1) - t.start_bytes;
    }
  }
  ADD_FAILURE() << "no backward phase in\n" << grads.lower(Tree<Array>::list({a, b}), c).text();
  return 0;
}

TEST(Float8Linear, KeepsXAndWInEightBitsForTheBackwardPass) {
  const std::int64_t eight_bit = 64 * 32 + 2 * 32;  // x8 and w8
  const std::int64_t f8 = kept_for_backward(true), bf16 = kept_for_backward(false);
  // Besides x8 and w8: two f32 scales, the output y and y * c (64 x 2 bf16 each) at most.
  EXPECT_GE(f8, eight_bit);
  EXPECT_LE(f8, eight_bit + 8 + 2 * (64 * 2 * 2));
  EXPECT_GE(bf16, 2 * eight_bit);  // the plain linear keeps them in bf16: twice the bytes
}
}  // namespace
}  // namespace shardplan
