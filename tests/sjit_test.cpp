// sjit: tracing, propagation (with origins), partitioning, the compiled-program cache,
// constraints, annotations, donation, lower() on abstract arguments, and the examples of JAX's
// "Distributed arrays" guide and Flax's DotReluDot, each against the single-device result.
#include "shardplan/sjit.hpp"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "../examples/mlp.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.get(i) - b.get(i)));
  return m;
}

struct Meshes {
  Executor exec{8};
  Mesh mesh = Mesh::parse("data:4,model:2", 8);
  Executor one = Executor::process_local(1);       // each process's own reference device
  int first = exec.local_devices().front();        // a device of this process
  Mesh single = Mesh::parse("data:1,model:1", 1);  // same axis names, one device
  Array put(const Tensor& t, const PartitionSpec& s) const {
    return device_put(t, NamedSharding(mesh, s), exec);
  }
  Array put1(const Tensor& t) const { return device_put(t, NamedSharding(single, P()), one); }
};

Array dot_relu_dot(const Array& x, const Array& w1, const Array& w2) {
  Array h = relu(matmul(x, w1));
  h = with_sharding_constraint(h, P("data", "model"));
  return matmul(h, w2);
}

TEST(Sjit, DotReluDotMatchesOneDeviceAndShowsWhereShardingsCameFrom) {
  Meshes s;
  const Tensor x = Tensor::normal(Shape{16, 8}, DType::kF32, 1);
  const Tensor w1 = Tensor::normal(Shape{8, 32}, DType::kF32, 2);
  const Tensor w2 = Tensor::normal(Shape{32, 8}, DType::kF32, 3);
  SjitOptions o;
  o.out_shardings = RuleTree(P("data", nullptr));
  auto step = sjit(MeshShardingHelper(s.mesh), &dot_relu_dot, o);
  const Array xs = s.put(x, P("data")), w1s = s.put(w1, P(nullptr, "model")),
              w2s = s.put(w2, P("model"));
  const Array y = step(xs, w1s, w2s);
  EXPECT_EQ(y.sharding().spec(), P("data"));
  const Array y1 = dot_relu_dot(s.put1(x), s.put1(w1), s.put1(w2));
  EXPECT_LT(max_diff(y.to_host(), y1.to_host()), 1e-4);
  const Lowered low = step.lower(xs, w1s, w2s);
  const std::string text = low.text();
  // The hidden activation is sharded by the constraint, the first dot takes it by propagation,
  // and the second dot's partial sums over 'model' are reduced for the ('data', None) output.
  EXPECT_THAT(text, ::testing::HasSubstr("with_sharding_constraint"));
  EXPECT_THAT(text, ::testing::HasSubstr("pending sum over model"));
  EXPECT_THAT(text, ::testing::HasSubstr("all_reduce over 'model'"));
  EXPECT_THAT(text, ::testing::HasSubstr("output 0 (out_shardings)"));
  EXPECT_EQ(low.cost().bytes_by_kind.count(CollectiveKind::kAllReduce), 1u);
  // Bitwise the same from run to run.
  EXPECT_TRUE(step(xs, w1s, w2s).to_host() == y.to_host());
  // A consumer that keeps the output split over 'model' gets a reduce-scatter instead.
  SjitOptions split = o;
  split.out_shardings = RuleTree(P("data", "model"));
  auto step2 = sjit(MeshShardingHelper(s.mesh), &dot_relu_dot, split);
  const Lowered low2 = step2.lower(xs, w1s, w2s);
  EXPECT_THAT(low2.text(), ::testing::HasSubstr("reduce_scatter over 'model'"));
  EXPECT_EQ(low2.cost().bytes_by_kind.count(CollectiveKind::kAllReduce), 0u);
  EXPECT_LT(max_diff(step2(xs, w1s, w2s).to_host(), y1.to_host()), 1e-4);
}

// What a time model reads off the cost: a product's FLOPs are matmul FLOPs; any other kernel is
// the bytes it reads and writes (relu on f32[4, 6] per device: 96 bytes read, 96 written); a
// constraint, an input and an output move nothing.
TEST(Sjit, TheCostSplitsMatmulFlopsFromTheBytesOtherKernelsReadAndWrite) {
  Executor exec{4};
  const Mesh mesh = Mesh::parse("data:4", 4);
  const auto f = [](const Array& x, const Array& w) {
    return relu(with_sharding_constraint(matmul(x, w), P("data")));
  };
  SjitOptions o;
  o.out_shardings = RuleTree(P("data"));
  const Array x = device_put(Tensor::normal(Shape{16, 8}, DType::kF32, 1), NamedSharding(mesh, P("data")), exec);
  const Array w = device_put(Tensor::normal(Shape{8, 6}, DType::kF32, 2), NamedSharding(mesh, P()), exec);
  const Lowered low = sjit(mesh, f, o).lower(x, w);
  const ProgramCost& c = low.cost();
  ASSERT_EQ(c.matmul_flops.size(), 4u);
  ASSERT_EQ(c.attention_flops.size(), 4u);
  for (std::size_t d = 0; d < 4; ++d) {
    EXPECT_DOUBLE_EQ(c.matmul_flops[d], 2.0 * 4 * 8 * 6) << low.text();
    EXPECT_EQ(c.attention_flops[d], 0);
    EXPECT_DOUBLE_EQ(c.flops[d], 2.0 * 4 * 8 * 6 + 4 * 6);  // and one per element of relu
  }
  EXPECT_EQ(c.memory_traffic, 2 * 4 * 6 * 4) << low.text();
  EXPECT_TRUE(c.bytes_by_axes.empty());
}

// Mixed precision's reduce dtype: a bf16 weight gradient, a sum pending over 'data', converted
// with convert_pending to f32 is reduced in f32 (FSDP2's reduce_dtype), although reducing the
// bf16 sum first would move half the bytes (which plain astype does). f32[8, 6] is 192 bytes; a
// device of 4 receives 3/4 of it in the reduce-scatter: 144 (bf16: 72).
TEST(Sjit, ConvertPendingReducesTheSumInTheWiderDtype) {
  Executor exec{4};
  const Mesh mesh = Mesh::parse("data:4", 4);
  const auto put = [&](const Tensor& t, const PartitionSpec& s) {
    return device_put(t, NamedSharding(mesh, s), exec);
  };
  const Array x = put(Tensor::normal(Shape{16, 8}, DType::kBF16, 1), P("data"));
  const Array dy = put(Tensor::normal(Shape{16, 6}, DType::kBF16, 2), P("data"));
  const Array w = put(Tensor::normal(Shape{8, 6}, DType::kF32, 3), P("data"));
  for (const bool pending : {true, false}) {
    SCOPED_TRACE(pending ? "convert_pending" : "astype");
    const auto update = [&](const Array& xb, const Array& dyb, const Array& wb) {
      const Array g = matmul(transpose(xb, {1, 0}), dyb);  // bf16, pending over 'data'
      return wb - (pending ? convert_pending(g, DType::kF32) : astype(g, DType::kF32)) * 0.1;
    };
    auto step = sjit(mesh, update);
    const Lowered low = step.lower(x, dy, w);
    const auto& bytes = low.cost().bytes_by_kind;
    ASSERT_EQ(bytes.count(CollectiveKind::kReduceScatter), 1u) << low.text();
    EXPECT_EQ(bytes.at(CollectiveKind::kReduceScatter), pending ? 144 : 72) << low.text();
    // The same values as the plain conversion run on one device, to bf16 rounding of the sum.
    const Tensor got = step(x, dy, w).to_host();
    Executor one = Executor::process_local(1);
    const Mesh single = Mesh::parse("data:1", 1);
    const auto put1 = [&](const Array& a) {
      return device_put(a.to_host(), NamedSharding(single, P()), one);
    };
    const Tensor want = update(put1(x), put1(dy), put1(w)).to_host();
    EXPECT_LT(max_diff(got, want), 0.05);
  }
  EXPECT_THROW_WITH(convert_pending(x, DType::kI32), SpecError, "[convert_pending]",
                    "converts between float types, not bf16 to i32");
}

// A reshape merging dimensions shares only the smaller major factor between operand and result
// ([2, 2, 3] -> [4, 3] shares a factor of 2). A result split 4 ways on the merged dimension is
// not a split of that factor: the partitioner must not claim it (it once ran the copy on each
// device's whole operand and every device got the first row: 0 1 2 0 1 2 ...). Each value is
// checked against the row-major order worked out here, over every sharding of both sides.
TEST(Sjit, AReshapeSplitFurtherThanItsSharedFactorGivesTheRightBlocks) {
  Executor exec{4};
  const Mesh mesh = Mesh::parse("a:2,b:2", 4);
  Tensor x(Shape{2, 2, 3}, DType::kF32);
  for (std::int64_t i = 0; i < 12; ++i) x.set(i, static_cast<double>(i));
  const std::vector<PartitionSpec> ins{P(), P("a"), P("a", "b"), P(nullptr, "a"), P(AxisNames{"a", "b"})};
  const std::vector<PartitionSpec> outs{P(AxisNames{"a", "b"}), P("a"), P("b"), P(nullptr, "a"), P()};
  for (const auto& in : ins) {
    if (in == P(AxisNames{"a", "b"})) continue;  // dimension 0 of size 2 splits 2 ways at most
    for (const auto& out : outs) {
      if (out == P(nullptr, "a")) continue;  // 3 columns do not split 2 ways
      SCOPED_TRACE(in.to_string() + " -> " + out.to_string());
      const Array xs = device_put(x, NamedSharding(mesh, in), exec);
      auto f = sjit(MeshShardingHelper(mesh), [&](const Array& a) {
        return with_sharding_constraint(reshape(a, Shape{4, 3}), out);
      });
      const Array y = f(xs);
      EXPECT_TRUE(y.sharding().is_equivalent_to(NamedSharding(mesh, out), 2));
      const Tensor h = y.to_host();
      ASSERT_EQ(h.shape(), (Shape{4, 3}));
      for (std::int64_t i = 0; i < 12; ++i) EXPECT_EQ(h.get(i), static_cast<double>(i)) << i;
    }
  }
}

// XLA's sharded weight update, made by the partitioner: `w - 0.1 * g` with w replicated and g a
// sum pending over 'data' (the weight gradient of a data-parallel step) reduce-scatters g
// instead of all-reducing it, updates a quarter of w on each device, and all-gathers the result
// for the replicated output. The bytes are the all-reduce's (worked out here by hand) and the
// values those of one device.
TEST(Sjit, AnElementwiseUpdateBySummedGradientsRunsSplit) {
  Meshes s;
  const Tensor x = Tensor::normal(Shape{16, 8}, DType::kF32, 11);
  const Tensor dy = Tensor::normal(Shape{16, 6}, DType::kF32, 12);
  const Tensor w = Tensor::normal(Shape{8, 6}, DType::kF32, 13);
  const auto update = [](const Array& xb, const Array& dyb, const Array& wb) {
    const Array g = matmul(transpose(xb, {1, 0}), dyb);  // pending sum over 'data'
    return wb - g * 0.1;
  };
  auto step = sjit(s.mesh, update);
  const Array xs = s.put(x, P("data")), dys = s.put(dy, P("data")), ws = s.put(w, P());
  const Lowered low = step.lower(xs, dys, ws);
  const auto& bytes = low.cost().bytes_by_kind;
  EXPECT_EQ(bytes.count(CollectiveKind::kAllReduce), 0u) << low.text();
  // f32[8, 6] is 192 bytes; each of 4 devices of a 'data' group receives 3 quarters of it in the
  // reduce-scatter and again in the all-gather: 144 + 144, the all-reduce's 2 * 3/4 * 192.
  ASSERT_EQ(bytes.count(CollectiveKind::kReduceScatter), 1u) << low.text();
  ASSERT_EQ(bytes.count(CollectiveKind::kAllGather), 1u) << low.text();
  EXPECT_EQ(bytes.at(CollectiveKind::kReduceScatter), 144);
  EXPECT_EQ(bytes.at(CollectiveKind::kAllGather), 144);
  // Per device: the dot's 2 * 4 * 8 * 6 FLOPs, then the multiply and subtract on 2 of w's 8 rows.
  const auto& flops = low.cost().flops;
  EXPECT_DOUBLE_EQ(flops.at(static_cast<std::size_t>(s.first)), 2.0 * 4 * 8 * 6 + 2.0 * 2 * 6);
  // The same bytes by the axes each collective runs in, and whether an argument (w) is moved; the
  // dot's FLOPs are the matmul FLOPs.
  const std::map<CollectiveOn, std::int64_t> by_axes{
      {CollectiveOn{CollectiveKind::kReduceScatter, {"data"}}, 144},
      {CollectiveOn{CollectiveKind::kAllGather, {"data"}}, 144},
      {CollectiveOn{CollectiveKind::kSlice, {}, /*of_argument=*/true}, 0}};  // w's local slice
  EXPECT_EQ(low.cost().bytes_by_axes, by_axes) << low.text();
  EXPECT_DOUBLE_EQ(low.cost().matmul_flops.at(static_cast<std::size_t>(s.first)), 2.0 * 4 * 8 * 6);
  const Array out = step(xs, dys, ws);
  EXPECT_EQ(out.sharding().spec(), P());
  const Array ref = update(s.put1(x), s.put1(dy), s.put1(w));
  EXPECT_LT(max_diff(out.to_host(), ref.to_host()), 1e-5);
  EXPECT_TRUE(step(xs, dys, ws).to_host() == out.to_host());  // bitwise run to run

  // No dimension of f32[3, 5] divides by 4: the sum is all-reduced and the update runs whole.
  const Tensor x2 = Tensor::normal(Shape{16, 3}, DType::kF32, 14);
  const Tensor dy2 = Tensor::normal(Shape{16, 5}, DType::kF32, 15);
  const Tensor w2 = Tensor::normal(Shape{3, 5}, DType::kF32, 16);
  const Array x2s = s.put(x2, P("data")), dy2s = s.put(dy2, P("data")), w2s = s.put(w2, P());
  const Lowered whole = step.lower(x2s, dy2s, w2s);
  EXPECT_EQ(whole.cost().bytes_by_kind.count(CollectiveKind::kAllReduce), 1u) << whole.text();
  EXPECT_EQ(whole.cost().bytes_by_kind.count(CollectiveKind::kReduceScatter), 0u) << whole.text();
  EXPECT_LT(max_diff(step(x2s, dy2s, w2s).to_host(),
                     update(s.put1(x2), s.put1(dy2), s.put1(w2)).to_host()),
            1e-5);

  // The sum also returned as it is: it is all-reduced for that output anyway, and the update
  // reads the reduced copy (splitting it too would move the gradient twice).
  auto both = sjit(s.mesh, [&](const Array& xb, const Array& dyb, const Array& wb) {
    const Array g = matmul(transpose(xb, {1, 0}), dyb);
    return Tree<Array>::dict({{"w", wb - g * 0.1}, {"g", g}});
  });
  const Lowered twice = both.lower(xs, dys, ws);
  EXPECT_EQ(twice.cost().bytes_by_kind.count(CollectiveKind::kReduceScatter), 0u) << twice.text();
  ASSERT_EQ(twice.cost().bytes_by_kind.count(CollectiveKind::kAllReduce), 1u) << twice.text();
  EXPECT_EQ(twice.cost().bytes_by_kind.at(CollectiveKind::kAllReduce), 288);
  EXPECT_EQ(twice.cost().bytes_by_kind.count(CollectiveKind::kAllGather), 0u) << twice.text();
  EXPECT_LT(max_diff(both(xs, dys, ws).at("w").leaf().to_host(), ref.to_host()), 1e-5);

  // Two sums pending over 'data' added (gradients of two micro-batches, or of a value used
  // twice) stay pending: one all-reduce of 2 * 3/4 * 192 bytes for the output, not one each.
  auto two = sjit(s.mesh, [](const Array& xb, const Array& dyb, const Array& dzb) {
    const Array xt = transpose(xb, {1, 0});
    return matmul(xt, dyb) + matmul(xt, dzb) - matmul(xt, dyb);
  });
  const Tensor dz = Tensor::normal(Shape{16, 6}, DType::kF32, 18);
  const Array dzs = s.put(dz, P("data"));
  const Lowered summed = two.lower(xs, dys, dzs);
  ASSERT_EQ(summed.cost().bytes_by_kind.count(CollectiveKind::kAllReduce), 1u) << summed.text();
  EXPECT_EQ(summed.cost().bytes_by_kind.at(CollectiveKind::kAllReduce), 288) << summed.text();
  {
    const Array x1 = s.put1(x), xt1 = transpose(x1, {1, 0});
    const Array want = matmul(xt1, s.put1(dy)) + matmul(xt1, s.put1(dz)) - matmul(xt1, s.put1(dy));
    EXPECT_LT(max_diff(two(xs, dys, dzs).to_host(), want.to_host()), 1e-5);
  }

  // A pending max (a max over the split batch) is reduce-scattered with max, not summed.
  auto peak = sjit(s.mesh, [](const Array& xb, const Array& wb) { return wb + max(xb, {0}); });
  const Tensor w8 = Tensor::normal(Shape{8}, DType::kF32, 17);
  const Array y = peak(xs, s.put(w8, P()));
  EXPECT_EQ(y.sharding().spec(), P());
  EXPECT_LT(max_diff(y.to_host(), (s.put1(w8) + max(s.put1(x), {0})).to_host()), 1e-6);
}

// More devices than threads: the devices of one thread that hold the same weight block run their
// dots as one GEMM call packing the weight once (the dot's group kernel). Each device's block of
// the result must still be bitwise its own product, computed here on one device from its blocks.
// Twice as many devices as threads, and the weight split over 'model' so that a thread's devices
// hold two different blocks (two groups per thread).
TEST(Sjit, DevicesSharingAThreadAndAWeightGetTheirOwnProductsBitwise) {
  const int threads = Executor::process_local(1).concurrency();
  const int n = 4 * std::max(1, threads);
  const Executor exec(n);
  const Mesh mesh = Mesh::parse("data:" + std::to_string(n / 2) + ",model:2", n);
  const Executor one = Executor::process_local(1);
  const Mesh single = Mesh::parse("data:1,model:1", 1);
  const Tensor x = Tensor::normal(Shape{64 * (n / 2), 96}, DType::kF32, 21);
  const Tensor w = Tensor::normal(Shape{96, 160}, DType::kF32, 22);
  const Array xs = device_put(x, NamedSharding(mesh, P("data")), exec);
  const Array ws = device_put(w, NamedSharding(mesh, P(nullptr, "model")), exec);
  for (const bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "x @ w^T" : "x @ w");
    // x @ w^T with w stored [160, 96] split over rows: the weight read transposed.
    std::vector<float> w_t(static_cast<std::size_t>(w.numel()));
    for (std::int64_t i = 0; i < 96; ++i) {
      for (std::int64_t j = 0; j < 160; ++j) {
        w_t[static_cast<std::size_t>(j * 96 + i)] = static_cast<float>(w.get(i * 160 + j));
      }
    }
    const Array wt =
        device_put(Tensor::from<float>(Shape{160, 96}, w_t), NamedSharding(mesh, P("model")), exec);
    auto f = sjit(mesh, [transposed](const Array& a, const Array& b) {
      return transposed ? matmul(a, transpose(b, {1, 0})) : matmul(a, b);
    });
    const Array y = transposed ? f(xs, wt) : f(xs, ws);
    ASSERT_EQ(y.sharding().spec(), P("data", "model"));
    for (const int d : exec.local_devices()) {
      const Array xb = device_put(xs.shard_tensor(d), NamedSharding(single, P()), one);
      const Array wb =
          device_put((transposed ? wt : ws).shard_tensor(d), NamedSharding(single, P()), one);
      const Tensor want =
          (transposed ? matmul(xb, transpose(wb, {1, 0})) : matmul(xb, wb)).to_host();
      const Tensor got = y.shard_tensor(d);
      ASSERT_EQ(got.shape(), want.shape());
      EXPECT_EQ(std::memcmp(got.bytes(), want.bytes(), static_cast<std::size_t>(got.nbytes())), 0)
          << "device " << d;
    }
  }
}

// Values no output depends on are not computed (dead-code elimination before partitioning): a
// product nobody returns costs no FLOPs and moves no bytes, and value_and_grad's step does not
// compute the gradient of its data (only the parameters' are asked for). The results are those
// of one device.
TEST(Sjit, ValuesNoOutputNeedsAreNotComputed) {
  Meshes s;
  const Tensor x = Tensor::normal(Shape{16, 8}, DType::kF32, 31);
  const Tensor w = Tensor::normal(Shape{8, 4}, DType::kF32, 32);
  const Array xs = s.put(x, P("data")), ws = s.put(w, P(nullptr, "model"));
  auto f = sjit(s.mesh, [](const Array& a, const Array& b) {
    const Array unused = sum(matmul(a, b));  // an all-reduce over both axes if it were computed
    (void)unused;
    return a * 2.0;
  });
  const Lowered low = f.lower(xs, ws);
  EXPECT_THAT(low.text(), ::testing::Not(::testing::HasSubstr("dot_general")));
  EXPECT_TRUE(low.cost().bytes_by_kind.empty()) << low.text();
  // 16 x 8 elements over 8 devices (x is split 4 ways and replicated over 'model'): 32 each.
  EXPECT_DOUBLE_EQ(low.cost().flops.at(static_cast<std::size_t>(s.first)), 32.0);
  EXPECT_EQ(max_diff(f(xs, ws).to_host(), (s.put1(x) * 2.0).to_host()), 0.0);

  // One weight: the forward product and the weight's gradient, 2 * 16 * 8 * 4 FLOPs each over
  // the 4-way split batch, plus elementwise work; never the 3rd product (the gradient of x).
  auto grad = sjit(s.mesh, [](const Array& a, const Array& b) {
    return value_and_grad([](const Array& v, const Array& q) { return sum(tanh(matmul(q, v))); })(b,
                                                                                                  a)
        .second;
  });
  const Lowered g = grad.lower(xs, s.put(w, P()));
  const double product = 2.0 * 16 / 4 * 8 * 4;
  const double fl = g.cost().flops.at(static_cast<std::size_t>(s.first));
  EXPECT_GE(fl, 2 * product);
  EXPECT_LT(fl, 2.5 * product) << g.text();
}

TEST(Sjit, TheGuidesDotNeedsNoCommunication) {
  Meshes s;
  auto dot = sjit(s.mesh, [](const Array& a, const Array& b) { return matmul(a, b); });
  const Tensor a = Tensor::normal(Shape{16, 8}, DType::kF32, 4);
  const Tensor b = Tensor::normal(Shape{8, 16}, DType::kF32, 5);
  const Array as = s.put(a, P("data", nullptr)), bs = s.put(b, P(nullptr, "model"));
  const Array c = dot(as, bs);
  EXPECT_EQ(c.sharding().spec(), P("data", "model"));
  EXPECT_TRUE(dot.lower(as, bs).cost().bytes_by_kind.empty());
  EXPECT_LT(max_diff(c.to_host(), matmul(s.put1(a), s.put1(b)).to_host()), 1e-5);
  // sin of an array sharded 4 x 2 keeps its sharding.
  auto f = sjit(s.mesh, [](const Array& v) { return sin(v); });
  EXPECT_EQ(f(s.put(a, P("data", "model"))).sharding().spec(), P("data", "model"));
}

TEST(Sjit, ProgramsAreCachedPerSignature) {
  Meshes s;
  int traces = 0;
  auto f = sjit(s.mesh, [&](const Array& x, int power) {
    ++traces;
    Array y = x;
    for (int i = 1; i < power; ++i) y = y * x;
    return y;
  });
  const Array a = s.put(Tensor::ones(Shape{8, 8}, DType::kF32), P("data"));
  f(a, 2);
  f(a, 2);
  EXPECT_EQ(traces, 1);
  EXPECT_EQ(f.cache_size(), 1u);
  f(a, 3);  // another static value
  EXPECT_EQ(traces, 2);
  f(s.put(Tensor::ones(Shape{8, 16}, DType::kF32), P("data")), 2);  // another shape
  EXPECT_EQ(traces, 3);
  f(s.put(Tensor::ones(Shape{8, 8}, DType::kF32), P(nullptr, "model")), 2);  // another sharding
  EXPECT_EQ(traces, 4);
  f(s.put(Tensor::ones(Shape{8, 8}, DType::kBF16), P("data")), 2);  // another dtype
  EXPECT_EQ(traces, 5);
  f(a, 2);
  EXPECT_EQ(traces, 5);
  EXPECT_EQ(f.cache_size(), 5u);
}

// Statics are keyed by value: these pairs print alike (or hash alike) but are different values.
TEST(Sjit, StaticFloatsAreKeyedByExactValue) {
  Meshes s;
  int traces = 0;
  auto f = sjit(s.mesh, [&](const Array& x, double c) {
    ++traces;
    return x * c;
  });
  const Array x = s.put(Tensor::ones(Shape{8}, DType::kF64), P("data"));
  // Both print as "123457" with the stream's default precision.
  EXPECT_EQ(f(x, 123456.7).to_host().get(3), 123456.7);
  EXPECT_EQ(f(x, 123457.2).to_host().get(3), 123457.2);
  EXPECT_EQ(traces, 2);
  const double one_up = std::nextafter(1.0, 2.0);  // differs in the last bit
  EXPECT_EQ(f(x, 1.0).to_host().get(0), 1.0);
  EXPECT_EQ(f(x, one_up).to_host().get(0), one_up);
  EXPECT_EQ(traces, 4);
  // 0.0 == -0.0, but they are different statics (the sign of the result differs).
  EXPECT_FALSE(std::signbit(f(x, 0.0).to_host().get(0)));
  EXPECT_TRUE(std::signbit(f(x, -0.0).to_host().get(0)));
  EXPECT_EQ(traces, 6);
  // The same NaN bits are the same static: cached.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(f(x, nan).to_host().get(0)));
  EXPECT_TRUE(std::isnan(f(x, nan).to_host().get(0)));
  EXPECT_EQ(traces, 7);
  f(x, 123456.7);
  EXPECT_EQ(traces, 7);
  EXPECT_EQ(f.cache_size(), 7u);
}

TEST(Sjit, StaticFloatsInsideContainersAreComparedBitwise) {
  Meshes s;
  int traces = 0;
  auto f = sjit(s.mesh, [&](const Array& x, const std::vector<double>& c) {
    ++traces;
    return x * c.at(0);
  });
  const Array x = s.put(Tensor::ones(Shape{8}, DType::kF64), P("data"));
  EXPECT_FALSE(std::signbit(f(x, std::vector<double>{0.0}).to_host().get(0)));
  EXPECT_TRUE(std::signbit(f(x, std::vector<double>{-0.0}).to_host().get(0)));
  f(x, std::vector<double>{0.0});
  EXPECT_EQ(traces, 2);
}

TEST(Sjit, StaticStringsAreKeyedByContent) {
  Meshes s;
  auto f = sjit(
      s.mesh, [](const Array& x, const std::string& op) { return op == "sin" ? sin(x) : cos(x); });
  const Array x = s.put(Tensor::generate(Shape{8}, DType::kF64, Generator::full(0.5)), P("data"));
  EXPECT_DOUBLE_EQ(f(x, std::string("sin")).to_host().get(0), std::sin(0.5));
  EXPECT_DOUBLE_EQ(f(x, std::string("cos")).to_host().get(0), std::cos(0.5));
  // Another string object with the same text: the same program.
  std::string again = "si";
  again += "n";
  EXPECT_DOUBLE_EQ(f(x, again).to_host().get(0), std::sin(0.5));
  EXPECT_EQ(f.cache_size(), 2u);
  // A C string is keyed by its text, not its address.
  auto g = sjit(s.mesh, [](const Array& v, const char* op) {
    return std::string(op) == "sin" ? sin(v) : cos(v);
  });
  char buf[8] = "sin";
  EXPECT_DOUBLE_EQ(g(x, static_cast<const char*>(buf)).to_host().get(0), std::sin(0.5));
  std::strcpy(buf, "cos");  // same address, other text
  EXPECT_DOUBLE_EQ(g(x, static_cast<const char*>(buf)).to_host().get(0), std::cos(0.5));
  EXPECT_EQ(g.cache_size(), 2u);
}

// The cache key is structured (issue 13; it was text): trees that differ only in their keys or
// kinds, or an equivalent spec written differently, are other entries; the same call is the
// same entry.
TEST(Sjit, TheCacheKeyTellsCallsApartByStructureAndSpec) {
  Meshes s;
  int traces = 0;
  auto f = sjit(s.mesh, [&](const Tree<Array>& t) {
    ++traces;
    const std::vector<Array> l = t.leaves();
    return l[0] + l[1] * 2.0;
  });
  const Array x = s.put(Tensor::ones(Shape{8, 4}, DType::kF32), P("data"));
  const Array y = s.put(Tensor::ones(Shape{8, 4}, DType::kF32), P("data"));
  f(Tree<Array>::dict({{"a", x}, {"b", y}}));
  f(Tree<Array>::dict({{"a", y}, {"b", x}}));  // other arrays, same key: the same entry
  EXPECT_EQ(f.cache_size(), 1u);
  f(Tree<Array>::dict({{"a", x}, {"c", y}}));  // another key
  f(Tree<Array>::list({x, y}));                // a list, not a dict
  EXPECT_EQ(f.cache_size(), 3u);
  const Array written_longer = s.put(Tensor::ones(Shape{8, 4}, DType::kF32), P("data", nullptr));
  f(Tree<Array>::list({written_longer, y}));  // equivalent, written differently: its own entry
  EXPECT_EQ(f.cache_size(), 4u);
  EXPECT_EQ(traces, 4);
  f(Tree<Array>::list({x, y}));
  EXPECT_EQ(traces, 4);
}

struct Ratio {
  int num = 1;
  int den = 1;
  friend bool operator==(const Ratio&, const Ratio&) = default;
};
// Every value hashes alike: only the equality can tell them apart.
struct Colliding {
  int value = 0;
  friend bool operator==(const Colliding&, const Colliding&) = default;
};

}  // namespace
}  // namespace shardplan

template <>
struct std::hash<shardplan::Ratio> {
  std::size_t operator()(const shardplan::Ratio& r) const {
    return std::hash<int>()(r.num) * 31 + std::hash<int>()(r.den);
  }
};
template <>
struct std::hash<shardplan::Colliding> {
  std::size_t operator()(const shardplan::Colliding&) const { return 42; }
};

namespace shardplan {
namespace {

TEST(Sjit, UserStaticsUseTheirEqualityAndHashCollisionsDoNotFoolTheCache) {
  Meshes s;
  auto f = sjit(s.mesh, [](const Array& x, const Ratio& r) { return x * (double(r.num) / r.den); });
  const Array x = s.put(Tensor::ones(Shape{8}, DType::kF64), P("data"));
  EXPECT_EQ(f(x, Ratio{1, 2}).to_host().get(0), 0.5);
  EXPECT_EQ(f(x, Ratio{3, 4}).to_host().get(0), 0.75);
  EXPECT_EQ(f(x, Ratio{1, 2}).to_host().get(0), 0.5);
  EXPECT_EQ(f.cache_size(), 2u);
  auto g = sjit(s.mesh, [](const Array& v, const Colliding& c) { return v + double(c.value); });
  for (int round = 0; round < 2; ++round) {
    for (int v = 0; v < 5; ++v) EXPECT_EQ(g(x, Colliding{v}).to_host().get(0), 1.0 + v);
  }
  EXPECT_EQ(g.cache_size(), 5u);
  // The same value at another position, or the same bits under another type, is another key.
  auto h = sjit(s.mesh, [](const Array& v, auto a, auto b) { return v * double(a) + double(b); });
  EXPECT_EQ(h(x, 2, 3).to_host().get(0), 5.0);
  EXPECT_EQ(h(x, 3, 2).to_host().get(0), 5.0);
  EXPECT_EQ(h(x, 2u, 3).to_host().get(0), 5.0);
  EXPECT_EQ(h.cache_size(), 3u);
}

TEST(Sjit, InShardingsReshardArgumentsAndTreesWork) {
  Meshes s;
  auto f = sjit(
      s.mesh,
      [](const Tree<Array>& params, const Array& x) {
        return Tree<Array>::dict(
            {{"y", matmul(x, params.at("w").leaf()) + params.at("b").leaf()}, {"x", x}});
      },
      SjitOptions{.in_shardings = RuleTree::list(
                      {RuleTree::dict({{"w", RuleTree(P(nullptr, "model"))}, {"b", RuleTree(P())}}),
                       RuleTree(P("data"))})});
  const Tensor w = Tensor::normal(Shape{8, 4}, DType::kF32, 1);
  const Tensor b = Tensor::normal(Shape{4}, DType::kF32, 2);
  const Tensor x = Tensor::normal(Shape{8, 8}, DType::kF32, 3);
  const Tree<Array> params = Tree<Array>::dict({{"w", s.put(w, P())}, {"b", s.put(b, P())}});
  const Tree<Array> out = f(params, s.put(x, P()));
  EXPECT_EQ(out.at("x").leaf().sharding().spec(), P("data"));
  EXPECT_EQ(out.at("y").leaf().sharding().spec(), P("data", "model"));
  const Array ref = matmul(s.put1(x), s.put1(w)) + s.put1(b);
  EXPECT_LT(max_diff(out.at("y").leaf().to_host(), ref.to_host()), 1e-5);
}

Array annotated(const Array& x, const Array& w) {
  const Array h = with_sharding_annotation(relu(matmul(x, w)), "hidden");
  return sum(h, {1});
}

TEST(Sjit, OneFunctionTwoAnnotationMapsTwoPrograms) {
  Meshes s;
  const Tensor x = Tensor::normal(Shape{8, 8}, DType::kF32, 6);
  const Tensor w = Tensor::normal(Shape{8, 16}, DType::kF32, 7);
  const Array xs = s.put(x, P()), ws = s.put(w, P());
  SjitOptions by_rows, by_cols;
  by_rows.annotation_shardings = {{"hidden", RuleTree(P("data", nullptr))}};
  by_cols.annotation_shardings = {{"hidden", RuleTree(P(nullptr, "model"))}};
  auto f_rows = sjit(s.mesh, &annotated, by_rows);
  auto f_cols = sjit(s.mesh, &annotated, by_cols);
  const std::string rows = f_rows.lower(xs, ws).text();
  const std::string cols = f_cols.lower(xs, ws).text();
  EXPECT_NE(rows, cols);
  EXPECT_THAT(rows, ::testing::HasSubstr("annotation 'hidden'"));
  EXPECT_THAT(cols, ::testing::HasSubstr("reduce_sum on blocks [8] (pending sum over model)"));
  const Tensor ref = annotated(s.put1(x), s.put1(w)).to_host();
  EXPECT_LT(max_diff(f_rows(xs, ws).to_host(), ref), 1e-5);
  EXPECT_LT(max_diff(f_cols(xs, ws).to_host(), ref), 1e-5);
  // A name the sjit was not given is an error listing the known ones, unless allowed.
  SjitOptions other;
  other.annotation_shardings = {{"embed", RuleTree(P())}};
  EXPECT_THROW_WITH(sjit(s.mesh, &annotated, other)(xs, ws), SpecError, "'hidden'", "'embed'");
  other.allow_unknown_annotations = true;
  EXPECT_LT(max_diff(sjit(s.mesh, &annotated, other)(xs, ws).to_host(), ref), 1e-5);
}

TEST(Sjit, ArgsShardingConstraintAppliesOnEntry) {
  Meshes s;
  SjitOptions o;
  o.args_sharding_constraint = RuleTree::list({RuleTree(P("data", "model"))});
  auto f = sjit(
      s.mesh, [](const Array& x) { return exp(x); }, o);
  const Array x = s.put(Tensor::normal(Shape{8, 8}, DType::kF32, 1), P());
  EXPECT_EQ(f(x).sharding().spec(), P("data", "model"));
  EXPECT_THAT(f.lower(x).text(), ::testing::HasSubstr("with_sharding_constraint"));
}

TEST(Sjit, DonatedArgumentsCannotBeUsedAfterwards) {
  Meshes s;
  SjitOptions o;
  o.donate_argnums = {0};
  auto f = sjit(
      s.mesh, [](const Array& x) { return x + x; }, o);
  Array x = s.put(Tensor::ones(Shape{64, 64}, DType::kF32), P("data"));
  const Array y = f(x);
  EXPECT_EQ(y.to_host().get(0), 2.0);
  EXPECT_THROW_WITH(x.to_host(), ArrayError, "donated");
  // Only the output lives on: the donated buffers went back to the executor.
  EXPECT_EQ(s.exec.memory(s.first).in_use, y.shard_nbytes());
}

// Constants (values made from no input) up to 1 MiB per device are kept for the next run; a
// larger one, as a causal mask's index arrays over [B, H, T, T], is made again each run and
// freed: kept, a model's per-layer masks would stay resident between steps. The second and third
// runs (the small constant from the cache, the large one made again) give the first run's values.
// Constants each under the per-constant bound, together over the total one
// (kDefaultKeptConstantBytes, 4 MiB per device): only the first ones that fit are kept; the others
// are made again each run. Eight iotas of ~0.9 MiB each per device (replicated) would otherwise
// keep 7.3 MiB resident.
TEST(Sjit, ManySmallConstantsAreKeptOnlyUpToATotal) {
  Meshes s;
  auto f = sjit(s.mesh, [](const Array& x) {
    Array total = sum(x);
    for (std::int64_t k = 0; k < 8; ++k) {
      const Array ids = iota_like(full(Shape{230000 + k}, DType::kF32, 0, x), 0, DType::kF32);
      total = total + sum(ids);
    }
    return total;
  });
  const Array x = s.put(Tensor::uniform(Shape{8, 4}, DType::kF32, 3, -1, 1), P("data"));
  double first = 0;
  for (int run = 0; run < 3; ++run) {
    const Array y = f(x);
    const double v = y.to_host().get(0);
    if (run == 0) {
      // sum of 0..n-1 for n = 230000..230007, plus sum(x): checked against the formula.
      double want = 0;
      for (double e : x.to_host().to_doubles()) want += e;
      for (std::int64_t k = 0; k < 8; ++k) {
        const double n = 230000.0 + static_cast<double>(k);
        want += n * (n - 1) / 2;
      }
      EXPECT_NEAR(v, want, want * 1e-6);
      first = v;
    } else {
      EXPECT_EQ(v, first) << "run " << run;
    }
    const std::int64_t kept = s.exec.memory(s.first).in_use - x.shard_nbytes() - y.shard_nbytes();
    EXPECT_LE(kept, std::int64_t{4} << 20) << "run " << run;
    EXPECT_GT(kept, std::int64_t{3} << 20) << "run " << run;  // but up to the total, they are kept
  }
}

// kept_constant_bytes = 0: the same constants are made again every run and nothing stays
// resident between runs; the values are the kept program's.
TEST(Sjit, WithKeepConstantsOffNoConstantIsKept) {
  Meshes s;
  const auto body = [](const Array& x) {
    Array total = sum(x);
    for (std::int64_t k = 0; k < 4; ++k) {
      total = total + sum(iota_like(full(Shape{1000 + k}, DType::kF32, 0, x), 0, DType::kF32));
    }
    return total;
  };
  SjitOptions off;
  off.kept_constant_bytes = 0;
  auto kept = sjit(s.mesh, body);
  auto made = sjit(s.mesh, body, off);
  const Array x = s.put(Tensor::uniform(Shape{8, 4}, DType::kF32, 5, -1, 1), P("data"));
  const double want = kept(x).to_host().get(0);
  const std::int64_t held = s.exec.memory(s.first).in_use;  // x and the kept program's constants
  EXPECT_GE(held, x.shard_nbytes() + 4 * (1000 + 1001 + 1002 + 1003));
  for (int run = 0; run < 2; ++run) {
    const Array y = made(x);
    EXPECT_EQ(y.to_host().get(0), want) << "run " << run;
    EXPECT_EQ(s.exec.memory(s.first).in_use, held + y.shard_nbytes()) << "run " << run;
  }
}

// count_constants = false (train-plan): a constant's bytes are left out of the planned peak, as a
// compiler folds an iota into the kernel that reads it; the program still runs with it. Here the
// peak is x, the iota and the sum's result live at once: 4,000 bytes of iota less.
TEST(Sjit, UncountedConstantsAreLeftOutOfThePeak) {
  Meshes s;
  const auto body = [](const Array& x) {
    return x + iota_like(full(Shape{1000}, DType::kF32, 0, x), 0, DType::kF32);
  };
  SjitOptions folded;
  folded.count_constants = false;
  folded.kept_constant_bytes = 0;
  SjitOptions counted;
  counted.kept_constant_bytes = 0;
  const Array x = device_put(Tensor::uniform(Shape{1000}, DType::kF32, 7, -1, 1),
                             NamedSharding(s.mesh, P()), s.exec);
  const std::int64_t with = sjit(s.mesh, body, counted).lower(x).cost().peak_bytes.at(0);
  const std::int64_t without = sjit(s.mesh, body, folded).lower(x).cost().peak_bytes.at(0);
  EXPECT_EQ(with - without, 4000);
  EXPECT_EQ(without, 2 * 4000);  // x and the result
  auto run = sjit(s.mesh, body, folded);
  EXPECT_FLOAT_EQ(static_cast<float>(run(x).to_host().get(999)),
                  static_cast<float>(x.to_host().get(999) + 999));
}

TEST(Sjit, LargeConstantsAreMadeAgainEachRunNotKept) {
  Meshes s;
  SjitOptions o;
  o.donate_argnums = {0};
  auto f = sjit(
      s.mesh,
      [](const Array& x) {
        // iota over [8, 512, 512] i32 is 2 MiB per device on data:4: not kept. The [512] one is.
        const Array small = astype(iota_like(full(Shape{512}, DType::kF32, 0, x), 0), DType::kF32);
        return causal_mask(x) + small;
      },
      o);
  const Tensor host = Tensor::uniform(Shape{8, 4, 512, 512}, DType::kF32, 3, -1, 1);
  std::vector<double> first;
  for (int run = 0; run < 3; ++run) {
    Array x = s.put(host, P("data"));
    const Array y = f(x);
    const Tensor out = y.to_host();
    if (run == 0) {
      first = out.to_doubles();
      // Checked against the definition at a few places: j > i masked, else x + j.
      const auto at = [](int i, int j) { return (std::int64_t{3} * 512 + i) * 512 + j; };
      EXPECT_LT(first[static_cast<std::size_t>(at(5, 6))], -1e29);
      EXPECT_FLOAT_EQ(static_cast<float>(first[static_cast<std::size_t>(at(6, 5))]),
                      static_cast<float>(host.get(static_cast<std::size_t>(at(6, 5))) + 5));
    } else {
      ASSERT_EQ(out.to_doubles(), first) << "run " << run;
    }
    // Only the output and the small cached constant stay: no mask-sized buffer is kept.
    EXPECT_LT(s.exec.memory(s.first).in_use, y.shard_nbytes() + (1 << 20)) << "run " << run;
  }
}

// What is live at the peak, by kind, worked out by hand: w [64, 64] f32 arrives split over
// data:4 (4 KiB per device), is gathered whole (16 KiB), and the product (16 KiB) is made while
// both are held, beside the f32 scalar 2 (4 bytes, computed); not donated, the argument stays.
TEST(Sjit, PeakByKindNamesHeldGatheredAndComputedBytes) {
  Meshes s;
  auto f = sjit(
      s.mesh, [](const Array& w) { return with_sharding_constraint(w, P()) * 2.0; },
      SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("data"))})});
  const ProgramCost& c = f.lower(TensorSpec{Shape{64, 64}, DType::kF32}).cost();
  EXPECT_EQ(c.peak_bytes[0], 4096 + 16384 + 16384 + 4);
  EXPECT_EQ(c.peak_by_kind.inputs, 4096);
  EXPECT_EQ(c.peak_by_kind.resharded_inputs, 16384);
  EXPECT_EQ(c.peak_by_kind.computed, 16384 + 4);
  // Donated, the argument is given up after the gather: the peak holds no argument.
  auto g = sjit(
      s.mesh, [](const Array& w) { return with_sharding_constraint(w, P()) * 2.0; },
      SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("data"))}), .donate_argnums = {0}});
  const ProgramCost& d = g.lower(TensorSpec{Shape{64, 64}, DType::kF32}).cost();
  EXPECT_EQ(d.peak_by_kind.inputs, 0);
  EXPECT_EQ(d.peak_bytes[0], d.peak_by_kind.resharded_inputs + d.peak_by_kind.computed);
}

// A kernel step's per-device blocks are shared between steps of equal (spec, shape): steps of the
// same shape under other specs, and of the same spec over other shapes, must get their own
// (each result is checked whole against the host computation).
TEST(Sjit, StepsOfOneShapeOrOneSpecKeepTheirOwnBlocks) {
  Meshes s;
  auto f = sjit(
      s.mesh,
      [](const Array& a, const Array& b, const Array& c) {
        return Tree<Array>::dict({{"a", a + 1.0}, {"b", b * 2.0}, {"c", c - 3.0}});
      },
      SjitOptions{.in_shardings =
                      RuleTree::list({RuleTree(P("data", "model")), RuleTree(P("model", "data")),
                                      RuleTree(P("data", "model"))}),
                  .out_shardings = RuleTree::dict({{"a", RuleTree(P("data", "model"))},
                                                   {"b", RuleTree(P("model", "data"))},
                                                   {"c", RuleTree(P("data", "model"))}})});
  const Tensor a = Tensor::uniform(Shape{8, 8}, DType::kF32, 1, -1, 1);
  const Tensor b = Tensor::uniform(Shape{8, 8}, DType::kF32, 2, -1, 1);
  const Tensor c = Tensor::uniform(Shape{16, 4}, DType::kF32, 3, -1, 1);
  const Tree<Array> out =
      f(s.put(a, P("data", "model")), s.put(b, P("model", "data")), s.put(c, P("data", "model")));
  const auto expect = [](const Tensor& t, double (*op)(double)) {
    std::vector<double> v = t.to_doubles();
    for (double& x : v) x = static_cast<double>(static_cast<float>(op(x)));
    return v;
  };
  EXPECT_EQ(out.at("a").leaf().to_host().to_doubles(), expect(a, [](double x) { return x + 1; }));
  EXPECT_EQ(out.at("b").leaf().to_host().to_doubles(), expect(b, [](double x) { return x * 2; }));
  EXPECT_EQ(out.at("c").leaf().to_host().to_doubles(), expect(c, [](double x) { return x - 3; }));
}

Array sin_cos_exp(const Array& x) { return sin(cos(exp(x))); }
// The same with a transpose between exp and sin: three steps no fusion joins (a transpose is not
// pointwise), each result a block of the input's size ([256, 32] -> [32, 256]).
Array exp_transpose_sin(const Array& x) { return sin(transpose(exp(x), {1, 0})); }

// A call that runs out of memory: an OutOfMemoryError in one process; over processes, where
// every process learns of the failure, a DistributedError carrying its message
// (docs/distributed.md, "Failure").
template <class F>
void expect_out_of_memory(F&& call) {
  if (distributed::process_count() == 1) {
    EXPECT_THROW_WITH(call(), OutOfMemoryError, "limit");
  } else {
    EXPECT_THROW_WITH(call(), DistributedError, "out of memory", "limit");
  }
}

// x [1024, 64] f32 sharded 4 x 2: a shard is [256, 32], 32 KiB per device.
constexpr std::int64_t kShard = 256 * 32 * 4;

TEST(Sjit, DonationLowersPeakMemoryAndLowerAgreesWithTheExecutor) {
  const Mesh mesh = Mesh::parse("data:4,model:2", 8);
  const Tensor t = Tensor::normal(Shape{1024, 64}, DType::kF32, 1);
  const Tensor expect =
      exp_transpose_sin(device_put(t, NamedSharding(mesh, P()), Executor(8))).to_host();
  SjitOptions donating;
  donating.donate_argnums = {0};
  for (const bool donate : {false, true}) {
    SCOPED_TRACE(donate ? "donated" : "not donated");
    const Executor exec(8);
    auto f = sjit(mesh, &exp_transpose_sin, donate ? donating : SjitOptions{});
    Array x = device_put(t, NamedSharding(mesh, P("data", "model")), exec);
    // x, exp(x), its transpose: three shards live at once unless x is freed after exp.
    const std::int64_t peak = f.lower(x).cost().peak_bytes[0];
    EXPECT_EQ(peak, (donate ? 2 : 3) * kShard);
    exec.reset_peak();
    const Array y = f(x);
    EXPECT_LT(max_diff(y.to_host(), expect), 1e-6);
    for (const int d : exec.local_devices()) {
      EXPECT_EQ(exec.memory(d).peak, peak) << "device " << d;
    }
    EXPECT_EQ(exec.memory(exec.local_devices().front()).in_use, donate ? kShard : 2 * kShard);
  }
  // With room for 2.5 shards per device the donated call fits and the other runs out.
  for (const bool donate : {false, true}) {
    const Executor exec(8, kShard * 5 / 2);
    auto f = sjit(mesh, &exp_transpose_sin, donate ? donating : SjitOptions{});
    const Array x = device_put(t, NamedSharding(mesh, P("data", "model")), exec);
    if (donate) {
      EXPECT_LT(max_diff(f(x).to_host(), expect), 1e-6);
      EXPECT_THROW_WITH(x.to_host(), ArrayError, "donated");
    } else {
      expect_out_of_memory([&] { f(x); });
      EXPECT_TRUE(x.to_host() == t);  // not donated: untouched
    }
  }
}

TEST(Sjit, DonatingOneArrayFromTwoThreadsConsumesItOnce) {
  if (distributed::process_count() > 1) {
    // Over processes every process must enter the same collectives in the same order
    // (docs/distributed.md), which two racing threads do not.
    GTEST_SKIP() << "two threads calling one program: a one-process test";
  }
  Meshes s;
  SjitOptions o;
  o.donate_argnums = {0};
  auto f = sjit(
      s.mesh, [](const Array& x) { return x * 2.0; }, o);
  const Tensor t = Tensor::normal(Shape{64, 64}, DType::kF32, 3);
  const Tensor twice = (s.put1(t) * 2.0).to_host();
  f(s.put(t, P("data")));  // compiled before the race
  for (int round = 0; round < 50; ++round) {
    const Array x = s.put(t, P("data"));
    std::atomic<int> ok{0};
    std::vector<std::string> errors(2);
    std::vector<Tensor> results(2);
    auto call = [&](int k) {
      try {
        results[static_cast<std::size_t>(k)] = f(x).to_host();
        ++ok;
      } catch (const ArrayError& e) {
        errors[static_cast<std::size_t>(k)] = e.what();
      }
    };
    std::thread a(call, 0), b(call, 1);
    a.join();
    b.join();
    ASSERT_EQ(ok.load(), 1) << "round " << round;
    const std::size_t winner = errors[0].empty() ? 0 : 1;
    EXPECT_TRUE(results[winner] == twice);
    EXPECT_THAT(errors[1 - winner], ::testing::HasSubstr("argument 0"));
    EXPECT_THAT(errors[1 - winner], ::testing::HasSubstr("donated"));
    EXPECT_THROW_WITH(x.to_host(), ArrayError, "donated");
  }
}

TEST(Sjit, InvalidDonateArgnumsAreErrorsNamingThePosition) {
  Meshes s;
  const auto f = [](const Array& x, int k) { return x * double(k); };
  EXPECT_THROW_WITH(sjit(s.mesh, f, SjitOptions{.donate_argnums = {-1}}), SpecError,
                    "donate_argnums", "-1", "negative");
  EXPECT_THROW_WITH(sjit(s.mesh, f, SjitOptions{.donate_argnums = {0, 0}}), SpecError,
                    "donate_argnums", "0", "twice");
  EXPECT_THROW_WITH(sjit(s.mesh, f, SjitOptions{.static_argnums = {1}, .donate_argnums = {1}}),
                    SpecError, "donate_argnums", "1", "static_argnums");
  const Array x = s.put(Tensor::ones(Shape{8}, DType::kF32), P());
  auto static_one = sjit(s.mesh, f, SjitOptions{.donate_argnums = {1}});
  EXPECT_THROW_WITH(static_one(x, 2), SpecError, "argument 1", "static");
  EXPECT_THROW_WITH(static_one.lower(x, 2), SpecError, "argument 1", "static");
  auto out_of_range = sjit(s.mesh, f, SjitOptions{.donate_argnums = {2}});
  EXPECT_THROW_WITH(out_of_range(x, 2), SpecError, "position 2", "out of range", "2 arguments");
  EXPECT_EQ(x.to_host().get(0), 1.0);  // nothing was donated
  // The same array donated and passed again (or captured) would be read after it is freed.
  auto both = sjit(
      s.mesh, [](const Array& a, const Array& b) { return a + b; },
      SjitOptions{.donate_argnums = {0}});
  EXPECT_THROW_WITH(both(x, x), ArrayError, "argument 0", "also passed as argument 1");
  auto captures = sjit(
      s.mesh, [&](const Array& a) { return a + x; }, SjitOptions{.donate_argnums = {0}});
  EXPECT_THROW_WITH(captures(x), ArrayError, "argument 0", "captures");
  EXPECT_EQ(x.to_host().get(0), 1.0);
}

TEST(Sjit, AFailedCallDoesNotConsumeItsDonatedArguments) {
  const Mesh mesh = Mesh::parse("data:4,model:2", 8);
  const Tensor t = Tensor::normal(Shape{1024, 64}, DType::kF32, 1);
  SjitOptions o;
  o.donate_argnums = {0};
  {
    Meshes s;
    const Array x = s.put(Tensor::ones(Shape{8, 4}, DType::kF32), P("data"));
    auto bad_shape = sjit(
        s.mesh, [](const Array& a) { return matmul(a, a); }, o);
    EXPECT_THROW_WITH(bad_shape(x), SpecError, "matmul");
    auto throws = sjit(
        s.mesh,
        [](const Array& a) -> Array {
          if (a.shape()[0] == 8) throw std::runtime_error("user error");
          return a;
        },
        o);
    EXPECT_THROW_WITH(throws(x), std::runtime_error, "user error");
    EXPECT_EQ(x.to_host().get(5), 1.0);
  }
  // Out of memory at the program's first allocation: x is given back, and a later call with
  // enough memory may donate it.
  const Executor exec(8, kShard * 3 / 2);
  auto f = sjit(mesh, &sin_cos_exp, o);
  const Array x = device_put(t, NamedSharding(mesh, P("data", "model")), exec);
  expect_out_of_memory([&] { f(x); });
  EXPECT_TRUE(x.to_host() == t);
  exec.set_memory_limit(kShard * 2);
  const Array y = f(x);
  EXPECT_THROW_WITH(x.to_host(), ArrayError, "donated");
  EXPECT_EQ(y.shape(), t.shape());
}

TEST(Sjit, ArraysOnAnotherExecutorAreErrorsAsForEagerOps) {
  Meshes s;
  const Executor other(8);
  const Tensor t = Tensor::ones(Shape{8}, DType::kF32);
  const Array bias = device_put(t, NamedSharding(s.mesh, P("data")), other);
  auto f = sjit(s.mesh, [&](const Array& x) { return x + bias; });
  EXPECT_THROW_WITH(f(s.put(t, P())), ArrayError, "different executors", "captured",
                    "Array(f32[8], NamedSharding(", "argument 0");
  // Eager ops say the same.
  EXPECT_THROW_WITH(s.put(t, P()) + bias, ArrayError, "different executors");
  auto g = sjit(s.mesh, [](const Array& a, const Array& b) { return a + b; });
  EXPECT_THROW_WITH(g(s.put(t, P()), bias), ArrayError, "different executors", "argument 0",
                    "argument 1");
  auto h = sjit(
      s.mesh, [](const Array& a) { return a + 1.0; }, SjitOptions{.executor = other});
  EXPECT_THROW_WITH(h(s.put(t, P())), ArrayError, "argument 0", "SjitOptions::executor");
  EXPECT_EQ(h(bias).to_host().get(0), 2.0);
}

TEST(Sjit, ANestedSjitIsTracedInlineWithItsShardingsAsConstraints) {
  Meshes s;
  SjitOptions inner_o;
  inner_o.in_shardings = RuleTree::list({RuleTree(P(nullptr, "model"))});
  inner_o.out_shardings = RuleTree(P("data", "model"));
  inner_o.annotation_shardings = {{"hidden", RuleTree(P("data"))}};
  int inner_traces = 0;
  auto inner = sjit(
      s.mesh,
      [&](const Array& h) {
        ++inner_traces;
        return with_sharding_annotation(relu(h), "hidden") * 2.0;
      },
      inner_o);
  auto outer =
      sjit(s.mesh, [&](const Array& x, const Array& w) { return sum(inner(matmul(x, w)), {1}); });
  const Tensor x = Tensor::normal(Shape{16, 8}, DType::kF32, 1);
  const Tensor w = Tensor::normal(Shape{8, 32}, DType::kF32, 2);
  const Array xs = s.put(x, P("data")), ws = s.put(w, P());
  const Array y = outer(xs, ws);
  EXPECT_EQ(outer.cache_size(), 1u);
  EXPECT_EQ(inner.cache_size(), 0u);  // nothing compiled for the inner one
  EXPECT_EQ(inner_traces, 1);
  // The composition run eagerly on one device.
  const Tensor ref = sum(relu(matmul(s.put1(x), s.put1(w))) * 2.0, {1}).to_host();
  EXPECT_LT(max_diff(y.to_host(), ref), 1e-4);
  const std::string text = outer.lower(xs, ws).text();
  EXPECT_THAT(text, ::testing::HasSubstr("nested sjit in_shardings (argument 0)"));
  EXPECT_THAT(text, ::testing::HasSubstr("nested sjit out_shardings (output leaf 0)"));
  EXPECT_THAT(text, ::testing::HasSubstr("annotation 'hidden'"));
  // The inner function called on its own is compiled and cached as usual.
  EXPECT_LT(max_diff(inner(matmul(xs, ws)).to_host(),
                     (relu(matmul(s.put1(x), s.put1(w))) * 2.0).to_host()),
            1e-4);
  EXPECT_EQ(inner.cache_size(), 1u);
  // A nested sjit on another mesh is an error naming both.
  auto elsewhere = sjit(s.single, [](const Array& h) { return h + 1.0; });
  auto bad = sjit(s.mesh, [&](const Array& v) { return elsewhere(v); });
  EXPECT_THROW_WITH(bad(xs), ArrayError, "nested sjit", "Mesh('data': 1, 'model': 1)",
                    "Mesh('data': 4, 'model': 2)");
}

TEST(Sjit, NoneInShardingsMeansReplicatedAndUnspecifiedKeepsWhatItHas) {
  Meshes s;
  const Array x = s.put(Tensor::normal(Shape{8, 8}, DType::kF32, 1), P("data"));
  auto none = sjit(
      s.mesh, [](const Array& v) { return v * 2.0; },
      SjitOptions{.in_shardings = RuleTree::list({RuleTree::none()}),
                  .out_shardings = RuleTree::none()});
  EXPECT_EQ(none.lower(x).input_shardings()[0], NamedSharding(s.mesh, P()));
  EXPECT_EQ(none(x).sharding(), NamedSharding(s.mesh, P()));
  auto keep = sjit(
      s.mesh, [](const Array& v) { return v * 2.0; },
      SjitOptions{.in_shardings = RuleTree::list({RuleTree(Unspecified{})}),
                  .out_shardings = RuleTree(Unspecified{})});
  EXPECT_EQ(keep.lower(x).input_shardings()[0], NamedSharding(s.mesh, P("data")));
  EXPECT_EQ(keep(x).sharding(), NamedSharding(s.mesh, P("data")));
  EXPECT_TRUE(none(x).to_host() == keep(x).to_host());
}

TEST(Sjit, AMeshContextGivesTheMeshAndTheAnnotationShardings) {
  Meshes s;
  const Tensor t = Tensor::normal(Shape{8, 8}, DType::kF32, 2);
  const Array x = s.put(t, P());
  EXPECT_THROW_WITH(sjit([](const Array& v) { return v + 1.0; }), SpecError, "no MeshContext");
  // Outside any context an annotation outside sjit does nothing.
  EXPECT_EQ(with_sharding_annotation(x, "act").sharding().spec(), P());
  {
    MeshContext ctx(MeshShardingHelper(s.mesh), {{"act", RuleTree(P("data", "model"))}});
    // Outside sjit, the context's sharding applies at once; unknown names pass unchanged.
    const Array a = with_sharding_annotation(x, "act");
    EXPECT_EQ(a.sharding().spec(), P("data", "model"));
    EXPECT_TRUE(a.to_host() == t);
    EXPECT_EQ(with_sharding_annotation(x, "other").sharding().spec(), P());
    // sjit without a mesh runs on the context's, with its annotation shardings.
    auto f = sjit([](const Array& v) { return with_sharding_annotation(exp(v), "act"); });
    const Array y = f(x);
    EXPECT_EQ(y.sharding().spec(), P("data", "model"));
    EXPECT_LT(max_diff(y.to_host(), exp(s.put1(t)).to_host()), 1e-6);
    // An sjit's own annotation_shardings win over the context's.
    auto g = sjit([](const Array& v) { return with_sharding_annotation(exp(v), "act"); },
                  SjitOptions{.annotation_shardings = {{"act", RuleTree(P("data"))}}});
    EXPECT_EQ(g(x).sharding().spec(), P("data"));
  }
  EXPECT_EQ(get_context(), nullptr);
  // Mesh and annotations are taken when the sjit is built: it works the same after the context.
  auto built = [&] {
    MeshContext ctx(s.mesh, {{"act", RuleTree(P(nullptr, "model"))}});
    return sjit([](const Array& v) { return with_sharding_annotation(v * 2.0, "act"); });
  }();
  EXPECT_EQ(get_context(), nullptr);
  EXPECT_EQ(built(x).sharding().spec(), P(nullptr, "model"));
}

TEST(Sjit, GetJittedFunctionByArgsIsTheCacheEntryACallUses) {
  Meshes s;
  auto f = sjit(s.mesh, [](const Array& x, double c) { return x * c; });
  const Array a = s.put(Tensor::ones(Shape{8, 8}, DType::kF32), P("data"));
  f(a, 2.0);
  EXPECT_EQ(f.cache_size(), 1u);
  const Lowered p = f.get_jitted_function_by_args(a, 2.0);
  EXPECT_EQ(f.cache_size(), 1u);  // the call's program, not a new one
  EXPECT_TRUE(p == f.compiled(a, 2.0));
  EXPECT_TRUE(p == f.lower(a, 2.0));
  EXPECT_EQ(p.input_shardings()[0], NamedSharding(s.mesh, P("data")));
  // Other arguments, another program (compiled now, then used by the call).
  const Lowered q = f.compiled(a, 3.0);
  EXPECT_FALSE(p == q);
  EXPECT_EQ(f.cache_size(), 2u);
  f(a, 3.0);
  EXPECT_EQ(f.cache_size(), 2u);
  const Lowered r = f.compiled(s.put(Tensor::ones(Shape{8, 8}, DType::kF32), P("model")), 2.0);
  EXPECT_FALSE(p == r);
  EXPECT_EQ(r.input_shardings()[0], NamedSharding(s.mesh, P("model")));
}

TEST(Sjit, ConstantsAreComputedOncePerExecutorAndStayCorrect) {
  Meshes s;
  auto f = sjit(s.mesh, [](const Array& x) { return x * 2.0 + 1.0; });
  const Tensor t = Tensor::normal(Shape{8, 8}, DType::kF32, 3);
  const Tensor expect = (s.put1(t) * 2.0 + 1.0).to_host();
  EXPECT_LT(max_diff(f(s.put(t, P("data"))).to_host(), expect), 1e-6);
  EXPECT_LT(max_diff(f(s.put(t, P("data"))).to_host(), expect), 1e-6);  // constants cached
  const Executor other(8);  // another executor: its own constants
  const Array on_other = device_put(t, NamedSharding(s.mesh, P("data")), other);
  const Array y = f(on_other);
  EXPECT_EQ(y.executor(), other);
  EXPECT_LT(max_diff(y.to_host(), expect), 1e-6);
}

TEST(Sjit, LowerWorksOnAbstractArgumentsTooLargeToRun) {
  Meshes s;
  auto f = sjit(
      s.mesh, [](const Array& x, const Array& w) { return relu(matmul(x, w)); },
      SjitOptions{.in_shardings =
                      RuleTree::list({RuleTree(P("data")), RuleTree(P(nullptr, "model"))})});
  // 64 GiB of weights: never allocated.
  const TensorSpec x{Shape{1024, 131072}, DType::kF32};
  const TensorSpec w{Shape{131072, 131072}, DType::kF32};
  const std::int64_t before = s.exec.memory(s.first).in_use;
  const Lowered low = f.lower(x, w);
  EXPECT_EQ(s.exec.memory(s.first).in_use, before);
  // Per device: x/4 (128 MiB) + w/2 (32 GiB) + the result block [256, 65536] (64 MiB), twice
  // (dot, then relu; the dot's block is freed after relu).
  const std::int64_t expect =
      1024LL * 131072 * 4 / 4 + 131072LL * 131072 * 4 / 2 + 2 * 256LL * 65536 * 4;
  EXPECT_EQ(low.cost().peak_bytes[0], expect);
  EXPECT_DOUBLE_EQ(low.cost().flops[0], 2.0 * 256 * 131072 * 65536 + 256.0 * 65536);
  EXPECT_THROW_WITH(f(x, w), ArrayError, "TensorSpec", "lower()");
}

// A call without arrays has no executor: its tracers say so rather than name a stand-in.
TEST(Sjit, TracersOfACallWithoutArraysHaveNoExecutor) {
  Meshes s;
  auto f = sjit(s.mesh, [](const Array& x) {
    EXPECT_THROW_WITH(x.executor(), ArrayError, "tracer", "f32[4, 4]", "no executor");
    return x * 2.0;
  });
  const Lowered low = f.lower(TensorSpec{Shape{4, 4}, DType::kF32});
  EXPECT_THAT(low.text(), ::testing::HasSubstr("mul"));
  // With arrays, the tracers have the arrays' executor.
  auto g = sjit(s.mesh, [&](const Array& x) {
    EXPECT_TRUE(x.executor() == s.exec);
    return x * 2.0;
  });
  g(device_put(Tensor::uniform(Shape{4, 4}, DType::kF32, 1, -1, 1), NamedSharding(s.mesh, P()),
               s.exec));
}

struct State {
  Array step;
  Tree<Array> params;
};
SHARDPLAN_TREE_STRUCT(State, step, params)

TEST(Sjit, RegisteredStructsGoInAndComeOut) {
  Meshes s;
  auto f = sjit(s.mesh, [](const State& st) {
    return State{st.step + 1.0, st.params.map([](const Array& p) { return p * 0.5; })};
  });
  const State st{
      s.put(Tensor::zeros(Shape{}, DType::kF32), P()),
      Tree<Array>::dict({{"w", s.put(Tensor::ones(Shape{8, 2}, DType::kF32), P("data"))}})};
  const State next = f(st);
  EXPECT_EQ(next.step.to_host().get(0), 1.0);
  EXPECT_EQ(next.params.at("w").leaf().to_host().get(3), 0.5);
  EXPECT_EQ(next.params.at("w").leaf().sharding().spec(), P("data"));
}

TEST(Sjit, TracersDoNotEscape) {
  Meshes s;
  Array leaked;
  auto f = sjit(s.mesh, [&](const Array& x) {
    leaked = x;
    EXPECT_TRUE(x.is_tracer());
    EXPECT_THROW_WITH(x.to_host(), ArrayError, "tracer");
    return x + 1.0;
  });
  f(s.put(Tensor::ones(Shape{8}, DType::kF32), P("data")));
  EXPECT_THROW_WITH(sin(leaked), ArrayError, "tracer", "outside");
}

TEST(Sjit, ArraysFromOutsideAreCapturedAsInputs) {
  Meshes s;
  const Array bias = s.put(Tensor::ones(Shape{8}, DType::kF32), P("data"));
  auto f = sjit(s.mesh, [&](const Array& x) { return x + bias; });
  const Array y = f(s.put(Tensor::ones(Shape{8}, DType::kF32), P()));
  EXPECT_EQ(y.to_host().to_doubles(), std::vector<double>(8, 2.0));
}

// The guide's MLP (smaller layers): forward loss with 8-way data parallelism and with 4-way data
// x 2-way tensor parallelism, equal to the single-device loss.
TEST(Sjit, TheGuidesMlpLossIsTheSameDataParallelAndTensorParallel) {
  const std::vector<std::int64_t> sizes = {64, 128, 128, 128, 10};
  std::vector<Tensor> ws, bs;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    ws.push_back(Tensor::normal(Shape{sizes[i], sizes[i + 1]}, DType::kF32, 10 + i, 0,
                                1.0 / std::sqrt(static_cast<double>(sizes[i]))));
    bs.push_back(Tensor::normal(Shape{sizes[i + 1]}, DType::kF32, 20 + i, 0, 0.1));
  }
  const Tensor x = Tensor::normal(Shape{32, 64}, DType::kF32, 1);
  std::vector<std::int32_t> lab;
  for (int i = 0; i < 32; ++i) lab.push_back(i % 10);
  const Tensor labels = Tensor::from<std::int32_t>(Shape{32}, lab);

  auto run = [&](const Mesh& mesh, const Executor& exec, auto w_spec, const PartitionSpec& batch) {
    std::vector<Tree<Array>> layers;
    for (std::size_t i = 0; i < ws.size(); ++i) {
      const auto [wsp, bsp] = w_spec(i);
      layers.push_back(
          Tree<Array>::dict({{"w", device_put(ws[i], NamedSharding(mesh, wsp), exec)},
                             {"b", device_put(bs[i], NamedSharding(mesh, bsp), exec)}}));
    }
    auto loss = sjit(mesh, &mlp::loss);
    return loss(Tree<Array>::list(layers), device_put(x, NamedSharding(mesh, batch), exec),
                device_put(labels, NamedSharding(mesh, batch), exec))
        .to_host()
        .get(0);
  };
  const Executor one = Executor::process_local(1), eight(8);
  const auto replicated = [](std::size_t) { return std::pair{P(), P()}; };
  const double single = run(Mesh::parse("data:1,model:1", 1), one, replicated, P());
  const double dp = run(Mesh::parse("data:8", 8), eight, replicated, P("data"));
  // W2 P(None, 'model'), W3 P('model', None), as in the guide.
  const auto tp = [](std::size_t i) {
    if (i == 1) return std::pair{P(nullptr, "model"), P("model")};
    if (i == 2) return std::pair{P("model", nullptr), P()};
    return std::pair{P(), P()};
  };
  const double dp_tp = run(Mesh::parse("data:4,model:2", 8), eight, tp, P("data"));
  EXPECT_GT(single, 1.0);  // about log(10) for an untrained net
  EXPECT_NEAR(dp, single, 1e-5);
  EXPECT_NEAR(dp_tp, single, 1e-5);
}

TEST(Sjit, ArgumentErrorsNameTheMeshesAndPositions) {
  Meshes s;
  auto f = sjit(
      s.mesh, [](const Array& x, int) { return x + 1.0; }, SjitOptions{.static_argnums = {0}});
  const Array x = s.put(Tensor::ones(Shape{8}, DType::kF32), P());
  EXPECT_THROW_WITH(f(x, 1), SpecError, "argument 0", "static_argnums");
  auto g = sjit(s.mesh, [](const Array& v) { return v + 1.0; });
  EXPECT_THROW_WITH(g(s.put1(Tensor::ones(Shape{8}, DType::kF32))), ArrayError,
                    "Mesh('data': 1, 'model': 1)", "Mesh('data': 4, 'model': 2)");
  auto h =
      sjit(s.mesh, [](std::uint64_t seed) { return random_normal(Shape{8}, DType::kF32, seed); });
  EXPECT_THROW_WITH(h(std::uint64_t{1}), ArrayError, "SjitOptions::executor");
}

// The options' rule trees are resolved by the planner; its errors keep their type (callers catch
// a structure mismatch as TreeError, a rule that cannot decide as RuleError) and say which
// option they come from.
TEST(Sjit, ShardingOptionErrorsKeepTheirTypeAndNameTheOption) {
  Meshes s;
  const Array x = s.put(Tensor::normal(Shape{8, 8}, DType::kF32, 1), P());
  const Tree<Array> params = Tree<Array>::dict({{"w", x}});
  const auto f = [](const Tree<Array>& p, const Array& v) { return matmul(v, p.at("w").leaf()); };
  // The first argument's tree has key 'w', the rule tree 'b': not a prefix.
  const RuleTree wrong_keys =
      RuleTree::list({RuleTree::dict({{"b", RuleTree(P())}}), RuleTree(P())});
  auto in = sjit(s.mesh, f, SjitOptions{.in_shardings = wrong_keys});
  EXPECT_THROW_WITH(in(params, x), TreeError, "[sjit] in_shardings: ", "not a prefix", "at '0'",
                    "keys [b]");
  EXPECT_THROW_WITH(in.lower(params, x), TreeError, "[sjit] in_shardings: ");
  auto constraint = sjit(s.mesh, f, SjitOptions{.args_sharding_constraint = wrong_keys});
  EXPECT_THROW_WITH(constraint(params, x), TreeError, "[sjit] args_sharding_constraint: ");
  auto out = sjit(s.mesh, f, SjitOptions{.out_shardings = RuleTree::list({RuleTree(P())})});
  EXPECT_THROW_WITH(out(params, x), TreeError, "[sjit] out_shardings: ");
  // A strict path rule with no entry for '0/w' cannot decide it: a RuleError naming the path.
  const auto strict = std::make_shared<TreePathShardingRule>(
      std::vector<TreePathShardingRule::Entry>{{"bias", P()}});
  auto rule = sjit(s.mesh, f, SjitOptions{.in_shardings = RuleTree(strict)});
  EXPECT_THROW_WITH(rule(params, x), RuleError, "[sjit] in_shardings: ", "0/w");
  // A spec that does not divide the shape stays a SpecError (6 rows over 'data' of size 4).
  auto spec = sjit(
      s.mesh, f, SjitOptions{.in_shardings = RuleTree::list({RuleTree(P()), RuleTree(P("data"))})});
  EXPECT_THROW_WITH(spec(params, s.put(Tensor::normal(Shape{6, 8}, DType::kF32, 2), P())),
                    SpecError, "[sjit] in_shardings: ");
}

TEST(Sjit, OriginsAndErrorsNameTheArgumentAndTheLeafsPath) {
  Meshes s;
  const auto f = [](const Tree<Array>& p, const Array& v) {
    return matmul(v, p.at("layer").at("w").leaf());
  };
  const Tree<Array> params = Tree<Array>::dict(
      {{"layer", Tree<Array>::dict({{"w", s.put(Tensor::ones(Shape{8, 4}, DType::kF32), P())}})}});
  const Array x = s.put(Tensor::ones(Shape{8, 8}, DType::kF32), P("data"));
  auto step = sjit(s.mesh, f,
                   SjitOptions{.in_shardings = RuleTree::list(
                                   {RuleTree(P(nullptr, "model")), RuleTree(Unspecified{})})});
  const std::string text = step.lower(params, x).text();
  EXPECT_THAT(text, ::testing::HasSubstr("in_shardings (argument 0 'layer/w')"));
  EXPECT_THAT(text, ::testing::HasSubstr("argument 1 as passed"));
  // A donated leaf is named by its argument and path when it is passed again.
  auto donating = sjit(s.mesh, f, SjitOptions{.donate_argnums = {0}});
  donating(params, x);
  EXPECT_THROW_WITH(step(params, x), ArrayError, "argument 0 'layer/w' was donated");
}

}  // namespace
}  // namespace shardplan
