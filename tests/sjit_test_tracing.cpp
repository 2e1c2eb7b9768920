// sjit's tracing: nested sjit, None and unspecified shardings, mesh contexts, the cache entry of a
// call, lower() on abstract arguments, registered structs, escaping tracers, captured arrays,
// the guide's MLP loss, and errors naming the argument and the leaf's path.
#include "sjit_test.hpp"

namespace shardplan {
namespace {

using namespace test;

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
