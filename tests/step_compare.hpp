#pragma once
// The comparison the training-step tests share: a step's loss and every gradient against a
// reference step's, to float32 rounding (only the order of sums differs).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "shardplan/tensor.hpp"
#include "shardplan/tree.hpp"

namespace shardplan {

/// `got` and `want` hold "loss" (a scalar) and "grads" (a tree of the same structure).
inline void expect_same_step(const Tree<Tensor>& got, const Tree<Tensor>& want,
                             const std::string& what) {
  EXPECT_NEAR(got.at("loss").leaf().get(0), want.at("loss").leaf().get(0), 1e-5) << what;
  const auto a = want.at("grads").flatten(), b = got.at("grads").flatten();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].second.to_doubles(), z = b[i].second.to_doubles();
    ASSERT_EQ(x.size(), z.size()) << what << " " << a[i].first;
    for (std::size_t k = 0; k < x.size(); ++k) {
      ASSERT_NEAR(x[k], z[k], 1e-5 + 1e-4 * std::abs(x[k]))
          << what << " " << a[i].first << " [" << k << "]";
    }
  }
}

}  // namespace shardplan
