// Per-device kernels, continued: data movement (reshape, transpose, broadcast, slice, concat),
// take, iota, constants, identities, dtype errors and flops, each against a reference computed
// here with plain loops in double.
#include "kernels_test.hpp"

namespace shardplan::detail {
namespace {

using namespace test;

// ---------------------------------------------------------------------------------------------
// Data movement

TEST(Kernels, ReshapeKeepsRowMajorOrder) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = random(Shape{2, 3, 4}, dtype, 15, -9, 9);
    EXPECT_EQ(run(make_node(prim::reshape), {&x}, Shape{6, 4}, dtype).to_doubles(), x.to_doubles());
    const Tensor s = make(Shape{}, dtype, {3});
    EXPECT_EQ(run(make_node(prim::reshape), {&s}, Shape{1, 1}, dtype).to_doubles(),
              (std::vector<double>{3}));
  }
}

TEST(Kernels, TransposeByPermutation) {
  for (DType dtype : kNumericTypes) {
    for (const std::vector<int>& perm : std::vector<std::vector<int>>{{2, 0, 1}, {1, 2, 0}}) {
      SCOPED_TRACE(name(dtype));
      const Shape in_shape{2, 3, 4};
      const Shape out_shape{in_shape[perm[0]], in_shape[perm[1]], in_shape[perm[2]]};
      const Tensor x = random(in_shape, dtype, 16, -9, 9);
      std::vector<double> want;
      for (std::int64_t o = 0; o < out_shape.numel(); ++o) {
        const std::vector<std::int64_t> oi = unravel(o, out_shape);
        std::vector<std::int64_t> xi(3);
        for (int d = 0; d < 3; ++d) xi[perm[d]] = oi[d];
        want.push_back(x.get(ravel(xi, in_shape)));
      }
      const Node node = recorded([&](const std::vector<Array>& a) { return transpose(a[0], perm); },
                                 {f32(in_shape)});
      EXPECT_EQ(run(node, {&x}, out_shape, dtype).to_doubles(), want);
    }
  }
  const Tensor s = make(Shape{}, DType::kF32, {4});
  const Node scalar =
      recorded([](const std::vector<Array>& a) { return transpose(a[0], {}); }, {f32(Shape{})});
  EXPECT_EQ(run(scalar, {&s}, Shape{}, DType::kF32).get(0), 4.0);
}

TEST(Kernels, BroadcastInDim) {
  struct Case {
    Shape in, out;
    std::vector<int> axes;
  };
  const std::vector<Case> cases = {
      {Shape{3}, Shape{2, 3, 4}, {1}},        // new leading and trailing dims
      {Shape{1, 4}, Shape{3, 2, 4}, {0, 2}},  // a size-1 dim repeated, one new dim
      {Shape{}, Shape{2, 3}, {}},             // a scalar
      {Shape{2, 3}, Shape{2, 3}, {0, 1}},     // nothing to do
  };
  for (DType dtype : kNumericTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(label(dtype, c.in) + " -> " + c.out.to_string());
      const Tensor x = random(c.in, dtype, 17, -9, 9);
      std::vector<double> want;
      for (std::int64_t o = 0; o < c.out.numel(); ++o) {
        const std::vector<std::int64_t> oi = unravel(o, c.out);
        std::vector<std::int64_t> xi;
        for (int d = 0; d < c.in.rank(); ++d) xi.push_back(c.in[d] == 1 ? 0 : oi[c.axes[d]]);
        want.push_back(x.get(ravel(xi, c.in)));
      }
      // broadcast_in_dim records nothing when it has nothing to do: the same attributes are
      // recorded from an operand with a size-1 leading dimension.
      std::vector<std::int64_t> recorded_in = c.in.dims();
      if (c.in == c.out) recorded_in[0] = 1;
      const Node node = recorded(
          [&](const std::vector<Array>& a) { return broadcast_in_dim(a[0], c.out, c.axes); },
          {f32(Shape(recorded_in))});
      EXPECT_EQ(run(node, {&x}, c.out, dtype).to_doubles(), want);
    }
  }
}

TEST(Kernels, SliceWithStartsAndLimits) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const Shape in_shape{4, 5, 6};
    const Tensor x = random(in_shape, dtype, 18, -9, 9);
    const std::vector<std::int64_t> starts = {1, 0, 2};
    const Node node = recorded(
        [&](const std::vector<Array>& a) {
          return slice(a[0], starts, {3, 5, 5});
        },
        {f32(in_shape)});
    const Shape out_shape{2, 5, 3};
    std::vector<double> want;
    for (std::int64_t o = 0; o < out_shape.numel(); ++o) {
      std::vector<std::int64_t> xi = unravel(o, out_shape);
      for (int d = 0; d < 3; ++d) xi[d] += starts[d];
      want.push_back(x.get(ravel(xi, in_shape)));
    }
    EXPECT_EQ(run(node, {&x}, out_shape, dtype).to_doubles(), want);
  }
  const Tensor s = make(Shape{}, DType::kI32, {5});
  const Node scalar =
      recorded([](const std::vector<Array>& a) { return slice(a[0], {}, {}); }, {f32(Shape{})});
  EXPECT_EQ(run(scalar, {&s}, Shape{}, DType::kI32).get(0), 5.0);
}

TEST(Kernels, ConcatAlongAnAxis) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const std::vector<Tensor> parts = {random(Shape{2, 1, 3}, dtype, 19, -9, 9),
                                       random(Shape{2, 4, 3}, dtype, 20, -9, 9),
                                       random(Shape{2, 2, 3}, dtype, 21, -9, 9)};
    const Shape out_shape{2, 7, 3};
    std::vector<double> want;
    for (std::int64_t o = 0; o < out_shape.numel(); ++o) {
      std::vector<std::int64_t> oi = unravel(o, out_shape);
      std::size_t p = 0;
      while (oi[1] >= parts[p].shape()[1]) oi[1] -= parts[p++].shape()[1];
      want.push_back(parts[p].get(ravel(oi, parts[p].shape())));
    }
    const Node node = recorded([](const std::vector<Array>& a) { return concatenate(a, 1); },
                               {f32(Shape{2, 1, 3}), f32(Shape{2, 4, 3}), f32(Shape{2, 2, 3})});
    EXPECT_EQ(run(node, {&parts[0], &parts[1], &parts[2]}, out_shape, dtype).to_doubles(), want);
  }
  const Tensor a = make(Shape{2}, DType::kF32, {1, 2});
  const Tensor b = make(Shape{1}, DType::kF32, {3});
  const Node flat = recorded([](const std::vector<Array>& xs) { return concatenate(xs, 0); },
                             {f32(Shape{2}), f32(Shape{1}), f32(Shape{2})});
  EXPECT_EQ(run(flat, {&a, &b, &a}, Shape{5}, DType::kF32).to_doubles(),
            (std::vector<double>{1, 2, 3, 1, 2}));
}

// out[pre, j..., post] = x[pre, clamp(indices[j...]), post].
std::vector<double> take_reference(const Tensor& x, const Tensor& indices, int axis,
                                   const Shape& out) {
  const int ri = indices.shape().rank();
  std::vector<double> want;
  for (std::int64_t o = 0; o < out.numel(); ++o) {
    const std::vector<std::int64_t> oi = unravel(o, out);
    const std::vector<std::int64_t> ji(oi.begin() + axis, oi.begin() + axis + ri);
    const auto k = static_cast<std::int64_t>(indices.get(ravel(ji, indices.shape())));
    std::vector<std::int64_t> xi(oi.begin(), oi.begin() + axis);
    xi.push_back(std::clamp<std::int64_t>(k, 0, x.shape()[axis] - 1));
    xi.insert(xi.end(), oi.begin() + axis + ri, oi.end());
    want.push_back(x.get(ravel(xi, x.shape())));
  }
  return want;
}

TEST(Kernels, TakeAlongAnAxisClampsOutOfRangeIndices) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = random(Shape{4, 5}, dtype, 22, -9, 9);
    const Tensor indices = make(Shape{4}, DType::kI32, {2, -1, 7, 0});
    const Node node = recorded([](const std::vector<Array>& a) { return take(a[0], a[1], 0); },
                               {f32(Shape{4, 5}), TensorType{Shape{4}, DType::kI32}});
    const Tensor out = run(node, {&x, &indices}, Shape{4, 5}, dtype);
    EXPECT_EQ(out.to_doubles(), take_reference(x, indices, 0, Shape{4, 5}));
    EXPECT_EQ(out.get(5), x.get(0));    // -1 -> 0
    EXPECT_EQ(out.get(10), x.get(15));  // 7 -> 3
  }
}

TEST(Kernels, TakeWithTwoDimensionalIndices) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const Tensor x = random(Shape{3, 4, 5}, dtype, 23, -9, 9);
    const Tensor indices = make(Shape{2, 3}, DType::kI32, {3, 0, 1, 1, 2, 3});
    const auto take_node = [](int axis) {
      return recorded([&](const std::vector<Array>& a) { return take(a[0], a[1], axis); },
                      {f32(Shape{3, 4, 5}), TensorType{Shape{2, 3}, DType::kI32}});
    };
    Node node = take_node(1);
    const Shape out_shape{3, 2, 3, 5};
    EXPECT_EQ(run(node, {&x, &indices}, out_shape, dtype).to_doubles(),
              take_reference(x, indices, 1, out_shape));
    node = take_node(2);  // the last axis: single elements
    const Shape last{3, 4, 2, 3};
    EXPECT_EQ(run(node, {&x, &indices}, last, dtype).to_doubles(),
              take_reference(x, indices, 2, last));
  }
}

TEST(Kernels, TakeRejectsFloatIndices) {
  const Tensor x(Shape{3}, DType::kF32);
  const Tensor indices(Shape{2}, DType::kF32);
  EXPECT_THROW_WITH(run(recorded([](const std::vector<Array>& a) { return take(a[0], a[1], 0); },
                                 {f32(Shape{3}), TensorType{Shape{2}, DType::kI32}}),
                        {&x, &indices}, Shape{2}, DType::kF32),
                    SpecError, "[kernel] take", "dtype f32", "f32[3], f32[2]");
}

TEST(Kernels, IotaCountsFromTheBlockOffset) {
  for (DType dtype : {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64}) {
    for (int axis : {0, 1, 2}) {
      SCOPED_TRACE(std::string(name(dtype)) + " axis " + std::to_string(axis));
      const Shape shape{2, 3, 4};
      const std::vector<std::int64_t> offset = {6, 3, 8};
      std::vector<double> want;
      for (std::int64_t o = 0; o < shape.numel(); ++o) {
        want.push_back(static_cast<double>(offset[axis] + unravel(o, shape)[axis]));
      }
      const Node node =
          recorded([&](const std::vector<Array>& a) { return iota_like(a[0], axis, DType::kF32); },
                   {f32(shape)});
      EXPECT_EQ(run(node, {}, shape, dtype, offset).to_doubles(), want);
    }
  }
}

TEST(Kernels, ConstantCopiesItsBlock) {
  for (DType dtype : kNumericTypes) {
    SCOPED_TRACE(name(dtype));
    const Shape global{6, 8};
    const auto value = std::make_shared<const Tensor>(random(global, dtype, 24, -9, 9));
    const Node node{.op = &prim::constant, .attrs = ConstantAttrs{value}};
    const Shape block{3, 4};
    const std::vector<std::int64_t> offset = {3, 4};
    std::vector<double> want;
    for (std::int64_t o = 0; o < block.numel(); ++o) {
      const std::vector<std::int64_t> bi = unravel(o, block);
      want.push_back(value->get(ravel({bi[0] + 3, bi[1] + 4}, global)));
    }
    EXPECT_EQ(run(node, {}, block, dtype, offset).to_doubles(), want);
  }
  const Node scalar{
      .op = &prim::constant,
      .attrs = ConstantAttrs{std::make_shared<const Tensor>(make(Shape{}, DType::kF64, {1.25}))}};
  EXPECT_EQ(run(scalar, {}, Shape{}, DType::kF64).get(0), 1.25);
}

TEST(Kernels, ConstraintAndAnnotationAreIdentities) {
  for (const Primitive* op : {&prim::sharding_constraint, &prim::sharding_annotation}) {
    for (DType dtype : kNumericTypes) {
      const Tensor x = random(Shape{2, 3, 4}, dtype, 25, -9, 9);
      EXPECT_TRUE(run(make_node(op), {&x}, x.shape(), dtype) == x);
    }
  }
}

TEST(Kernels, InputHasNoKernel) {
  EXPECT_THROW_WITH(run(make_node(prim::input), {}, Shape{2}, DType::kF32), Error,
                    "[kernel] input");
}

TEST(Kernels, UnsupportedDtypeNamesOpDtypeAndShapes) {
  const Tensor x(Shape{2, 3}, DType::kF16);
  EXPECT_THROW_WITH(run(make_node(prim::add), {&x, &x}, x.shape(), DType::kF16), SpecError,
                    "[kernel] add", "dtype f16", "operands (f16[2, 3], f16[2, 3])",
                    "result f16[2, 3]");
  const Node node = recorded(
      [](const std::vector<Array>& a) { return iota_like(a[0], 0, DType::kF32); }, {f32(Shape{4})});
  EXPECT_THROW_WITH(run(node, {}, Shape{4}, DType::kBool), SpecError, "[kernel] iota", "dtype bool",
                    "result bool[4]");
}

// ---------------------------------------------------------------------------------------------
// Flops

TEST(Kernels, FlopsCountDotElementwiseAndReductions) {
  const auto flops = [](const Node& n, const std::vector<Shape>& in, const Shape& out) {
    return n.op->flops(n, in, out);
  };
  // [k=3, b=2, m=4] x [n=5, k=3, b=2]: 2 * 2 * 4 * 5 * 3.
  const Shape l{3, 2, 4}, r{5, 3, 2};
  EXPECT_EQ(flops(dot_node(DotDims{{1}, {2}, {0}, {1}}, l, r), {l, r}, Shape{2, 4, 5}), 240.0);
  EXPECT_EQ(flops(make_node(prim::gelu), {Shape{2, 3}}, Shape{2, 3}), 6.0);
  EXPECT_EQ(flops(make_node(prim::lt), {Shape{4}, Shape{4}}, Shape{4}), 4.0);
  EXPECT_EQ(flops(make_node(prim::select), {Shape{4}, Shape{4}, Shape{4}}, Shape{4}), 4.0);
  const Node sum_node =
      recorded([](const std::vector<Array>& a) { return sum(a[0], {1}); }, {f32(Shape{2, 3, 4})});
  EXPECT_EQ(flops(sum_node, {Shape{2, 3, 4}}, Shape{2, 4}), 24.0);
  for (const Primitive* op :
       {&prim::reshape, &prim::transpose, &prim::broadcast_in_dim, &prim::slice, &prim::concatenate,
        &prim::take, &prim::iota, &prim::constant, &prim::convert, &prim::sharding_constraint,
        &prim::sharding_annotation, &prim::input}) {
    EXPECT_EQ(flops(make_node(op), {Shape{2, 3}}, Shape{2, 3}), 0.0);
  }
}

}  // namespace
}  // namespace shardplan::detail
