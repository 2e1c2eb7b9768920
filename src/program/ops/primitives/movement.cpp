// Data movement: reshape, transpose, broadcast_in_dim, slice, concatenate, take (the last three in
// movement_index.cpp). No arithmetic (no FLOPs); kernels move elements as bytes of their size, so
// every dtype moves.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include "../../../runtime/box_copy.hpp"
#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "movement_tests.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

/// reshape: to `shape` (row-major).
struct ReshapeAttrs {
  Shape shape;
};
/// transpose: result dim i = operand dim perm[i].
struct TransposeAttrs {
  std::vector<int> perm;
};
/// broadcast_in_dim: to `shape`; operand dim i becomes result dim dims[i] (equal, or 1).
struct BroadcastAttrs {
  Shape shape;
  std::vector<int> dims;
};
std::string format_attrs(const ReshapeAttrs&) { return {}; }  // the result type says it
std::string format_attrs(const TransposeAttrs& a) {
  return a.perm.empty() ? std::string() : fmt::format(" axes=[{}]", fmt::join(a.perm, ","));
}
std::string format_attrs(const BroadcastAttrs& a) {
  return a.dims.empty() ? std::string() : fmt::format(" axes=[{}]", fmt::join(a.dims, ","));
}

namespace {

using Arrays = std::vector<Array>;

// A reshape keeps the row-major order: result element i is operand element i.
Repetition reshape_repeat(const Node&, const Shape& operand) { return {operand.numel(), 1}; }

void copy_kernel(const KernelArgs& k) {
  const auto bytes = static_cast<std::size_t>(k.out.shape.numel()) * size_of(k.out.dtype);
  if (bytes > 0) std::memcpy(k.out.data, k.in[0].data, bytes);
}

// ---- reshape ----------------------------------------------------------------------------------

TensorType reshape_type(const Node& n, std::span<const TensorType> in) {
  const Shape& to = n.attr<ReshapeAttrs>().shape;
  if (to.numel() != in[0].shape.numel()) {
    throw SpecError(fmt::format("[{}] cannot reshape {}{} ({} elements) to {} ({})", n.op->name,
                                name(in[0].dtype), in[0].shape.to_string(), in[0].shape.numel(),
                                to.to_string(), to.numel()));
  }
  return TensorType{to, in[0].dtype};
}

// Dimensions equal from the front and from the back are shared; in between, a dimension split
// into several (or several merged into one) shares its major part; the rest must be whole.
OpFactors reshape_factors(const Node& n, std::span<const Shape> operands) {
  OpFactors f;
  const Shape& in = operands[0];
  const Shape& out = n.type.shape;
  std::vector<int> inf(static_cast<std::size_t>(in.rank()), -1);
  std::vector<int> outf(static_cast<std::size_t>(out.rank()), -1);
  int a = 0, b = 0;
  while (a < in.rank() && b < out.rank() && in[a] == out[b]) {
    inf[static_cast<std::size_t>(a)] = outf[static_cast<std::size_t>(b)] =
        f.add(in[a], FactorKind::kPass);
    ++a;
    ++b;
  }
  int ea = in.rank() - 1, eb = out.rank() - 1;
  while (ea >= a && eb >= b && in[ea] == out[eb]) {
    inf[static_cast<std::size_t>(ea)] = outf[static_cast<std::size_t>(eb)] =
        f.add(in[ea], FactorKind::kPass);
    --ea;
    --eb;
  }
  // The middle: in[a..ea] and out[b..eb] hold the same number of elements.
  if (ea >= a && eb >= b) {
    // Their major dimensions share a factor of the smaller size when one divides the other. The
    // larger side's dimension is a compound: sharding it over the factor's axes is the same
    // blocks as sharding the factor, so it is shared too (sizes are checked on use).
    const std::int64_t x = in[a], y = out[b];
    const std::int64_t m = std::min(x, y);
    if (m > 0 && std::max(x, y) % m == 0) {
      const int id = f.add(m, FactorKind::kPass);
      inf[static_cast<std::size_t>(a)] = id;
      outf[static_cast<std::size_t>(b)] = id;
    }
    for (int d = a; d <= ea; ++d) {
      if (inf[static_cast<std::size_t>(d)] < 0)
        inf[static_cast<std::size_t>(d)] = f.add(in[d], FactorKind::kReplicate);
    }
    for (int d = b; d <= eb; ++d) {
      if (outf[static_cast<std::size_t>(d)] < 0)
        outf[static_cast<std::size_t>(d)] = f.add(out[d], FactorKind::kReplicate);
    }
  }
  f.operands = {inf};
  f.result = outf;
  return f;
}

Arrays reshape_vjp(const Node&, const Arrays& in, const Array&, const Array& g) {
  return {reshape(g, in[0].shape())};
}

// ---- transpose --------------------------------------------------------------------------------

TensorType transpose_type(const Node& n, std::span<const TensorType> in) {
  const std::vector<int>& perm = n.attr<TransposeAttrs>().perm;
  const int r = in[0].shape.rank();
  std::vector<int> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != int_range(0, r)) {
    throw SpecError(fmt::format("[transpose] [{}] is not a permutation of the {} dimensions of {}",
                                fmt::join(perm, ", "), r, to_string(in[0])));
  }
  std::vector<std::int64_t> out;
  for (const int p : perm) out.push_back(in[0].shape[p]);
  return TensorType{Shape(out), in[0].dtype};
}

OpFactors transpose_factors(const Node& n, std::span<const Shape> in) {
  OpFactors f;
  std::vector<int> inf(static_cast<std::size_t>(in[0].rank()));
  for (int d = 0; d < in[0].rank(); ++d)
    inf[static_cast<std::size_t>(d)] = f.add(in[0][d], FactorKind::kPass);
  for (const int p : n.attr<TransposeAttrs>().perm)
    f.result.push_back(inf[static_cast<std::size_t>(p)]);
  f.operands = {inf};
  return f;
}

void transpose_kernel(const KernelArgs& k) {
  const std::vector<std::int64_t> in_strides = row_major_strides(k.in[0].shape);
  std::vector<std::int64_t> strides;
  for (const int d : k.node.attr<TransposeAttrs>().perm) strides.push_back(in_strides[d]);
  gather(k, strides);
}

Arrays transpose_vjp(const Node& n, const Arrays&, const Array&, const Array& g) {
  return {transpose(g, inverse_permutation(n.attr<TransposeAttrs>().perm))};
}

// ---- broadcast_in_dim -------------------------------------------------------------------------

TensorType broadcast_type(const Node& n, std::span<const TensorType> in) {
  const auto& [shape, dims] = n.attr<BroadcastAttrs>();
  const Shape& x = in[0].shape;
  bool ok = static_cast<int>(dims.size()) == x.rank();
  for (std::size_t i = 0; ok && i < dims.size(); ++i) {
    const int d = dims[i];
    ok = d >= 0 && d < shape.rank() && (i == 0 || d > dims[i - 1]) &&
         (x[static_cast<int>(i)] == shape[d] || x[static_cast<int>(i)] == 1);
  }
  if (!ok) {
    throw SpecError(fmt::format("[broadcast_in_dim] cannot broadcast {} to {} with dims [{}]",
                                to_string(in[0]), shape.to_string(), fmt::join(dims, ", ")));
  }
  return TensorType{shape, in[0].dtype};
}

OpFactors broadcast_factors(const Node& n, std::span<const Shape> operands) {
  OpFactors f;
  const Shape& in = operands[0];
  const Shape& out = n.type.shape;
  const std::vector<int>& dims = n.attr<BroadcastAttrs>().dims;
  f.result.assign(static_cast<std::size_t>(out.rank()), -1);
  std::vector<int> inf(static_cast<std::size_t>(in.rank()), -1);
  for (int d = 0; d < in.rank(); ++d) {
    const int od = dims[static_cast<std::size_t>(d)];
    if (in[d] == out[od]) {
      inf[static_cast<std::size_t>(d)] = f.result[static_cast<std::size_t>(od)] =
          f.add(in[d], FactorKind::kPass);
    }
  }
  for (int d = 0; d < out.rank(); ++d) {
    if (f.result[static_cast<std::size_t>(d)] < 0)
      f.result[static_cast<std::size_t>(d)] = f.add(out[d], FactorKind::kPass);
  }
  f.operands = {inf};
  return f;
}

// A repetition when the operand's dimensions other than 1 are consecutive dimensions of the
// result, in order and of the same sizes: a bias [n] to [m, n] (period n), a row statistic [m, 1]
// to [m, n] (period m, each element n times), [t, 1] to [b, t, d], a scalar to anything.
Repetition broadcast_repeat(const Node& n, const Shape& operand) {
  const std::vector<int>& dims = n.attr<BroadcastAttrs>().dims;
  const Shape& out = n.type.shape;
  int last = -1;  // the result dimension of the operand's last dimension other than 1
  std::optional<int> next;  // the one its previous such dimension must sit at
  for (int d = operand.rank() - 1; d >= 0; --d) {
    if (operand[d] == 1) continue;
    const int to = dims[static_cast<std::size_t>(d)];
    if (out[to] != operand[d] || (next.has_value() && to != *next)) return {};
    if (last < 0) last = to;
    next = to - 1;
  }
  std::int64_t inner = 1;
  for (int d = last + 1; last >= 0 && d < out.rank(); ++d) inner *= out[d];
  return {operand.numel(), inner};
}

void broadcast_kernel(const KernelArgs& k) {
  const Shape& in = k.in[0].shape;
  const std::vector<int>& dims = k.node.attr<BroadcastAttrs>().dims;
  const std::vector<std::int64_t> in_strides = row_major_strides(in);
  std::vector<std::int64_t> strides(static_cast<std::size_t>(k.out.shape.rank()), 0);
  for (int d = 0; d < in.rank(); ++d) {
    const int to = dims[static_cast<std::size_t>(d)];
    if (in[d] == k.out.shape[to]) strides[to] = in_strides[d];  // else size 1: repeated
  }
  gather(k, strides);
}

// The cotangent summed over the broadcast dimensions.
Arrays broadcast_vjp(const Node& n, const Arrays& in, const Array&, const Array& g) {
  const Shape& s = in[0].shape();
  const std::vector<int>& dims = n.attr<BroadcastAttrs>().dims;
  std::vector<int> summed;
  for (int d = 0; d < n.type.shape.rank(); ++d) {
    const auto it = std::find(dims.begin(), dims.end(), d);
    if (it == dims.end() || s[static_cast<int>(it - dims.begin())] != n.type.shape[d]) {
      summed.push_back(d);  // a new dimension, or a size-1 dimension broadcast
    }
  }
  const Array r = summed.empty() ? g : sum(g, summed, true);
  return {reshape(r, s)};
}

// ---- Test declarations (primitive_tests.hpp) --------------------------------------------------
// Each reference finds, for every result index, the operand element it holds.

std::vector<TestCase> reshape_cases(const Primitive&, DType t) {
  return {movement_case(ReshapeAttrs{Shape{48}}, {Shape{8, 6}}, t),
          movement_case(ReshapeAttrs{Shape{4, 2, 6}}, {Shape{8, 6}}, t),
          movement_case(ReshapeAttrs{Shape{6, 4}}, {Shape{2, 3, 4}}, t),
          movement_case(ReshapeAttrs{Shape{6, 8}}, {Shape{8, 6}}, t)};
}
constexpr PrimitiveTests kReshapeTests{
    .public_ops = "reshape",
    .dtypes = kMovedTypes,
    .cases = reshape_cases,
    .reference = [](const Node&, std::span<const HostValues> in) { return in[0].v; },
    .gradient = true};

std::vector<TestCase> transpose_cases(const Primitive&, DType t) {
  return {movement_case(TransposeAttrs{{1, 0}}, {Shape{8, 6}}, t),
          movement_case(TransposeAttrs{{2, 0, 1}}, {Shape{2, 4, 6}}, t),
          movement_case(TransposeAttrs{{0, 1}}, {Shape{4, 6}}, t)};
}
std::vector<double> transpose_reference(const Node& n, std::span<const HostValues> in) {
  const std::vector<int>& perm = n.attr<TransposeAttrs>().perm;
  return gather_reference(n, in[0], [&](const std::vector<std::int64_t>& r) {
    std::vector<std::int64_t> x(r.size());
    for (std::size_t i = 0; i < r.size(); ++i) x[static_cast<std::size_t>(perm[i])] = r[i];
    return x;
  });
}
constexpr PrimitiveTests kTransposeTests{.public_ops = "transpose",
                                         .dtypes = kMovedTypes,
                                         .cases = transpose_cases,
                                         .reference = transpose_reference,
                                         .gradient = true};

std::vector<TestCase> broadcast_cases(const Primitive&, DType t) {
  return {movement_case(BroadcastAttrs{Shape{8, 6}, {1}}, {Shape{6}}, t),
          movement_case(BroadcastAttrs{Shape{8, 6}, {0, 1}}, {Shape{8, 1}}, t),
          movement_case(BroadcastAttrs{Shape{4, 2}, {}}, {Shape{}}, t),
          movement_case(BroadcastAttrs{Shape{8, 2, 4}, {0}}, {Shape{8}}, t),
          movement_case(BroadcastAttrs{Shape{2, 4, 6}, {1, 2}}, {Shape{1, 6}}, t)};
}
std::vector<double> broadcast_reference(const Node& n, std::span<const HostValues> in) {
  const std::vector<int>& dims = n.attr<BroadcastAttrs>().dims;
  const Shape& xs = in[0].shape;
  return gather_reference(n, in[0], [&](const std::vector<std::int64_t>& r) {
    std::vector<std::int64_t> x(static_cast<std::size_t>(xs.rank()));
    for (int d = 0; d < xs.rank(); ++d) {
      x[static_cast<std::size_t>(d)] =
          xs[d] == 1 ? 0 : r[static_cast<std::size_t>(dims[static_cast<std::size_t>(d)])];
    }
    return x;
  });
}
constexpr PrimitiveTests kBroadcastTests{.public_ops = "broadcast_in_dim broadcast_to",
                                         .dtypes = kMovedTypes,
                                         .cases = broadcast_cases,
                                         .reference = broadcast_reference,
                                         .gradient = true};

}  // namespace

namespace prim {
constinit const Primitive reshape{.name = "reshape",
                                  .arity = 1,
                                  .infer = reshape_type,
                                  .factors = reshape_factors,
                                  .kernel = copy_kernel,
                                  .flops = no_flops,
                                  .vjp = reshape_vjp,
                                  .repeat = reshape_repeat,
                                  .linearity = linear_in_all,
                                  .tests = &kReshapeTests};
constinit const Primitive transpose{.name = "transpose",
                                    .arity = 1,
                                    .infer = transpose_type,
                                    .factors = transpose_factors,
                                    .kernel = transpose_kernel,
                                    .flops = no_flops,
                                    .vjp = transpose_vjp,
                                    .linearity = linear_in_all,
                                    .tests = &kTransposeTests};
constinit const Primitive broadcast_in_dim{.name = "broadcast_in_dim",
                                           .arity = 1,
                                           .infer = broadcast_type,
                                           .factors = broadcast_factors,
                                           .kernel = broadcast_kernel,
                                           .flops = no_flops,
                                           .vjp = broadcast_vjp,
                                           .repeat = broadcast_repeat,
                                           .remade_for_backward = true,
                                           .linearity = linear_in_all,
                                           .tests = &kBroadcastTests};
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {
using detail::apply;
using detail::type_str;
namespace prim = detail::prim;

Array reshape(const Array& x, const Shape& shape) {
  // A shape of another size is refused by the primitive's shape rule (eagerly over processes,
  // that is where the processes agree on it).
  if (shape == x.shape()) return x;
  return apply(prim::reshape, detail::ReshapeAttrs{shape}, {x});
}

Array transpose(const Array& x, std::vector<int> perm) {
  if (perm.empty()) {
    for (int i = x.shape().rank() - 1; i >= 0; --i) perm.push_back(i);
  }
  return apply(prim::transpose, detail::TransposeAttrs{std::move(perm)}, {x});
}

Array broadcast_in_dim(const Array& x, const Shape& shape, std::vector<int> dims) {
  if (shape == x.shape() && dims == detail::int_range(0, shape.rank())) return x;
  return apply(prim::broadcast_in_dim, detail::BroadcastAttrs{shape, std::move(dims)}, {x});
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
  if (x.shape() == shape) return x;
  return broadcast_in_dim(x, shape,
                          detail::int_range(shape.rank() - x.shape().rank(), shape.rank()));
}

}  // namespace shardplan
