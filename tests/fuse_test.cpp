// Fusion of pointwise steps (src/program/compiler/fuse.hpp): under sjit a group of pointwise ops runs as
// one step, chunk by chunk, and gives bitwise what the same ops give run one by one (eagerly,
// where every op is a program of its own and nothing is fused).
#include "../src/program/compiler/fuse.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../src/program/ir/primitives.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

struct Devices {
  Executor exec{8};
  Mesh mesh = Mesh::parse("data:4,model:2", 8);
  Array put(const Tensor& t, const PartitionSpec& s) const {
    return device_put(t, NamedSharding(mesh, s), exec);
  }
};

// Blocks of [250, 42] = 10,500 elements: two whole chunks and a tail.
const Shape kShape{1000, 84};
static_assert(detail::kFusedChunk == 4096);

Array chain(const Array& x, const Array& y) { return relu(x * y + exp(x)) - y; }

TEST(Fusion, AChainRunsAsOneStepAndEqualsTheOpsRunOneByOne) {
  Devices s;
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF64}) {
    SCOPED_TRACE(std::string(name(dtype)));
    const Array x = s.put(Tensor::uniform(kShape, dtype, 1, -2, 2), P("data", "model"));
    const Array y = s.put(Tensor::uniform(kShape, dtype, 2, -2, 2), P("data", "model"));
    auto f = sjit(s.mesh, &chain);
    const std::string text = f.lower(x, y).text();
    // (The operands of + are traced in the order the compiler evaluates them.)
    EXPECT_THAT(text, ::testing::ContainsRegex("fused\\((exp, mul|mul, exp), add, relu, sub\\)"))
        << text;
    // bf16 intermediates are rounded to bf16 in the fused step too: the same bits.
    EXPECT_TRUE(f(x, y).to_host() == chain(x, y).to_host());
  }
}

// SjitOptions::fuse false: every op a step of its own, the same bits.
TEST(Fusion, SjitOptionsFuseFalseRunsTheOpsOneByOne) {
  Devices s;
  const Array x = s.put(Tensor::uniform(kShape, DType::kF32, 1, -2, 2), P("data", "model"));
  const Array y = s.put(Tensor::uniform(kShape, DType::kF32, 2, -2, 2), P("data", "model"));
  SjitOptions off;
  off.fuse = false;
  auto unfused = sjit(s.mesh, &chain, off);
  auto fused = sjit(s.mesh, &chain);
  const std::string text = unfused.lower(x, y).text();
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("fused("))) << text;
  EXPECT_THAT(fused.lower(x, y).text(), ::testing::HasSubstr("fused("));
  EXPECT_TRUE(unfused(x, y).to_host() == fused(x, y).to_host());
}

TEST(Fusion, DtypeChangesComparisonsAndSelectFuseToo) {
  Devices s;
  auto g = [](const Array& x) {
    const Array big = greater(x, full(x.shape(), x.dtype(), 0.5, x));
    return astype(where(big, x * 2.0, -x), DType::kBF16);
  };
  const Array x = s.put(Tensor::uniform(kShape, DType::kF32, 3, -1, 1), P("data"));
  auto f = sjit(s.mesh, g);
  const std::string text = f.lower(x).text();
  EXPECT_THAT(text, ::testing::HasSubstr("fused(")) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("convert)")) << text;
  EXPECT_TRUE(f(x).to_host() == g(x).to_host());
}

TEST(Fusion, AResultUsedTwiceOrReturnedIsKeptAndComputedOnce) {
  Devices s;
  const Array x = s.put(Tensor::uniform(kShape, DType::kF32, 4, -1, 1), P("data", "model"));
  // e is read by sin and by mul: it stays a step of its own; sin and mul fuse.
  auto twice = [](const Array& v) {
    const Array e = exp(v);
    return e * sin(e);
  };
  auto f = sjit(s.mesh, twice);
  const std::string text = f.lower(x).text();
  EXPECT_THAT(text, ::testing::HasSubstr("= exp on blocks")) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("fused(sin, mul)")) << text;
  EXPECT_TRUE(f(x).to_host() == twice(x).to_host());
  // An intermediate that is also an output is not fused away.
  auto both = [](const Array& v) {
    const Array e = exp(v);
    return Tree<Array>::dict({{"e", e}, {"c", cos(e)}});
  };
  auto g = sjit(s.mesh, both);
  const Tree<Array> got = g(x);
  const Tree<Array> want = both(x);
  for (const char* k : {"e", "c"}) {
    EXPECT_TRUE(got.at(k).leaf().to_host() == want.at(k).leaf().to_host()) << k;
  }
  EXPECT_THAT(g.lower(x).text(), ::testing::Not(::testing::HasSubstr("fused(")));
}

TEST(Fusion, FusedIntermediatesTakeNoMemory) {
  Devices s;
  const Array x =
      s.put(Tensor::uniform(Shape{1024, 64}, DType::kF32, 5, -1, 1), P("data", "model"));
  auto f = sjit(s.mesh, [](const Array& v) { return sin(cos(exp(v))); });
  // x and the result, a [256, 32] f32 block each: exp(x) and cos(..) are never allocated.
  const std::int64_t shard = 256 * 32 * 4;
  const std::int64_t planned = f.lower(x).cost().peak_bytes[0];
  EXPECT_EQ(planned, 2 * shard);
  s.exec.reset_peak();
  const std::int64_t before = s.exec.memory(0).in_use;
  const Array y = f(x);
  EXPECT_EQ(s.exec.memory(0).peak - before, shard);  // the result only
}

// A sum of values made far apart (gradients summed over micro-batches) is not fused into one
// step at the last sum: that would keep every addend alive until then. Each sum runs where it is.
TEST(Fusion, ASumOfValuesMadeFarApartIsNotFusedIntoTheLastSum) {
  Devices s;
  const Array x =
      s.put(Tensor::uniform(Shape{1024, 64}, DType::kF32, 8, -1, 1), P("data", "model"));
  auto sums = [](const Array& v) {
    Array total = transpose(v, {1, 0});
    for (int k = 2; k <= 6; ++k) total = total + transpose(v * static_cast<double>(k), {1, 0});
    return total;
  };
  auto f = sjit(s.mesh, sums);
  const Lowered low = f.lower(x);
  EXPECT_THAT(low.text(), ::testing::Not(::testing::HasSubstr("fused(add, add"))) << low.text();
  // Live at most: x, the sum so far, a scaled copy, its transpose and the new sum.
  const std::int64_t shard = 256 * 32 * 4;
  EXPECT_LE(low.cost().peak_bytes[0], 5 * shard) << low.text();
  EXPECT_TRUE(f(x).to_host() == sums(x).to_host());
}

TEST(Fusion, ABroadcastThatRepeatsItsOperandIsReadInPlaceOthersAreNot) {
  Devices s;
  const Shape sq{64, 64};
  // Replicated, so that every device's blocks are square too.
  const Array x = s.put(Tensor::uniform(sq, DType::kF32, 6, -1, 1), P());
  const Array b = s.put(Tensor::uniform(Shape{64}, DType::kF32, 7, -1, 1), P());
  // Along the last dimension (a bias): b repeated whole, period 64. Along the first (each row one
  // value of b, as a row's maximum or sum is broadcast along the row): each element of b 64 times
  // over. Both square, so only the dims tell them apart: a kernel reading b in the other order
  // gives other values (checked bitwise below). Both are read in place, none made whole.
  auto rows = [](const Array& v, const Array& w) {
    return relu(v + broadcast_in_dim(w, v.shape(), {1}));
  };
  auto cols = [](const Array& v, const Array& w) {
    return relu(v + broadcast_in_dim(w, v.shape(), {0}));
  };
  auto scalar = [](const Array& v, const Array& w) {
    return v * broadcast_in_dim(reshape(slice(w, {0}, {1}), Shape{}), v.shape(), {}) - v;
  };
  // The middle dimension of [4, 64, 16]: each element 16 times, the whole 4 times.
  auto middle = [](const Array& v, const Array& w) {
    return relu(reshape(v, Shape{4, 64, 16}) + broadcast_in_dim(w, Shape{4, 64, 16}, {1}));
  };
  // [8, 8] onto dimensions 0 and 2 of [8, 64, 8]: not one run of the result's dimensions, so
  // not a repetition the fused kernel can read; it stays a broadcast step of its own.
  auto apart = [](const Array& v, const Array& w) {
    const Array w2 = reshape(w, Shape{8, 8});
    return relu(reshape(v, Shape{8, 64, 8}) + broadcast_in_dim(w2, Shape{8, 64, 8}, {0, 2}));
  };
  auto f_rows = sjit(s.mesh, rows);
  auto f_cols = sjit(s.mesh, cols);
  auto f_scalar = sjit(s.mesh, scalar);
  auto f_middle = sjit(s.mesh, middle);
  auto f_apart = sjit(s.mesh, apart);
  EXPECT_THAT(f_rows.lower(x, b).text(),
              ::testing::HasSubstr("fused(broadcast_in_dim, add, relu)"));
  EXPECT_THAT(f_cols.lower(x, b).text(),
              ::testing::HasSubstr("fused(broadcast_in_dim, add, relu)"));
  EXPECT_THAT(f_scalar.lower(x, b).text(),
              ::testing::HasSubstr("fused(broadcast_in_dim, mul, sub)"));
  EXPECT_THAT(f_middle.lower(x, b).text(),
              ::testing::HasSubstr("fused(broadcast_in_dim, reshape, add, relu)"));
  const std::string apart_text = f_apart.lower(x, b).text();
  EXPECT_THAT(apart_text, ::testing::HasSubstr("= broadcast_in_dim on blocks")) << apart_text;
  EXPECT_THAT(apart_text, ::testing::HasSubstr("fused(reshape, add, relu)")) << apart_text;
  EXPECT_TRUE(f_rows(x, b).to_host() == rows(x, b).to_host());
  EXPECT_TRUE(f_cols(x, b).to_host() == cols(x, b).to_host());
  EXPECT_TRUE(f_scalar(x, b).to_host() == scalar(x, b).to_host());
  EXPECT_TRUE(f_middle(x, b).to_host() == middle(x, b).to_host());
  EXPECT_TRUE(f_apart(x, b).to_host() == apart(x, b).to_host());
  // Split over rows: each device reads its own 16 values of b, each 64 times.
  const Array xs = s.put(Tensor::uniform(sq, DType::kF32, 8, -1, 1), P("data"));
  const Array bs = s.put(Tensor::uniform(Shape{64}, DType::kF32, 9, -1, 1), P("data"));
  EXPECT_THAT(f_cols.lower(xs, bs).text(),
              ::testing::HasSubstr("fused(broadcast_in_dim, add, relu)"));
  EXPECT_TRUE(f_cols(xs, bs).to_host() == cols(xs, bs).to_host());
}

// A row's statistic broadcast along the row is read where it is, never made whole: softmax over
// [256, 512] holds its input, e and the result (3 x 512 KiB), not the broadcast max and sum too.
TEST(Fusion, ARowStatisticIsNotMadeWhole) {
  Devices s;
  const Array x = s.put(Tensor::uniform(Shape{256, 512}, DType::kF32, 10, -4, 4), P());
  auto f = sjit(s.mesh, [](const Array& v) { return softmax(v, -1); });
  const Lowered low = f.lower(x);
  EXPECT_EQ(low.text().find("= broadcast_in_dim on blocks"), std::string::npos) << low.text();
  constexpr std::int64_t kArray = 256 * 512 * 4;
  EXPECT_LT(low.cost().peak_bytes[0], 3 * kArray + kArray / 4);
  const Tensor got = f(x).to_host(), want = softmax(x, -1).to_host();
  EXPECT_TRUE(got == want);
}

// Nothing fuses across an optimization barrier (as in XLA): exp's result read through one is
// written whole by a kernel of its own, then cast by another; without it, one fused kernel.
TEST(Fusion, AnOptimizationBarrierIsAFusionBoundary) {
  Devices s;
  const Array x = s.put(Tensor::uniform(Shape{64, 64}, DType::kF32, 11, -1, 1), P());
  auto barred = sjit(s.mesh, [](const Array& v) {
    return astype(optimization_barrier(exp(v)), DType::kBF16);
  });
  auto plain = sjit(s.mesh, [](const Array& v) { return astype(exp(v), DType::kBF16); });
  const std::string text = barred.lower(x).text();
  EXPECT_THAT(text, ::testing::HasSubstr("= exp on blocks")) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("= convert on blocks")) << text;
  EXPECT_THAT(plain.lower(x).text(), ::testing::HasSubstr("fused(exp, convert)"));
  // The f32 exp (16 KiB) and the bf16 result (8 KiB) live at once, beside x (16 KiB).
  EXPECT_EQ(barred.lower(x).cost().peak_bytes[0], (16 + 16 + 8) << 10);
  EXPECT_EQ(plain.lower(x).cost().peak_bytes[0], (16 + 8) << 10);
  EXPECT_TRUE(barred(x).to_host() == plain(x).to_host());
}

// Eager (SjitOptions::eager, an eager framework's kernels): every op writes its result, only a
// broadcast is read in place (PyTorch's expand is a view). relu(x * 2 + b): the scaling, the
// add (each reading its broadcast operand in place) and relu are steps of their own; results
// bitwise the compiled ones.
TEST(Fusion, EagerFusesOnlyRepetitions) {
  Devices s;
  const Array x = s.put(Tensor::uniform(Shape{64, 64}, DType::kF32, 12, -1, 1), P());
  const Array b = s.put(Tensor::uniform(Shape{64}, DType::kF32, 13, -1, 1), P());
  auto f = [](const Array& v, const Array& w) {
    return relu(v * 2.0 + broadcast_in_dim(w, v.shape(), {0}));
  };
  SjitOptions eager;
  eager.eager = true;
  auto compiled_step = sjit(s.mesh, f);
  auto eager_step = sjit(s.mesh, f, eager);
  const std::string text = eager_step.lower(x, b).text();
  EXPECT_THAT(text, ::testing::HasSubstr("fused(broadcast_in_dim, add)")) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("= relu on blocks")) << text;
  EXPECT_THAT(text, ::testing::HasSubstr("fused(broadcast_in_dim, mul)")) << text;  // the 2
  EXPECT_THAT(compiled_step.lower(x, b).text(),
              ::testing::HasSubstr("fused(broadcast_in_dim, broadcast_in_dim, mul, add, relu)"));
  // Eager holds x, x * 2 and their sum at once (16 KiB each); compiled, x and the result; both
  // b (256 B) and the constant 2 (4 B).
  EXPECT_EQ(eager_step.lower(x, b).cost().peak_bytes[0], (3 * 16 << 10) + 256 + 4);
  EXPECT_EQ(compiled_step.lower(x, b).cost().peak_bytes[0], (2 * 16 << 10) + 256 + 4);
  EXPECT_TRUE(eager_step(x, b).to_host() == compiled_step(x, b).to_host());
}

TEST(Fusion, TheFusedKernelRefusesBlocksOfAnotherSize) {
  // A block that does not hold as many elements as the result would be read past its end.
  Tensor a(Shape{10}, DType::kF32), out(Shape{12}, DType::kF32);
  const detail::Node node{.op = &detail::prim::exp, .type = {Shape{12}, DType::kF32}};
  const std::vector<detail::FusedOp> ops = {{.local = node, .args = {0}},
                                            {.local = node, .args = {-1}}};
  EXPECT_THROW_WITH(detail::run_fused(ops, {{a.bytes(), a.shape(), DType::kF32}},
                                      {out.bytes(), out.shape(), DType::kF32}),
                    SpecError, "10 elements", "12");
}

}  // namespace
}  // namespace shardplan
