// grad and value_and_grad: every op's gradient against central finite differences in f64, on one
// device and sharded over eight (sharded gradients equal the single-device ones), inside sjit,
// with auxiliary outputs, and gradients sharded like their parameters.
#include "shardplan/autodiff.hpp"

#include <cmath>
#include <functional>

#include "shardplan/error.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using Fn = std::function<Array(const Tree<Array>&)>;

struct Case {
  std::string name;
  Fn f;  // of the inputs tree, any output shape
  std::vector<std::pair<std::string, Tensor>> inputs;
  std::vector<std::pair<std::string, PartitionSpec>> specs;  // on the 8-device mesh
  double eps = 1e-6;                                         // finite-difference step
  double tol = 1e-5;                                         // relative tolerance
};

Tensor f64(Shape s, std::uint64_t seed, double lo = -1.5, double hi = 1.5) {
  return Tensor::uniform(std::move(s), DType::kF64, seed, lo, hi);
}

// loss = sum(f(x) * w) for fixed random w: a scalar whose gradient exercises every output.
Array weighted(const Fn& f, const Tree<Array>& x) {
  const Array y = f(x);
  if (y.shape().rank() == 0) return y * 1.7;
  const Array w = full(y.shape(), DType::kF64, 1.0, y) +
                  astype(iota_like(y, y.shape().rank() > 0 ? y.shape().rank() - 1 : 0, DType::kF64),
                         DType::kF64) *
                      0.37;
  return sum(y * w);
}

Tree<Array> put(const Case& c, const Mesh& mesh, const Executor& exec, bool sharded) {
  std::vector<Tree<Array>::DictEntry> entries;
  for (const auto& [name, t] : c.inputs) {
    PartitionSpec spec;
    if (sharded) {
      for (const auto& [n2, s] : c.specs) {
        if (n2 == name) spec = s;
      }
    }
    entries.emplace_back(name, device_put(t, NamedSharding(mesh, spec), exec));
  }
  return Tree<Array>::dict(std::move(entries));
}

void check(const Case& c) {
  SCOPED_TRACE(c.name);
  const Executor one(1), eight(8);
  const Mesh m1 = Mesh::parse("x:1,y:1", 1);
  const Mesh m8 = Mesh::parse("x:4,y:2", 8);
  const auto loss = [&](const Tree<Array>& x) { return weighted(c.f, x); };
  const Tree<Array> x1 = put(c, m1, one, false);
  const auto [value, g1] = value_and_grad(loss)(x1);
  const auto g8 = grad(loss)(put(c, m8, eight, true));
  for (const auto& [name, t] : c.inputs) {
    const Tensor ga = g1.at(name).leaf().to_host();
    const Tensor gb = g8.at(name).leaf().to_host();
    // Sharded gradients equal the single-device ones, and keep their parameter's sharding.
    for (std::int64_t i = 0; i < ga.numel(); ++i)
      EXPECT_NEAR(ga.get(i), gb.get(i), 1e-9) << name << i;
    // Central differences on up to 12 elements.
    const std::int64_t stride = std::max<std::int64_t>(1, t.numel() / 12);
    for (std::int64_t i = 0; i < t.numel(); i += stride) {
      auto at = [&](double delta) {
        std::vector<Tree<Array>::DictEntry> entries;
        for (const auto& [n2, t2] : c.inputs) {
          Tensor v = t2;
          if (n2 == name) v.set(i, v.get(i) + delta);
          entries.emplace_back(n2, device_put(v, NamedSharding(m1, P()), one));
        }
        return loss(Tree<Array>::dict(std::move(entries))).to_host().get(0);
      };
      const double eps = c.eps;
      const double numeric = (at(eps) - at(-eps)) / (2 * eps);
      EXPECT_NEAR(ga.get(i), numeric, c.tol * std::max(1.0, std::abs(numeric)))
          << name << "[" << i << "]";
    }
  }
  EXPECT_EQ(value.shape().rank(), 0);
}

Array in(const Tree<Array>& t, const char* k) { return t.at(k).leaf(); }

TEST(Autodiff, ElementwiseOpsMatchFiniteDifferences) {
  const Tensor x = f64(Shape{8, 4}, 1);
  const Tensor pos = f64(Shape{8, 4}, 2, 0.3, 2.0);
  const std::vector<std::pair<std::string, PartitionSpec>> s = {{"x", P("x", "y")}};
  const std::vector<std::pair<const char*, Array (*)(const Array&)>> on_x = {
      {"neg", &neg},   {"exp", &exp},         {"sin", &sin},   {"cos", &cos}, {"tanh", &tanh},
      {"gelu", &gelu}, {"sigmoid", &sigmoid}, {"relu", &relu}, {"abs", &abs}};
  for (const auto& [name, op] : on_x) {
    check({name, [op = op](const Tree<Array>& t) { return op(in(t, "x")); }, {{"x", x}}, s});
  }
  for (const auto& [name, op] : std::vector<std::pair<const char*, Array (*)(const Array&)>>{
           {"log", &log}, {"sqrt", &sqrt}, {"rsqrt", &rsqrt}}) {
    check({name, [op = op](const Tree<Array>& t) { return op(in(t, "x")); }, {{"x", pos}}, s});
  }
}

TEST(Autodiff, BinaryOpsMatchFiniteDifferences) {
  const Tensor a = f64(Shape{8, 4}, 3), b = f64(Shape{8, 4}, 4, 0.5, 2.0), row = f64(Shape{4}, 5);
  const std::vector<std::pair<std::string, PartitionSpec>> s = {{"a", P("x")},
                                                                {"b", P(nullptr, "y")}};
  check({"add",
         [](const Tree<Array>& t) { return in(t, "a") + in(t, "b"); },
         {{"a", a}, {"b", b}},
         s});
  check({"sub",
         [](const Tree<Array>& t) { return in(t, "a") - in(t, "b"); },
         {{"a", a}, {"b", b}},
         s});
  check({"mul",
         [](const Tree<Array>& t) { return in(t, "a") * in(t, "b"); },
         {{"a", a}, {"b", b}},
         s});
  check({"div",
         [](const Tree<Array>& t) { return in(t, "a") / in(t, "b"); },
         {{"a", a}, {"b", b}},
         s});
  check({"max",
         [](const Tree<Array>& t) { return maximum(in(t, "a"), in(t, "b")); },
         {{"a", a}, {"b", b}},
         s});
  check({"min",
         [](const Tree<Array>& t) { return minimum(in(t, "a"), in(t, "b")); },
         {{"a", a}, {"b", b}},
         s});
  check({"pow",
         [](const Tree<Array>& t) { return power(in(t, "b"), in(t, "a")); },
         {{"a", a}, {"b", b}},
         s});
  check({"broadcast add",
         [](const Tree<Array>& t) { return in(t, "a") + in(t, "r"); },
         {{"a", a}, {"r", row}},
         {{"a", P("x", "y")}, {"r", P()}}});
  check({"where",
         [](const Tree<Array>& t) {
           return where(greater(in(t, "a"), full_like(in(t, "a"), 0)), in(t, "a") * 3.0,
                        in(t, "b"));
         },
         {{"a", a}, {"b", b}},
         s});
  check({"scalar ops",
         [](const Tree<Array>& t) { return 2.0 - in(t, "a") / 3.0 + 1.5 * in(t, "a"); },
         {{"a", a}},
         s});
}

TEST(Autodiff, ContractionsAndReductionsMatchFiniteDifferences) {
  const Tensor a = f64(Shape{8, 6}, 6), w = f64(Shape{6, 4}, 7), b3 = f64(Shape{2, 8, 6}, 8),
               w3 = f64(Shape{2, 4, 6}, 9);
  check({"matmul",
         [](const Tree<Array>& t) { return matmul(in(t, "a"), in(t, "w")); },
         {{"a", a}, {"w", w}},
         {{"a", P("x")}, {"w", P(nullptr, "y")}}});
  check({"matmul contracting a sharded dim",
         [](const Tree<Array>& t) { return matmul(in(t, "a"), in(t, "w")); },
         {{"a", a}, {"w", w}},
         {{"a", P(nullptr, "y")}, {"w", P("y")}}});
  // Batch dim 0 of both, contract b3's dim 2 with w3's dim 2 (non-canonical positions).
  check({"dot_general batched",
         [](const Tree<Array>& t) {
           return dot_general(in(t, "b"), in(t, "w"), DotDims{{0}, {0}, {2}, {2}});
         },
         {{"b", b3}, {"w", w3}},
         {{"b", P(nullptr, "x")}, {"w", P()}}});
  check({"dot_general lhs contract first",
         [](const Tree<Array>& t) {
           return dot_general(in(t, "a"), in(t, "b"), DotDims{{}, {}, {0}, {1}});
         },
         {{"a", a}, {"b", f64(Shape{4, 8}, 10)}},
         {{"a", P("x")}, {"b", P()}}});
  check({"sum",
         [](const Tree<Array>& t) { return sum(in(t, "a"), {1}); },
         {{"a", a}},
         {{"a", P("x", "y")}}});
  check({"mean all",
         [](const Tree<Array>& t) { return mean(in(t, "a")); },
         {{"a", a}},
         {{"a", P("x")}}});
  check({"max",
         [](const Tree<Array>& t) { return max(in(t, "a"), {0}); },
         {{"a", a}},
         {{"a", P("x")}}});
  check({"min keepdims",
         [](const Tree<Array>& t) { return min(in(t, "a"), {1}, true); },
         {{"a", a}},
         {{"a", P("x")}}});
}

TEST(Autodiff, ShapeOpsMatchFiniteDifferences) {
  const Tensor a = f64(Shape{8, 6}, 11), c = f64(Shape{1, 6}, 12);
  const std::vector<std::pair<std::string, PartitionSpec>> s = {{"a", P("x")}};
  check({"reshape",
         [](const Tree<Array>& t) {
           return reshape(in(t, "a"), Shape{4, 12});
         },
         {{"a", a}},
         s});
  check({"transpose",
         [](const Tree<Array>& t) {
           return transpose(in(t, "a"), {1, 0});
         },
         {{"a", a}},
         s});
  check({"broadcast size-1",
         [](const Tree<Array>& t) {
           return broadcast_to(in(t, "c"), Shape{3, 8, 6});
         },
         {{"c", c}},
         {{"c", P()}}});
  check({"slice",
         [](const Tree<Array>& t) {
           return slice(in(t, "a"), {1, 2}, {7, 5});
         },
         {{"a", a}},
         s});
  check({"concatenate",
         [](const Tree<Array>& t) {
           return concatenate({in(t, "a"), in(t, "a") * 2.0}, 1);
         },
         {{"a", a}},
         s});
  check({"convert",
         [](const Tree<Array>& t) { return astype(astype(in(t, "a"), DType::kF32), DType::kF64); },
         {{"a", f64(Shape{8, 6}, 13, 1, 2)}},
         s,
         // Through f32 the function is a staircase at 1e-7: a wider step (it is linear anyway).
         1e-2,
         1e-4});
}

TEST(Autodiff, NetworkPiecesMatchFiniteDifferences) {
  const Tensor x = f64(Shape{8, 6}, 14), scale = f64(Shape{6}, 15, 0.5, 1.5),
               bias = f64(Shape{6}, 16);
  const Tensor emb = f64(Shape{10, 4}, 17);
  const std::vector<std::pair<std::string, PartitionSpec>> s = {{"x", P("x")}};
  check({"softmax", [](const Tree<Array>& t) { return softmax(in(t, "x")); }, {{"x", x}}, s});
  check(
      {"log_softmax", [](const Tree<Array>& t) { return log_softmax(in(t, "x")); }, {{"x", x}}, s});
  check({"layer_norm",
         [](const Tree<Array>& t) { return layer_norm(in(t, "x"), in(t, "s"), in(t, "b")); },
         {{"x", x}, {"s", scale}, {"b", bias}},
         {{"x", P("x")}, {"s", P()}, {"b", P()}}});
  check({"rms_norm",
         [](const Tree<Array>& t) { return rms_norm(in(t, "x"), in(t, "s")); },
         {{"x", x}, {"s", scale}},
         {{"x", P("x")}, {"s", P()}}});
  check({"silu", [](const Tree<Array>& t) { return silu(in(t, "x")); }, {{"x", x}}, s});
  check({"causal_mask",
         [](const Tree<Array>& t) {
           return softmax(causal_mask(matmul(in(t, "x"), transpose(in(t, "x"), {1, 0}))));
         },
         {{"x", x}},
         s});
  check({"take (embedding)",
         [](const Tree<Array>& t) {
           const Array idx =
               astype(iota_like(full(Shape{3, 2}, DType::kF64, 0, in(t, "e")), 0, DType::kI32),
                      DType::kI32) *
                   0 +
               astype(iota_like(full(Shape{3, 2}, DType::kF64, 0, in(t, "e")), 1, DType::kI32),
                      DType::kI32) *
                   3;
           return take(in(t, "e"), idx, 0);
         },
         {{"e", emb}},
         {{"e", P(nullptr, "y")}}});
  check({"cross_entropy",
         [](const Tree<Array>& t) {
           const Array labels =
               astype(iota_like(full(Shape{8}, DType::kF64, 0, in(t, "x")), 0, DType::kI32) - 0,
                      DType::kI32);
           const Array l =
               astype(astype(labels, DType::kF64) * 0.5, DType::kI32);  // 0,0,1,1,2,2,3,3
           return cross_entropy(in(t, "x"), l);
         },
         {{"x", x}},
         s});
}

// What one more layer of `layer` adds to the peak of value_and_grad under sjit on one device:
// the bytes its backward pass keeps. x [1024, 256] f32 (1 MiB), a weight [256] per layer.
std::int64_t kept_per_layer(const std::function<Array(const Array&, const Array&)>& layer) {
  static const Executor exec(1);
  const Mesh mesh = Mesh::parse("d:1", 1);
  const auto peak = [&](int layers) {
    const auto put = [&](Shape shape, std::uint64_t seed) {
      return device_put(Tensor::uniform(std::move(shape), DType::kF32, seed, -1, 1),
                        NamedSharding(mesh, P()), exec);
    };
    std::vector<Tree<Array>> ws;
    for (int i = 0; i < layers; ++i) ws.push_back(Tree<Array>(put(Shape{256}, 10 + i)));
    const Tree<Array> params = Tree<Array>::dict(
        {{"w", Tree<Array>::list(std::move(ws))}, {"x", Tree<Array>(put(Shape{1024, 256}, 1))}});
    auto step = sjit(mesh, [&](const Tree<Array>& p) {
      auto [value, grads] = value_and_grad([&](const Tree<Array>& q) {
        Array h = q.at("x").leaf();
        for (int i = 0; i < layers; ++i) h = layer(h, q.at("w").at(static_cast<std::size_t>(i)).leaf());
        return sum(h);
      })(p);
      return Tree<Array>::list({Tree<Array>(value), grads});
    });
    return step.lower(params).cost().peak_bytes[0];
  };
  return peak(3) - peak(2);
}

// The backward pass keeps what PyTorch's keeps: no broadcast (expand is a view there; the
// broadcast's smaller operand is kept and the broadcast made again), and silu its input only.
// By hand, per layer: rms_norm keeps x and x * rsqrt(ms) (2 MiB) and the [1024, 1] rsqrt, not
// [1024, 256] copies of rsqrt(ms) and the weight (4 MiB before); silu(x) * w keeps x and silu(x)
// (2 MiB; through x * sigmoid(x): x, sigmoid(x), their product and the broadcast weight, 4 MiB);
// tanh(x) * w keeps tanh(x) (1 MiB; 2 with the broadcast weight). The rest of a layer is under
// 16 KiB (the weight, its gradient, the rsqrt column).
TEST(Autodiff, TheBackwardPassKeepsNoBroadcastAndSiluItsInput) {
  constexpr std::int64_t kMiB = std::int64_t{1} << 20, kSmall = 16 << 10;
  const std::int64_t norm = kept_per_layer([](const Array& h, const Array& w) { return rms_norm(h, w); });
  EXPECT_GE(norm, 2 * kMiB);
  EXPECT_LT(norm, 2 * kMiB + kSmall);
  const std::int64_t swish = kept_per_layer([](const Array& h, const Array& w) { return silu(h) * w; });
  EXPECT_GE(swish, 2 * kMiB);
  EXPECT_LT(swish, 2 * kMiB + kSmall);
  const std::int64_t t = kept_per_layer([](const Array& h, const Array& w) { return tanh(h) * w; });
  EXPECT_GE(t, kMiB);
  EXPECT_LT(t, kMiB + kSmall);
}

// silu's own backward (s (1 + x (1 - s))) gives what differentiating x * sigmoid(x) gives.
TEST(Autodiff, SiluGradientIsThatOfItsDefinition) {
  const Tensor x = f64(Shape{64}, 31, -6, 6);
  const Executor exec(1);
  const Array xa = device_put(x, NamedSharding(Mesh::parse("d:1", 1), P()), exec);
  const auto grad_of = [&](const std::function<Array(const Array&)>& f) {
    return grad([&](const Array& a) { return sum(f(a)); })(xa).to_host();
  };
  const Tensor a = grad_of([](const Array& v) { return silu(v); });
  const Tensor b = grad_of([](const Array& v) { return v * sigmoid(v); });
  for (std::int64_t i = 0; i < 64; ++i) EXPECT_NEAR(a.get(i), b.get(i), 1e-14) << "at " << x.get(i);
}

TEST(Autodiff, InsideSjitGradientsAreShardedLikeTheirParameters) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("data:8", 8);
  const Tensor w = f64(Shape{16, 4}, 20), x = f64(Shape{32, 16}, 21);
  const auto loss = [](const Tree<Array>& p, const Array& xb) {
    return mean(tanh(matmul(xb, p.at("w").leaf())));
  };
  auto step = sjit(mesh, [&](const Tree<Array>& p, const Array& xb) {
    const auto [l, g] = value_and_grad(loss)(p, xb);
    return Tree<Array>::dict({{"loss", l}, {"g", g.at("w").leaf()}});
  });
  const Tree<Array> p = Tree<Array>::dict({{"w", device_put(w, NamedSharding(mesh, P()), exec)}});
  const Array xb = device_put(x, NamedSharding(mesh, P("data")), exec);
  const Tree<Array> out = step(p, xb);
  // Data parallel: the replicated weight's gradient is all-reduced over the batch axis.
  EXPECT_EQ(out.at("g").leaf().sharding().spec(), P());
  EXPECT_THAT(step.lower(p, xb).text(), ::testing::HasSubstr("all_reduce over 'data'"));
  // Same as eagerly on one device.
  const Executor one(1);
  const Mesh m1 = Mesh::parse("data:1", 1);
  const auto ref =
      value_and_grad(loss)(Tree<Array>::dict({{"w", device_put(w, NamedSharding(m1, P()), one)}}),
                           device_put(x, NamedSharding(m1, P()), one));
  EXPECT_NEAR(out.at("loss").leaf().to_host().get(0), ref.first.to_host().get(0), 1e-12);
  const Tensor g8 = out.at("g").leaf().to_host(), g1 = ref.second.at("w").leaf().to_host();
  for (std::int64_t i = 0; i < g1.numel(); ++i) EXPECT_NEAR(g8.get(i), g1.get(i), 1e-12);
  // FSDP: the weight sharded over the same axis as the batch; its gradient is reduce-scattered.
  const Tree<Array> pf =
      Tree<Array>::dict({{"w", device_put(w, NamedSharding(mesh, P("data")), exec)}});
  const Tree<Array> outf = step(pf, xb);
  EXPECT_EQ(outf.at("g").leaf().sharding().spec(), P("data"));
  EXPECT_THAT(step.lower(pf, xb).text(), ::testing::HasSubstr("reduce_scatter over 'data'"));
  const Tensor gf = outf.at("g").leaf().to_host();
  for (std::int64_t i = 0; i < g1.numel(); ++i) EXPECT_NEAR(gf.get(i), g1.get(i), 1e-12);
}

TEST(Autodiff, AccumulatedMicroBatchesGiveTheWholeBatchGradient) {
  const Executor exec(8);
  const Mesh mesh = Mesh::parse("data:8", 8);
  const auto loss = [](const Tree<Array>& p, const Array& x, const Array& y) {
    const Array d = tanh(matmul(x, p.at("w").leaf())) - y;
    return mean(d * d);
  };
  const Tree<Array> p =
      Tree<Array>::dict({{"w", device_put(f64(Shape{6, 3}, 30), NamedSharding(mesh, P()), exec)}});
  const Array x = device_put(f64(Shape{64, 6}, 31), NamedSharding(mesh, P("data")), exec);
  const Array y = device_put(f64(Shape{64, 3}, 32), NamedSharding(mesh, P("data")), exec);
  const auto [v1, g1] = value_and_grad(loss)(p, x, y);
  auto step = sjit(mesh, [&](const Tree<Array>& ps, const Array& xb, const Array& yb) {
    const auto [v, g] = value_and_grad_accumulated(loss, 4)(ps, xb, yb);
    return Tree<Array>::dict({{"v", v}, {"g", g.at("w")}});
  });
  const Tree<Array> out = step(p, x, y);
  EXPECT_NEAR(out.at("v").leaf().to_host().get(0), v1.to_host().get(0), 1e-12);
  const Tensor a = out.at("g").leaf().to_host(), b = g1.at("w").leaf().to_host();
  for (std::int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.get(i), b.get(i), 1e-12);
  EXPECT_THROW_WITH(value_and_grad_accumulated(loss, 5)(p, x, y), SpecError, "64 rows",
                    "5 micro-batches");
}

TEST(Autodiff, MixedPrecisionKeepsF32MasterGradients) {
  const Executor one(1);
  const Mesh m1 = Mesh::parse("x:1", 1);
  const auto put = [&](const Tensor& t) { return device_put(t, NamedSharding(m1, P()), one); };
  const Tensor w = Tensor::normal(Shape{16, 8}, DType::kF32, 40, 0, 0.3);
  const Tensor x = Tensor::normal(Shape{32, 16}, DType::kF32, 41);
  // bf16 compute, f32 master weights: the cast's gradient brings the cotangent back to f32.
  const auto loss_bf16 = [](const Array& wm, const Array& xb) {
    return astype(mean(tanh(matmul(astype(xb, DType::kBF16), astype(wm, DType::kBF16)))),
                  DType::kF32);
  };
  const auto loss_f32 = [](const Array& wm, const Array& xb) { return mean(tanh(matmul(xb, wm))); };
  const Array g16 = grad(loss_bf16)(put(w), put(x));
  const Array g32 = grad(loss_f32)(put(w), put(x));
  EXPECT_EQ(g16.dtype(), DType::kF32);
  const Tensor a = g16.to_host(), b = g32.to_host();
  double scale = 0;
  for (std::int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, std::abs(b.get(i)));
  for (std::int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.get(i), b.get(i), 0.02 * scale) << i;
}

TEST(Autodiff, AuxiliaryOutputsAndErrors) {
  const Executor one(1);
  const Mesh m1 = Mesh::parse("x:1", 1);
  const Array w =
      device_put(Tensor::from<double>(Shape{2}, {1.0, 2.0}), NamedSharding(m1, P()), one);
  const auto [value_aux, g] = value_and_grad_with_aux([](const Array& v) {
    const Array sq = v * v;
    return std::pair<Array, Tree<Array>>{sum(sq), Tree<Array>::dict({{"sq", sq}})};
  })(w);
  EXPECT_EQ(value_aux.first.to_host().get(0), 5.0);
  EXPECT_EQ(value_aux.second.at("sq").leaf().to_host().get(1), 4.0);
  EXPECT_EQ(g.to_host().to_doubles(), (std::vector<double>{2.0, 4.0}));
  EXPECT_THROW_WITH(grad([](const Array& v) { return v * 2.0; })(w), SpecError, "float scalar",
                    "[2]");
  const Array ints =
      device_put(Tensor::from<std::int32_t>(Shape{2}, {1, 2}), NamedSharding(m1, P()), one);
  EXPECT_THROW_WITH(grad([](const Array& v) { return sum(v); })(ints), SpecError, "i32");
}

TEST(Autodiff, ATreeWithoutArraysHasNothingToDifferentiate) {
  EXPECT_THROW_WITH(grad([](const Tree<Array>&) { return Array(); })(Tree<Array>::dict({})),
                    SpecError, "[grad]", "no arrays");
}

}  // namespace
}  // namespace shardplan
