// What the primitive definitions share: the list of all primitives, the explicit "none" parts
// (no gradient, no FLOPs, no kernel), the factor shapes most ops use, and kernel helpers.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

std::span<const Primitive* const> all_primitives() {
#define SHARDPLAN_ADDRESS_OF(n) &prim::n,
  static const Primitive* const all[] = {SHARDPLAN_PRIMITIVES(SHARDPLAN_ADDRESS_OF)};
#undef SHARDPLAN_ADDRESS_OF
  return all;
}

std::vector<Array> no_gradient(const Node&, const std::vector<Array>& operands, const Array&,
                               const Array&) {
  return std::vector<Array>(operands.size());
}

double no_flops(const Node&, std::span<const Shape>, const Shape&) { return 0; }

double flops_per_result(const Node&, std::span<const Shape>, const Shape& result) {
  return static_cast<double>(result.numel());
}

Linearity linear_in_all(const Node&, std::span<const TensorType>) {
  return {Linearity::Kind::kJointly, kAllOperands};
}
Linearity linear_in_first(const Node&, std::span<const TensorType>) {
  return {Linearity::Kind::kJointly, 1u};
}
Linearity linear_in_each(const Node&, std::span<const TensorType>) {
  return {Linearity::Kind::kSeparately, kAllOperands};
}
Linearity linear_in_branches(const Node&, std::span<const TensorType>) {
  return {Linearity::Kind::kJointly, 0b110u};
}

std::optional<Pending> carried_pending(const Linearity& lin, std::span<const Pending> operands) {
  const Pending* first = nullptr;
  int pending = 0;
  for (std::size_t k = 0; k < operands.size(); ++k) {
    const Pending& p = operands[k];
    if (p.empty()) {
      // Jointly linear: an operand it is linear in that is whole would be counted once per
      // device of the sum.
      if (lin.kind == Linearity::Kind::kJointly && lin.covers(k)) return std::nullopt;
      continue;
    }
    if (!lin.covers(k) || p.op != ReduceOp::kSum) return std::nullopt;
    if (first != nullptr && !(p == *first)) return std::nullopt;
    first = &p;
    ++pending;
  }
  if (first == nullptr) return std::nullopt;
  if (lin.kind == Linearity::Kind::kSeparately && pending != 1) return std::nullopt;
  return *first;
}

void no_kernel(const KernelArgs& k) {
  throw Error(
      fmt::format("[kernel] {} has no kernel (inputs are bound, not computed)", k.node.op->name));
}

std::string type_str(const Array& a) {
  return fmt::format("{}{}", name(a.dtype()), a.shape().to_string());
}

int normalize_axis(int axis, const Array& x, std::string_view op) {
  const int rank = x.shape().rank();
  const int a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= std::max(rank, 1)) {
    throw SpecError(fmt::format("[{}] axis {} is out of range for {}", op, axis, type_str(x)));
  }
  return a;
}

std::vector<int> normalize_axes(std::vector<int> axes, const Array& x, std::string_view op) {
  for (int& a : axes) a = normalize_axis(a, x, op);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) {
    throw SpecError(fmt::format("[{}] an axis appears twice in [{}]", op, fmt::join(axes, ", ")));
  }
  return axes;
}

std::vector<int> inverse_permutation(const std::vector<int>& order) {
  std::vector<int> perm(order.size());
  for (std::size_t t = 0; t < order.size(); ++t)
    perm[static_cast<std::size_t>(order[t])] = static_cast<int>(t);
  return perm;
}

Array maybe_transpose(const Array& x, const std::vector<int>& perm) {
  for (std::size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int>(i)) return transpose(x, perm);
  }
  return x;
}

Array clamped_indices(const Array& indices, std::int64_t size) {
  return minimum(maximum(indices, full_like(indices, 0)),
                 full_like(indices, static_cast<double>(std::max<std::int64_t>(size - 1, 0))));
}

std::vector<int> int_range(int from, int to) {
  std::vector<int> v(static_cast<std::size_t>(std::max(0, to - from)));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::string describe(std::span<const TensorType> operands) {
  std::vector<std::string> parts;
  for (const TensorType& t : operands) parts.push_back(to_string(t));
  return fmt::format("{}", fmt::join(parts, ", "));
}

void reject(std::string_view op, std::span<const TensorType> operands, std::string_view why) {
  throw SpecError(fmt::format("[{}] {}: {}", op, describe(operands), why));
}

void unsupported(const KernelArgs& k, DType dtype) {
  std::vector<std::string> operands;
  for (const ConstBlock& b : k.in) operands.push_back(describe(b.dtype, b.shape));
  throw SpecError(fmt::format("[kernel] {} does not support dtype {} (operands ({}), result {})",
                              k.node.op->name, name(dtype), fmt::join(operands, ", "),
                              describe(k.out.dtype, k.out.shape)));
}

std::vector<std::int64_t> row_major_strides(const Shape& s) {
  std::vector<std::int64_t> strides(static_cast<std::size_t>(s.rank()), 1);
  for (int d = s.rank() - 2; d >= 0; --d) strides[d] = strides[d + 1] * s[d + 1];
  return strides;
}

void gather(const KernelArgs& k, const std::vector<std::int64_t>& strides) {
  // Dimensions of size 1 dropped and neighbours that walk memory as one merged (a broadcast over
  // leading dimensions becomes [rows, row]); then each innermost run is a copy (stride 1), a fill
  // (stride 0, a broadcast) or a strided loop (a transpose), instead of one call per element.
  std::vector<std::int64_t> dims, steps;
  for (int d = 0; d < k.out.shape.rank(); ++d) {
    const std::int64_t n = k.out.shape[d];
    const std::int64_t st = strides[static_cast<std::size_t>(d)];
    if (n == 0) return;
    if (n == 1) continue;
    if (!dims.empty() && steps.back() == st * n) {
      dims.back() *= n;
      steps.back() = st;
    } else {
      dims.push_back(n);
      steps.push_back(st);
    }
  }
  const std::int64_t inner = dims.empty() ? 1 : dims.back();
  const std::int64_t step = dims.empty() ? 0 : steps.back();
  if (!dims.empty()) {
    dims.pop_back();
    steps.pop_back();
  }
  visit_dtype(k.out.dtype, [&]<class T>(Tag<T>) {
    using U = bits_t<T>;
    const U* x = elems<U>(k.in[0]);
    U* y = elems<U>(k.out);
    for_each_offset(dims, steps, [&](std::int64_t base) {
      const U* from = x + base;
      if (step == 1) {
        std::copy(from, from + inner, y);
      } else if (step == 0) {
        std::fill(y, y + inner, *from);
      } else {
        for (std::int64_t i = 0; i < inner; ++i) y[i] = from[i * step];
      }
      y += inner;
    });
  });
}

std::vector<int> free_dims(int rank, const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> f;
  for (int d = 0; d < rank; ++d) {
    if (std::find(a.begin(), a.end(), d) == a.end() && std::find(b.begin(), b.end(), d) == b.end())
      f.push_back(d);
  }
  return f;
}

OpFactors same_dims(const Shape& result, std::span<const Shape> operands) {
  OpFactors f;
  const auto rank = static_cast<std::size_t>(result.rank());
  f.sizes.reserve(rank);
  f.kinds.reserve(rank);
  f.result.reserve(rank);
  f.operands.reserve(operands.size());
  for (int d = 0; d < result.rank(); ++d) f.result.push_back(f.add(result[d], FactorKind::kPass));
  for (const Shape& s : operands) {
    std::vector<int> dims(static_cast<std::size_t>(s.rank()));
    std::iota(dims.begin(), dims.end(), 0);
    f.operands.push_back(std::move(dims));
  }
  return f;
}

OpFactors result_only(const Shape& result) { return same_dims(result, {}); }

// ---- Test declarations (primitive_tests.hpp) --------------------------------------------------

std::vector<DType> DTypeSet::list() const {
  std::vector<DType> out;
  for (unsigned d = 0; d < 32; ++d) {
    if (((bits_ >> d) & 1u) != 0) out.push_back(static_cast<DType>(d));
  }
  return out;
}

std::vector<TestCase> pointwise_cases(const Primitive& p, DType dtype) {
  std::vector<TestCase> cases;
  for (const Shape& shape : {Shape{8, 6}, Shape{}, Shape{3, 5}}) {
    TestCase c{.attrs = NoAttrs{}, .operands = {}};
    for (int i = 0; i < p.arity; ++i) {
      c.operands.push_back({{shape, dtype}, p.tests->domains[static_cast<std::size_t>(i)]});
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<std::int64_t> unravel(std::int64_t i, const Shape& s) {
  std::vector<std::int64_t> index(static_cast<std::size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    index[static_cast<std::size_t>(d)] = i % s[d];
    i /= s[d];
  }
  return index;
}

std::int64_t ravel(std::span<const std::int64_t> index, const Shape& s) {
  std::int64_t i = 0;
  for (int d = 0; d < s.rank(); ++d) i = i * s[d] + index[static_cast<std::size_t>(d)];
  return i;
}

std::vector<double> host_doubles(const Tensor& t) {
  if (t.dtype() != DType::kBool) return t.to_doubles();
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = t.bytes()[i] != std::byte{0} ? 1 : 0;
  return v;
}

void set_host_value(Tensor& t, std::int64_t i, double v) {
  if (t.dtype() != DType::kBool) return t.set(i, v);
  t.bytes()[i] = std::byte{v != 0};
}

}  // namespace shardplan::detail
