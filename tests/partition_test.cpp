// The partitioner's decisions (src/program/compiler/partition.cpp), each on its own, on small traced
// graphs compiled without fusion (so that every kernel step computes one node): which step
// computes a value, in which sharding, pending or not; which reshards run, with their
// collectives and bytes worked out by hand; and the values, against the same function run on one
// device.
//
// Bytes on the mesh x:2 (two devices), for a value of B bytes: an all-reduce of a replicated
// pending sum receives B on each device (its half of the other's summand, then the other half
// reduced: (n - 1) * chunk + (total - chunk) elements); a reduce-scatter or an all-gather over x
// receives B / 2; a local slice moves nothing (it is not counted as a collective below).
#include "../src/program/compiler/partition.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "../src/program/compiler/compile.hpp"
#include "../src/program/ir/primitives.hpp"
#include "shardplan/ops.hpp"
#include "test_util.hpp"
#include "../src/program/frontend/trace.hpp"

namespace shardplan {
// For gtest's messages: "sum over [x]".
void PrintTo(const Pending& p, std::ostream* os) {
  *os << to_string(p.op) << " over [" << fmt::format("{}", fmt::join(p.axes, ", ")) << "]";
}
}  // namespace shardplan

namespace shardplan::detail {
namespace {

using ::testing::ElementsAre;
using Fn = std::function<std::vector<Array>(const std::vector<Array>&)>;

// An input of a traced function: its type, the sharding it arrives in, and the pending sum it
// arrives as (each device holding a summand), if any. `positive`: values in [1, 5] (a divisor).
struct Arg {
  TensorType type;
  PartitionSpec spec;
  Pending pending;
  bool positive = false;
};

Pending sum_over(const std::string& axis) { return Pending{ReduceOp::kSum, {axis}}; }
// A replicated input that is a sum pending over 'x'.
Arg pending(Shape s, DType dtype = DType::kF32) {
  return Arg{{std::move(s), dtype}, P(), sum_over("x")};
}
// A replicated input, nothing pending.
Arg whole(Shape s, DType dtype = DType::kF32) { return Arg{{std::move(s), dtype}, P(), {}}; }

// Multiples of 1/4 in [-4, 4] (bool: true for the positive ones): small sums of them are exact
// in every float dtype, so a sum reduced in another order is the same value.
Tensor quarters(const Shape& shape, DType dtype, std::uint64_t seed, bool positive) {
  Tensor t(shape, dtype);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = std::floor(random_uniform(seed, static_cast<std::uint64_t>(i)) * 33) / 4 - 4;
    if (positive) v = std::abs(v) + 1;
    if (dtype == DType::kBool) {
      t.bytes()[i] = static_cast<std::byte>(v > 0 ? 1 : 0);
    } else {
      t.set(i, v);
    }
  }
  return t;
}

double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.get(i) - b.get(i)));
  return m;
}

// `f` traced on inputs of `args`, compiled on `mesh` (without fusion) with output shardings
// `outs` (open where nullopt or missing); run on inputs made as the args say.
class Case {
 public:
  Case(Mesh mesh, std::vector<Arg> args, Fn f, std::vector<std::optional<PartitionSpec>> outs = {},
       bool fuse = false)
      : exec_(static_cast<int>(mesh.size())),
        mesh_(std::move(mesh)),
        args_(std::move(args)),
        f_(std::move(f)),
        fuse_(fuse),
        prog_(compile_traced(std::move(outs))) {}

  const Program& prog() const { return prog_; }
  const Graph& graph() const { return prog_.graph(); }
  const std::vector<Step>& steps() const { return prog_.steps(); }

  // The nth node (in graph order) that applies `op`.
  ValueId node(const Primitive& op, int nth = 0) const {
    for (std::size_t i = 0; i < graph().size(); ++i) {
      if (graph().nodes[i].is(op) && nth-- == 0) return value_id(i);
    }
    ADD_FAILURE() << "no node applies " << op.name << "\n" << graph().to_string();
    return ValueId{0};
  }
  // The node of input k.
  ValueId input(int k) const {
    for (std::size_t i = 0; i < graph().size(); ++i) {
      const Node& n = graph().nodes[i];
      if (n.is(prim::input) && n.attr<InputAttrs>().index == k) return value_id(i);
    }
    ADD_FAILURE() << "no input " << k;
    return ValueId{0};
  }
  ValueId output(std::size_t k) const { return graph().outputs.at(k); }

  // The kernel steps that compute `v`.
  std::vector<const Step*> kernels(ValueId v) const { return of(v, Step::Kind::kKernel); }
  // The one kernel step that computes `v` (a test failure and nullptr when there is not one).
  const Step* kernel(ValueId v) const {
    const auto k = kernels(v);
    if (k.size() == 1) return k[0];
    ADD_FAILURE() << k.size() << " kernel steps compute " << value_name(v) << "\n" << text();
    return nullptr;
  }
  // The reshard steps of `v`, in order.
  std::vector<const Step*> reshards(ValueId v) const { return of(v, Step::Kind::kReshard); }

  // Every collective the reshard steps run, in order, as "kind %value bytes" (the most bytes a
  // device receives); local slices move nothing and are left out.
  std::vector<std::string> collectives() const {
    std::vector<std::string> out;
    for (const Step& st : steps()) {
      if (st.kind != Step::Kind::kReshard) continue;
      for (const CollectiveRecord& rec : st.cost) {
        if (rec.kind == CollectiveKind::kSlice) continue;
        out.push_back(
            fmt::format("{} {} {}", to_string(rec.kind), value_name(st.node), rec.max_bytes_in()));
      }
    }
    return out;
  }
  std::string collective(std::string_view kind, ValueId v, std::int64_t bytes) const {
    return fmt::format("{} {} {}", kind, value_name(v), bytes);
  }

  // The graph and the program's text, for failure messages.
  std::string text() const { return graph().to_string() + "\n" + prog_.text(); }

  // Runs the program and compares each output with `f` run on one device on the inputs' values
  // (a pending input's value is the sum of its summands); every output arrives in the program's
  // output sharding with nothing pending.
  void expect_values(double tolerance = 1e-5) const {
    const Executor one = Executor::process_local(1);
    std::vector<std::pair<std::string, std::int64_t>> axes;
    for (const std::string& a : mesh_.axis_names()) axes.emplace_back(a, 1);
    const Mesh single(axes, 1);
    std::vector<Array> ins, ones;
    for (std::size_t k = 0; k < args_.size(); ++k) {
      ins.push_back(make_input(k));
      ones.push_back(device_put(ins.back().to_host(), NamedSharding(single, P()), one));
    }
    const std::vector<Array> got = prog_.run(exec_, ins);
    const std::vector<Array> want = f_(ones);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      SCOPED_TRACE(fmt::format("output {}", k));
      EXPECT_FALSE(got[k].is_pending());
      EXPECT_TRUE(got[k].sharding() == prog_.output_shardings()[k])
          << got[k].sharding().spec().to_string();
      const Tensor g = got[k].to_host();
      const Tensor w = want[k].to_host();
      ASSERT_EQ(g.shape(), w.shape());
      ASSERT_EQ(g.dtype(), w.dtype());
      EXPECT_LE(max_diff(g, w), tolerance) << text();
    }
  }

 private:
  Program compile_traced(std::vector<std::optional<PartitionSpec>> outs) const {
    TraceContext ctx(exec_, mesh_);
    std::vector<Array> results;
    {
      TraceScope scope(&ctx);
      std::vector<Array> xs;
      for (const Arg& a : args_) xs.push_back(ctx.add_argument(a.type));
      results = f_(xs);
    }
    const Graph g = ctx.finish(results);
    CompileSpec spec{.mesh = mesh_, .outputs = std::move(outs), .fuse = fuse_};
    for (std::size_t k = 0; k < args_.size(); ++k) {
      spec.inputs.push_back(InputSpec{.spec = args_[k].spec,
                                      .pending = args_[k].pending,
                                      .origin = fmt::format("input {}", k)});
    }
    return compile(g, spec);
  }

  std::vector<const Step*> of(ValueId v, Step::Kind kind) const {
    std::vector<const Step*> out;
    for (const Step& st : steps()) {
      if (st.kind == kind && st.node == v) out.push_back(&st);
    }
    return out;
  }

  // Input k: device d's summand, or the value put on every device.
  Array make_input(std::size_t k) const {
    const Arg& a = args_[k];
    const NamedSharding s(mesh_, a.spec);
    const std::uint64_t seed = 1000 * (k + 1);
    if (a.pending.empty()) {
      return device_put(quarters(a.type.shape, a.type.dtype, seed, a.positive), s, exec_);
    }
    std::vector<std::shared_ptr<Buffer>> bufs(static_cast<std::size_t>(exec_.num_devices()));
    for (const int d : mesh_.devices()) {
      const Tensor t = quarters(s.shard_shape(a.type.shape), a.type.dtype,
                                seed + static_cast<std::uint64_t>(d) + 1, a.positive);
      auto b = std::make_shared<Buffer>(exec_.allocate(d, t.nbytes()));
      std::memcpy(b->data(), t.bytes(), static_cast<std::size_t>(t.nbytes()));
      bufs[static_cast<std::size_t>(d)] = b;
    }
    return Array::from_buffers(exec_, a.type.shape, a.type.dtype, s, bufs, a.pending);
  }

  Executor exec_;
  Mesh mesh_;
  std::vector<Arg> args_;
  Fn f_;
  bool fuse_ = false;
  Program prog_;
};

Mesh x2() { return Mesh::parse("x:2", 2); }

// ---- Where a pending sum is reduced -------------------------------------------------------------
// The pending inputs are f32[3, 5] (60 bytes): no dimension divides by 2, so no pointwise node can
// run split over x (split_pointwise, tested on its own below) and a reduction is an all-reduce.

// `op`'s one node runs on the pending inputs `reduced` all-reduced (60 bytes each, the program's
// only collectives, each input's one reshard), with nothing pending.
void expect_reduced_first(const Case& c, const Primitive& op, const std::vector<int>& reduced) {
  const Step* k = c.kernel(c.node(op));
  ASSERT_NE(k, nullptr);
  EXPECT_TRUE(k->pending.empty()) << c.text();
  std::vector<std::string> want;
  for (const int i : reduced) {
    const ValueId in = c.input(i);
    want.push_back(c.collective("all_reduce", in, 60));
    const auto r = c.reshards(in);
    ASSERT_EQ(r.size(), 1u) << c.text();
    EXPECT_THAT(k->in, ::testing::Contains(r[0]->out)) << "the kernel reads the reduced copy";
  }
  EXPECT_THAT(c.collectives(), ::testing::ElementsAreArray(want)) << c.text();
  c.expect_values();
}

TEST(Partition, ReducesAPendingSumRightBeforeExp) {
  const Case c(x2(), {pending({3, 5})}, [](const auto& a) { return std::vector{exp(a[0])}; });
  expect_reduced_first(c, prim::exp, {0});
}

TEST(Partition, ReducesBothPendingOperandsOfMax) {
  const Case c(x2(), {pending({3, 5}), pending({3, 5})},
               [](const auto& a) { return std::vector{maximum(a[0], a[1])}; });
  expect_reduced_first(c, prim::max, {0, 1});
}

TEST(Partition, ReducesBothPendingFactorsOfAProduct) {
  // (p0 + p1)(q0 + q1) is not p0 q0 + p1 q1: a product of two pending sums is not pending.
  const Case c(x2(), {pending({3, 5}), pending({3, 5})},
               [](const auto& a) { return std::vector{a[0] * a[1]}; });
  expect_reduced_first(c, prim::mul, {0, 1});
}

TEST(Partition, ReducesAPendingSumAddedToAValueNotPending) {
  // (p0 + r) + (p1 + r) would count r twice.
  const Case c(x2(), {pending({3, 5}), whole({3, 5})},
               [](const auto& a) { return std::vector{a[0] + a[1]}; });
  expect_reduced_first(c, prim::add, {0});
}

TEST(Partition, ReducesAPendingSumBeforeAConvertToInt) {
  // Truncating each summand is not truncating the sum.
  const Case c(x2(), {pending({3, 5})},
               [](const auto& a) { return std::vector{astype(a[0], DType::kI32)}; });
  expect_reduced_first(c, prim::convert, {0});
}

// ---- Where a pending sum stays pending (declared linearity) ----------------------------------
// `op`'s node runs on the summands as they are (no step reshards a pending input) and leaves its
// result pending over x; the add of another pending sum of the result's type keeps it so (two
// pending sums), and the program's one collective is the output's all-reduce of `bytes` (the
// result's bytes). Reducing first would cost an all-reduce of each pending input as well: staying
// pending is the cheaper program in every case below, not only the one the rule allows.

void expect_stays_pending(const Case& c, const Primitive& op, std::int64_t bytes) {
  const Step* k = c.kernel(c.node(op));
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->pending, sum_over("x")) << c.text();
  const ValueId out = c.output(0);
  ASSERT_TRUE(c.graph()[out].is(prim::add)) << c.text();
  const Step* sum = c.kernel(out);
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(sum->pending, sum_over("x")) << c.text();
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("all_reduce", out, bytes))) << c.text();
  c.expect_values();
}

TEST(Partition, KeepsASumPendingThroughAnAddOfTwoPendingSums) {
  const Case c(x2(), {pending({3, 5}), pending({3, 5})},
               [](const auto& a) { return std::vector{a[0] + a[1]}; });
  const Step* k = c.kernel(c.output(0));
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->pending, sum_over("x"));
  EXPECT_TRUE(c.reshards(c.input(0)).empty() && c.reshards(c.input(1)).empty()) << c.text();
  // One all-reduce of the sum (60 bytes), not one of each addend.
  EXPECT_THAT(c.collectives(), ElementsAre(c.collective("all_reduce", c.output(0), 60)))
      << c.text();
  c.expect_values();
}

TEST(Partition, KeepsASumPendingThroughNeg) {
  const Case c(x2(), {pending({3, 5}), pending({3, 5})},
               [](const auto& a) { return std::vector{-a[0] + a[1]}; });
  expect_stays_pending(c, prim::neg, 60);
}

TEST(Partition, KeepsASumPendingThroughMulByAValueNotPending) {
  const Case c(x2(), {pending({3, 5}), whole({3, 5}), pending({3, 5})},
               [](const auto& a) { return std::vector{a[0] * a[1] + a[2]}; });
  expect_stays_pending(c, prim::mul, 60);
}

TEST(Partition, KeepsASumPendingThroughDivOfAPendingNumerator) {
  Arg divisor = whole({3, 5});
  divisor.positive = true;
  const Case c(x2(), {pending({3, 5}), divisor, pending({3, 5})},
               [](const auto& a) { return std::vector{a[0] / a[1] + a[2]}; });
  expect_stays_pending(c, prim::div, 60);
}

TEST(Partition, KeepsASumPendingThroughReshape) {
  const Case c(x2(), {pending({3, 5}), pending({15})},
               [](const auto& a) { return std::vector{reshape(a[0], Shape{15}) + a[1]}; });
  expect_stays_pending(c, prim::reshape, 60);
}

TEST(Partition, KeepsASumPendingThroughTranspose) {
  const Case c(x2(), {pending({3, 5}), pending({5, 3})}, [](const auto& a) {
    return std::vector{transpose(a[0], {1, 0}) + a[1]};
  });
  expect_stays_pending(c, prim::transpose, 60);
}

TEST(Partition, KeepsASumPendingThroughSlice) {
  // f32[3, 3]: 36 bytes (reducing first: 60 + 36).
  const Case c(x2(), {pending({3, 5}), pending({3, 3})}, [](const auto& a) {
    return std::vector{slice(a[0], {0, 1}, {3, 4}) + a[1]};
  });
  expect_stays_pending(c, prim::slice, 36);
}

TEST(Partition, KeepsASumPendingThroughBroadcastInDim) {
  // f32[3, 3, 5]: 180 bytes (reducing first: 60 + 180).
  const Case c(x2(), {pending({3, 5}), pending({3, 3, 5})}, [](const auto& a) {
    return std::vector{broadcast_in_dim(a[0], Shape{3, 3, 5}, {1, 2}) + a[1]};
  });
  expect_stays_pending(c, prim::broadcast_in_dim, 180);
}

TEST(Partition, KeepsASumPendingThroughReduceSum) {
  // f32[3]: 12 bytes (reducing first: 60 + 12).
  const Case c(x2(), {pending({3, 5}), pending({3})},
               [](const auto& a) { return std::vector{sum(a[0], {1}) + a[1]}; });
  expect_stays_pending(c, prim::reduce_sum, 12);
}

TEST(Partition, KeepsASumPendingThroughAConvertFromF32ToF64) {
  // f64[3, 5]: 120 bytes (reducing first: 60 + 120).
  const Case c(x2(), {pending({3, 5}), pending({3, 5}, DType::kF64)},
               [](const auto& a) { return std::vector{astype(a[0], DType::kF64) + a[1]}; });
  expect_stays_pending(c, prim::convert, 120);
}

TEST(Partition, KeepsASumPendingThroughASelectOfTwoEquallyPendingSums) {
  // select(c, p0 + p1, q0 + q1) = select(c, p0, q0) + select(c, p1, q1) for a c not pending.
  const Case c(x2(),
               {whole({3, 5}, DType::kBool), pending({3, 5}), pending({3, 5}), pending({3, 5})},
               [](const auto& a) { return std::vector{where(a[0], a[1], a[2]) + a[3]}; });
  expect_stays_pending(c, prim::select, 60);
}

TEST(Partition, KeepsASumPendingThroughAConcatenateOfEquallyPendingSums) {
  // f32[6, 5]: 120 bytes (reducing first: 60 + 60 + 120).
  const Case c(x2(), {pending({3, 5}), pending({3, 5}), pending({6, 5})}, [](const auto& a) {
    return std::vector{concatenate({a[0], a[1]}, 0) + a[2]};
  });
  expect_stays_pending(c, prim::concatenate, 120);
}

// ---- The sharded pointwise update ------------------------------------------------------------

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
