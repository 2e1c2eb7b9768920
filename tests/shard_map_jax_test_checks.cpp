// JAX's shard_map behaviours ported, continued (numbers of docs/shard_map_behaviours.md, as in
// shard_map_jax_test.cpp): the replication checker (#32 to #39), spec and axis errors, eager
// against sjit, closed-over arrays, nesting in sjit, and gradients (G53 to G66, I68, I71).
#include "shard_map_jax_test.hpp"

namespace shardplan {
namespace {

using namespace test;

// #32 TEST:test_replication_checker_eager (g2).
TEST(ShardMapJax, B32PsumResultAcceptedForReplicatedOut) {
  On m("x:2,y:2", 4);
  Fn f = shard_map([](const Array& b) { return lax::psum(b, "x"); }, m.mesh, {P("x", "y")}, {P(nullptr, "y")});
  const Array y = both(m, f, m.put(arange(Shape{8, 8})));
  EXPECT_EQ(y.shape(), (Shape{4, 8}));
  V want;
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 8; ++c) want.push_back(16 * r + 2 * c + 32);
  }
  EXPECT_EQ(values(y), want);
}

// #33 DOC VMA section, TEST:test_replication_checker_eager, test_vma_out_specs_error_check;
// #39 check off accepts (values not tested: each device keeps its own block here).
TEST(ShardMapJax, B33B39MissingCollectiveIsRefused) {
  On m("i:2", 2);
  const Array x = m.put(arange(Shape{6}));
  Fn id = shard_map([](const Array& b) { return b; }, m.mesh, {P("i")}, {P()});
  EXPECT_THROW_WITH(id(x), SpecError, "output 0", "'i'", "out_specs[0] = PartitionSpec()");
  EXPECT_THROW_WITH(sjit(m.mesh, id)(x), SpecError, "output 0", "'i'");
  Fn off = shard_map([](const Array& b) { return b; }, m.mesh, {P("i")}, {P()}, false);
  EXPECT_EQ(off(x).shape(), (Shape{3}));
  On m2("x:2,y:2", 4);
  Fn twice = shard_map([](const Array& b) { return b * 2.0; }, m2.mesh, {P("x", "y")}, {P(nullptr, "y")});
  EXPECT_THROW_WITH(twice(m2.put(arange(Shape{4, 4}))), SpecError, "'x'");
  On m3("x:2,y:2,z:2", 8);
  Fn three = shard_map([](const Array& b) { return b * 2.0; }, m3.mesh, {P("x", "y", "z")}, {P("x")});
  EXPECT_THROW_WITH(three(m3.put(arange(Shape{4, 2, 2}))), SpecError, "'y'", "'z'", "out_specs[0]");
  On m4("i:4", 4);
  Fn off4 = shard_map([](const Array& b) { return b; }, m4.mesh, {P("i")}, {P()}, false);
  EXPECT_EQ(off4(m4.put(arange(Shape{8}))).shape(), (Shape{2}));
}

// #34 DOC all_gather note; #75 accelerator-microbenchmarks PR #25: all_gather's result may still
// differ, so out P() is refused with the check on and accepted with it off.
TEST(ShardMapJax, B34B75AllGatherToReplicatedOut) {
  On m("x:4", 4);
  const Array x = m.put(arange(Shape{8}));
  Fn on = shard_map([](const Array& b) { return lax::all_gather(b, "x", 0, true); }, m.mesh, {P("x")}, {P()});
  EXPECT_THROW_WITH(on(x), SpecError, "output 0", "'x'");
  Fn off = shard_map([](const Array& b) { return lax::all_gather(b, "x", 0, true); }, m.mesh, {P("x")}, {P()}, false);
  EXPECT_EQ(off(x).shape(), (Shape{8}));
  On m2("x:4,y:2", 8);  // #75: a 2-D gather to P(None, None)
  Fn g = shard_map([](const Array& b) { return lax::all_gather(b, {"x", "y"}, 0, true); }, m2.mesh,
                   {P(AxisNames{"x", "y"}, nullptr)}, {P(nullptr, nullptr)});
  EXPECT_THROW_WITH(g(m2.put(arange(Shape{8, 2}))), SpecError, "output 0");
}

// #35 PAR / JEP17111: ppermute, all_to_all, psum_scatter results vary (Varying -> Varying).
TEST(ShardMapJax, B35CollectivesThatKeepVarying) {
  On m("i:4", 4);
  const Array x = m.put(Tensor::ones(Shape{16}, DType::kF32));
  const std::vector<Fn> bodies = {
      [](const Array& b) { return lax::ppermute(b, "i", {{0, 1}, {1, 2}, {2, 3}, {3, 0}}); },
      [](const Array& b) { return lax::all_to_all(b, "i", 0, 0, true); },
      [](const Array& b) { return lax::psum_scatter(b, "i", 0, true); },
  };
  for (const Fn& body : bodies) {
    Fn f = shard_map(body, m.mesh, {P("i")}, {P()});
    EXPECT_THROW_WITH(f(x), SpecError, "output 0", "'i'");
  }
}

// #36 DOC VMA section, TEST:test_mat_invarying, test_jaxpr_shardings_with_no_outputs.
TEST(ShardMapJax, B36InvariantValuesAccepted) {
  On m("i:2", 2);
  Fn f = shard_map([](const Array& b) { return b * 2.0; }, m.mesh, {P()}, {P()});
  EXPECT_EQ(values(both(m, f, m.put(arange(Shape{6})))), (V{0, 2, 4, 6, 8, 10}));
  On m4("i:4", 4);
  Fn io = shard_map([](const Array& b) { return iota_like(b, 0, DType::kF32); }, m4.mesh, {P()}, {P("i")});
  const Array y = both(m4, io, m4.put(arange(Shape{4})));
  EXPECT_EQ(y.shape(), (Shape{16}));
  EXPECT_EQ(values(y), repeat({0, 1, 2, 3}, 4));
}

// #37 DOC (implicit pcast to varying), TEST:test_rewrite_binops; #74 / #26887: a comparison of
// a varying value with an invariant constant.
TEST(ShardMapJax, B37B74ImplicitPvary) {
  On m("x:4", 4);
  Fn2 f = shard_map([](const Array& a, const Array& b) { return a * b; }, m.mesh, {P(), P("x")}, {P("x")});
  EXPECT_EQ(values(both(m, f, m.put(tensor(Shape{1}, {2})), m.put(arange(Shape{4})))), (V{0, 2, 4, 6}));
  EXPECT_EQ(values(both(m, f, m.put(arange(Shape{1})), m.put(arange(Shape{4})))), (V{0, 0, 0, 0}));
  On g("g:4", 4);
  const Array three = g.put(tensor(Shape{}, {3}));
  Fn gt = shard_map([three](const Array& b) { return greater(b, three); }, g.mesh, {P("g")}, {P("g")});
  const Array y = both(g, gt, g.put(arange(Shape{8})));
  EXPECT_EQ(y.dtype(), DType::kBool);
  EXPECT_EQ(values(y), (V{0, 0, 0, 0, 1, 1, 1, 1}));
}

// #38 DOC pcast section, TEST:test_pvary, test_pvary_eager.
TEST(ShardMapJax, B38ExplicitPvary) {
  On m("x:2", 2);
  const Array x = m.put(arange(Shape{8}));
  Fn f = shard_map([](const Array& b) { return lax::pvary(b, "x"); }, m.mesh, {P()}, {P("x")});
  const Array y = both(m, f, x);
  EXPECT_EQ(y.shape(), (Shape{16}));
  EXPECT_EQ(values(y), repeat({0, 1, 2, 3, 4, 5, 6, 7}, 2));
  Fn rep = shard_map([](const Array& b) { return lax::pvary(b, "x"); }, m.mesh, {P()}, {P()});
  EXPECT_THROW_WITH(rep(x), SpecError, "output 0", "'x'");
  EXPECT_THROW_WITH(lax::pvary(x, "x"), SpecError, "lax.pvary", "outside a shard_map");
}

// ---------------------------------------------------------------- E. errors

// #41 SMAP _spec_rank_error; #42 TEST:test_varargs_error; #43 _check_specs; #44
// _spec_divisibility_error.
TEST(ShardMapJax, B41To44SpecErrors) {
  On m("x:2,y:2", 4);
  const Array x = m.put(Tensor::ones(Shape{8, 8}, DType::kF32));
  Fn rank = shard_map([](const Array& b) { return b; }, m.mesh, {P("x", "y", nullptr)}, {P()});
  EXPECT_THROW_WITH(rank(x), SpecError, "argument 0", "[8, 8]");
  Fn out_rank = shard_map([](const Array& b) { return sum(b); }, m.mesh, {P()}, {P("x")});
  EXPECT_THROW_WITH(out_rank(x), SpecError, "output 0");
  auto three = shard_map([](const Array& a, const Array&, const Array&) { return a; }, m.mesh, {P()}, {P()});
  EXPECT_THROW_WITH(three(x, x, x), SpecError, "1 in_specs for 3 arguments");
  On m2("x:4,y:2", 8);
  Fn unknown = shard_map([](const Array& b) { return b; }, m2.mesh, {P("z")}, {P()});
  EXPECT_THROW_WITH(unknown(m2.put(arange(Shape{8}))), SpecError, "'z'");
  Fn unknown_out = shard_map([](const Array& b) { return b; }, m2.mesh, {P()}, {P("z")});
  EXPECT_THROW_WITH(unknown_out(m2.put(arange(Shape{8}))), SpecError, "'z'");
  On m3("i:4,j:2", 8);
  Fn undiv = shard_map([](const Array& b) { return b; }, m3.mesh, {P("i")}, {P("i")});
  EXPECT_THROW_WITH(undiv(m3.put(arange(Shape{2, 2}))), SpecError, "argument 0", "2");
  Fn undiv2 = shard_map([](const Array& b) { return b; }, m3.mesh, {P(AxisNames{"i", "j"})}, {P(AxisNames{"i", "j"})});
  EXPECT_THROW_WITH(undiv2(m3.put(arange(Shape{4}))), SpecError, "argument 0", "4");
}

// #45 PAR abstract-eval rules: psum_scatter's size preconditions.
TEST(ShardMapJax, B45PsumScatterShapes) {
  On m("i:4", 4);
  const auto run = [&](bool tiled, std::int64_t n) {
    Fn f = shard_map([tiled](const Array& b) { return lax::psum_scatter(b, "i", 0, tiled); }, m.mesh, {P()},
                     {P()}, false);
    return f(m.put(arange(Shape{n})));
  };
  EXPECT_THROW_WITH(run(true, 6), SpecError, "psum_scatter");
  EXPECT_EQ(run(false, 4).shape(), (Shape{}));
  EXPECT_THROW_WITH(run(false, 8), SpecError, "psum_scatter");
  EXPECT_EQ(run(true, 8).shape(), (Shape{2}));
}

// #46 PAR _check_axis_names, TEST:test_psum_not_under_shmap_error: every collective and
// axis_index over an unknown axis, and outside any shard_map (eagerly and under sjit).
TEST(ShardMapJax, B46UnknownAxisAndOutsideShardMap) {
  On m("x:2", 2);
  const Array x = m.put(arange(Shape{4}));
  const std::vector<std::pair<std::string, Fn>> ops = {
      {"psum", [](const Array& b) { return lax::psum(b, "z"); }},
      {"pmean", [](const Array& b) { return lax::pmean(b, "z"); }},
      {"pmax", [](const Array& b) { return lax::pmax(b, "z"); }},
      {"pmin", [](const Array& b) { return lax::pmin(b, "z"); }},
      {"all_gather", [](const Array& b) { return lax::all_gather(b, "z"); }},
      {"psum_scatter", [](const Array& b) { return lax::psum_scatter(b, "z", 0, true); }},
      {"ppermute", [](const Array& b) { return lax::ppermute(b, "z", {}); }},
      {"all_to_all", [](const Array& b) { return lax::all_to_all(b, "z", 0, 0, true); }},
      {"axis_index", [](const Array&) { return lax::axis_index("z"); }},
      {"pvary", [](const Array& b) { return lax::pvary(b, "z"); }},
  };
  for (const auto& [name, op] : ops) {
    Fn f = shard_map(op, m.mesh, {P("x")}, {P("x")}, false);
    EXPECT_THROW_WITH(f(x), SpecError, std::string("lax.") + name, std::string("'z'"));
    EXPECT_THROW_WITH(op(x), SpecError, std::string("lax.") + name, std::string("outside a shard_map"));
  }
  EXPECT_THROW_WITH(sjit(m.mesh, [](const Array& b) { return lax::psum(b, "x"); })(x), SpecError,
                    "lax.psum", "outside a shard_map");
}

// #47 PAR _ppermute_lowering: sources and destinations must be unique.
TEST(ShardMapJax, B47PpermuteDuplicates) {
  On m("i:4", 4);
  const Array x = m.put(arange(Shape{4}));
  for (const std::vector<std::pair<int, int>>& perm :
       {std::vector<std::pair<int, int>>{{0, 1}, {2, 1}}, std::vector<std::pair<int, int>>{{0, 1}, {0, 2}}}) {
    Fn f = shard_map([perm](const Array& b) { return lax::ppermute(b, "i", perm); }, m.mesh, {P("i")}, {P("i")});
    EXPECT_THROW_WITH(f(x), SpecError, "lax.ppermute", "permutation");
  }
}

// ---------------------------------------------------------------- F. eager, sjit, closures

// #49 DOC "it even works eagerly", TEST:test_eager_control_flow: eager and sjit agree (both());
// the data-dependent Python branch becomes a where on the psum.
TEST(ShardMapJax, B49EagerEqualsSjit) {
  On m("x:2,y:2", 4);
  Fn f = shard_map(
      [](const Array& b) {
        const Array s = lax::psum(b, {"x", "y"});  // 6
        return where(less(s, full_like(s, 0.0)), b, -b);
      },
      m.mesh, {P("x", "y")}, {P("x", "y")});
  EXPECT_EQ(values(both(m, f, m.put(arange(Shape{2, 2})))), (V{0, -1, -2, -3}));
}

// #50 DOC (closing over = a P() input), TEST:test_process_env_traces; #64b the closure's
// gradient is the sum over devices.
TEST(ShardMapJax, B50B64ClosedOverArrays) {
  On m("x:4", 4);
  const Array c = m.put(tensor(Shape{}, {3}, DType::kF64));
  const Array x = m.put(arange(Shape{8}, DType::kF64));
  const auto body_of = [&m](const Array& cc) {
    return Fn(shard_map([cc](const Array& b) { return b * 2.0 * cc; }, m.mesh, {P("x")}, {P("x")}));
  };
  EXPECT_EQ(values(both(m, body_of(c), x)), (V{0, 6, 12, 18, 24, 30, 36, 42}));
  Fn rep = shard_map([c](const Array& b) { return full_like(b, 1.0) * c; }, m.mesh, {P()}, {P()});
  EXPECT_EQ(values(both(m, rep, m.put(tensor(Shape{1}, {0}, DType::kF64)))), (V{3}));
  // d/dc sum(2 x c) = 2 sum(x) = 56; d/dx = 6.
  EXPECT_EQ(grad_checked(m, [&](const Array& cc) { return body_of(cc)(x); }, c), (V{56}));
  EXPECT_EQ(grad_checked(m, body_of(c), x), V(8, 6));
  // #64a TEST:test_post_process_partial_eval_with_scalar_res: sin of a closed-over 2.0, out P().
  On m2("x:4,y:2", 8);
  const Array d = m2.dummy();
  const Fn closed = [&m2, d](const Array& cc) {
    return Fn(shard_map([cc](const Array&) { return sin(cc); }, m2.mesh, {P()}, {P()}))(d);
  };
  expect_near(grad_checked(m2, closed, m2.put(tensor(Shape{}, {2}, DType::kF64))), {std::cos(2.0)}, 1e-12);
}

// #51 DOC (composable with jit), TEST:test_partial_auto: automatic partitioning around it; and
// TEST:test_outer_jit_detects_shard_map_mesh.
TEST(ShardMapJax, B51NestedInSjit) {
  On m("x:4,y:2", 8);
  Fn2 basic = shard_map([](const Array& ab, const Array& bb) { return lax::psum(matmul(ab, bb), "y"); },
                        m.mesh, {P("x", "y"), P("y", nullptr)}, {P("x", nullptr)});
  auto g = sjit(m.mesh, [&](const Array& a, const Array& b) { return basic(a * 2.0, b) + 1.0; });
  const Array y = g(m.put(arange(Shape{8, 16})), m.put(arange(Shape{16, 4})));
  const V v = values(y);
  EXPECT_EQ(V(v.begin(), v.begin() + 4), (V{9921, 10161, 10401, 10641}));
  EXPECT_EQ(v[31], 128913);
  On m2("x:2,y:2", 4);
  Fn s = shard_map([](const Array& b) { return reshape(b, Shape{1}); }, m2.mesh, {P()}, {P("x")});
  EXPECT_EQ(values(both(m2, s, m2.put(tensor(Shape{}, {2})))), (V{2, 2}));
}

// #52 TEST:test_returned_out_sharding, test_same_pspec_eager_shard_map.
TEST(ShardMapJax, B52ReturnedShardingFollowsOutSpecs) {
  On m("x:4,y:2", 8);
  const Array z = m.put(Tensor::zeros(Shape{8, 4}, DType::kF32), P("x", "y"));
  for (const PartitionSpec& out : {P("x", "y"), P(nullptr, "y")}) {
    Fn f = shard_map([](const Array& b) { return b; }, m.mesh, {P("x", "y")}, {out}, false);
    EXPECT_EQ(f(z).sharding().spec(), out);
  }
  Fn r = shard_map([](const Array& b) { return lax::psum(b, {"x", "y"}); }, m.mesh, {P("x", "y")}, {P()});
  const Array y = r(z);
  EXPECT_EQ(y.sharding().spec(), P());
  EXPECT_EQ(values(y), V(4, 0));
}

// ---------------------------------------------------------------- G. gradients

// #53 JEP17111 Example 1, TEST:test_fanin_psum_transposes_to_fanout (check on and off).
TEST(ShardMapJax, G53GradPsumShardedInReplicatedOut) {
  On m("i:4", 4);
  const Array x = m.put(arange(Shape{8}, DType::kF64));
  for (bool check : {true, false}) {
    Fn f = shard_map([](const Array& b) { return lax::psum(b, "i"); }, m.mesh, {P("i")}, {P()}, check);
    EXPECT_EQ(values(both(m, f, x)), (V{12, 16}));
    EXPECT_EQ(grad_checked(m, f, x), V(8, 1));
    EXPECT_EQ(grad_checked(m, f, x, tensor(Shape{2}, {1, 10}, DType::kF64)), repeat({1, 10}, 4));
  }
}

// #54 TEST:test_psum_with_implicit_fanout_self_transposes, JEP17111 Example 2.
TEST(ShardMapJax, G54GradPsumShardedInTiledOut) {
  On m("i:4", 4);
  const Array x = m.put(arange(Shape{8}, DType::kF64));
  for (bool check : {true, false}) {  // the same with the check off (vma-tracked transposes)
    Fn f = shard_map([](const Array& b) { return lax::psum(b, "i"); }, m.mesh, {P("i")}, {P("i")}, check);
    EXPECT_EQ(values(both(m, f, x)), repeat({12, 16}, 4));
    EXPECT_EQ(grad_checked(m, f, x), V(8, 4));
    EXPECT_EQ(grad_checked(m, f, x, arange(Shape{8}, DType::kF64)), repeat({12, 16}, 4));
  }
}

// #55 JEP17111 Example 3, TEST:test_transpose_identity ("cursed identity"); #56
// TEST:test_fanout_specs_transpose_to_psum.
TEST(ShardMapJax, G55G56ReplicatedInIdentity) {
  On m("x:4", 4);
  Fn id = shard_map([](const Array& b) { return b; }, m.mesh, {P()}, {P()});
  const Array x = m.put(arange(Shape{4}, DType::kF64));
  EXPECT_EQ(values(both(m, id, x)), (V{0, 1, 2, 3}));
  EXPECT_EQ(grad_checked(m, id, x), V(4, 1));
  const Array x2 = m.put(arange(Shape{2}, DType::kF64));
  for (bool check : {true, false}) {
    Fn fan = shard_map([](const Array& b) { return b; }, m.mesh, {P()}, {P("x")}, check);
    EXPECT_EQ(values(both(m, fan, x2)), repeat({0, 1}, 4));
    EXPECT_EQ(grad_checked(m, fan, x2), (V{4, 4}));
    EXPECT_EQ(grad_checked(m, fan, x2, arange(Shape{8}, DType::kF64)), (V{12, 16}));
  }
}

// #57 TEST:test_pvary: pvary's gradient is a psum.
TEST(ShardMapJax, G57GradPvary) {
  On m("x:4", 4);
  Fn f = shard_map([](const Array& b) { return lax::pvary(b, "x"); }, m.mesh, {P()}, {P("x")});
  const Array x = m.put(arange(Shape{8}, DType::kF64));
  EXPECT_EQ(both(m, f, x).shape(), (Shape{32}));
  EXPECT_EQ(grad_checked(m, f, x), V(8, 4));
}

// #58 JEP17111 "Motivation": a data-parallel loss with pmean.
TEST(ShardMapJax, G58PmeanDataParallel) {
  On m("batch:4", 4);
  const Array w = m.put(tensor(Shape{2, 1}, {1, 2}, DType::kF64));
  const Array xs = m.put(arange(Shape{4, 2}, DType::kF64));
  Fn2 loss = shard_map([](const Array& wb, const Array& xb) { return lax::pmean(sum(matmul(xb, wb)), "batch"); },
                       m.mesh, {P(), P("batch", nullptr)}, {P()});
  EXPECT_EQ(values(both(m, loss, w, xs)), (V{11}));
  EXPECT_EQ(grad_checked(m, [&](const Array& v) { return loss(v, xs); }, w), (V{3, 4}));
  EXPECT_EQ(grad_checked(m, [&](const Array& v) { return loss(w, v); }, xs), repeat({0.25, 0.5}, 4));
  Fn mean = shard_map([](const Array& b) { return lax::pmean(b, "batch"); }, m.mesh, {P("batch")}, {P()});
  EXPECT_EQ(grad_checked(m, mean, m.put(arange(Shape{8}, DType::kF64))), V(8, 0.25));
}

// #59 JEP17111 Example 5: all_gather transposes to psum_scatter; #61 psum_scatter to all_gather.
TEST(ShardMapJax, G59G61GradAllGatherAndPsumScatter) {
  On m("i:4", 4);
  Fn g = shard_map([](const Array& b) { return lax::all_gather(b, "i", 0, true); }, m.mesh, {P("i")}, {P("i")});
  const Array x = m.put(arange(Shape{4}, DType::kF64));
  EXPECT_EQ(grad_checked(m, g, x), V(4, 4));
  EXPECT_EQ(grad_checked(m, g, x, arange(Shape{16}, DType::kF64)), (V{24, 28, 32, 36}));
  On two("i:2", 2);
  Fn s = shard_map([](const Array& b) { return lax::psum_scatter(b, "i", 0, true); }, two.mesh, {P("i")}, {P("i")});
  const Array x8 = two.put(arange(Shape{8}, DType::kF64));
  EXPECT_EQ(values(both(two, s, x8)), (V{4, 6, 8, 10}));
  EXPECT_EQ(grad_checked(two, s, x8, tensor(Shape{4}, {1, 2, 3, 4}, DType::kF64)), (V{1, 2, 3, 4, 1, 2, 3, 4}));
}

// #62 PAR _ppermute_transpose_rule: the inverse permutation; a partial one gives zeros.
TEST(ShardMapJax, G62GradPpermute) {
  On m("i:4", 4);
  const Array x = m.put(arange(Shape{4}, DType::kF64));
  const Tensor c = tensor(Shape{4}, {10, 20, 30, 40}, DType::kF64);
  Fn ring = shard_map([](const Array& b) { return lax::ppermute(b, "i", {{0, 1}, {1, 2}, {2, 3}, {3, 0}}); },
                      m.mesh, {P("i")}, {P("i")});
  EXPECT_EQ(values(both(m, ring, x)), (V{3, 0, 1, 2}));
  EXPECT_EQ(grad_checked(m, ring, x, c), (V{20, 30, 40, 10}));
  Fn one = shard_map([](const Array& b) { return lax::ppermute(b, "i", {{0, 1}}); }, m.mesh, {P("i")}, {P("i")});
  EXPECT_EQ(values(both(m, one, x)), (V{0, 0, 0, 0}));
  EXPECT_EQ(grad_checked(m, one, x, c), (V{20, 0, 0, 0}));
}

// #63 PAR _all_to_all_transpose_rule, TEST:test_all_to_all_grad.
TEST(ShardMapJax, G63GradAllToAll) {
  On m("x:4", 4);
  Fn f = shard_map([](const Array& b) { return lax::all_to_all(b, "x", 1, 0, true); }, m.mesh,
                   {P("x", nullptr)}, {P(nullptr, "x")});
  const Array a = m.put(arange(Shape{8, 8}, DType::kF64));
  Tensor twos(Shape{8, 8}, DType::kF64);
  for (std::int64_t i = 0; i < 64; ++i) twos.set(i, 2);
  EXPECT_EQ(sum(both(m, f, a) * 2.0).to_host().get(0), 4032);
  EXPECT_EQ(grad_checked(m, f, a, twos), V(64, 2));
  On two("i:2", 2);
  Fn g = shard_map([](const Array& b) { return lax::all_to_all(b, "i", 0, 1, true); }, two.mesh,
                   {P("i", nullptr)}, {P("i", nullptr)});
  EXPECT_EQ(grad_checked(two, g, two.put(arange(Shape{4, 2}, DType::kF64)), arange(Shape{2, 4}, DType::kF64)),
            (V{0, 1, 4, 5, 2, 3, 6, 7}));
}

// #65 TEST:test_reverse_mode_ad: mixed sharded / replicated inputs; 'y' left out of out_specs
// counts its copies once.
TEST(ShardMapJax, G65MixedReplicatedAndSharded) {
  On m("x:2,y:2", 4);
  Tensor xt = arange(Shape{8}, DType::kF64), yt = arange(Shape{4}, DType::kF64);
  for (int i = 0; i < 8; ++i) xt.set(i, i / 10.0);
  for (int i = 0; i < 4; ++i) yt.set(i, i / 10.0);
  const Array x = m.put(xt), y = m.put(yt);
  Fn2 f = shard_map([](const Array& a, const Array& b) { return sin(a) + 3.0 + std::tan(2.0) * cos(a) + b; },
                    m.mesh, {P("x"), P(nullptr)}, {P("x")});
  V fwd;
  for (int k = 0; k < 8; ++k) fwd.push_back(std::sin(k / 10.0) + 3 + std::tan(2.0) * std::cos(k / 10.0) + (k % 4) / 10.0);
  expect_near(values(both(m, f, x, y)), fwd, 1e-12);
  expect_near(grad_checked(m, [&](const Array& v) { return f(x, v); }, y), {2, 2, 2, 2});
  V gx;
  for (int k = 0; k < 8; ++k) gx.push_back(std::cos(k / 10.0) - std::tan(2.0) * std::sin(k / 10.0));
  expect_near(grad_checked(m, [&](const Array& v) { return f(v, y); }, x), gx);
  EXPECT_NEAR(gx[0], 1.0, 1e-15);
}

// #66 / #70 (#7167): JAX has no pmax/pmin rule; shardplan's decision: the cotangent goes to the
// device(s) holding the extreme value, shared equally on a tie (what central differences give
// along the tied elements: (max(5 + h, 5) - max(5 - h, 5)) / 2h = 1/2); a replicated input,
// which every device holds, gets the whole cotangent back (the identity's derivative, 1).
TEST(ShardMapJax, G66PmaxPminGradients) {
  On m("i:4", 4);
  const Array x = m.put(arange(Shape{8}, DType::kF64));
  Fn mx = shard_map([](const Array& b) { return lax::pmax(b, "i"); }, m.mesh, {P("i")}, {P()});
  Fn mn = shard_map([](const Array& b) { return lax::pmin(b, "i"); }, m.mesh, {P("i")}, {P()});
  EXPECT_EQ(grad_checked(m, mx, x), (V{0, 0, 0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(grad_checked(m, mn, x, tensor(Shape{2}, {5, 7}, DType::kF64)), (V{5, 7, 0, 0, 0, 0, 0, 0}));
  const Array tie = m.put(tensor(Shape{4}, {1, 5, 5, 2}, DType::kF64));
  const auto g = value_and_grad([&](const Array& v) { return sum(mx(v)); })(tie).second;
  EXPECT_EQ(values(g), (V{0, 0.5, 0.5, 0}));
  Fn same = shard_map([](const Array& b) { return lax::pmax(b, "i"); }, m.mesh, {P()}, {P()});
  EXPECT_EQ(grad_checked(m, same, tie), (V{1, 1, 1, 1}));
}

// ---------------------------------------------------------------- I. issues

// #68 / #3970: grad inside the function of a psum'd loss of an invariant w: the total
// derivative on every device (JAX with check_vma=False / pmap gives [0, 4]; shardplan always
// uses the vma-tracked transposes, with the check on or off).
TEST(ShardMapJax, I68GradOfPsumInsideTheFunction) {
  On m("batch:2", 2);
  const Array w = m.put(tensor(Shape{1}, {1}, DType::kF64));
  const Array d = m.put(arange(Shape{2}, DType::kF64));
  for (bool check : {true, false}) {
    Fn2 f = shard_map(
        [](const Array& wb, const Array& db) {
          return value_and_grad([&](const Array& v) { return sum(lax::psum((v * v + 1.0) * db, "batch")); })(wb)
              .second;
        },
        m.mesh, {P(), P("batch")}, {P("batch")}, check);
    EXPECT_EQ(values(both(m, f, w, d)), (V{2, 2}));
  }
}

// #71 / #36886: per-sample gradients w.r.t. closed-over params (vmap replaced by one sample per
// device): the gradient w.r.t. an invariant value is summed over devices; after pvary it is
// each device's own.
TEST(ShardMapJax, I71GradOfClosedOverParamsInside) {
  On m("devices:4", 4);
  const Array params = m.put(tensor(Shape{2}, {1, 2}, DType::kF64));
  const Array samples = m.put(tensor(Shape{4, 2}, {0, 1, 1, 1, 1, 0, 0, 0}, DType::kF64));
  for (bool vary : {false, true}) {
    Fn f = shard_map(
        [params, vary](const Array& s) {
          const Array p0 = vary ? lax::pvary(params, "devices") : params;
          return reshape(value_and_grad([&](const Array& p) { return sum(p * reshape(s, Shape{2})); })(p0).second,
                         Shape{1, 2});
        },
        m.mesh, {P("devices")}, {P("devices")});
    const V want = vary ? V{0, 1, 1, 1, 1, 0, 0, 0} : repeat({2, 2}, 4);
    EXPECT_EQ(values(both(m, f, samples)), want);
  }
}

}  // namespace
}  // namespace shardplan
