#pragma once
// What the kernel tests share (kernels_test*.cpp): dtypes and shapes to loop over, tensors by
// hand or at random, the reference's tolerance per dtype, index arithmetic.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <string>

#include "../src/program/ir/primitives.hpp"
#include "shardplan/ops.hpp"
#include "test_util.hpp"
#include "../src/program/frontend/trace.hpp"

namespace shardplan::detail::test {

inline const std::vector<DType> kFloatTypes = {DType::kF32, DType::kF64, DType::kBF16};
inline const std::vector<DType> kNumericTypes = {DType::kF32, DType::kF64, DType::kBF16,
                                                 DType::kI32};
inline const std::vector<Shape> kShapes = {Shape{}, Shape{7}, Shape{2, 3, 4}};

inline Node make_node(const Primitive* op) { return Node{.op = op}; }
inline Node make_node(const Primitive& op) { return Node{.op = &op}; }

// The node the public op `f` records on tracers of these types: its attributes are what the op
// sets. (The kernels below run it on blocks of any dtype.)
inline Node recorded(const std::function<Array(const std::vector<Array>&)>& f,
                     const std::vector<TensorType>& types) {
  TraceContext ctx(Executor(1), Mesh({{"x", 1}}, 1));
  TraceScope scope(&ctx);
  std::vector<Array> xs;
  for (const TensorType& t : types) xs.push_back(ctx.add_argument(t));
  f(xs);
  EXPECT_GT(ctx.graph.size(), types.size()) << "the op recorded no node";
  return ctx.graph.nodes.back();
}
inline TensorType f32(const Shape& s) { return TensorType{s, DType::kF32}; }

// Runs the kernel on host tensors into a fresh result of `shape` and `dtype`.
inline Tensor run(const Node& node, const std::vector<const Tensor*>& in, const Shape& shape,
                  DType dtype, std::vector<std::int64_t> offset = {}) {
  std::vector<ConstBlock> blocks;
  for (const Tensor* t : in) blocks.push_back({t->bytes(), t->shape(), t->dtype()});
  Tensor out(shape, dtype);
  if (offset.empty()) offset.assign(static_cast<std::size_t>(shape.rank()), 0);
  const MutBlock out_block{out.bytes(), out.shape(), dtype};
  node.op->kernel(KernelArgs{node, blocks, out_block, offset});
  return out;
}

// A tensor holding `values` (bool: nonzero is 1); ints truncate, bf16 rounds.
inline Tensor make(const Shape& shape, DType dtype, const std::vector<double>& values) {
  Tensor t(shape, dtype);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kBool) {
      t.bytes()[i] = static_cast<std::byte>(values[i] != 0 ? 1 : 0);
    } else {
      t.set(static_cast<std::int64_t>(i), values[i]);
    }
  }
  return t;
}

// Random values in [lo, hi), as stored in `dtype`.
inline Tensor random(const Shape& shape, DType dtype, std::uint64_t seed, double lo, double hi) {
  return Tensor::uniform(shape, dtype, seed, lo, hi);
}

// Random multiples of 1/4 in [-4, 4]: exact in every float dtype, and so are their small sums.
inline Tensor quarters(const Shape& shape, DType dtype, std::uint64_t seed) {
  std::vector<double> v(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = std::floor(random_uniform(seed, i) * 33) / 4 - 4;
  }
  return make(shape, dtype, v);
}

// The elements as doubles; bool bytes as 0 or 1.
inline std::vector<double> read(const Tensor& t) {
  if (t.dtype() != DType::kBool) return t.to_doubles();
  std::vector<double> v;
  for (std::int64_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<double>(t.bytes()[i]));
  return v;
}

inline double tolerance(DType dtype, double want) {
  switch (dtype) {
    case DType::kF64:
      return 1e-12 * (1 + std::abs(want));
    case DType::kF32:
      return 1e-5 * (1 + std::abs(want));
    case DType::kBF16:  // one rounding to 8 significant bits
      return 0x1p-8 * std::abs(want) + 1e-6;
    default:
      return 0;
  }
}

inline void expect_close(const Tensor& got, const std::vector<double>& want) {
  const std::vector<double> v = read(got);
  ASSERT_EQ(v.size(), want.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(v[i])) << "element " << i;
    } else {
      EXPECT_NEAR(v[i], want[i], tolerance(got.dtype(), want[i])) << "element " << i;
    }
  }
}

inline std::vector<std::int64_t> unravel(std::int64_t flat, const Shape& s) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[d] = flat % s[d];
    flat /= s[d];
  }
  return idx;
}

inline std::int64_t ravel(const std::vector<std::int64_t>& idx, const Shape& s) {
  std::int64_t flat = 0;
  for (int d = 0; d < s.rank(); ++d) flat = flat * s[d] + idx[d];
  return flat;
}

inline std::vector<double> rounded(const Tensor& t) {
  std::vector<double> v = t.to_doubles();
  for (double& e : v) e = std::round(e);
  return v;
}

inline std::string label(DType dtype, const Shape& shape) {
  return std::string(name(dtype)) + shape.to_string();
}

inline Node dot_node(const DotDims& d, const Shape& lhs, const Shape& rhs) {
  return recorded([&](const std::vector<Array>& x) { return dot_general(x[0], x[1], d); },
                  {f32(lhs), f32(rhs)});
}

}  // namespace shardplan::detail::test
