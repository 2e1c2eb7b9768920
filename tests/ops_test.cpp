// Ops on sharded arrays outside sjit: computed shard by shard under the same sharding rules, with
// values equal to plain host references, shardings that follow the data, and clear shape errors.
#include "shardplan/ops.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/error.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

struct Fixture {
  Executor exec{8};
  Mesh mesh = Mesh::parse("a:4,b:2", 8);
  Array put(const Tensor& t, const PartitionSpec& spec) const {
    return device_put(t, NamedSharding(mesh, spec), exec);
  }
};

// Max |a - b| over the elements.
double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.get(i) - b.get(i)));
  return m;
}

// A host tensor from a function of the flat index.
template <class F>
Tensor host(Shape shape, F f) {
  Tensor t(shape, DType::kF64);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, f(i));
  return t;
}

TEST(Ops, ElementwiseOpsRunShardByShardAndKeepTheSharding) {
  Fixture fx;
  const Tensor x = Tensor::normal(Shape{8, 8}, DType::kF32, 1);
  const Array y = fx.put(x, P("a", "b"));
  const struct {
    const char* name;
    Array (*op)(const Array&);
    double (*ref)(double);
  } cases[] = {
      {"sin", &sin, [](double v) { return std::sin(v); }},
      {"exp", &exp, [](double v) { return std::exp(v); }},
      {"tanh", &tanh, [](double v) { return std::tanh(v); }},
      {"relu", &relu, [](double v) { return std::max(v, 0.0); }},
      {"abs", &abs, [](double v) { return std::abs(v); }},
      {"sigmoid", &sigmoid, [](double v) { return 1 / (1 + std::exp(-v)); }},
      {"gelu", &gelu,
       [](double v) {
         return 0.5 * v *
                (1 + std::tanh(std::sqrt(2 / 3.141592653589793) * (v + 0.044715 * v * v * v)));
       }},
  };
  for (const auto& c : cases) {
    const Array r = c.op(y);
    EXPECT_EQ(r.sharding().spec(), P("a", "b")) << c.name;
    const Tensor expect = host(Shape{8, 8}, [&](std::int64_t i) { return c.ref(x.get(i)); });
    EXPECT_LT(max_diff(r.to_host(), expect), 1e-5) << c.name;
  }
}

TEST(Ops, BinaryOpsBroadcastLikeNumpy) {
  Fixture fx;
  const Tensor x = Tensor::normal(Shape{8, 4}, DType::kF32, 2);
  const Tensor b = Tensor::normal(Shape{4}, DType::kF32, 3);
  const Array r = fx.put(x, P("a")) + fx.put(b, P());
  EXPECT_EQ(r.sharding().spec(), P("a"));
  EXPECT_LT(max_diff(r.to_host(),
                     host(Shape{8, 4}, [&](std::int64_t i) { return x.get(i) + b.get(i % 4); })),
            1e-6);
  const Array s = fx.put(x, P("a", "b")) * 2.0 - 1.0;
  EXPECT_LT(
      max_diff(s.to_host(), host(Shape{8, 4}, [&](std::int64_t i) { return 2 * x.get(i) - 1; })),
      1e-6);
  const Array m = maximum(fx.put(x, P("a")), full_like(fx.put(x, P("a")), 0.25));
  EXPECT_LT(max_diff(m.to_host(),
                     host(Shape{8, 4}, [&](std::int64_t i) { return std::max(x.get(i), 0.25); })),
            1e-7);
  const Array w = where(greater(fx.put(x, P("a")), full_like(fx.put(x, P("a")), 0.0)),
                        fx.put(x, P("a")), full_like(fx.put(x, P("a")), -1.0));
  EXPECT_LT(
      max_diff(w.to_host(),
               host(Shape{8, 4}, [&](std::int64_t i) { return x.get(i) > 0 ? x.get(i) : -1.0; })),
      1e-7);
}

TEST(Ops, MatmulOfRowAndColumnShardsNeedsNoCommunication) {
  Fixture fx;
  const Tensor x = Tensor::normal(Shape{8, 16}, DType::kF32, 4);
  const Tensor w = Tensor::normal(Shape{16, 8}, DType::kF32, 5);
  const Array r = matmul(fx.put(x, P("a", nullptr)), fx.put(w, P(nullptr, "b")));
  EXPECT_EQ(r.sharding().spec(), P("a", "b"));
  const Tensor expect = host(Shape{8, 8}, [&](std::int64_t i) {
    double acc = 0;
    for (int k = 0; k < 16; ++k) acc += x.get(i / 8 * 16 + k) * w.get(k * 8 + i % 8);
    return acc;
  });
  EXPECT_LT(max_diff(r.to_host(), expect), 1e-4);
}

TEST(Ops, ContractingAShardedDimensionReducesThePartialSums) {
  Fixture fx;
  const Tensor x = Tensor::normal(Shape{4, 16}, DType::kF64, 6);
  const Tensor w = Tensor::normal(Shape{16, 4}, DType::kF64, 7);
  const Array r = matmul(fx.put(x, P(nullptr, "a")), fx.put(w, P("a", nullptr)));
  EXPECT_FALSE(r.is_pending());
  const Tensor expect = host(Shape{4, 4}, [&](std::int64_t i) {
    double acc = 0;
    for (int k = 0; k < 16; ++k) acc += x.get(i / 4 * 16 + k) * w.get(k * 4 + i % 4);
    return acc;
  });
  EXPECT_LT(max_diff(r.to_host(), expect), 1e-12);
  // A sum over a sharded axis too.
  const Array s = sum(fx.put(x, P(nullptr, "a")), {1});
  EXPECT_LT(max_diff(s.to_host(), host(Shape{4},
                                       [&](std::int64_t i) {
                                         double acc = 0;
                                         for (int k = 0; k < 16; ++k) acc += x.get(i * 16 + k);
                                         return acc;
                                       })),
            1e-12);
}

TEST(Ops, ShapeOpsMoveTheRightElements) {
  Fixture fx;
  const Tensor x = Tensor::generate(Shape{8, 4}, DType::kF32, Generator::iota());
  const Array a = fx.put(x, P("a", "b"));
  EXPECT_EQ(transpose(a, {1, 0}).to_host().to_doubles(), host(Shape{4, 8}, [](std::int64_t i) {
                                                           return double(i % 8 * 4 + i / 8);
                                                         }).to_doubles());
  EXPECT_EQ(reshape(a, Shape{4, 8}).to_host().to_doubles(), x.to_doubles());
  EXPECT_EQ(slice(a, {2, 1}, {5, 3}).to_host().to_doubles(),
            (std::vector<double>{9, 10, 13, 14, 17, 18}));
  EXPECT_EQ(concatenate({a, a}, 1).shape(), Shape({8, 8}));
  EXPECT_EQ(concatenate({a, a}, 1).to_host().get(5), 1.0);
  const Array idx = device_put(Tensor::from<std::int32_t>(Shape{3}, {7, 0, 2}),
                               NamedSharding(fx.mesh, P()), fx.exec);
  EXPECT_EQ(take(a, idx, 0).to_host().to_doubles(),
            (std::vector<double>{28, 29, 30, 31, 0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(one_hot(idx, 8).to_host().get(7), 1.0);
  EXPECT_EQ(one_hot(idx, 8).to_host().get(8), 1.0);
  EXPECT_EQ(sum(one_hot(idx, 8)).to_host().get(0), 3.0);
}

TEST(Ops, NeuralNetworkPiecesMatchTheirDefinitions) {
  Fixture fx;
  const Tensor x = Tensor::normal(Shape{8, 6}, DType::kF64, 9);
  const Array a = fx.put(x, P("a"));
  auto row = [&](std::int64_t r, int c) { return x.get(r * 6 + c); };
  const Tensor sm = softmax(a).to_host();
  const Tensor ls = log_softmax(a).to_host();
  for (std::int64_t r = 0; r < 8; ++r) {
    double z = 0;
    for (int c = 0; c < 6; ++c) z += std::exp(row(r, c));
    for (int c = 0; c < 6; ++c) {
      EXPECT_NEAR(sm.get(r * 6 + c), std::exp(row(r, c)) / z, 1e-12);
      EXPECT_NEAR(ls.get(r * 6 + c), row(r, c) - std::log(z), 1e-12);
    }
  }
  const Array labels = device_put(Tensor::from<std::int32_t>(Shape{8}, {0, 1, 2, 3, 4, 5, 0, 1}),
                                  NamedSharding(fx.mesh, P("a")), fx.exec);
  const Tensor ce = cross_entropy(a, labels).to_host();
  for (std::int64_t r = 0; r < 8; ++r) {
    EXPECT_NEAR(ce.get(r), -ls.get(r * 6 + labels.to_host().get(r)), 1e-12);
  }
  const Tensor scale = Tensor::uniform(Shape{6}, DType::kF64, 1, 0.5, 1.5);
  const Tensor bias = Tensor::uniform(Shape{6}, DType::kF64, 2);
  const Tensor ln = layer_norm(a, fx.put(scale, P()), fx.put(bias, P()), 1e-5).to_host();
  const Tensor rn = rms_norm(a, fx.put(scale, P()), 1e-6).to_host();
  for (std::int64_t r = 0; r < 8; ++r) {
    double mu = 0, ms = 0, var = 0;
    for (int c = 0; c < 6; ++c) mu += row(r, c) / 6;
    for (int c = 0; c < 6; ++c) {
      var += (row(r, c) - mu) * (row(r, c) - mu) / 6;
      ms += row(r, c) * row(r, c) / 6;
    }
    for (int c = 0; c < 6; ++c) {
      EXPECT_NEAR(ln.get(r * 6 + c),
                  (row(r, c) - mu) / std::sqrt(var + 1e-5) * scale.get(c) + bias.get(c), 1e-10);
      EXPECT_NEAR(rn.get(r * 6 + c), row(r, c) / std::sqrt(ms + 1e-6) * scale.get(c), 1e-10);
    }
  }
  const Tensor masked =
      causal_mask(fx.put(Tensor::ones(Shape{4, 4}, DType::kF32), P("a"))).to_host();
  EXPECT_EQ(masked.get(0 * 4 + 0), 1.0);
  EXPECT_LT(masked.get(0 * 4 + 1), -1e29);
  EXPECT_EQ(masked.get(3 * 4 + 2), 1.0);
}

// take_along_axis from an axis split over devices: each device takes the indices that fall in
// its slice (0 for the others) and the sum over them is the value, as DTensor's masked gather
// under loss_parallel; inside sjit only the [rows] values are reduced, x is never gathered.
// Out-of-range indices are clamped. fused_log_softmax equals log_softmax.
TEST(Ops, TakeAlongASplitAxisSumsEachDevicesOwnIndices) {
  Fixture fx;
  const Tensor x = Tensor::normal(Shape{8, 12}, DType::kF64, 21);
  const std::vector<std::int32_t> at{0, 5, 11, 3, -1, 12, 7, 8};  // clamped: -1 -> 0, 12 -> 11
  const Tensor idx = Tensor::from<std::int32_t>(Shape{8, 1}, at);
  const Array xa = fx.put(x, P(nullptr, "a"));  // 3 columns a device
  const Array ia = device_put(idx, NamedSharding(fx.mesh, P()), fx.exec);
  const Tensor got = take_along_axis(xa, ia, 1).to_host();
  ASSERT_EQ(got.shape(), Shape({8, 1}));
  for (std::int64_t r = 0; r < 8; ++r) {
    const std::int64_t c = std::clamp<std::int64_t>(at[static_cast<std::size_t>(r)], 0, 11);
    EXPECT_EQ(got.get(r), x.get(r * 12 + c)) << r;
  }
  const auto fn = [](const Array& a, const Array& i) { return take_along_axis(a, i, 1); };
  const Lowered lowered = sjit(fx.mesh, fn, SjitOptions{.in_shardings = RuleTree::list(
                                                            {RuleTree(P(nullptr, "a")), RuleTree(P())})})
                              .lower(TensorSpec{Shape{8, 12}, DType::kF64},
                                     TensorSpec{Shape{8, 1}, DType::kI32});
  const auto& moved = lowered.cost().bytes_by_kind;
  EXPECT_EQ(moved.count(CollectiveKind::kAllGather), 0u) << lowered.text();
  // The pending [8, 1] f64 sum over a's 4 devices, all-reduced: 2 x 3/4 x 64 bytes.
  ASSERT_EQ(moved.count(CollectiveKind::kAllReduce), 1u) << lowered.text();
  EXPECT_EQ(moved.at(CollectiveKind::kAllReduce), 96);
  const Tensor run = sjit(fx.mesh, fn)(xa, ia).to_host();
  for (std::int64_t r = 0; r < 8; ++r) EXPECT_EQ(run.get(r), got.get(r));

  EXPECT_LT(max_diff(fused_log_softmax(xa, 1).to_host(), log_softmax(xa, 1).to_host()), 1e-12);
  EXPECT_THROW_WITH(take_along_axis(xa, device_put(Tensor::from<std::int32_t>(Shape{8}, at),
                                                   NamedSharding(fx.mesh, P()), fx.exec), 1),
                    SpecError, "take_along_axis", "f64[8, 12]", "i32[8]", "[8, 1]");
  EXPECT_THROW_WITH(take_along_axis(xa, astype(ia, DType::kF32), 1), SpecError,
                    "take_along_axis", "f32[8, 1]", "must be i32");
  EXPECT_THROW_WITH(take_along_axis(astype(xa, DType::kBool), ia, 1), SpecError,
                    "take_along_axis", "bool[8, 12]", "cannot take");
  EXPECT_THROW_WITH(fused_log_softmax(ia), SpecError, "fused_log_softmax", "i32[8, 1]",
                    "floating-point");
  // An axis past i32's reach would wrap the positions: refused (traced: no bytes are made).
  const auto huge = [](const Array& a, const Array& i) { return take_along_axis(a, i, 1); };
  EXPECT_THROW_WITH(sjit(fx.mesh, huge).lower(TensorSpec{Shape{2, std::int64_t{1} << 31}, DType::kBF16},
                                              TensorSpec{Shape{2, 1}, DType::kI32}),
                    SpecError, "take_along_axis", "2147483648", "i32");
}

// fused_log_softmax keeps four running maxima and sums a row: rows whose length is not a
// multiple of four (the tail), a NaN in any lane, +inf, a row of -inf and a row of one element
// give what the composed log_softmax gives, element for element (NaN where it has NaN).
TEST(Ops, FusedLogSoftmaxEqualsTheComposedOneOnEveryLaneAndSpecialValue) {
  Fixture fx;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  for (const std::int64_t n : {1, 3, 4, 7, 9}) {
    for (const DType t : {DType::kF32, DType::kF64}) {
      Tensor x = Tensor::normal(Shape{8, n}, t, static_cast<std::uint64_t>(5 + n));
      x.set(1 * n + (n - 1), nan);  // the tail's (or the last lane's) element
      x.set(2 * n, inf);
      for (std::int64_t j = 0; j < n; ++j) x.set(3 * n + j, -inf);
      x.set(4 * n + n / 2, 1e30);
      const Array a = fx.put(x, P("a"));
      const Tensor got = fused_log_softmax(a, 1).to_host(), want = log_softmax(a, 1).to_host();
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " " << name(t) << " element " << i);
        if (std::isnan(want.get(i))) {
          EXPECT_TRUE(std::isnan(got.get(i))) << got.get(i);
        } else if (std::isinf(want.get(i))) {
          EXPECT_EQ(got.get(i), want.get(i));
        } else {
          EXPECT_NEAR(got.get(i), want.get(i), t == DType::kF32 ? 1e-5 : 1e-12);
        }
      }
    }
  }
}

TEST(Ops, ConstraintOutsideSjitReshardsAtOnceAndAnnotationIsIdentity) {
  Fixture fx;
  const Tensor x = Tensor::normal(Shape{8, 8}, DType::kF32, 3);
  const Array a = fx.put(x, P("a"));
  const Array c = with_sharding_constraint(a, P(nullptr, "b"));
  EXPECT_EQ(c.sharding().spec(), P(nullptr, "b"));
  EXPECT_TRUE(c.to_host() == x);
  EXPECT_EQ(with_sharding_annotation(a, "anything").sharding().spec(), P("a"));
}

TEST(Ops, ShapeAndDtypeErrorsNameTheOpAndTheShapes) {
  Fixture fx;
  const Array a = fx.put(Tensor::ones(Shape{8, 4}, DType::kF32), P("a"));
  const Array b = fx.put(Tensor::ones(Shape{8, 3}, DType::kF32), P("a"));
  EXPECT_THROW_WITH(a + b, SpecError, "[add]", "f32[8, 4]", "f32[8, 3]", "do not broadcast");
  EXPECT_THROW_WITH(matmul(a, b), SpecError, "[matmul]", "f32[8, 4]", "f32[8, 3]", "4 != 8");
  EXPECT_THROW_WITH(a + fx.put(Tensor::ones(Shape{8, 4}, DType::kF64), P()), SpecError, "[add]",
                    "different dtypes");
  EXPECT_THROW_WITH(reshape(a, Shape{5, 5}), SpecError, "[reshape]", "[8, 4]", "[5, 5]");
  EXPECT_THROW_WITH(sin(fx.put(Tensor::ones(Shape{8}, DType::kI32), P())), SpecError, "[sin]",
                    "i32[8]");
  EXPECT_THROW_WITH(transpose(a, {0, 0}), SpecError, "[transpose]", "not a permutation");
  const Executor other(8);
  EXPECT_THROW_WITH(
      a + device_put(Tensor::ones(Shape{8, 4}, DType::kF32), NamedSharding(fx.mesh, P()), other),
      ArrayError, "different executors");
}

TEST(Ops, MoreShapeErrorsNameTheOpAndTheShapes) {
  Fixture fx;
  const Array a = fx.put(Tensor::ones(Shape{8, 4}, DType::kF32), P("a"));
  const Array v = fx.put(Tensor::ones(Shape{8}, DType::kF32), P());
  const Array idx = fx.put(Tensor::ones(Shape{3}, DType::kI32), P());
  EXPECT_THROW_WITH(concatenate({a, v}, 0), SpecError, "[concatenate]", "f32[8]", "f32[8, 4]");
  EXPECT_THROW_WITH(concatenate({}, 0), SpecError, "[concatenate]", "at least one");
  EXPECT_THROW_WITH(slice(a, {0, 2}, {8, 6}), SpecError, "[slice]", "[0, 2]", "[8, 6]",
                    "f32[8, 4]");
  EXPECT_THROW_WITH(take(a, v, 0), SpecError, "[take]", "i32", "f32[8]");
  EXPECT_THROW_WITH(one_hot(v, 4), SpecError, "[one_hot]", "i32", "f32[8]");
  EXPECT_THROW_WITH(dot_general(a, a, DotDims{{}, {}, {1}, {0}}), SpecError, "[dot_general]",
                    "f32[8, 4]", "4 vs 8");
  EXPECT_THROW_WITH(matmul(a, v), SpecError, "[matmul]", "f32[8, 4]", "f32[8]");
  EXPECT_THROW_WITH(broadcast_in_dim(a, Shape{8, 5}, {0, 1}), SpecError, "[broadcast_in_dim]",
                    "f32[8, 4]", "[8, 5]");
  EXPECT_THROW_WITH(broadcast_to(a, Shape{8, 5}), SpecError, "f32[8, 4]", "[8, 5]");
  EXPECT_THROW_WITH(causal_mask(a), SpecError, "[causal_mask]", "f32[8, 4]");
  EXPECT_THROW_WITH(cross_entropy(a, a), SpecError, "[cross_entropy]", "f32[8, 4]", "rank 1");
  EXPECT_THROW_WITH(where(a, a, a), SpecError, "[where]", "bool", "f32[8, 4]");
  EXPECT_THROW_WITH(iota_like(sum(a), 0), SpecError, "[iota]", "f32[]");
  EXPECT_THROW_WITH(sum(a, {2}), SpecError, "axis 2", "f32[8, 4]");
  (void)idx;
}


// ---- The losses' labels (PyTorch's cross_entropy: ignore_index -100, "Target out of bounds") ----

// 8 tokens over d:4 (2 a device), 10 classes; labels i % 10 with `at` set to `label`.
struct LabelProblem {
  Executor exec{4};
  Mesh mesh = Mesh::parse("d:4", 4);
  Tensor logits_host = Tensor::normal(Shape{8, 10}, DType::kF64, 21);
  Array logits = device_put(logits_host, NamedSharding(mesh, P("d")), exec);
  Array hidden = device_put(Tensor::normal(Shape{8, 6}, DType::kF64, 22),
                            NamedSharding(mesh, P("d")), exec);
  Array weight = device_put(Tensor::normal(Shape{10, 6}, DType::kF64, 23),
                            NamedSharding(mesh, P()), exec);
  Array labels_with(const std::vector<std::pair<int, std::int32_t>>& set) const {
    std::vector<std::int32_t> l;
    for (int i = 0; i < 8; ++i) l.push_back(i % 10);
    for (const auto& [at, v] : set) l[static_cast<std::size_t>(at)] = v;
    return device_put(Tensor::from<std::int32_t>(Shape{8}, l), NamedSharding(mesh, P("d")), exec);
  }
};

// Every label outside [0, 10) but -100 is refused where it is seen: eagerly at the op, under
// sjit when the compiled step runs (the labels sharded: device 2 holds index 5), by
// cross_entropy and linear_cross_entropy alike, naming the op, the label, its index and the
// classes; the DeviceError holds the ValueError.
TEST(CrossEntropy, ALabelOutsideTheClassesIsAnErrorEagerlyAndUnderSjit) {
  LabelProblem p;
  auto loss = sjit(p.mesh, [](const Array& logits, const Array& labels) {
    return mean_over_labels(cross_entropy(logits, labels), labels);
  });
  auto grads = sjit(p.mesh, [](const Array& h, const Array& w, const Array& labels) {
    return value_and_grad([&](const Array& v) {
             return mean_over_labels(linear_cross_entropy(h, v, labels, 2), labels);
           })(w)
        .second;
  });
  for (const std::int32_t bad : {-1, 10, 1000000, std::numeric_limits<std::int32_t>::min()}) {
    SCOPED_TRACE(bad);
    const Array labels = p.labels_with({{5, bad}});
    const std::string label = "label " + std::to_string(bad) + " at index [5]";
    const std::string classes = "[0, 10)";
    EXPECT_THROW_WITH(cross_entropy(p.logits, labels), DeviceError, std::string("device 2"),
                      std::string("[cross_entropy]"), label, classes);
    EXPECT_THROW_WITH(linear_cross_entropy(p.hidden, p.weight, labels), DeviceError,
                      std::string("[linear_cross_entropy]"), label, classes);
    EXPECT_THROW_WITH(loss(p.logits, labels), DeviceError, std::string("device 2"),
                      std::string("[cross_entropy]"), label, classes);
    EXPECT_THROW_WITH(grads(p.hidden, p.weight, labels), DeviceError,
                      std::string("[linear_cross_entropy]"), label, classes);
    try {
      (void)cross_entropy(p.logits, labels);
    } catch (const DeviceError& e) {
      EXPECT_THROW(std::rethrow_if_nested(e), ValueError);
    }
  }
  // The same programs run with good labels afterwards.
  EXPECT_TRUE(std::isfinite(loss(p.logits, p.labels_with({})).to_host().get(0)));
  EXPECT_THROW_WITH(check_labels(p.labels_with({}), 0), SpecError, "[check_labels]", "0");
}

// -100 leaves a token out: its loss is 0 and its logits' gradient exactly 0, and the mean is over
// the other tokens (PyTorch's reduction='mean'), its gradient (softmax - one_hot) / 6 by hand;
// eagerly and under sjit alike. Every token ignored: NaN (0 / 0, as PyTorch).
TEST(CrossEntropy, IgnoredLabelsGiveZeroAndTheMeanIsOverTheOthers) {
  LabelProblem p;
  const Array labels = p.labels_with({{1, kIgnoreIndex}, {6, kIgnoreIndex}});
  const std::vector<std::int32_t> l{0, -100, 2, 3, 4, 5, -100, 7};
  const auto x = [&](int r, int c) { return p.logits_host.get(r * 10 + c); };
  std::vector<double> lse(8, 0.0);
  for (int r = 0; r < 8; ++r) {
    for (int c = 0; c < 10; ++c) lse[static_cast<std::size_t>(r)] += std::exp(x(r, c));
    lse[static_cast<std::size_t>(r)] = std::log(lse[static_cast<std::size_t>(r)]);
  }
  const Tensor per_token = cross_entropy(p.logits, labels).to_host();
  double total = 0;
  for (int r = 0; r < 8; ++r) {
    const auto lr = l[static_cast<std::size_t>(r)];
    const double want = lr == kIgnoreIndex ? 0.0 : lse[static_cast<std::size_t>(r)] - x(r, lr);
    EXPECT_NEAR(per_token.get(r), want, 1e-12) << r;
    total += want;
  }
  const auto loss = [&](const Array& logits) {
    return mean_over_labels(cross_entropy(logits, labels), labels);
  };
  auto jitted = sjit(p.mesh, [&](const Array& logits) {
    const auto [v, g] = value_and_grad(loss)(logits);
    return Tree<Array>::list({Tree<Array>(v), Tree<Array>(g)});
  });
  const Tree<Array> under_sjit = jitted(p.logits);
  const std::vector<std::pair<Array, Array>> runs{
      value_and_grad(loss)(p.logits),
      {under_sjit.at(0).leaf(), under_sjit.at(1).leaf()}};
  for (const auto& [value, grad] : runs) {
    EXPECT_NEAR(value.to_host().get(0), total / 6, 1e-12);
    const Tensor g = grad.to_host();
    for (int r = 0; r < 8; ++r) {
      const auto lr = l[static_cast<std::size_t>(r)];
      for (int c = 0; c < 10; ++c) {
        const double gv = g.get(r * 10 + c);
        if (lr == kIgnoreIndex) {
          EXPECT_EQ(gv, 0.0) << r << ", " << c;  // exactly
        } else {
          const double softmax = std::exp(x(r, c) - lse[static_cast<std::size_t>(r)]);
          EXPECT_NEAR(gv, (softmax - (c == lr ? 1.0 : 0.0)) / 6, 1e-12) << r << ", " << c;
        }
      }
    }
  }
  // linear_cross_entropy leaves the same tokens out.
  const Tensor fused = linear_cross_entropy(p.hidden, p.weight, labels, 2).to_host();
  EXPECT_EQ(fused.get(1), 0.0);
  EXPECT_EQ(fused.get(6), 0.0);
  EXPECT_GT(fused.get(0), 0.0);
  // Every token ignored: 0 / 0.
  const Array none = p.labels_with({{0, -100}, {1, -100}, {2, -100}, {3, -100}, {4, -100},
                                    {5, -100}, {6, -100}, {7, -100}});
  EXPECT_TRUE(std::isnan(mean_over_labels(cross_entropy(p.logits, none), none).to_host().get(0)));
  EXPECT_TRUE(std::isnan(
      mean_over_labels(linear_cross_entropy(p.hidden, p.weight, none), none).to_host().get(0)));
  // Another ignore_index: -100 is then a bad label, and 3 the one left out.
  EXPECT_THROW_WITH(cross_entropy(p.logits, labels, 3), DeviceError, "label -100 at index [1]",
                    "or the ignore_index 3");
  EXPECT_EQ(cross_entropy(p.logits, p.labels_with({}), 3).to_host().get(3), 0.0);
  EXPECT_THROW_WITH(mean_over_labels(p.logits, labels), SpecError, "[mean_over_labels]",
                    "f64[8, 10]", "i32[8]");
}

}  // namespace
}  // namespace shardplan
