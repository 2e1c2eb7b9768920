// Padded arrays in programs (NamedSharding's Uneven::kPad over a dimension its axes do not
// divide): sjit and eager ops take them; no op takes a padded dimension, each reads it gathered
// (its valid rows only), and the program says so. Each result is compared with one device's,
// bitwise: the shapes here have no dimension that 3, 4 or 7 divides, so nothing is summed in
// partial blocks.
#include "shardplan/optim.hpp"
#include "sjit_test.hpp"

namespace shardplan::test {
namespace {

// An executor of `devices` devices over the processes when they split evenly (mpirun -np 2 and 4
// run this suite), else this process's own.
Executor executor_of(int devices) {
  return devices % distributed::process_count() == 0 ? Executor{devices}
                                                     : Executor::process_local(devices);
}

// f over `devices` devices, its operands split on dimension `dims[k]` of `mesh` (padded where the
// axis does not divide), against f on one device: equal bit for bit.
template <class F>
void expect_padded_is_one_device(F f, const std::vector<Tensor>& xs, const std::vector<int>& dims) {
  const Executor one = Executor::process_local(1);
  const Mesh single = Mesh::parse("x:1", 1);
  auto on = [&](const Mesh& mesh, const Executor& exec, bool split) {
    std::vector<Tree<Array>> args;
    for (std::size_t k = 0; k < xs.size(); ++k) {
      std::vector<AxisNames> spec(static_cast<std::size_t>(std::max(dims[k] + 1, 0)));
      if (split && dims[k] >= 0) spec[static_cast<std::size_t>(dims[k])] = {"x"};
      args.emplace_back(
          device_put(xs[k], NamedSharding(mesh, PartitionSpec(spec), Uneven::kPad), exec));
    }
    auto g = sjit(mesh, [&](const Tree<Array>& t) { return f(t.leaves()); });
    return g(Tree<Array>::list(std::move(args))).to_host();
  };
  const Tensor want = on(single, one, false);
  for (const int devices : {3, 4, 7}) {
    SCOPED_TRACE("devices " + std::to_string(devices));
    const Executor exec = executor_of(devices);
    const Mesh mesh = Mesh::parse("x:" + std::to_string(devices), devices);
    const Tensor got = on(mesh, exec, true);
    EXPECT_TRUE(got == want) << "largest difference " << max_diff(got, want);
  }
}

const Tensor kX = Tensor::normal(Shape{10, 5}, DType::kF32, 1);
// All below zero: a zero pad row would be the max.
const Tensor kNegative = Tensor::uniform(Shape{10, 5}, DType::kF32, 2, -3.0, -1.0);

TEST(SjitPadded, SumOverAPaddedDimensionAddsNoPad) {
  expect_padded_is_one_device([](const auto& a) { return sum(exp(a[0]), {0}); }, {kX}, {0});
  expect_padded_is_one_device([](const auto& a) { return sum(a[0] + 1.0); }, {kX}, {0});
  expect_padded_is_one_device([](const auto& a) { return mean(a[0], {0}); }, {kX}, {0});
}

TEST(SjitPadded, MaxOverAPaddedDimensionIgnoresThePad) {
  expect_padded_is_one_device([](const auto& a) { return max(a[0], {0}); }, {kNegative}, {0});
  expect_padded_is_one_device([](const auto& a) { return min(-a[0], {0}); }, {kNegative}, {0});
}

TEST(SjitPadded, SoftmaxOverAPaddedDimensionIgnoresThePad) {
  expect_padded_is_one_device([](const auto& a) { return softmax(a[0], 0); }, {kNegative}, {0});
  expect_padded_is_one_device([](const auto& a) { return log_softmax(a[0], 0); }, {kX}, {0});
  // The padded dimension not the softmax's: still read gathered.
  expect_padded_is_one_device([](const auto& a) { return softmax(a[0], 1); }, {kX}, {0});
}

TEST(SjitPadded, AMatmulContractingAPaddedDimensionAddsNoPad) {
  const Tensor a = Tensor::normal(Shape{5, 10}, DType::kF32, 3);
  const Tensor b = Tensor::normal(Shape{10, 5}, DType::kF32, 4);
  // Both operands padded on the contracted dimension, then one of them only.
  expect_padded_is_one_device([](const auto& v) { return matmul(v[0], v[1]); }, {a, b}, {1, 0});
  expect_padded_is_one_device([](const auto& v) { return matmul(v[0], v[1]); }, {a, b}, {-1, 0});
  // The padded dimension a free one of the result.
  expect_padded_is_one_device([](const auto& v) { return matmul(v[0], v[1]); }, {b, a}, {0, -1});
}

TEST(SjitPadded, PointwiseOpsGiveTheValidRows) {
  expect_padded_is_one_device([](const auto& a) { return a[0] * 2.0 + 1.0; }, {kX}, {0});
  expect_padded_is_one_device([](const auto& a) { return exp(a[0]) - a[1]; }, {kX, kX}, {0, 1});
}

// The plan names the gather: the reshard of the padded argument gives the dimension, the rows,
// the blocks and the axis.
TEST(SjitPadded, ThePlanSaysAPaddedDimensionIsReadGathered) {
  const Executor exec{4};
  const Mesh mesh = Mesh::parse("x:4", 4);  // 10 rows: blocks of 3, 3, 3 and 1
  const Array x = device_put(kX, NamedSharding(mesh, P("x"), Uneven::kPad), exec);
  auto f = sjit(mesh, [](const Array& a) { return max(a, {0}); });
  const std::string text = f.lower(x).text();
  EXPECT_NE(text.find("dim 0 of %0 is padded (10 rows in 4 blocks of 3 over 'x'): read gathered"),
            std::string::npos)
      << text;
}

// An array captured from outside and an eager op's operands may be padded too; a padded
// argument returned as it is keeps its padded sharding.
TEST(SjitPadded, CapturedArraysEagerOpsAndIdentityTakePaddedArrays) {
  const Executor exec{4};
  const Mesh mesh = Mesh::parse("x:4", 4);
  const NamedSharding padded(mesh, P("x"), Uneven::kPad);
  const Array x = device_put(kX, padded, exec);
  const Tensor wh = Tensor::normal(Shape{5, 3}, DType::kF32, 5);
  const Array w = device_put(wh, NamedSharding(mesh, P()), exec);
  const Executor one = Executor::process_local(1);
  const NamedSharding single(Mesh::parse("x:1", 1), P());
  const Array x1 = device_put(kX, single, one);
  const Array w1 = device_put(wh, single, one);
  auto captured = sjit(mesh, [&](const Array& b) { return matmul(x, b); });
  EXPECT_TRUE(captured(w).to_host() == matmul(x1, w1).to_host());
  EXPECT_TRUE((x * 2.0).to_host() == (x1 * 2.0).to_host());
  EXPECT_TRUE(sum(x, {0}).to_host() == sum(x1, {0}).to_host());
  auto identity = sjit(mesh, [](const Array& a) { return a; });
  const Array same = identity(x);
  EXPECT_EQ(same.sharding(), padded);
  EXPECT_TRUE(same.to_host() == kX);
}

// SjitOptions::uneven = kPad: in_shardings and out_shardings that do not divide pad, and a
// pointwise op (Primitive::pointwise, operands of its shape) runs on the padded shards as they
// are (takes_padded): one fused kernel on blocks of ceil(10/4) = 3 rows, nothing gathered (the
// scalars' broadcasts are sliced, 0 B), and the result is one device's.
TEST(SjitPadded, TheUnevenOptionPadsInAndOutShardingsAndPointwiseOpsRunPadded) {
  const Executor exec{4};
  const Mesh mesh = Mesh::parse("x:4", 4);
  const Array x = device_put(kX, NamedSharding(mesh, P()), exec);
  auto f = sjit(mesh, [](const Array& a) { return exp(a * 2.0) + 1.0; },
                SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("x"))}),
                            .out_shardings = RuleTree(P("x")),
                            .uneven = Uneven::kPad});
  const std::string text = f.lower(x).text();
  EXPECT_NE(text.find("kernel  %7 = fused(mul, exp, add) on blocks [3, 5] in PartitionSpec('x')"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("all_gather"), std::string::npos) << text;
  const Array y = f(x);
  EXPECT_EQ(y.sharding(), NamedSharding(mesh, P("x"), Uneven::kPad));
  const Executor one = Executor::process_local(1);
  const Array x1 = device_put(kX, NamedSharding(Mesh::parse("x:1", 1), P()), one);
  EXPECT_TRUE(y.to_host() == (exp(x1 * 2.0) + 1.0).to_host());
}

// The fused Adam(W) update (Primitive::per_element: element i from the operands' elements i and
// the scalar rate and step count) runs on the padded moments as they are, as a pointwise op
// does: nothing gathered, one device's values bit for bit.
TEST(SjitPadded, TheFusedOptimizerUpdateRunsOnPaddedShards) {
  const Executor exec{4};
  const Mesh mesh = Mesh::parse("x:4", 4);
  const auto update = [](const Array& p, const Array& g, const Array& m, const Array& v,
                         const Array& lr, const Array& count) {
    const AdamwUpdate u = adamw_update(p, g, m, v, lr, count, 0.9, 0.999, 1e-8, 0.01);
    return Tree<Array>::list({Tree<Array>(u.param), Tree<Array>(u.mu), Tree<Array>(u.nu)});
  };
  const Tensor p = kX, g = Tensor::normal(Shape{10, 5}, DType::kF32, 7),
               m = Tensor::normal(Shape{10, 5}, DType::kF32, 8),
               v = Tensor::uniform(Shape{10, 5}, DType::kF32, 9, 0.1, 1.0);
  const Tensor lr = Tensor::from(Shape{}, std::vector<float>{1e-3F}),
               count = Tensor::from(Shape{}, std::vector<float>{3.0F});
  const NamedSharding rows(mesh, P("x"), Uneven::kPad), whole(mesh, P());
  auto f = sjit(mesh, update);
  const auto put = [&](const Tensor& t, const NamedSharding& s) { return device_put(t, s, exec); };
  const Array args[] = {put(p, rows), put(g, rows), put(m, rows), put(v, rows), put(lr, whole),
                        put(count, whole)};
  const std::string text = f.lower(args[0], args[1], args[2], args[3], args[4], args[5]).text();
  EXPECT_EQ(text.find("all_gather"), std::string::npos) << text;
  const Tree<Array> got = f(args[0], args[1], args[2], args[3], args[4], args[5]);
  const Executor one = Executor::process_local(1);
  const NamedSharding single(Mesh::parse("x:1", 1), P());
  const auto put1 = [&](const Tensor& t) { return device_put(t, single, one); };
  const Tree<Array> want = update(put1(p), put1(g), put1(m), put1(v), put1(lr), put1(count));
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(got.at(k).leaf().sharding(), rows) << "result " << k;
    EXPECT_TRUE(got.at(k).leaf().to_host() == want.at(k).leaf().to_host()) << "result " << k;
  }
}

// A sharding that does not divide and does not pad is still refused, naming the argument.
TEST(SjitPadded, AnUnpaddedShardingThatDoesNotDivideIsRefused) {
  const Executor exec{4};
  const Mesh mesh = Mesh::parse("x:4", 4);
  const Array x = device_put(kX, NamedSharding(mesh, P()), exec);
  auto f = sjit(mesh, [](const Array& a) { return a * 2.0; },
                SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("x"))})});
  EXPECT_THROW_WITH(f(x), SpecError, "dim 0", "(shape [10, 5])", "'x' (size 4)",
                    "10 is not a multiple of 4");
}

// A constraint inside the function that does not divide is refused too, naming the value, its
// shape and the axis (compile's propagation checks each fixed sharding as NamedSharding does).
TEST(SjitPadded, AConstraintThatDoesNotDivideIsRefused) {
  const Executor exec{4};
  const Mesh mesh = Mesh::parse("x:4", 4);
  const Array x = device_put(kX, NamedSharding(mesh, P()), exec);
  auto f = sjit(mesh, [](const Array& a) { return with_sharding_constraint(a * 2.0, P("x")); });
  EXPECT_THROW_WITH(f(x), SpecError, "dim 0 of '%", "(shape [10, 5])", "'x' (size 4)",
                    "10 is not a multiple of 4");
}

// Issue 41's goal: a training step (the MLP of JAX's guide, Adam, two steps, the second from the
// first's outputs) with every parameter, moment and batch split FSDP-style over 3, 5, 6 and 7
// devices, each split padded (11, 13, 17 and 19 rows: none of them divides), gives one device's
// loss, parameters and state bit for bit. Bitwise because each op reads a padded dimension
// gathered and no other dimension divides, so no sum is split into partial sums (a split
// contraction adds the blocks' sums in another order: equal to rounding only).
TEST(SjitPadded, AnMlpTrainingStepOverThreeFiveSixAndSevenDevicesIsOneDevicesBitwise) {
  const std::vector<std::int64_t> sizes = {13, 17, 19};
  std::vector<Tensor> ws, bs;
  for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
    ws.push_back(Tensor::normal(Shape{sizes[i], sizes[i + 1]}, DType::kF32, 10 + i, 0, 0.3));
    bs.push_back(Tensor::normal(Shape{sizes[i + 1]}, DType::kF32, 20 + i, 0, 0.1));
  }
  const Tensor x = Tensor::normal(Shape{11, sizes.front()}, DType::kF32, 1);
  std::vector<std::int32_t> lab;
  for (int i = 0; i < 11; ++i) lab.push_back((i * 7) % 19);
  const Tensor labels = Tensor::from<std::int32_t>(Shape{11}, lab);
  const Optimizer adam = Optimizer::adam(0.01);
  // Loss then every leaf of the parameters and the state after two steps, on host.
  const auto train = [&](const Mesh& mesh, const Executor& exec) {
    const NamedSharding rows(mesh, P("fsdp"), Uneven::kPad);
    std::vector<Tree<Array>> layers;
    for (std::size_t i = 0; i < ws.size(); ++i) {
      layers.push_back(Tree<Array>::dict(
          {{"w", device_put(ws[i], rows, exec)}, {"b", device_put(bs[i], rows, exec)}}));
    }
    Tree<Array> params = Tree<Array>::list(layers);
    Tree<Array> state = adam.init(params);
    auto step = sjit(mesh, [&](const Tree<Array>& p, const Tree<Array>& st, const Array& xb,
                               const Array& yb) {
      const auto [loss, g] = value_and_grad(mlp::loss)(p, xb, yb);
      auto [np, ns] = adam.update(g, st, p);
      return Tree<Array>::dict({{"loss", loss}, {"params", np}, {"state", ns}});
    });
    const Array xa = device_put(x, rows, exec), ya = device_put(labels, rows, exec);
    std::vector<Tensor> out;
    for (int i = 0; i < 2; ++i) {
      const Tree<Array> r = step(params, state, xa, ya);
      out.push_back(r.at("loss").leaf().to_host());
      params = r.at("params");
      state = r.at("state");
    }
    for (const Array& a : params.leaves()) out.push_back(a.to_host());
    for (const Array& a : state.leaves()) out.push_back(a.to_host());
    return out;
  };
  const std::vector<Tensor> want = train(Mesh::parse("fsdp:1", 1), Executor::process_local(1));
  EXPECT_GT(want[0].get(0), want[1].get(0));  // it learns
  for (const int devices : {3, 5, 6, 7}) {
    SCOPED_TRACE("devices " + std::to_string(devices));
    const std::vector<Tensor> got =
        train(Mesh::parse("fsdp:" + std::to_string(devices), devices), executor_of(devices));
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      EXPECT_TRUE(got[k] == want[k]) << "output " << k << ", largest difference "
                                     << max_diff(got[k], want[k]);
    }
  }
}

}  // namespace
}  // namespace shardplan::test
