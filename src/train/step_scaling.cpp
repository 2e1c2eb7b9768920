#include "step_scaling.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"

namespace shardplan::train {
namespace {

std::int64_t add(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (!detail::checked_add(a, b, &out)) {
    throw SpecError(
        fmt::format("[train] a byte count of the step overflows int64 ({} + {})", a, b));
  }
  return out;
}
std::int64_t mul(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (!detail::checked_mul(a, b, &out)) {
    throw SpecError(
        fmt::format("[train] a byte count of the step overflows int64 ({} x {})", a, b));
  }
  return out;
}
std::int64_t sub(std::int64_t a, std::int64_t b) {
  if (b == INT64_MIN) throw SpecError("[train] a byte count of the step overflows int64");
  return add(a, -b);
}

/// The coefficients of a + b l + c k + d l k in l - l0 and k - k0.
template <class T>
struct Bilinear {
  T a{}, b{}, c{}, d{};
};

std::optional<StepFigures> fit(const std::vector<StepSample>& samples, std::int64_t layers,
                               std::int64_t micro_batches);

}  // namespace

std::optional<StepFigures> extrapolate(const std::vector<StepSample>& samples, std::int64_t layers,
                                       std::int64_t micro_batches) {
  if (auto figures = fit(samples, layers, micro_batches)) return figures;
  // A step of the fewest layers or micro-batches may peak elsewhere (a small model's 2
  // micro-batches): fitted again past the smallest count of each dimension that varies, when
  // the fitting pair and a third count to check remain in each.
  std::set<std::int64_t> ls, ks;
  for (const StepSample& s : samples) {
    ls.insert(s.layers);
    ks.insert(s.micro_batches);
  }
  if (ls.empty()) return std::nullopt;
  const bool by_l = ls.size() > 1, by_k = ks.size() > 1;
  std::vector<StepSample> past;
  std::set<std::int64_t> past_ls, past_ks;
  for (const StepSample& s : samples) {
    if ((by_l && s.layers == *ls.begin()) || (by_k && s.micro_batches == *ks.begin())) continue;
    past.push_back(s);
    past_ls.insert(s.layers);
    past_ks.insert(s.micro_batches);
  }
  if ((by_l && past_ls.size() < 3) || (by_k && past_ks.size() < 3)) return std::nullopt;
  return fit(past, layers, micro_batches);
}

namespace {

std::optional<StepFigures> fit(const std::vector<StepSample>& samples, std::int64_t layers,
                               std::int64_t micro_batches) {
  if (samples.empty()) return std::nullopt;
  std::set<std::int64_t> ls, ks;
  for (const StepSample& s : samples) {
    ls.insert(s.layers);
    ks.insert(s.micro_batches);
  }
  const std::int64_t l0 = *ls.begin(), k0 = *ks.begin();
  const bool by_l = ls.size() > 1, by_k = ks.size() > 1;
  // With one count sampled the figures do not depend on it: only that count can be asked for.
  if ((!by_l && layers != l0) || (!by_k && micro_batches != k0)) return std::nullopt;
  const auto find = [&](std::int64_t l, std::int64_t k) -> const StepFigures* {
    for (const StepSample& s : samples) {
      if (s.layers == l && s.micro_batches == k) return &s.figures;
    }
    return nullptr;
  };
  const StepFigures* f00 = find(l0, k0);
  const StepFigures* f10 = by_l ? find(l0 + 1, k0) : f00;
  const StepFigures* f01 = by_k ? find(l0, k0 + 1) : f00;
  const StepFigures* f11 = by_l && by_k ? find(l0 + 1, k0 + 1) : by_l ? f10 : f01;
  if (f00 == nullptr || f10 == nullptr || f01 == nullptr || f11 == nullptr) return std::nullopt;
  for (const StepSample& s : samples) {  // the same figures in every sample
    const auto same_keys = [](const auto& x, const auto& y) {
      return x.size() == y.size() &&
             std::equal(x.begin(), x.end(), y.begin(),
                        [](const auto& p, const auto& q) { return p.first == q.first; });
    };
    if (!same_keys(s.figures.bytes, f00->bytes) || !same_keys(s.figures.flops, f00->flops)) {
      return std::nullopt;
    }
  }
  StepFigures out;
  // Bytes: integers, so the function is fitted, checked and evaluated exactly.
  for (const auto& [key, v00] : f00->bytes) {
    Bilinear<std::int64_t> m;
    m.a = v00;
    m.b = sub(f10->bytes.at(key), v00);
    m.c = sub(f01->bytes.at(key), v00);
    m.d = sub(sub(f11->bytes.at(key), f10->bytes.at(key)), m.c);
    const auto at = [&](std::int64_t l, std::int64_t k) {
      const std::int64_t dl = sub(l, l0), dk = sub(k, k0);
      return add(add(m.a, mul(m.b, dl)), add(mul(m.c, dk), mul(m.d, mul(dl, dk))));
    };
    // The memory traffic feeds the time model only, and fusion may group a few small ops of the
    // gradient sums differently at some micro-batch counts: equal to a relative 1e-3.
    const bool approximate = key == ByteKey(ByteFigure::kMemoryTraffic);
    for (const StepSample& s : samples) {
      const std::int64_t want = s.figures.bytes.at(key), got = at(s.layers, s.micro_batches);
      const auto off = std::abs(static_cast<double>(got) - static_cast<double>(want));
      if (approximate ? !(off <= 1e-3 * std::abs(static_cast<double>(want))) : got != want) {
        return std::nullopt;
      }
    }
    out.bytes[key] = at(layers, micro_batches);
  }
  // FLOPs: sums of doubles, equal only to rounding.
  for (const auto& [key, v00] : f00->flops) {
    Bilinear<double> m;
    m.a = v00;
    m.b = f10->flops.at(key) - v00;
    m.c = f01->flops.at(key) - v00;
    m.d = f11->flops.at(key) - f10->flops.at(key) - m.c;
    const auto at = [&](std::int64_t l, std::int64_t k) {
      const auto dl = static_cast<double>(l - l0), dk = static_cast<double>(k - k0);
      return m.a + m.b * dl + m.c * dk + m.d * dl * dk;
    };
    for (const StepSample& s : samples) {
      const double want = s.figures.flops.at(key), got = at(s.layers, s.micro_batches);
      if (!(std::abs(got - want) <= 1e-12 * std::max(std::abs(want), 1.0))) return std::nullopt;
    }
    out.flops[key] = at(layers, micro_batches);
  }
  return out;
}

}  // namespace
}  // namespace shardplan::train
