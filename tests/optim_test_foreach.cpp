// Optimizer::foreach (adamw_foreach): torch's foreach AdamW passes give the ops' values, move the
// bytes their passes read and write (counted by hand from _multi_tensor_adamw), and hold every
// square root until the parameters are updated.
#include <cmath>
#include <tuple>

#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

struct OneDevice {
  Executor exec{1};
  Mesh mesh = Mesh::parse("x:1", 1);
  template <class T>
  Array put(const std::vector<double>& v) const {
    std::vector<T> typed(v.begin(), v.end());
    const auto n = static_cast<std::int64_t>(v.size());
    return device_put(Tensor::from<T>(Shape{n}, typed), NamedSharding(mesh, P()), exec);
  }
};

std::vector<double> leaf(const Tree<Array>& t, const char* k) {
  return t.at(k).leaf().to_host().to_doubles();
}

// The foreach update gives the ops' values over several steps, a decay mask included (the norm
// leaf does not decay: its parameter's mul_ pass is not run): to f64 rounding in f64, to f32
// rounding in f32 (each pass stores its result in f32, as torch's in-place ops do).
template <class T>
void expect_foreach_equals_ops(double tolerance) {
  OneDevice o;
  const Tree<Array> p = Tree<Array>::dict(
      {{"kernel", o.put<T>({2.0, -1.0, 0.75})}, {"norm", o.put<T>({0.5})}});
  const Tree<Array> g = Tree<Array>::dict(
      {{"kernel", o.put<T>({1.0, 0.25, -0.125})}, {"norm", o.put<T>({-3.0})}});
  const Optimizer ops = Optimizer::adamw(constant_schedule(0.1), 0.5, {"kernel$"}, 0.9, 0.95);
  const Optimizer foreach = ops.foreach();
  EXPECT_TRUE(foreach.is_foreach());
  EXPECT_FALSE(foreach.is_fused());
  EXPECT_FALSE(ops.is_foreach());
  EXPECT_FALSE(foreach.fused().is_foreach());  // the later call decides
  Tree<Array> pa = p, pb = p, sa = ops.init(p), sb = foreach.init(p);
  for (int step = 0; step < 4; ++step) {
    std::tie(pa, sa) = ops.update(g, sa, pa);
    std::tie(pb, sb) = foreach.update(g, sb, pb);
  }
  for (const char* k : {"kernel", "norm"}) {
    const std::vector<double> a = leaf(pa, k), b = leaf(pb, k);
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(b[i], a[i], tolerance) << k << " " << i;
      EXPECT_NEAR(leaf(sb.at("mu"), k)[i], leaf(sa.at("mu"), k)[i], tolerance) << k;
      EXPECT_NEAR(leaf(sb.at("nu"), k)[i], leaf(sa.at("nu"), k)[i], tolerance) << k;
    }
    // The update moved the parameter (the comparison is not of two unchanged copies).
    EXPECT_GT(std::abs(b[0] - leaf(p, k)[0]), 0.1) << k;
  }
  EXPECT_EQ(sb.at("count").leaf().to_host().get(0), 4.0);
}

TEST(OptimForeach, TheForeachAdamWUpdateEqualsItsOps) {
  expect_foreach_equals_ops<double>(1e-12);
  expect_foreach_equals_ops<float>(2e-6);
}

// _multi_tensor_adamw's passes (torch/optim/adamw.py, PyTorch 2.5), each reading and writing
// whole f32 arrays (4 B an element), counted by hand:
//   _foreach_mul_(params, 1 - lr * wd)            read p, write p         8  (decay only)
//   _foreach_lerp_(exp_avgs, grads, 1 - b1)       read m, g, write m     12
//   _foreach_mul_(exp_avg_sqs, b2)                read v, write v         8
//   _foreach_addcmul_(exp_avg_sqs, g, g, 1 - b2)  read v, g, write v     12
//   _foreach_sqrt(exp_avg_sqs)                    read v, write s         8
//   _foreach_div_(s, bias_correction2_sqrt)       read s, write s         8
//   _foreach_add_(s, eps)                         read s, write s         8
//   _foreach_addcdiv_(params, exp_avgs, s, step)  read p, m, s, write p  16
// 80 B per element of a decayed parameter, 72 of one without decay. The scalars (lr, the step's
// bias corrections) are the kernels' arguments: no traffic.
TEST(OptimForeach, TheUpdateMovesItsPassesBytes) {
  OneDevice o;
  const std::int64_t n1 = 1024, n2 = 96;
  const auto f32 = [&](std::int64_t n, double v) {
    return device_put(Tensor::from<float>(Shape{n}, std::vector<float>(n, static_cast<float>(v))),
                      NamedSharding(o.mesh, P()), o.exec);
  };
  const auto scalar = [&](double v) {
    return device_put(Tensor::from<float>(Shape{}, {static_cast<float>(v)}),
                      NamedSharding(o.mesh, P()), o.exec);
  };
  const auto step = [](const Array& p1, const Array& p2, const Array& g1, const Array& g2,
                       const Array& m1, const Array& m2, const Array& v1, const Array& v2,
                       const Array& lr, const Array& count) {
    const AdamwForeach u =
        adamw_foreach({p1, p2}, {g1, g2}, {m1, m2}, {v1, v2}, lr, count, 0.9, 0.95, 1e-8, {0.1, 0});
    std::vector<Tree<Array>> out;
    for (const auto* list : {&u.params, &u.mu, &u.nu}) {
      for (const Array& a : *list) out.emplace_back(a);
    }
    return Tree<Array>::list(std::move(out));
  };
  const Lowered low = sjit(o.mesh, step).lower(f32(n1, 1), f32(n2, 1), f32(n1, 0.5), f32(n2, 0.5),
                                               f32(n1, 0.1), f32(n2, 0.1), f32(n1, 0.2),
                                               f32(n2, 0.2), scalar(1e-3), scalar(1));
  EXPECT_EQ(low.cost().memory_traffic, 80 * n1 + 72 * n2) << low.text();
  // Against adamw_update's one kernel per leaf on the same arrays: 28 B an element (4 reads,
  // 3 writes) and its two scalars once a leaf.
  const auto fused = [](const Array& p1, const Array& p2, const Array& g1, const Array& g2,
                        const Array& m1, const Array& m2, const Array& v1, const Array& v2,
                        const Array& lr, const Array& count) {
    const AdamwUpdate a = adamw_update(p1, g1, m1, v1, lr, count, 0.9, 0.95, 1e-8, 0.1);
    const AdamwUpdate b = adamw_update(p2, g2, m2, v2, lr, count, 0.9, 0.95, 1e-8, 0);
    return Tree<Array>::list({Tree<Array>(a.param), Tree<Array>(b.param), Tree<Array>(a.mu),
                              Tree<Array>(b.mu), Tree<Array>(a.nu), Tree<Array>(b.nu)});
  };
  const Lowered fused_low =
      sjit(o.mesh, fused).lower(f32(n1, 1), f32(n2, 1), f32(n1, 0.5), f32(n2, 0.5), f32(n1, 0.1),
                                f32(n2, 0.1), f32(n1, 0.2), f32(n2, 0.2), scalar(1e-3), scalar(1));
  EXPECT_EQ(fused_low.cost().memory_traffic, 28 * (n1 + n2) + 2 * 2 * 4);
  // Every square root (4 B an element of both parameters) is made before the first parameter's
  // update and held until its own: the peak holds them beside the new moments, where the fused
  // kernel holds no temporary.
  const std::int64_t in = 4 * 4 * (n1 + n2) + 2 * 4, out = 3 * 4 * (n1 + n2);
  EXPECT_GE(fused_low.cost().peak_bytes[0], in + out);
  EXPECT_GE(low.cost().peak_bytes[0] - fused_low.cost().peak_bytes[0], 4 * n2)
      << low.cost().peak_bytes[0] << " " << fused_low.cost().peak_bytes[0];
}

TEST(OptimForeach, WhatDoesNotFitIsRefused) {
  OneDevice o;
  EXPECT_THROW_WITH(Optimizer::sgd(0.1).foreach(), SpecError, "[optim]", "SGD", "adamw_foreach");
  const Array a = o.put<double>({1.0, 2.0}), b = o.put<double>({1.0, 2.0, 3.0});
  const Array scalar = full(Shape{}, DType::kF64, 1, a);
  EXPECT_THROW_WITH(adamw_foreach({a}, {a, a}, {a}, {a}, scalar, scalar, 0.9, 0.95, 1e-8, {0}),
                    SpecError, "[adamw_foreach]", "1 params, 2 grads");
  EXPECT_THROW_WITH(adamw_foreach({a}, {b}, {a}, {a}, scalar, scalar, 0.9, 0.95, 1e-8, {0}),
                    SpecError, "[adamw_foreach]", "f64[2], f64[3]", "one dtype and shape");
  EXPECT_THROW_WITH(adamw_foreach({a}, {a}, {a}, {a}, a, scalar, 0.9, 0.95, 1e-8, {0}),
                    SpecError, "[adamw_foreach]", "lr and count must be scalars");
  const Optimizer foreach = Optimizer::adam(0.1).foreach();
  const Tree<Array> p = Tree<Array>::dict({{"w", a}});
  const Tree<Array> other = Tree<Array>::dict({{"v", a}});
  EXPECT_THROW_WITH(foreach.update(other, foreach.init(p), p), TreeError, "[optim]", "gradients",
                    "parameters' structure");
}

}  // namespace
}  // namespace shardplan
