// Optimizers: updates against hand computations, schedules, clipping, weight-decay masks, state
// sharded like the parameters, and a training step under sjit equal to one device.
#include "shardplan/optim.hpp"

#include <cmath>
#include <numbers>
#include <tuple>

#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

struct One {
  Executor exec{1};
  Mesh mesh = Mesh::parse("x:1", 1);
  Array put(std::vector<double> v) const {
    const auto n = static_cast<std::int64_t>(v.size());
    return device_put(Tensor::from<double>(Shape{n}, v), NamedSharding(mesh, P()), exec);
  }
};

std::vector<double> host(const Tree<Array>& t, const char* k) {
  return t.at(k).leaf().to_host().to_doubles();
}

TEST(Optim, SgdAndMomentumFollowTheirFormulas) {
  One o;
  const Tree<Array> p = Tree<Array>::dict({{"w", o.put({1.0, -2.0})}});
  const Tree<Array> g = Tree<Array>::dict({{"w", o.put({0.5, 4.0})}});
  const Optimizer sgd = Optimizer::sgd(0.1);
  auto [p1, s1] = sgd.update(g, sgd.init(p), p);
  EXPECT_EQ(host(p1, "w"), (std::vector<double>{1.0 - 0.05, -2.0 - 0.4}));
  EXPECT_EQ(s1.at("count").leaf().to_host().get(0), 1.0);
  const Optimizer mom = Optimizer::sgd(0.1, 0.9);
  auto [q1, t1] = mom.update(g, mom.init(p), p);
  auto [q2, t2] = mom.update(g, t1, q1);
  // m1 = g, m2 = 0.9 g + g = 1.9 g; p2 = p - 0.1 (g + 1.9 g) = p - 0.29 g.
  EXPECT_NEAR(host(q2, "w")[0], 1.0 - 0.29 * 0.5, 1e-12);
  EXPECT_NEAR(host(q2, "w")[1], -2.0 - 0.29 * 4.0, 1e-12);
  EXPECT_NEAR(host(t2.at("momentum"), "w")[1], 1.9 * 4.0, 1e-12);
}

TEST(Optim, AdamFirstStepMovesEachWeightByTheLearningRate) {
  One o;
  const Tree<Array> p = Tree<Array>::dict({{"w", o.put({1.0, -2.0, 3.0})}});
  const Tree<Array> g = Tree<Array>::dict({{"w", o.put({0.5, -4.0, 1e-3})}});
  const Optimizer adam = Optimizer::adam(0.01);
  const auto [p1, s1] = adam.update(g, adam.init(p), p);
  // After bias correction, mhat = g and vhat = g^2: the step is lr * g / (|g| + eps).
  const std::vector<double> gv = {0.5, -4.0, 1e-3}, pv = {1.0, -2.0, 3.0};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(
        host(p1, "w")[static_cast<std::size_t>(i)],
        pv[static_cast<std::size_t>(i)] - 0.01 * gv[static_cast<std::size_t>(i)] /
                                              (std::abs(gv[static_cast<std::size_t>(i)]) + 1e-8),
        1e-12);
  }
  EXPECT_NEAR(host(s1.at("mu"), "w")[1], 0.1 * -4.0, 1e-12);
  EXPECT_NEAR(host(s1.at("nu"), "w")[1], 0.001 * 16.0, 1e-12);
}

TEST(Optim, AdamWDecaysOnlyTheMaskedPaths) {
  One o;
  const Tree<Array> p = Tree<Array>::dict({{"kernel", o.put({2.0})}, {"norm", o.put({2.0})}});
  const Tree<Array> g = Tree<Array>::dict({{"kernel", o.put({1.0})}, {"norm", o.put({1.0})}});
  const Optimizer opt = Optimizer::adamw(constant_schedule(0.1), 0.5, {"kernel$"});
  const auto [p1, s1] = opt.update(g, opt.init(p), p);
  // Adam's step is ~0.1; the decayed leaf also loses lr * wd * p = 0.1.
  EXPECT_NEAR(host(p1, "norm")[0], 2.0 - 0.1, 1e-6);
  EXPECT_NEAR(host(p1, "kernel")[0], 2.0 - 0.1 - 0.1, 1e-6);
  EXPECT_THROW_WITH(Optimizer::adamw(constant_schedule(0.1), 0.1, {"(bad"}), RuleError, "(bad");
}

TEST(Optim, DecayPathsArePythonPatternsLikeRulePatterns) {
  One o;
  const Tree<Array> p = Tree<Array>::dict({{"kernel", o.put({2.0})}, {"norm", o.put({2.0})}});
  const Tree<Array> g = Tree<Array>::dict({{"kernel", o.put({1.0})}, {"norm", o.put({1.0})}});
  // A named group and \Z, as Python writes them.
  const Optimizer opt = Optimizer::adamw(constant_schedule(0.1), 0.5, {"(?P<k>kern)el\\Z"});
  const auto [p1, s1] = opt.update(g, opt.init(p), p);
  EXPECT_NEAR(host(p1, "kernel")[0], 2.0 - 0.1 - 0.1, 1e-6);
  EXPECT_NEAR(host(p1, "norm")[0], 2.0 - 0.1, 1e-6);
  // Python rejects "\\e" (Boost took it for ESC), at position 0, and so do decay paths.
  EXPECT_THROW_WITH(Optimizer::adamw(constant_schedule(0.1), 0.1, {"\\e"}), RuleError, "'\\e'",
                    "position 0", "bad escape");
}

TEST(Optim, ClippingBoundsTheGlobalNorm) {
  One o;
  const Tree<Array> p = Tree<Array>::dict({{"a", o.put({0.0, 0.0})}, {"b", o.put({0.0})}});
  const Tree<Array> g = Tree<Array>::dict({{"a", o.put({3.0, 0.0})}, {"b", o.put({4.0})}});
  EXPECT_NEAR(global_norm(g).to_host().get(0), 5.0, 1e-12);
  const Optimizer opt = Optimizer::sgd(1.0).clip_by_global_norm(1.0);
  const auto [p1, s1] = opt.update(g, opt.init(p), p);
  // The gradient is scaled to norm 1: (3, 0, 4) / 5.
  EXPECT_NEAR(host(p1, "a")[0], -0.6, 1e-6);
  EXPECT_NEAR(host(p1, "b")[0], -0.8, 1e-6);
  EXPECT_THROW_WITH(Optimizer::sgd(1.0).clip_by_global_norm(0), SpecError, "positive");
}

TEST(Optim, WarmupCosineScheduleFollowsItsFormula) {
  One o;
  const Schedule s = warmup_cosine_decay_schedule(0.0, 1.0, 10, 110, 0.1);
  const auto at = [&](double step) {
    return s(device_put(Tensor::from<float>(Shape{}, {static_cast<float>(step)}),
                        NamedSharding(o.mesh, P()), o.exec))
        .to_host()
        .get(0);
  };
  EXPECT_NEAR(at(0), 0.0, 1e-6);
  EXPECT_NEAR(at(5), 0.5, 1e-6);
  EXPECT_NEAR(at(10), 1.0, 1e-6);
  EXPECT_NEAR(at(60), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.5)), 1e-6);
  EXPECT_NEAR(at(110), 0.1, 1e-6);
  EXPECT_NEAR(at(500), 0.1, 1e-6);
}

TEST(Optim, StateIsShardedLikeTheParameters) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("fsdp:8", 8);
  const Tree<Array> p = Tree<Array>::dict(
      {{"w", Array::normal(Shape{64, 16}, DType::kF32, NamedSharding(mesh, P("fsdp")), exec, 1)}});
  exec.reset_peak();
  const std::int64_t before = exec.memory(0).in_use;
  const Tree<Array> st = Optimizer::adam(1e-3).init(p);
  EXPECT_EQ(st.at_path("mu/w").leaf().sharding().spec(), P("fsdp"));
  EXPECT_EQ(st.at_path("nu/w").leaf().sharding().spec(), P("fsdp"));
  // Two moments of 1/8 of the weight each (plus the 4-byte count) on every device.
  EXPECT_EQ(exec.memory(0).in_use - before, 2 * 8 * 16 * 4 + 4);
  const Tree<Array> bad = Tree<Array>::dict({{"v", p.at("w")}});
  EXPECT_THROW_WITH(Optimizer::adam(1e-3).update(bad, st, p), TreeError, "structure");
}

TEST(Optim, ATrainingStepUnderSjitEqualsOneDevice) {
  const auto loss = [](const Tree<Array>& params, const Array& x, const Array& y) {
    const Array pred = matmul(x, params.at("w").leaf()) + params.at("b").leaf();
    const Array d = pred - y;
    return mean(d * d);
  };
  const Optimizer opt = Optimizer::adamw(warmup_cosine_decay_schedule(0, 0.05, 2, 20), 0.01, {"w$"})
                            .clip_by_global_norm(10.0);
  const auto train = [&](const Mesh& mesh, const Executor& exec, const PartitionSpec& wspec,
                         const PartitionSpec& batch) {
    Tree<Array> params = Tree<Array>::dict(
        {{"w", device_put(Tensor::normal(Shape{8, 4}, DType::kF32, 1, 0, 0.3),
                          NamedSharding(mesh, wspec), exec)},
         {"b", device_put(Tensor::zeros(Shape{4}, DType::kF32), NamedSharding(mesh, P()), exec)}});
    Tree<Array> state = opt.init(params);
    const Array x =
        device_put(Tensor::normal(Shape{32, 8}, DType::kF32, 2), NamedSharding(mesh, batch), exec);
    const Array y =
        device_put(Tensor::normal(Shape{32, 4}, DType::kF32, 3), NamedSharding(mesh, batch), exec);
    auto step = sjit(
        mesh, [&](const Tree<Array>& ps, const Tree<Array>& st, const Array& xb, const Array& yb) {
          const auto [l, g] = value_and_grad(loss)(ps, xb, yb);
          auto [np, ns] = opt.update(g, st, ps);
          return Tree<Array>::dict({{"loss", l}, {"params", np}, {"state", ns}});
        });
    std::vector<double> losses;
    for (int i = 0; i < 5; ++i) {
      const Tree<Array> out = step(params, state, x, y);
      losses.push_back(out.at("loss").leaf().to_host().get(0));
      params = out.at("params");
      state = out.at("state");
    }
    return losses;
  };
  const Executor one(1), eight(8);
  const auto l1 = train(Mesh::parse("data:1,fsdp:1", 1), one, P(), P());
  const auto l8 =
      train(Mesh::parse("data:4,fsdp:2", 8), eight, P("fsdp"), P(AxisNames{"data", "fsdp"}));
  ASSERT_EQ(l1.size(), l8.size());
  for (std::size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l8[i], 1e-5) << i;
  EXPECT_LT(l1.back(), l1.front());
}

// The fused update (one adamw_update per leaf) gives the ops' values over several steps, decay
// masks included, and refuses SGD.
TEST(Optim, TheFusedAdamWUpdateEqualsItsOps) {
  One o;
  const Tree<Array> p = Tree<Array>::dict({{"kernel", o.put({2.0, -1.0})}, {"norm", o.put({0.5})}});
  const Tree<Array> g =
      Tree<Array>::dict({{"kernel", o.put({1.0, 0.25})}, {"norm", o.put({-3.0})}});
  const Optimizer ops = Optimizer::adamw(constant_schedule(0.1), 0.5, {"kernel$"});
  const Optimizer fused = ops.fused();
  EXPECT_TRUE(fused.is_fused());
  EXPECT_FALSE(ops.is_fused());
  Tree<Array> pa = p, pb = p, sa = ops.init(p), sb = fused.init(p);
  for (int step = 0; step < 3; ++step) {
    std::tie(pa, sa) = ops.update(g, sa, pa);
    std::tie(pb, sb) = fused.update(g, sb, pb);
  }
  for (const char* k : {"kernel", "norm"}) {
    for (std::size_t i = 0; i < host(pa, k).size(); ++i) {
      EXPECT_NEAR(host(pb, k)[i], host(pa, k)[i], 1e-12) << k;
      EXPECT_NEAR(host(sb.at("mu"), k)[i], host(sa.at("mu"), k)[i], 1e-12) << k;
      EXPECT_NEAR(host(sb.at("nu"), k)[i], host(sa.at("nu"), k)[i], 1e-12) << k;
    }
  }
  EXPECT_EQ(sb.at("count").leaf().to_host().get(0), 3.0);
  EXPECT_THROW_WITH(Optimizer::sgd(0.1).fused(), SpecError, "[optim]", "SGD", "adamw_update");
}

// torch.optim.AdamW(fused=True)'s kernel reads the parameter, gradient and both moments once and
// writes the parameter and moments once: 4 + 3 accesses of 4 bytes per f32 element, 28 bytes
// (the three results of adamw_update are one kernel: Primitive::shared_reads). Its ops read and
// write every intermediate.
TEST(Optim, TheFusedUpdateReadsAndWritesEachElementOnce) {
  One o;
  const std::int64_t n = 1024;
  const auto f32 = [&](double v) {
    return device_put(Tensor::from<float>(Shape{n}, std::vector<float>(n, static_cast<float>(v))),
                      NamedSharding(o.mesh, P()), o.exec);
  };
  const auto scalar = [&](double v) {
    return device_put(Tensor::from<float>(Shape{}, {static_cast<float>(v)}),
                      NamedSharding(o.mesh, P()), o.exec);
  };
  const auto step = [](const Array& p, const Array& g, const Array& m, const Array& v,
                       const Array& lr, const Array& count) {
    const AdamwUpdate u = adamw_update(p, g, m, v, lr, count, 0.9, 0.95, 1e-8, 0.1);
    return Tree<Array>::list({Tree<Array>(u.param), Tree<Array>(u.mu), Tree<Array>(u.nu)});
  };
  const Lowered low =
      sjit(o.mesh, step).lower(f32(1), f32(0.5), f32(0.1), f32(0.2), scalar(1e-3), scalar(1));
  // 28 bytes per element, and the two f32 scalars read once.
  EXPECT_EQ(low.cost().memory_traffic, 28 * n + 2 * 4) << low.text();
  // The update as ops, in one kernel per chain (compiled): the new moments are outputs and read
  // again by the parameter's chain, 12 + 12 + 16 bytes per element at the least.
  const auto as_ops = [](const Tree<Array>& p, const Tree<Array>& g, const Tree<Array>& s) {
    const auto [np, ns] = Optimizer::adamw(constant_schedule(1e-3), 0.1).update(g, s, p);
    return Tree<Array>::list({np, ns});
  };
  const Optimizer adamw = Optimizer::adamw(constant_schedule(1e-3), 0.1);
  const Tree<Array> params = Tree<Array>::dict({{"w", Tree<Array>(f32(1))}});
  const Tree<Array> grads = Tree<Array>::dict({{"w", Tree<Array>(f32(0.5))}});
  const Lowered ops_low = sjit(o.mesh, as_ops).lower(params, grads, adamw.init(params));
  EXPECT_GE(ops_low.cost().memory_traffic, 40 * n) << ops_low.text();
}

// The fused kernel's operands are checked at the op, and the fused update's trees at the update.
TEST(Optim, TheFusedUpdateRefusesWhatDoesNotFit) {
  One o;
  const Array a = o.put({1.0, 2.0}), b = o.put({1.0, 2.0, 3.0}), s = o.put({0.1});
  const Array scalar = full(Shape{}, DType::kF64, 1, a);
  EXPECT_THROW_WITH(adamw_update(a, b, a, a, scalar, scalar, 0.9, 0.95, 1e-8, 0), SpecError,
                    "[adamw_update]", "f64[2], f64[3]", "one dtype and shape");
  EXPECT_THROW_WITH(adamw_update(a, a, a, a, s, scalar, 0.9, 0.95, 1e-8, 0), SpecError,
                    "[adamw_update]", "lr and count must be scalars");
  const Array ints = astype(a, DType::kI32);
  EXPECT_THROW_WITH(adamw_update(ints, ints, ints, ints, scalar, scalar, 0.9, 0.95, 1e-8, 0),
                    SpecError, "[adamw_update]", "i32[2]", "float array");
  const Optimizer fused = Optimizer::adam(0.1).fused();
  const Tree<Array> p = Tree<Array>::dict({{"w", a}});
  const Tree<Array> other = Tree<Array>::dict({{"v", a}});
  EXPECT_THROW_WITH(fused.update(other, fused.init(p), p), TreeError, "[optim]", "gradients",
                    "parameters' structure");
  EXPECT_THROW_WITH(fused.update(p, fused.init(other), p), TreeError, "[optim]", "first moments");
}

TEST(Optim, ErrorsSayWhatIsMissing) {
  One o;
  const Tree<Array> p = Tree<Array>::dict({{"w", o.put({1.0})}});
  const Tree<Array> empty = Tree<Array>::dict({});
  EXPECT_THROW_WITH(Optimizer::sgd(0.1).init(empty), SpecError, "[optim]", "no arrays");
  EXPECT_THROW_WITH(global_norm(empty), SpecError, "[global_norm]", "no arrays");
  EXPECT_THROW_WITH(Optimizer::sgd(0.1).update(p, Tree<Array>::dict({{"mu", p}}), p), TreeError,
                    "'count'", "init()");
}

// The update written as a sharded weight update (bench/mlp_train_step.hpp's sharded_update:
// gradients reduce-scattered over the batch axis, each device updating its slice, the new
// weights all-gathered) gives the replicated update's weights, and they come out replicated.
// The plain data-parallel step (replicated parameters, no constraint written by the user) gets
// the sharded weight update by itself: the gradients value_and_grad constrains to their
// parameters' sharding stay pending until the update takes them reduce-scattered, and the
// learning rate's broadcast is made in the update's split blocks (not made whole, then sliced).
// The result equals the step on one device. A user's own constraint on a pending gradient is
// resolved where it stands (an all-reduce).
TEST(Optim, ThePlainDataParallelStepUpdatesItsWeightsSplit) {
  const Executor exec(4);
  const Mesh mesh = Mesh::parse("data:4", 4);
  const Executor one(1);
  const Mesh single = Mesh::parse("data:1", 1);
  const Tensor w = Tensor::uniform(Shape{16, 8}, DType::kF32, 5, -1, 1);
  const Tensor x = Tensor::uniform(Shape{32, 16}, DType::kF32, 6, -1, 1);
  const Optimizer sgd = Optimizer::sgd(0.1);
  const auto loss = [](const Tree<Array>& q, const Array& v) {
    return mean(tanh(matmul(v, q.at("w").leaf())));
  };
  const auto make = [&](bool user_constraint) {
    return [&, user_constraint](const Tree<Array>& p, const Array& xb) {
      auto [value, g] = value_and_grad(loss)(p, xb);
      if (user_constraint)
        g = g.map([](const Array& a) { return with_sharding_constraint(a, P()); });
      const Tree<Array> state = sgd.init(p);
      return sgd.update(g, state, p).first;
    };
  };
  const Tree<Array> params =
      Tree<Array>::dict({{"w", device_put(w, NamedSharding(mesh, P()), exec)}});
  const Array xs = device_put(x, NamedSharding(mesh, P("data")), exec);
  auto step = sjit(mesh, make(false));
  const Lowered low = step.lower(params, xs);
  const auto& bytes = low.cost().bytes_by_kind;
  // f32[16, 8] = 512 bytes: 3/4 of it received in the reduce-scatter and again in the all-gather.
  // No all-reduce at all (the loss value, which nobody returns, is not computed either).
  EXPECT_EQ(bytes.count(CollectiveKind::kAllReduce), 0u) << low.text();
  ASSERT_EQ(bytes.count(CollectiveKind::kReduceScatter), 1u) << low.text();
  EXPECT_EQ(bytes.at(CollectiveKind::kReduceScatter), 384);
  EXPECT_EQ(bytes.at(CollectiveKind::kAllGather), 384);
  EXPECT_THAT(low.text(),
              ::testing::Not(::testing::HasSubstr("broadcast_in_dim on blocks [16, 8]")));
  EXPECT_THAT(low.text(), ::testing::HasSubstr("on blocks [4, 8]"));
  const Tree<Array> out = step(params, xs);
  EXPECT_EQ(out.at("w").leaf().sharding().spec(), P());
  const Tree<Array> ref =
      make(false)(Tree<Array>::dict({{"w", device_put(w, NamedSharding(single, P()), one)}}),
                  device_put(x, NamedSharding(single, P()), one));
  const auto a = host(out, "w"), b = host(ref, "w");
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
  EXPECT_NE(a, w.to_doubles());  // the step moved the weights

  const Lowered user = sjit(mesh, make(true)).lower(params, xs);
  // The gradient's all-reduce: 2 * 3/4 of 512 bytes.
  ASSERT_EQ(user.cost().bytes_by_kind.count(CollectiveKind::kAllReduce), 1u) << user.text();
  EXPECT_EQ(user.cost().bytes_by_kind.at(CollectiveKind::kAllReduce), 768);
  EXPECT_EQ(user.cost().bytes_by_kind.count(CollectiveKind::kReduceScatter), 0u) << user.text();
}

TEST(Optim, ShardedWeightUpdateEqualsTheReplicatedOne) {
  const Executor exec(4);
  const Mesh mesh = Mesh::parse("data:4", 4);
  const Tree<Array> params =
      Tree<Array>::dict({{"b", device_put(Tensor::uniform(Shape{6}, DType::kF32, 1, -1, 1),
                                          NamedSharding(mesh, P()), exec)},
                         {"w", device_put(Tensor::uniform(Shape{16, 6}, DType::kF32, 2, -1, 1),
                                          NamedSharding(mesh, P()), exec)}});
  const Array x = device_put(Tensor::uniform(Shape{32, 16}, DType::kF32, 3, -1, 1),
                             NamedSharding(mesh, P("data")), exec);
  const Optimizer adam = Optimizer::adam(0.01);
  const auto step = [&](bool sharded) {
    return sjit(mesh, [&, sharded](const Tree<Array>& p, const Array& xb) {
      const auto [loss, g] = value_and_grad([](const Tree<Array>& q, const Array& v) {
        return mean(tanh(matmul(v, q.at("w").leaf()) + q.at("b").leaf()));
      })(p, xb);
      const auto slice_of = [&](const Tree<Array>& t) {
        return t.map([&](const Array& a) {
          return sharded && a.shape()[0] % 4 == 0 ? with_sharding_constraint(a, P("data")) : a;
        });
      };
      const Tree<Array> state = adam.init(p);
      auto [np, ns] = adam.update(slice_of(g), state, slice_of(p));
      return np.map([](const Array& a) { return with_sharding_constraint(a, P()); });
    })(params, x);
  };
  const Tree<Array> plain = step(false), sharded = step(true);
  for (const char* k : {"b", "w"}) {
    EXPECT_EQ(sharded.at(k).leaf().sharding().spec(), P());
    const auto a = host(plain, k), b = host(sharded, k);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << k << " " << i;
    EXPECT_NE(a, host(params, k));  // the step moved the weights
  }
}

}  // namespace
}  // namespace shardplan
