// sjit: tracing, propagation (with origins), partitioning, the compiled-program cache,
// constraints, annotations and the examples of JAX's "Distributed arrays" guide and Flax's
// DotReluDot, each against the single-device result. Memory and donation: sjit_test_memory.cpp;
// nesting, mesh contexts, lower() and argument errors: sjit_test_tracing.cpp.
#include "sjit_test.hpp"

namespace shardplan {
namespace {

using namespace test;

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

}  // namespace
}  // namespace shardplan
