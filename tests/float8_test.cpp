// float8: the two formats' codes (src/runtime/numeric.hpp) against the format definitions and a
// brute-force nearest-value search written here, apart from the encoder; conversion to and from
// them on devices (astype). PyTorch's float8 dtypes (2.1+) are not in Debian's python3-torch 1.13,
// so the reference is the search: every finite value of the format, the nearest one taken, a
// tie going to the even code, and one more value past the largest standing for overflow (the
// next code, NaN for e4m3, inf for e5m2), which is how PyTorch's and ml_dtypes' casts behave.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "numeric.hpp"
#include "shardplan/array.hpp"
#include "shardplan/ops.hpp"
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

}  // namespace
}  // namespace shardplan
