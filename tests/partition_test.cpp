// The partitioner's decisions (src/program/compiler/partition.cpp), each on its own, on small
// traced graphs compiled without fusion (so that every kernel step computes one node): which step
// computes a value, in which sharding, pending or not; which reshards run, with their
// collectives and bytes worked out by hand; and the values, against the same function run on one
// device.
//
// Bytes on the mesh x:2 (two devices), for a value of B bytes: an all-reduce of a replicated
// pending sum receives B on each device (its half of the other's summand, then the other half
// reduced: (n - 1) * chunk + (total - chunk) elements); a reduce-scatter or an all-gather over x
// receives B / 2; a local slice moves nothing (it is not counted as a collective below).
#include "partition_test.hpp"
#include "shardplan/sjit.hpp"

namespace shardplan::detail {
namespace {

using ::testing::ElementsAre;

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

}  // namespace
}  // namespace shardplan::detail

namespace shardplan::detail {
namespace {

// The reshard memo is keyed by a value's type and its read mark, not its address or number: a
// pinned weight (pin_sharding: read as it is) and an unpinned one of the same type and sharding
// must not share answers. x [8, 4] is split by rows over x; each product x @ w wants w whole
// beside x's rows. The unpinned w2 is gathered (a cheap all-gather of 64 B); the pinned w1 never
// is: its product moves x instead. Priced from one memo entry, both would be gathered or neither.
TEST(Partition, APinnedValueIsNeverReshardedBesideAnUnpinnedOneOfItsType) {
  const Mesh mesh = Mesh::parse("x:4", 4);
  SjitOptions o;
  o.in_shardings = RuleTree::list({RuleTree(P("x")), RuleTree(P()), RuleTree(P())});
  const auto f = [](const Array& x, const Array& w1, const Array& w2) {
    const Array a = pin_sharding(w1, P(nullptr, "x"));
    const Array b = with_sharding_constraint(w2, P(nullptr, "x"));
    return matmul(x, a) + matmul(x, b);
  };
  const TensorSpec x{Shape{8, 4}, DType::kF32}, w{Shape{4, 4}, DType::kF32};
  const std::string text = sjit(mesh, f, o).lower(x, w, w).text();
  std::string a, b;  // the constraints' value names, read from the text
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find(" = sharding_constraint(");
    if (eq == std::string::npos) continue;
    const std::string name = line.substr(line.find('%'), eq - line.find('%'));
    (line.find("readers_keep") != std::string::npos || a.empty() ? a : b) = name;
  }
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_THAT(text, ::testing::HasSubstr("reshard " + b + " -> "));
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("reshard " + a + " -> "))) << text;
}

}  // namespace
}  // namespace shardplan::detail
