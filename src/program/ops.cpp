#include "shardplan/ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "compile.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/error.hpp"
#include "shardplan/sjit.hpp"
#include "trace.hpp"

namespace shardplan {
namespace {

using detail::TraceContext;

std::string type_str(const Array& a) {
  return fmt::format("{}{}", name(a.dtype()), a.shape().to_string());
}

int norm_axis(int axis, int rank, std::string_view op, const Array& x) {
  const int a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= std::max(rank, 1)) {
    throw SpecError(fmt::format("[{}] axis {} is out of range for {}", op, axis, type_str(x)));
  }
  return a;
}

// The signature of a one-op program for the eager cache.
std::string signature(const Node& n, const std::vector<Array>& ins) {
  std::string s = fmt::format(
      "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", name(n.op), to_string(n.type), fmt::join(n.axes, ","),
      fmt::join(n.starts, ","), fmt::join(n.limits, ","), n.axis, fmt::join(n.dot.lhs_batch, ","),
      fmt::join(n.dot.rhs_batch, ","), fmt::join(n.dot.lhs_contract, ","),
      fmt::join(n.dot.rhs_contract, ","), static_cast<const void*>(n.constant.get()));
  for (const Array& a : ins) {
    s += fmt::format("|{}:{}:{}", type_str(a), a.sharding().to_string(),
                     fmt::join(a.pending().axes, ","));
    s += fmt::format(":{}", static_cast<int>(a.pending().op));
  }
  return s;
}

// One op on concrete arrays: a one-op program, compiled once per signature, run at once.
Array run_eager(Node n, const std::vector<Array>& ins, const Array& placement) {
  for (std::size_t k = 1; k < ins.size(); ++k) check_same_placement(ins[0], ins[k], name(n.op));
  Graph g;
  detail::CompileSpec spec{placement.mesh(), {}, {std::nullopt}};
  for (std::size_t k = 0; k < ins.size(); ++k) {
    Node in;
    in.op = Op::kInput;
    in.index = static_cast<int>(k);
    in.type = TensorType{ins[k].shape(), ins[k].dtype()};
    n.operands.push_back(g.add(std::move(in)));
    spec.inputs.push_back(detail::InputSpec{ins[k].sharding().spec(), ins[k].pending(),
                                            fmt::format("operand {}", k)});
  }
  g.num_inputs = static_cast<int>(ins.size());
  const std::string key = signature(n, ins) + "|" + placement.mesh().to_string() +
                          fmt::format("{}", fmt::join(placement.mesh().devices(), ","));
  g.outputs = {g.add(std::move(n))};
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<const detail::Program>> cache;
  std::shared_ptr<const detail::Program> prog;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) prog = it->second;
  }
  if (!prog) {
    prog = std::make_shared<const detail::Program>(detail::compile(g, spec));
    std::lock_guard<std::mutex> lock(mu);
    if (cache.size() > 4096) cache.clear();
    cache.emplace(key, prog);
  }
  return prog->run(placement.executor(), ins)[0];
}

// Records (inside sjit) or runs (outside) `n` on `ins`; `placement` gives mesh and executor to
// ops without operands.
Array emit(Node n, const std::vector<Array>& ins, const Array* placement = nullptr) {
  TraceContext* ctx = detail::current_trace();
  bool traced = ctx != nullptr;
  for (const Array& a : ins) traced = traced || a.is_tracer();
  if (traced) {
    if (ctx == nullptr) {
      throw ArrayError(fmt::format("[{}] {} is a tracer used outside the sjit that made it",
                                   name(n.op), type_str(ins[0])));
    }
    for (const Array& a : ins) n.operands.push_back(ctx->node_of(a));
    return ctx->record(std::move(n));
  }
  const Array& where = placement ? *placement : ins.at(0);
  return run_eager(std::move(n), ins, where);
}

}  // namespace

Array detail::with_sharding_like(const Array& x, const Array& like) {
  TraceContext* ctx = detail::current_trace();
  if (ctx == nullptr) return with_sharding_constraint(x, like.sharding().spec());
  Node n;
  n.op = Op::kConstraint;
  n.type = TensorType{x.shape(), x.dtype()};
  n.like = ctx->node_of(like);
  return emit(std::move(n), {x});
}

Array detail::apply_node(Node n, const std::vector<Array>& operands, const Array* placement) {
  n.operands.clear();
  return emit(std::move(n), operands, placement);
}

namespace {

Node node(Op op, TensorType type) {
  Node n;
  n.op = op;
  n.type = std::move(type);
  return n;
}

Array unary(Op op, const Array& x) {
  const bool is_float =
      x.dtype() == DType::kF32 || x.dtype() == DType::kF64 || x.dtype() == DType::kBF16;
  const bool int_ok = op == Op::kNeg || op == Op::kAbs || op == Op::kRelu;
  if (!is_float && !(int_ok && (x.dtype() == DType::kI32 || x.dtype() == DType::kI64))) {
    throw SpecError(fmt::format("[{}] needs a float array, got {}", name(op), type_str(x)));
  }
  return emit(node(op, TensorType{x.shape(), x.dtype()}), {x});
}

Shape broadcast_shape(const Shape& a, const Shape& b, std::string_view op, const Array& x,
                      const Array& y) {
  const int r = std::max(a.rank(), b.rank());
  std::vector<std::int64_t> out(static_cast<std::size_t>(r));
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      throw SpecError(fmt::format("[{}] shapes {} and {} do not broadcast (dimension {}: {} vs {})",
                                  op, type_str(x), type_str(y), i, da, db));
    }
    out[static_cast<std::size_t>(i)] = da == 1 ? db : da;
  }
  return Shape(out);
}

Array broadcast_to_shape(const Array& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  std::vector<int> dims;
  for (int i = 0; i < x.shape().rank(); ++i) dims.push_back(shape.rank() - x.shape().rank() + i);
  return broadcast_in_dim(x, shape, dims);
}

Array binary(Op op, const Array& a, const Array& b) {
  if (a.dtype() != b.dtype()) {
    throw SpecError(fmt::format("[{}] operands have different dtypes: {} and {} (use astype)",
                                name(op), type_str(a), type_str(b)));
  }
  const Shape shape = broadcast_shape(a.shape(), b.shape(), name(op), a, b);
  return emit(node(op, TensorType{shape, is_comparison(op) ? DType::kBool : a.dtype()}),
              {broadcast_to_shape(a, shape), broadcast_to_shape(b, shape)});
}

// A scalar of `dtype` broadcast to `shape`, placed like `like`.
Array scalar(double value, DType dtype, const Shape& shape, const Array& like) {
  auto t = std::make_shared<Tensor>(Shape{}, dtype);
  t->set(0, value);
  Array s;
  if (detail::current_trace() != nullptr || like.is_tracer()) {
    Node n = node(Op::kConstant, TensorType{Shape{}, dtype});
    n.constant = t;
    s = emit(std::move(n), {}, &like);
  } else {
    s = device_put(*t, NamedSharding(like.mesh(), PartitionSpec()), like.executor());
  }
  return broadcast_in_dim(s, shape, {});
}

std::vector<int> norm_axes(std::vector<int> axes, const Array& x, std::string_view op) {
  for (int& a : axes) a = norm_axis(a, x.shape().rank(), op, x);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) {
    throw SpecError(fmt::format("[{}] an axis appears twice in [{}]", op, fmt::join(axes, ", ")));
  }
  return axes;
}

Array reduce(Op op, const Array& x, std::vector<int> axes, bool keepdims) {
  axes = norm_axes(std::move(axes), x, name(op));
  std::vector<std::int64_t> kept, with_ones;
  for (int d = 0; d < x.shape().rank(); ++d) {
    const bool r = std::binary_search(axes.begin(), axes.end(), d);
    if (!r) kept.push_back(x.shape()[d]);
    with_ones.push_back(r ? 1 : x.shape()[d]);
  }
  Node n = node(op, TensorType{Shape(kept), x.dtype()});
  n.axes = axes;
  Array out = emit(std::move(n), {x});
  return keepdims ? reshape(out, Shape(with_ones)) : out;
}

std::vector<int> all_axes(const Array& x) {
  std::vector<int> a(static_cast<std::size_t>(x.shape().rank()));
  for (int i = 0; i < x.shape().rank(); ++i) a[static_cast<std::size_t>(i)] = i;
  return a;
}

}  // namespace

Array neg(const Array& x) { return unary(Op::kNeg, x); }
Array exp(const Array& x) { return unary(Op::kExp, x); }
Array log(const Array& x) { return unary(Op::kLog, x); }
Array sqrt(const Array& x) { return unary(Op::kSqrt, x); }
Array rsqrt(const Array& x) { return unary(Op::kRsqrt, x); }
Array sin(const Array& x) { return unary(Op::kSin, x); }
Array cos(const Array& x) { return unary(Op::kCos, x); }
Array tanh(const Array& x) { return unary(Op::kTanh, x); }
Array relu(const Array& x) { return unary(Op::kRelu, x); }
Array gelu(const Array& x) { return unary(Op::kGelu, x); }
Array sigmoid(const Array& x) { return unary(Op::kSigmoid, x); }
Array abs(const Array& x) { return unary(Op::kAbs, x); }

Array add(const Array& a, const Array& b) { return binary(Op::kAdd, a, b); }
Array subtract(const Array& a, const Array& b) { return binary(Op::kSub, a, b); }
Array multiply(const Array& a, const Array& b) { return binary(Op::kMul, a, b); }
Array divide(const Array& a, const Array& b) { return binary(Op::kDiv, a, b); }
Array maximum(const Array& a, const Array& b) { return binary(Op::kMax, a, b); }
Array minimum(const Array& a, const Array& b) { return binary(Op::kMin, a, b); }
Array power(const Array& a, const Array& b) { return binary(Op::kPow, a, b); }
Array equal(const Array& a, const Array& b) { return binary(Op::kEq, a, b); }
Array not_equal(const Array& a, const Array& b) { return binary(Op::kNe, a, b); }
Array less(const Array& a, const Array& b) { return binary(Op::kLt, a, b); }
Array less_equal(const Array& a, const Array& b) { return binary(Op::kLe, a, b); }
Array greater(const Array& a, const Array& b) { return binary(Op::kGt, a, b); }
Array greater_equal(const Array& a, const Array& b) { return binary(Op::kGe, a, b); }

Array where(const Array& cond, const Array& a, const Array& b) {
  if (cond.dtype() != DType::kBool) {
    throw SpecError(fmt::format("[where] the condition must be bool, got {}", type_str(cond)));
  }
  if (a.dtype() != b.dtype()) {
    throw SpecError(
        fmt::format("[where] branches have different dtypes: {} and {}", type_str(a), type_str(b)));
  }
  const Shape s1 = broadcast_shape(a.shape(), b.shape(), "where", a, b);
  const Shape shape = broadcast_shape(cond.shape(), s1, "where", cond, a);
  return emit(node(Op::kSelect, TensorType{shape, a.dtype()}),
              {broadcast_to_shape(cond, shape), broadcast_to_shape(a, shape),
               broadcast_to_shape(b, shape)});
}

Array operator-(const Array& x) { return neg(x); }
Array operator+(const Array& a, const Array& b) { return add(a, b); }
Array operator-(const Array& a, const Array& b) { return subtract(a, b); }
Array operator*(const Array& a, const Array& b) { return multiply(a, b); }
Array operator/(const Array& a, const Array& b) { return divide(a, b); }
Array full_like(const Array& x, double value) { return scalar(value, x.dtype(), x.shape(), x); }
Array full(const Shape& shape, DType dtype, double value, const Array& placement) {
  return scalar(value, dtype, shape, placement);
}
Array operator+(const Array& a, double b) { return add(a, full_like(a, b)); }
Array operator-(const Array& a, double b) { return subtract(a, full_like(a, b)); }
Array operator*(const Array& a, double b) { return multiply(a, full_like(a, b)); }
Array operator/(const Array& a, double b) { return divide(a, full_like(a, b)); }
Array operator+(double a, const Array& b) { return add(full_like(b, a), b); }
Array operator-(double a, const Array& b) { return subtract(full_like(b, a), b); }
Array operator*(double a, const Array& b) { return multiply(full_like(b, a), b); }
Array operator/(double a, const Array& b) { return divide(full_like(b, a), b); }

Array astype(const Array& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return emit(node(Op::kConvert, TensorType{x.shape(), dtype}), {x});
}

Array dot_general(const Array& a, const Array& b, const DotDims& d) {
  auto fail = [&](const std::string& why) {
    return SpecError(fmt::format("[dot_general] {} and {}: {}", type_str(a), type_str(b), why));
  };
  if (a.dtype() != b.dtype()) throw fail("different dtypes");
  if (d.lhs_batch.size() != d.rhs_batch.size() || d.lhs_contract.size() != d.rhs_contract.size()) {
    throw fail("batch and contracting dimensions must pair up");
  }
  std::vector<bool> la(static_cast<std::size_t>(a.shape().rank()), false);
  std::vector<bool> rb(static_cast<std::size_t>(b.shape().rank()), false);
  auto mark = [&](std::vector<bool>& used, int dim, const Array& x) {
    if (dim < 0 || dim >= x.shape().rank() || used[static_cast<std::size_t>(dim)]) {
      throw fail(fmt::format("dimension {} is out of range or used twice", dim));
    }
    used[static_cast<std::size_t>(dim)] = true;
  };
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < d.lhs_batch.size(); ++i) {
    mark(la, d.lhs_batch[i], a);
    mark(rb, d.rhs_batch[i], b);
    if (a.shape()[d.lhs_batch[i]] != b.shape()[d.rhs_batch[i]]) {
      throw fail(fmt::format("batch dimensions {} and {} differ", d.lhs_batch[i], d.rhs_batch[i]));
    }
    out.push_back(a.shape()[d.lhs_batch[i]]);
  }
  for (std::size_t i = 0; i < d.lhs_contract.size(); ++i) {
    mark(la, d.lhs_contract[i], a);
    mark(rb, d.rhs_contract[i], b);
    if (a.shape()[d.lhs_contract[i]] != b.shape()[d.rhs_contract[i]]) {
      throw fail(fmt::format("contracting dimensions {} and {} differ ({} vs {})",
                             d.lhs_contract[i], d.rhs_contract[i], a.shape()[d.lhs_contract[i]],
                             b.shape()[d.rhs_contract[i]]));
    }
  }
  for (int i = 0; i < a.shape().rank(); ++i) {
    if (!la[static_cast<std::size_t>(i)]) out.push_back(a.shape()[i]);
  }
  for (int i = 0; i < b.shape().rank(); ++i) {
    if (!rb[static_cast<std::size_t>(i)]) out.push_back(b.shape()[i]);
  }
  Node n = node(Op::kDot, TensorType{Shape(out), a.dtype()});
  n.dot = d;
  return emit(std::move(n), {a, b});
}

Array matmul(const Array& a, const Array& b) {
  const int ra = a.shape().rank(), rb = b.shape().rank();
  if (ra < 1 || rb < 2) {
    throw SpecError(fmt::format("[matmul] needs a of rank >= 1 and b of rank >= 2, got {} and {}",
                                type_str(a), type_str(b)));
  }
  if (a.shape()[ra - 1] != b.shape()[rb - 2]) {
    throw SpecError(fmt::format("[matmul] {} and {} do not contract: {} != {}", type_str(a),
                                type_str(b), a.shape()[ra - 1], b.shape()[rb - 2]));
  }
  if (rb == 2) return dot_general(a, b, DotDims{{}, {}, {ra - 1}, {0}});
  if (ra != rb) {
    throw SpecError(fmt::format("[matmul] batched operands need the same rank: {} and {}",
                                type_str(a), type_str(b)));
  }
  DotDims d;
  for (int i = 0; i < ra - 2; ++i) {
    d.lhs_batch.push_back(i);
    d.rhs_batch.push_back(i);
  }
  d.lhs_contract = {ra - 1};
  d.rhs_contract = {rb - 2};
  return dot_general(a, b, d);
}

Array sum(const Array& x, std::vector<int> axes, bool keepdims) {
  return reduce(Op::kReduceSum, x, std::move(axes), keepdims);
}
Array max(const Array& x, std::vector<int> axes, bool keepdims) {
  return reduce(Op::kReduceMax, x, std::move(axes), keepdims);
}
Array min(const Array& x, std::vector<int> axes, bool keepdims) {
  return reduce(Op::kReduceMin, x, std::move(axes), keepdims);
}
Array mean(const Array& x, std::vector<int> axes, bool keepdims) {
  const auto norm = norm_axes(axes, x, "mean");
  double count = 1;
  for (const int a : norm) count *= static_cast<double>(x.shape()[a]);
  const Array s = sum(x, norm, keepdims);
  return s * (1.0 / count);
}
Array sum(const Array& x) { return sum(x, all_axes(x)); }
Array mean(const Array& x) { return mean(x, all_axes(x)); }

Array reshape(const Array& x, const Shape& shape) {
  if (shape.numel() != x.shape().numel()) {
    throw SpecError(fmt::format("[reshape] cannot reshape {} ({} elements) to {} ({})", type_str(x),
                                x.shape().numel(), shape.to_string(), shape.numel()));
  }
  if (shape == x.shape()) return x;
  return emit(node(Op::kReshape, TensorType{shape, x.dtype()}), {x});
}

Array transpose(const Array& x, std::vector<int> perm) {
  const int r = x.shape().rank();
  if (perm.empty()) {
    for (int i = r - 1; i >= 0; --i) perm.push_back(i);
  }
  std::vector<int> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  bool ok = static_cast<int>(perm.size()) == r;
  for (int i = 0; ok && i < r; ++i) ok = sorted[static_cast<std::size_t>(i)] == i;
  if (!ok) {
    throw SpecError(fmt::format("[transpose] [{}] is not a permutation of the {} dimensions of {}",
                                fmt::join(perm, ", "), r, type_str(x)));
  }
  std::vector<std::int64_t> out;
  for (const int p : perm) out.push_back(x.shape()[p]);
  Node n = node(Op::kTranspose, TensorType{Shape(out), x.dtype()});
  n.axes = perm;
  return emit(std::move(n), {x});
}

Array broadcast_in_dim(const Array& x, const Shape& shape, std::vector<int> dims) {
  bool ok = static_cast<int>(dims.size()) == x.shape().rank();
  for (std::size_t i = 0; ok && i < dims.size(); ++i) {
    const int d = dims[i];
    ok = d >= 0 && d < shape.rank() && (i == 0 || d > dims[i - 1]) &&
         (x.shape()[static_cast<int>(i)] == shape[d] || x.shape()[static_cast<int>(i)] == 1);
  }
  if (!ok) {
    throw SpecError(fmt::format("[broadcast_in_dim] cannot broadcast {} to {} with dims [{}]",
                                type_str(x), shape.to_string(), fmt::join(dims, ", ")));
  }
  if (shape == x.shape()) return x;
  Node n = node(Op::kBroadcast, TensorType{shape, x.dtype()});
  n.axes = std::move(dims);
  return emit(std::move(n), {x});
}

Array broadcast_to(const Array& x, const Shape& shape) {
  // numpy's rule, one way: x's dimensions, aligned right, are 1 or equal to the target's.
  bool ok = x.shape().rank() <= shape.rank();
  for (int i = 0; ok && i < x.shape().rank(); ++i) {
    const std::int64_t d = x.shape()[i];
    ok = d == 1 || d == shape[shape.rank() - x.shape().rank() + i];
  }
  if (!ok) {
    throw SpecError(
        fmt::format("[broadcast_to] cannot broadcast {} to {}", type_str(x), shape.to_string()));
  }
  return broadcast_to_shape(x, shape);
}

Array slice(const Array& x, std::vector<std::int64_t> starts, std::vector<std::int64_t> limits) {
  const int r = x.shape().rank();
  bool ok = static_cast<int>(starts.size()) == r && static_cast<int>(limits.size()) == r;
  std::vector<std::int64_t> out;
  for (int d = 0; ok && d < r; ++d) {
    const auto i = static_cast<std::size_t>(d);
    ok = starts[i] >= 0 && starts[i] <= limits[i] && limits[i] <= x.shape()[d];
    out.push_back(limits[i] - starts[i]);
  }
  if (!ok) {
    throw SpecError(fmt::format("[slice] [{}] to [{}] is not inside {}", fmt::join(starts, ", "),
                                fmt::join(limits, ", "), type_str(x)));
  }
  Node n = node(Op::kSlice, TensorType{Shape(out), x.dtype()});
  n.starts = std::move(starts);
  n.limits = std::move(limits);
  return emit(std::move(n), {x});
}

Array concatenate(const std::vector<Array>& xs, int axis) {
  if (xs.empty()) throw SpecError("[concatenate] needs at least one array");
  const int r = xs[0].shape().rank();
  axis = norm_axis(axis, r, "concatenate", xs[0]);
  std::vector<std::int64_t> out = xs[0].shape().dims();
  out[static_cast<std::size_t>(axis)] = 0;
  for (const Array& x : xs) {
    bool ok = x.shape().rank() == r && x.dtype() == xs[0].dtype();
    for (int d = 0; ok && d < r; ++d) ok = d == axis || x.shape()[d] == xs[0].shape()[d];
    if (!ok) {
      throw SpecError(fmt::format("[concatenate] {} does not fit {} along axis {}", type_str(x),
                                  type_str(xs[0]), axis));
    }
    out[static_cast<std::size_t>(axis)] += x.shape()[axis];
  }
  if (xs.size() == 1) return xs[0];
  Node n = node(Op::kConcat, TensorType{Shape(out), xs[0].dtype()});
  n.axis = axis;
  return emit(std::move(n), xs);
}

Array take(const Array& x, const Array& indices, int axis) {
  axis = norm_axis(axis, x.shape().rank(), "take", x);
  if (indices.dtype() != DType::kI32) {
    throw SpecError(fmt::format("[take] indices must be i32, got {}", type_str(indices)));
  }
  std::vector<std::int64_t> out;
  for (int d = 0; d < axis; ++d) out.push_back(x.shape()[d]);
  for (int d = 0; d < indices.shape().rank(); ++d) out.push_back(indices.shape()[d]);
  for (int d = axis + 1; d < x.shape().rank(); ++d) out.push_back(x.shape()[d]);
  Node n = node(Op::kTake, TensorType{Shape(out), x.dtype()});
  n.axis = axis;
  return emit(std::move(n), {x, indices});
}

namespace {
Array random_array(const Shape& shape, DType dtype, const Generator& g, std::string_view what) {
  TraceContext* ctx = detail::current_trace();
  if (ctx == nullptr) {
    throw ArrayError(fmt::format(
        "[{}] outside sjit there is no sharding to make the shards of; use Array::{} with a "
        "NamedSharding",
        what, what == "random_normal" ? "normal" : "uniform"));
  }
  if (!is_computable(dtype)) {
    throw SpecError(fmt::format("[{}] cannot make {} values", what, name(dtype)));
  }
  Node n = node(Op::kRandom, TensorType{shape, dtype});
  n.generator = g;
  return ctx->record(std::move(n));
}
}  // namespace

Array random_normal(const Shape& shape, DType dtype, std::uint64_t seed, double mean,
                    double stddev) {
  return random_array(shape, dtype, Generator::normal(seed, mean, stddev), "random_normal");
}

Array random_uniform(const Shape& shape, DType dtype, std::uint64_t seed, double low, double high) {
  return random_array(shape, dtype, Generator::uniform(seed, low, high), "random_uniform");
}

Array iota_like(const Array& like, int axis, DType dtype) {
  if (like.shape().rank() == 0) {
    throw SpecError(fmt::format("[iota] needs an array with an axis, got {}", type_str(like)));
  }
  axis = norm_axis(axis, like.shape().rank(), "iota", like);
  Node n = node(Op::kIota, TensorType{like.shape(), dtype});
  n.axis = axis;
  return emit(std::move(n), {}, &like);
}

Array one_hot(const Array& labels, std::int64_t n, DType dtype) {
  if (labels.dtype() != DType::kI32) {
    throw SpecError(fmt::format("[one_hot] labels must be i32, got {}", type_str(labels)));
  }
  std::vector<std::int64_t> dims = labels.shape().dims();
  dims.push_back(n);
  const Shape shape(dims);
  std::vector<int> keep;
  for (int d = 0; d < labels.shape().rank(); ++d) keep.push_back(d);
  const Array l = broadcast_in_dim(labels, shape, keep);
  const Array classes = iota_like(l, labels.shape().rank(), DType::kI32);
  return astype(equal(l, classes), dtype);
}

Array softmax(const Array& x, int axis) {
  axis = norm_axis(axis, x.shape().rank(), "softmax", x);
  const Array shifted = x - max(x, {axis}, true);
  const Array e = exp(shifted);
  return e / sum(e, {axis}, true);
}

Array log_softmax(const Array& x, int axis) {
  axis = norm_axis(axis, x.shape().rank(), "log_softmax", x);
  const Array shifted = x - max(x, {axis}, true);
  return shifted - log(sum(exp(shifted), {axis}, true));
}

Array cross_entropy(const Array& logits, const Array& labels) {
  const int r = logits.shape().rank();
  if (r < 1 || labels.shape().rank() != r - 1) {
    throw SpecError(fmt::format("[cross_entropy] logits {} need labels of rank {}, got {}",
                                type_str(logits), r - 1, type_str(labels)));
  }
  const Array lp = log_softmax(logits, -1);
  const Array oh = one_hot(labels, logits.shape()[r - 1], logits.dtype());
  return -sum(lp * oh, {-1});
}

Array layer_norm(const Array& x, const Array& scale, const Array& bias, double eps) {
  const Array mu = mean(x, {-1}, true);
  const Array centered = x - mu;
  const Array var = mean(centered * centered, {-1}, true);
  return centered * rsqrt(var + eps) * scale + bias;
}

Array rms_norm(const Array& x, const Array& scale, double eps) {
  const Array ms = mean(x * x, {-1}, true);
  return x * rsqrt(ms + eps) * scale;
}

Array causal_mask(const Array& scores) {
  const int r = scores.shape().rank();
  if (r < 2 || scores.shape()[r - 1] != scores.shape()[r - 2]) {
    throw SpecError(
        fmt::format("[causal_mask] needs scores [..., T, T], got {}", type_str(scores)));
  }
  const Array i = iota_like(scores, r - 2);
  const Array j = iota_like(scores, r - 1);
  return where(less_equal(j, i), scores, full_like(scores, -1e30));
}

Array with_sharding_constraint(const Array& x, const PartitionSpec& spec) {
  if (detail::current_trace() != nullptr || x.is_tracer()) {
    Node n = node(Op::kConstraint, TensorType{x.shape(), x.dtype()});
    n.spec = spec;
    return emit(std::move(n), {x});
  }
  return reshard(x, NamedSharding(x.mesh(), spec)).array;
}

Array with_sharding_annotation(const Array& x, const std::string& name) {
  return with_sharding_annotation(Tree<Array>(x), name).leaf();
}

Tree<Array> with_sharding_constraint(const Tree<Array>& tree, const RuleTree& rules) {
  const auto leaves = tree.leaves();
  if (leaves.empty()) return tree;
  TraceContext* ctx = detail::current_trace();
  const Mesh mesh = ctx != nullptr ? ctx->mesh : leaves.front().mesh();
  const Tree<TensorSpec> specs = tree.map([](const Array& a) {
    return TensorSpec{a.shape(), a.dtype()};
  });
  const auto shardings = MeshShardingHelper(mesh).match(rules, specs).leaves();
  std::size_t k = 0;
  return tree.map([&](const Array& a) {
    const MaybeSharding& s = shardings[k++];
    return s ? with_sharding_constraint(a, s->spec()) : a;
  });
}

Tree<Array> with_sharding_annotation(const Tree<Array>& tree, const std::string& name) {
  TraceContext* ctx = detail::current_trace();
  if (ctx == nullptr) {
    // Outside any sjit: the MeshContext's sharding for the name, if any, applies at once (as
    // scalax's global annotation shardings); otherwise nothing to annotate.
    const MeshContext* mc = get_context();
    if (mc == nullptr) return tree;
    const auto it = mc->annotation_shardings().find(name);
    if (it == mc->annotation_shardings().end()) return tree;
    return with_sharding_constraint(tree, it->second);
  }
  const RuleTree* rule = ctx->annotation_rule(name);
  std::vector<MaybeSharding> shardings;
  if (rule != nullptr) {
    const Tree<TensorSpec> specs = tree.map([](const Array& a) {
      return TensorSpec{a.shape(), a.dtype()};
    });
    shardings = MeshShardingHelper(ctx->mesh).match(*rule, specs).leaves();
  }
  std::size_t k = 0;
  return tree.map([&](const Array& a) {
    Node n = node(Op::kAnnotation, TensorType{a.shape(), a.dtype()});
    n.name = name;
    if (rule != nullptr && shardings[k]) n.spec = shardings[k]->spec();
    ++k;
    return emit(std::move(n), {a});
  });
}

}  // namespace shardplan
