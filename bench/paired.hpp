#pragma once
// What the paired benchmarks share (train_bench, sjit_bench): one call timed, and the median of
// the per-iteration figures (this VM drifts within minutes, so contenders are timed back to back
// in each iteration and compared by medians).
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace bench {

/// The wall time of one call of `f`, in milliseconds.
inline double ms_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

/// The median (the upper one of an even count); 0 for none.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace bench
