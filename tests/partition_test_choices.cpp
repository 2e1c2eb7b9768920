// The partitioner: dots, reshards made once, outputs, remade broadcasts and the text (the rest
// of partition_test.cpp).
#include "partition_test.hpp"

namespace shardplan::detail {
namespace {

using ::testing::ElementsAre;

TEST(Partition, SplitsAPointwiseUpdateOverAPendingGradient) {
  // exp(w - g), w f32[8, 4] (128 bytes) replicated, g a sum pending over x: g is
  // reduce-scattered (64 bytes) instead of all-reduced (128), w sliced locally, the subtraction
  // and exp run on 4 of the 8 rows, and only exp's result, which the replicated output needs
  // whole, is all-gathered (64 bytes). The difference in between is never gathered.
  const Case c(x2(), {whole({8, 4}), pending({8, 4})},
               [](const auto& a) { return std::vector{exp(a[0] - a[1])}; });
  const ValueId w = c.input(0), g = c.input(1);
  const ValueId diff = c.node(prim::sub), e = c.node(prim::exp);
  EXPECT_THAT(c.collectives(),
              ElementsAre(c.collective("reduce_scatter", g, 64), c.collective("all_gather", e, 64)))
      << c.text();
  for (const ValueId v : {diff, e}) {
    const Step* k = c.kernel(v);
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->sharding->spec(), P("x")) << value_name(v);
    EXPECT_EQ(k->local.type.shape, (Shape{4, 4})) << value_name(v);
    EXPECT_TRUE(k->pending.empty()) << value_name(v);
  }
  ASSERT_EQ(c.reshards(w).size(), 1u);
  EXPECT_EQ(c.reshards(w)[0]->sharding->spec(), P("x"));
  EXPECT_TRUE(c.reshards(diff).empty()) << c.text();
  EXPECT_EQ(c.prog().output_shardings()[0].spec(), P());
  c.expect_values();
}

// ---- A dot: an axis claimed by a reduce factor or by a pass factor ----------------------------
// x [8, K] split over x along its contraction, w [K, N] replicated, the output split over x by
// rows: the axis x is wanted both by the contraction (where x has it) and by the rows (where the
// output wants it). The partitioner prices both and keeps the cheaper.

TEST(Partition, ADotReducesOverTheSplitContractionWhenThatMovesFewerBytes) {
  // K = 16, N = 4. Contraction first: w sliced locally, each device's product of f32[8, 4] a
  // partial sum, reduce-scattered to the output's rows: (2 - 1) * f32[4, 4] = 64 bytes. Rows
  // first would move x from [8, 8] column blocks to [4, 16] row blocks (all-to-all: each device
  // receives the 4 x 8 elements it lacks, 128 bytes).
  const Case c(x2(), {Arg{{{8, 16}, DType::kF32}, P(nullptr, "x"), {}}, whole({16, 4})},
               [](const auto& a) { return std::vector{matmul(a[0], a[1])}; }, {P("x")});
  const ValueId dot = c.node(prim::dot_general);
  const Step* k = c.kernel(dot);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->pending, sum_over("x")) << c.text();
  EXPECT_EQ(k->sharding->spec(), P());
  EXPECT_EQ(k->local.type.shape, (Shape{8, 4}));
  EXPECT_TRUE(c.reshards(c.input(0)).empty()) << c.text();
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("reduce_scatter", dot, 64))) << c.text();
  EXPECT_EQ(c.prog().output_shardings()[0].spec(), P("x"));
  c.expect_values();
}

// Contested axes on a two-axis mesh (x:2, y:2): a mesh axis both a pass factor and a reduce
// factor of one dot want. Worked out by hand, bytes a device receives.
Mesh xy() { return Mesh::parse("x:2,y:2", 4); }

TEST(Partition, OnTwoAxesAContestedAxisGoesToTheReduceFactorWhenThatMovesFewerBytes) {
  // a f32[8, 64] columns over x, b f32[64, 8] rows over x and columns over y, the output wanted
  // P('x', 'y'): x is wanted by the rows (a pass factor, the output's) and by the contraction
  // (a reduce factor, both operands'). Contraction first: each device multiplies its [8, 32] by
  // its [32, 4], a partial sum of f32[8, 4] (128 bytes) reduce-scattered over x to the output's
  // [4, 4] blocks: 64 bytes. Rows first: a moved to row blocks (all-to-all, [4, 32] received:
  // 512 bytes) and b gathered over x ([32, 4] received: 512 bytes): 1024.
  const Case c(xy(),
               {Arg{{{8, 64}, DType::kF32}, P(nullptr, "x"), {}},
                Arg{{{64, 8}, DType::kF32}, P("x", "y"), {}}},
               [](const auto& a) { return std::vector{matmul(a[0], a[1])}; }, {P("x", "y")});
  const ValueId dot = c.node(prim::dot_general);
  const Step* k = c.kernel(dot);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->pending, sum_over("x")) << c.text();
  EXPECT_EQ(k->local.type.shape, (Shape{8, 4}));
  EXPECT_TRUE(c.reshards(c.input(0)).empty()) << c.text();
  EXPECT_TRUE(c.reshards(c.input(1)).empty()) << c.text();
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("reduce_scatter", dot, 64))) << c.text();
  EXPECT_EQ(c.prog().output_shardings()[0].spec(), P("x", "y"));
  c.expect_values();
}

TEST(Partition, OnTwoAxesAContestedAxisGoesToThePassFactorWhenThatMovesFewerBytes) {
  // a f32[16, 16] rows over x, b f32[16, 16] rows over x and columns over y, the output wanted
  // P('x', 'y'). Rows first: a as it is, b gathered over x to [16, 8] column blocks ([8, 8]
  // received: 256 bytes), each device's product its output block, nothing pending. Contraction
  // first: a moved to column blocks (all-to-all, [8, 8] received: 256 bytes) and the partial
  // sums of f32[16, 8] reduce-scattered over x (256 bytes): 512.
  const Case c(xy(),
               {Arg{{{16, 16}, DType::kF32}, P("x"), {}},
                Arg{{{16, 16}, DType::kF32}, P("x", "y"), {}}},
               [](const auto& a) { return std::vector{matmul(a[0], a[1])}; }, {P("x", "y")});
  const ValueId dot = c.node(prim::dot_general);
  const Step* k = c.kernel(dot);
  ASSERT_NE(k, nullptr);
  EXPECT_TRUE(k->pending.empty()) << c.text();
  EXPECT_EQ(k->local.type.shape, (Shape{8, 8}));
  EXPECT_TRUE(c.reshards(c.input(0)).empty()) << c.text();
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("all_gather", c.input(1), 256)))
      << c.text();
  EXPECT_EQ(c.prog().output_shardings()[0].spec(), P("x", "y"));
  c.expect_values();
}

TEST(Partition, ADotSplitsItsRowsWhenThatMovesFewerBytes) {
  // K = 4, N = 16. Rows first: x moved from [8, 2] column blocks to [4, 4] row blocks
  // (all-to-all: each device receives the 4 x 2 elements it lacks, 32 bytes), then each device
  // computes its 4 rows whole. Contraction first would reduce-scatter a partial f32[8, 16]:
  // (2 - 1) * f32[4, 16] = 256 bytes.
  const Case c(x2(), {Arg{{{8, 4}, DType::kF32}, P(nullptr, "x"), {}}, whole({4, 16})},
               [](const auto& a) { return std::vector{matmul(a[0], a[1])}; }, {P("x")});
  const ValueId dot = c.node(prim::dot_general);
  const Step* k = c.kernel(dot);
  ASSERT_NE(k, nullptr);
  EXPECT_TRUE(k->pending.empty()) << c.text();
  EXPECT_EQ(k->sharding->spec(), P("x"));
  EXPECT_EQ(k->local.type.shape, (Shape{4, 16}));
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("all_to_all", c.input(0), 32))) << c.text();
  c.expect_values();
}

// ---- Reshards, outputs, sharding identities --------------------------------------------------

TEST(Partition, ReshardsAnOperandOncePerShardingAndReusesIt) {
  // exp and sin both need p reduced (f32[3, 5]: no split): one all-reduce of 60 bytes, read by
  // both, not one each.
  const Case c(x2(), {pending({3, 5})}, [](const auto& a) {
    return std::vector{exp(a[0]), sin(a[0])};
  });
  const ValueId p = c.input(0);
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("all_reduce", p, 60))) << c.text();
  const auto r = c.reshards(p);
  ASSERT_EQ(r.size(), 1u);
  for (const Primitive* op : {&prim::exp, &prim::sin}) {
    const Step* k = c.kernel(c.node(*op));
    ASSERT_NE(k, nullptr);
    EXPECT_THAT(k->in, ElementsAre(r[0]->out)) << op->name;
  }
  EXPECT_EQ(c.prog().cost().bytes_by_kind.at(CollectiveKind::kAllReduce), 60);
  c.expect_values();
}

TEST(Partition, DeliversOutputsInTheirShardingsWithNothingPending) {
  // f32[4, 6] (96 bytes). p + q stays pending and is reduce-scattered to its out_shardings
  // P('x') ((2 - 1) * f32[2, 6] = 48 bytes); p returned as it is, open, is all-reduced to the
  // sharding propagation gave it (replicated, 96 bytes). Neither output is pending.
  const Case c(x2(), {pending({4, 6}), pending({4, 6})},
               [](const auto& a) {
                 return std::vector{a[0] + a[1], a[0]};
               },
               {P("x"), std::nullopt});
  const ValueId sum = c.node(prim::add), p = c.input(0);
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("reduce_scatter", sum, 48),
                                           c.collective("all_reduce", p, 96)))
      << c.text();
  ASSERT_EQ(c.prog().output_shardings().size(), 2u);
  EXPECT_EQ(c.prog().output_shardings()[0].spec(), P("x"));
  EXPECT_EQ(c.prog().output_shardings()[1].spec(), P());
  c.expect_values();
}

TEST(Partition, ShardingIdentitiesEmitNoKernelStep) {
  // A constraint is its operand resharded: x [4, 6] replicated sliced locally to P('x') (no
  // bytes), p pending reduce-scattered to it ((2 - 1) * f32[2, 6] = 48 bytes). No kernel step
  // runs for either constraint; exp runs on the slice.
  const Case c(x2(), {whole({4, 6}), pending({4, 6})}, [](const auto& a) {
    return std::vector{exp(with_sharding_constraint(a[0], P("x"))),
                       with_sharding_constraint(a[1], P("x"))};
  });
  for (const Step& st : c.steps()) {
    if (st.kind == Step::Kind::kKernel) {
      EXPECT_FALSE(st.local.op->sharding_identity) << value_name(st.node) << "\n" << c.text();
    }
  }
  EXPECT_TRUE(c.kernels(c.node(prim::sharding_constraint, 0)).empty());
  EXPECT_TRUE(c.kernels(c.node(prim::sharding_constraint, 1)).empty());
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("reduce_scatter", c.input(1), 48)))
      << c.text();
  const Step* k = c.kernel(c.node(prim::exp));
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->local.type.shape, (Shape{2, 6}));
  ASSERT_EQ(c.reshards(c.input(0)).size(), 1u);
  EXPECT_THAT(k->in, ElementsAre(c.reshards(c.input(0))[0]->out));
  // Two reshards and exp: nothing else runs.
  EXPECT_EQ(c.steps().size(), 3u) << c.text();
  c.expect_values();
}

TEST(Partition, RemakesABroadcastInTheShardingOfItsOneSplitUser) {
  // (w - g) + broadcast(b): the update runs split over x (g reduce-scattered, 64 bytes), so the
  // add wants the bias broadcast in P('x'). The broadcast, read by that add only, is made again
  // in P('x') (each device broadcasts b to its [4, 4] rows) instead of being made whole and
  // sliced: one broadcast step, on [4, 4] blocks, no reshard of it. The result is all-gathered
  // for the replicated output (64 bytes).
  const Case c(x2(), {whole({8, 4}), pending({8, 4}), whole({4})}, [](const auto& a) {
    const Array u = a[0] - a[1];
    return std::vector{u + broadcast_in_dim(a[2], Shape{8, 4}, {1})};
  });
  const ValueId bias = c.node(prim::broadcast_in_dim);
  const Step* k = c.kernel(bias);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->sharding->spec(), P("x"));
  EXPECT_EQ(k->local.type.shape, (Shape{4, 4}));
  EXPECT_TRUE(c.reshards(bias).empty()) << c.text();
  EXPECT_TRUE(c.reshards(c.input(2)).empty()) << c.text();
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("reduce_scatter", c.input(1), 64),
                                           c.collective("all_gather", c.output(0), 64)))
      << c.text();
  // Per device: the subtraction and the add on 16 elements each; a broadcast has no FLOPs.
  EXPECT_DOUBLE_EQ(c.prog().cost().flops[0], 32.0);
  c.expect_values();
}

TEST(Partition, ARemadeBroadcastLeavesNoReshardThatNothingReads) {
  // As above with the bias a sum pending over x, broadcast along the rows ([8] -> [8, 4], dims
  // {0}). Made first in its propagated sharding (replicated), the broadcast would read the bias
  // all-reduced (32 bytes); made again for the split add (P('x')), it reads the bias
  // reduce-scattered ((2 - 1) * f32[4] = 16 bytes). The first one's all-reduce then serves
  // nothing: it must not run, nor count. What runs: g reduce-scattered (64), the bias
  // reduce-scattered (16), the result all-gathered (64).
  const Case c(x2(), {whole({8, 4}), pending({8, 4}), pending({8})}, [](const auto& a) {
    const Array u = a[0] - a[1];
    return std::vector{u + broadcast_in_dim(a[2], Shape{8, 4}, {0})};
  });
  const ValueId bias = c.node(prim::broadcast_in_dim);
  const Step* k = c.kernel(bias);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->sharding->spec(), P("x"));
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("reduce_scatter", c.input(1), 64),
                                           c.collective("reduce_scatter", c.input(2), 16),
                                           c.collective("all_gather", c.output(0), 64)))
      << c.text();
  EXPECT_EQ(c.prog().cost().bytes_by_kind.count(CollectiveKind::kAllReduce), 0u) << c.text();
  // Every step's result is read by a later step, or is an output.
  for (std::size_t i = 0; i < c.steps().size(); ++i) {
    const Step& st = c.steps()[i];
    bool read = std::find(c.graph().outputs.begin(), c.graph().outputs.end(), st.node) !=
                c.graph().outputs.end();
    for (std::size_t j = i + 1; j < c.steps().size() && !read; ++j) {
      const auto& in = c.steps()[j].in;
      read = std::find(in.begin(), in.end(), st.out) != in.end();
    }
    EXPECT_TRUE(read) << "step " << i << " (" << value_name(st.node) << ") is read by nothing\n"
                      << c.text();
  }
  c.expect_values();
}

// ---- The text shows what runs ----------------------------------------------------------------

// The sharding printed on value v's line of Program::text(): the text between the value's type
// and " <- " (its origin), trimmed.
std::string printed_sharding(const std::string& text, ValueId v, const TensorType& type) {
  std::istringstream in(text);
  const std::string head = value_name(v) + " = ";
  const std::string t = to_string(type);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("steps:", 0) == 0) break;
    const std::size_t at = line.find_first_not_of(' ');
    if (at == std::string::npos || line.compare(at, head.size(), head) != 0) continue;
    const std::size_t ty = line.find(t, at + head.size());
    const std::size_t arrow = line.find(" <- ", ty);
    if (ty == std::string::npos || arrow == std::string::npos) return "(line not understood)";
    std::string s = line.substr(ty + t.size(), arrow - ty - t.size());
    s.erase(0, s.find_first_not_of(' '));
    s.erase(s.find_last_not_of(' ') + 1);
    return s;
  }
  return "(no line)";
}

// Each value's line of the text shows the sharding of the kernel step that computes it (its
// PartitionSpec, optionally followed by more after a space), and each input's the sharding it is
// bound in.
void expect_text_shows_what_runs(const Case& c) {
  const std::string text = c.prog().text();
  for (const Step& st : c.steps()) {
    if (st.kind != Step::Kind::kKernel) continue;
    const std::string want = st.sharding->spec().to_string();
    const std::string got = printed_sharding(text, st.node, c.graph()[st.node].type);
    EXPECT_TRUE(got == want || got.rfind(want + " ", 0) == 0)
        << value_name(st.node) << " runs with " << want << " but the text shows " << got << "\n"
        << text;
  }
  for (std::size_t k = 0; k < c.prog().input_shardings().size(); ++k) {
    const ValueId in = c.input(static_cast<int>(k));
    const std::string want = c.prog().input_shardings()[k].spec().to_string();
    const std::string got = printed_sharding(text, in, c.graph()[in].type);
    EXPECT_TRUE(got == want || got.rfind(want + " ", 0) == 0)
        << value_name(in) << " is bound in " << want << " but the text shows " << got;
  }
}

TEST(Partition, TheTextShowsTheShardingEachStepRunsWith) {
  {
    SCOPED_TRACE("a split update: propagated replicated, runs split over x");
    const Case c(x2(), {whole({8, 4}), pending({8, 4})},
                 [](const auto& a) { return std::vector{exp(a[0] - a[1])}; });
    expect_text_shows_what_runs(c);
  }
  {
    SCOPED_TRACE("a dot reduced first: propagated P('x'), runs replicated and pending");
    const Case c(x2(), {Arg{{{8, 16}, DType::kF32}, P(nullptr, "x"), {}}, whole({16, 4})},
                 [](const auto& a) { return std::vector{matmul(a[0], a[1])}; }, {P("x")});
    expect_text_shows_what_runs(c);
  }
}

// ---- The explicit rematerialisation barrier -----------------------------------------------------
// w f32[8, 8] (256 B) sharded over x by rows (128 B a device); x f32[4, 8] replicated. The weight
// is used twice, gathered (P()), around a large temporary: e = exp(broadcast(x @ w)) over
// [64, 4, 8] (8 KiB a device, twice with its broadcast), summed. Read the second time through
// optimization_barrier, the weight is gathered again for its second use instead of kept gathered
// across the temporary: one more all-gather (128 B a device), the same FLOPs, no step of its own,
// and a peak lower by exactly the gathered weight (256 B), the one value live at the peak (the
// temporary's exp) in one program and not the other.
Case barrier_case(bool barrier) {
  return Case(
      x2(), {whole({4, 8}), Arg{{{8, 8}, DType::kF32}, P("x"), {}}}, [barrier](const auto& a) {
        const Array w1 = with_sharding_constraint(a[1], P());
        const Array y = matmul(a[0], w1);
        const Array e = exp(broadcast_in_dim(y, Shape{64, 4, 8}, {1, 2}));
        const Array m = sum(e, {0});
        const Array w2 = with_sharding_constraint(barrier ? optimization_barrier(a[1]) : a[1], P());
        return std::vector{matmul(m, w2)};
      });
}

TEST(Partition, AnOptimizationBarrierGathersTheWeightAgainWhereItIsUsed) {
  const Case plain = barrier_case(false);
  const Case regathered = barrier_case(true);
  const ValueId w = plain.input(1);
  EXPECT_THAT(plain.collectives(), ElementsAre(plain.collective("all_gather", w, 128)))
      << plain.text();
  const ValueId b = regathered.node(prim::optimization_barrier);
  EXPECT_THAT(regathered.collectives(),
              ElementsAre(regathered.collective("all_gather", regathered.input(1), 128),
                          regathered.collective("all_gather", b, 128)))
      << regathered.text();
  // No step computes the barrier: its value is the weight's shard, taken as it is.
  EXPECT_TRUE(regathered.kernels(b).empty()) << regathered.text();
  EXPECT_EQ(regathered.prog().cost().flops, plain.prog().cost().flops);
  // Two dots of 2 * 4 * 8 * 8, the exp over 64 * 4 * 8 and its sum.
  EXPECT_EQ(plain.prog().cost().flops[0], 2 * (2 * 4 * 8 * 8) + 64 * 4 * 8 + 64 * 4 * 8);
  EXPECT_EQ(plain.prog().cost().peak_bytes[0] - regathered.prog().cost().peak_bytes[0], 256)
      << plain.text() << regathered.text();
  plain.expect_values();
  regathered.expect_values();
}

// Fused, a chain that carries a pending sum is one step: neg(p * c) + q with p and q pending
// over x and c whole runs as one fused step whose result is pending (fusion computes each
// device's summands as the steps would), then the output's one all-reduce (60 B).
TEST(Partition, FusesAChainCarryingAPendingSum) {
  const Case c(
      x2(), {pending({3, 5}), whole({3, 5}), pending({3, 5})},
      [](const auto& a) { return std::vector{neg(a[0] * a[1]) + a[2]}; }, {},
      /*fuse=*/true);
  const Step* k = c.kernel(c.node(prim::add));
  ASSERT_NE(k, nullptr);
  ASSERT_TRUE(k->fused) << c.text();
  EXPECT_EQ(k->fused->size(), 3u) << c.text();
  EXPECT_EQ(k->pending, sum_over("x"));
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("all_reduce", c.output(0), 60)))
      << c.text();
  c.expect_values();
}

// A pending sum wanted in two shardings is reduced once and the other sharding made from the
// reduced copy, whichever use comes first (issue 40: the order of uses decided it before):
// p f32[4, 6] (96 B) pending over x, wanted whole by exp and split by rows by a constraint.
// Reduced for each: all-reduce 96 B + reduce-scatter 48 B = 144 B. All-reduced, then sliced
// (nothing moves): 96 B, one collective. Reduce-scattered (48 B), then all-gathered (48 B): 96 B,
// two collectives. The tie in bytes goes to fewer collectives: one all-reduce in both orders.
TEST(Partition, AReducedSumIsReusedForAnotherSharding) {
  {
    const Case c(x2(), {pending({4, 6})}, [](const auto& a) {
      return std::vector{exp(a[0]), with_sharding_constraint(a[0], P("x"))};
    });
    EXPECT_THAT(c.collectives(), ElementsAre(c.collective("all_reduce", c.input(0), 96)))
        << c.text();
    c.expect_values();
  }
  {
    const Case c(x2(), {pending({4, 6})}, [](const auto& a) {
      return std::vector{with_sharding_constraint(a[0], P("x")), exp(a[0])};
    });
    EXPECT_THAT(c.collectives(), ElementsAre(c.collective("all_reduce", c.input(0), 96)))
        << c.text();
    c.expect_values();
  }
}

}  // namespace
}  // namespace shardplan::detail
