#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/dtype.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/shape.hpp"
#include "shardplan/tensor.hpp"

namespace shardplan {

/// The primitive operations of a traced program. Everything the user-facing ops offer (softmax,
/// layer norm, cross-entropy, broadcasting binary ops...) is built from these, so sharding rules,
/// kernels and (later) gradients are written once per primitive.
enum class Op : std::uint8_t {
  // Elementwise, one operand.
  kNeg,
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kSin,
  kCos,
  kTanh,
  kRelu,
  kGelu,
  kSigmoid,
  kAbs,
  // Elementwise, two operands of one shape and dtype; comparisons give bool.
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMax,
  kMin,
  kPow,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  // select(pred: bool, on_true, on_false), one shape.
  kSelect,
  // Cast to the node's dtype.
  kConvert,
  // dot_general: result dimensions are batch, then lhs free, then rhs free (as XLA's DotGeneral).
  kDot,
  // Reductions over `axes` (removed from the shape).
  kReduceSum,
  kReduceMax,
  kReduceMin,
  // Row-major reshape to the node's shape.
  kReshape,
  // result dim i = operand dim perm[i] (`axes` holds perm).
  kTranspose,
  // broadcast_in_dim: operand dim i becomes result dim axes[i] (size equal, or 1 to broadcast).
  kBroadcast,
  // [starts, limits) per dimension, stride 1.
  kSlice,
  // Concatenate the operands along `axis`.
  kConcat,
  // take(x, indices: i32) along `axis`: that dimension of x is replaced by indices' dimensions.
  kTake,
  // result index along `axis` (any dtype); no operands.
  kIota,
  // A host tensor (`constant`), the same on every device; no operands.
  kConstant,
  // Counter-based random values (`generator`) at each global index of the node's shape (kept in
  // `limits` when the node is made local); no operands. Each device makes only its block.
  kRandom,
  // Identity whose result has a fixed sharding (`spec`): with_sharding_constraint.
  kConstraint,
  // Identity whose result takes the sharding given to `name`: with_sharding_annotation.
  kAnnotation,
  // Argument `index` of the traced function.
  kInput,
};

/// "sin", "dot_general", ...
std::string_view name(Op op);
bool is_elementwise(Op op);
/// eq, ne, lt, le, gt, ge: their results are bool and carry no gradient.
bool is_comparison(Op op);

/// Shape and dtype of a value.
struct TensorType {
  Shape shape;
  DType dtype = DType::kF32;
  friend bool operator==(const TensorType&, const TensorType&) = default;
};
/// "f32[8, 16]".
std::string to_string(const TensorType& t);

/// Dimensions of a dot_general: batch pairs and contracting pairs.
struct DotDims {
  std::vector<int> lhs_batch, rhs_batch, lhs_contract, rhs_contract;
  friend bool operator==(const DotDims&, const DotDims&) = default;
};

/// One operation of a graph. Operands are indices of earlier nodes; only the attributes the op
/// uses are set.
struct Node {
  Op op = Op::kInput;
  std::vector<int> operands;
  TensorType type;                           // of the result
  std::vector<int> axes;                     // reduce axes; transpose perm; broadcast dims
  std::vector<std::int64_t> starts, limits;  // slice
  int axis = 0;                              // concat, take, iota
  DotDims dot;                               // dot
  std::shared_ptr<const Tensor> constant;    // constant
  Generator generator;                       // random
  std::optional<PartitionSpec> spec;         // constraint
  int like = -1;                             // constraint without spec: shard like this node
  std::string name;                          // annotation
  int index = -1;                            // input
};

/// A traced program: nodes in topological order (operands before users) and the outputs.
struct Graph {
  std::vector<Node> nodes;
  std::vector<int> outputs;
  int num_inputs = 0;

  int add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size()) - 1;
  }
  /// A jaxpr-like listing: "{ lambda %0:f32[8,16] %1:f32[16,4] . %2:f32[8,4] = dot_general ...
  std::string to_string() const;
};

}  // namespace shardplan
