// dot_general (XLA's DotGeneral): result dimensions are batch, then lhs free, then rhs free.
// Sharding a contracting dimension leaves a partial sum, reduced where the result is consumed.
#include "dot.hpp"

#include <algorithm>
#include <optional>

#include "../../../runtime/gemm.hpp"
#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

/// dot_general's dimensions.
struct DotAttrs {
  DotDims dims;
};
std::string format_attrs(const DotAttrs& a) {
  const DotDims& d = a.dims;
  return fmt::format(" batch=[{}]x[{}] contract=[{}]x[{}]", fmt::join(d.lhs_batch, ","),
                     fmt::join(d.rhs_batch, ","), fmt::join(d.lhs_contract, ","),
                     fmt::join(d.rhs_contract, ","));
}

Shape dot_shape(std::string_view op, const DotDims& d, const TensorType& ta, const TensorType& tb) {
  const Shape& a = ta.shape;
  const Shape& b = tb.shape;
  auto fail = [&](const std::string& why) {
    return SpecError(fmt::format("[{}] {} and {}: {}", op, to_string(ta), to_string(tb), why));
  };
  if (d.lhs_batch.size() != d.rhs_batch.size() || d.lhs_contract.size() != d.rhs_contract.size()) {
    throw fail("batch and contracting dimensions must pair up");
  }
  std::vector<bool> la(static_cast<std::size_t>(a.rank()), false);
  std::vector<bool> rb(static_cast<std::size_t>(b.rank()), false);
  auto mark = [&](std::vector<bool>& used, int dim, const Shape& x) {
    if (dim < 0 || dim >= x.rank() || used[static_cast<std::size_t>(dim)]) {
      throw fail(fmt::format("dimension {} is out of range or used twice", dim));
    }
    used[static_cast<std::size_t>(dim)] = true;
  };
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < d.lhs_batch.size(); ++i) {
    mark(la, d.lhs_batch[i], a);
    mark(rb, d.rhs_batch[i], b);
    if (a[d.lhs_batch[i]] != b[d.rhs_batch[i]]) {
      throw fail(fmt::format("batch dimensions {} and {} differ", d.lhs_batch[i], d.rhs_batch[i]));
    }
    out.push_back(a[d.lhs_batch[i]]);
  }
  for (std::size_t i = 0; i < d.lhs_contract.size(); ++i) {
    mark(la, d.lhs_contract[i], a);
    mark(rb, d.rhs_contract[i], b);
    if (a[d.lhs_contract[i]] != b[d.rhs_contract[i]]) {
      throw fail(fmt::format("contracting dimensions {} and {} differ ({} vs {})",
                             d.lhs_contract[i], d.rhs_contract[i], a[d.lhs_contract[i]],
                             b[d.rhs_contract[i]]));
    }
  }
  for (int i = 0; i < a.rank(); ++i) {
    if (!la[static_cast<std::size_t>(i)]) out.push_back(a[i]);
  }
  for (int i = 0; i < b.rank(); ++i) {
    if (!rb[static_cast<std::size_t>(i)]) out.push_back(b[i]);
  }
  return Shape(out);
}

namespace {

TensorType dot_type(const Node& n, std::span<const TensorType> in) {
  auto fail = [&](const std::string& why) {
    return SpecError(
        fmt::format("[dot_general] {} and {}: {}", to_string(in[0]), to_string(in[1]), why));
  };
  if (in[0].dtype != in[1].dtype) throw fail("different dtypes");
  if (!is_computable(in[0].dtype)) {
    throw fail(fmt::format("dtype {} is not supported", name(in[0].dtype)));
  }
  return TensorType{dot_shape(n.op->name, n.attr<DotAttrs>().dims, in[0], in[1]), in[0].dtype};
}

Contraction dot_contraction(const Node& n) { return dot_contraction_of(n.attr<DotAttrs>().dims); }

OpFactors dot_factors(const Node& n, std::span<const Shape> in) {
  return dot_factors_of(n.attr<DotAttrs>().dims, in[0], in[1]);
}

}  // namespace

Contraction dot_contraction_of(const DotDims& d) {
  return d.lhs_batch.empty() ? Contraction::kUnbatched : Contraction::kBatched;
}

OpFactors dot_factors_of(const DotDims& d, const Shape& l, const Shape& r) {
  OpFactors f;
  std::vector<int> lf(static_cast<std::size_t>(l.rank()), -1);
  std::vector<int> rf(static_cast<std::size_t>(r.rank()), -1);
  for (std::size_t i = 0; i < d.lhs_batch.size(); ++i) {
    const int id = f.add(l[d.lhs_batch[i]], FactorKind::kPass);
    lf[static_cast<std::size_t>(d.lhs_batch[i])] = id;
    rf[static_cast<std::size_t>(d.rhs_batch[i])] = id;
    f.result.push_back(id);
  }
  for (std::size_t i = 0; i < d.lhs_contract.size(); ++i) {
    const int id = f.add(l[d.lhs_contract[i]], FactorKind::kReduce);
    lf[static_cast<std::size_t>(d.lhs_contract[i])] = id;
    rf[static_cast<std::size_t>(d.rhs_contract[i])] = id;
  }
  for (const int dim : free_dims(l.rank(), d.lhs_batch, d.lhs_contract)) {
    lf[static_cast<std::size_t>(dim)] = f.add(l[dim], FactorKind::kPass);
    f.result.push_back(lf[static_cast<std::size_t>(dim)]);
  }
  for (const int dim : free_dims(r.rank(), d.rhs_batch, d.rhs_contract)) {
    rf[static_cast<std::size_t>(dim)] = f.add(r[dim], FactorKind::kPass);
    f.result.push_back(rf[static_cast<std::size_t>(dim)]);
  }
  f.operands = {lf, rf};
  return f;
}

namespace {

std::vector<int> arranged_dims(int rank, const std::vector<int>& batch,
                               const std::vector<int>& contract) {
  std::vector<int> perm = batch;
  for (int d = 0; d < rank; ++d) {
    const bool paired = std::find(batch.begin(), batch.end(), d) != batch.end() ||
                        std::find(contract.begin(), contract.end(), d) != contract.end();
    if (!paired) perm.push_back(d);
  }
  perm.insert(perm.end(), contract.begin(), contract.end());
  return perm;
}

}  // namespace

DotLayout dot_layout(const DotDims& dims, const Shape& lhs, const Shape& rhs) {
  DotLayout l;
  l.lhs_perm = arranged_dims(lhs.rank(), dims.lhs_batch, dims.lhs_contract);
  l.rhs_perm = arranged_dims(rhs.rank(), dims.rhs_batch, dims.rhs_contract);
  const std::size_t nb = dims.lhs_batch.size();
  const std::size_t lhs_free_end = l.lhs_perm.size() - dims.lhs_contract.size();
  const std::size_t rhs_free_end = l.rhs_perm.size() - dims.rhs_contract.size();
  for (std::size_t i = 0; i < l.lhs_perm.size(); ++i) {
    std::int64_t& part = i < nb ? l.batch : (i < lhs_free_end ? l.m : l.k);
    part *= lhs[l.lhs_perm[i]];
  }
  for (std::size_t i = nb; i < rhs_free_end; ++i) l.n *= rhs[l.rhs_perm[i]];
  return l;
}

namespace {

bool is_identity(const std::vector<int>& perm) {
  for (std::size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int>(i)) return false;
  }
  return true;
}

// The operand's elements as Calc<T> in the dimension order `perm`: the block itself when that is
// already its layout and type, else a copy into `storage`.
template <class T>
const Calc<T>* arrange(const ConstBlock& b, const std::vector<int>& perm,
                       std::vector<Calc<T>>& storage) {
  if (is_identity(perm) && std::is_same_v<T, Calc<T>>) {
    return reinterpret_cast<const Calc<T>*>(b.data);
  }
  const std::vector<std::int64_t> strides = row_major_strides(b.shape);
  std::vector<std::int64_t> dims, perm_strides;
  for (int d : perm) {
    dims.push_back(b.shape[d]);
    perm_strides.push_back(strides[d]);
  }
  storage.resize(static_cast<std::size_t>(b.shape.numel()));
  const T* x = elems<T>(b);
  Calc<T>* y = storage.data();
  for_each_offset(dims, perm_strides, [&](std::int64_t off) { *y++ = widen(x[off]); });
  return storage.data();
}

// y[b] = l[b] * r[b]^T for each batch; l is [batch, m, k], r is [batch, n, k], y is [batch, m, n].
template <class C>
void batched_matmul(const C* l, const C* r, C* y, const DotLayout& d) {
  if (d.k == 0) {
    std::fill(y, y + d.batch * d.m * d.n, C(0));
    return;
  }
  for (std::int64_t b = 0; b < d.batch; ++b) {
    const C* lb = l + b * d.m * d.k;
    const C* rb = r + b * d.n * d.k;
    C* yb = y + b * d.m * d.n;
    if constexpr (std::is_floating_point_v<C>) {
      gemm(false, true, d.m, d.n, d.k, lb, rb, yb);
    } else {
      using A = SumAcc<C>;  // the one accumulator type (integers: int64, wrapping)
      for (std::int64_t i = 0; i < d.m; ++i) {
        for (std::int64_t j = 0; j < d.n; ++j) {
          A acc = 0;
          for (std::int64_t p = 0; p < d.k; ++p)
            acc = add(acc, mul<A>(lb[i * d.k + p], rb[j * d.k + p]));
          yb[i * d.n + j] = narrow<C>(acc);
        }
      }
    }
  }
}

// [batch, contract, free] order: the layout of a plain x @ w right operand ([k, n]).
std::vector<int> contract_first_dims(int rank, const std::vector<int>& batch,
                                     const std::vector<int>& contract) {
  std::vector<int> perm = batch;
  perm.insert(perm.end(), contract.begin(), contract.end());
  for (int d = 0; d < rank; ++d) {
    const bool paired = std::find(batch.begin(), batch.end(), d) != batch.end() ||
                        std::find(contract.begin(), contract.end(), d) != contract.end();
    if (!paired) perm.push_back(d);
  }
  return perm;
}

// f32/f64 operands already laid out as [batch, m, k] / [batch, k, n] (or [batch, k, m] /
// [batch, n, k]) are multiplied in place, with the GEMM told which ones are transposed, instead of
// being copied into [batch, free, contract] first: x @ w never copies w.
struct GemmFlags {
  bool trans_a = false, trans_b = false;
};

// The GEMM's transpose flags when both operands can be read where they lie ([batch, m, k] or
// [batch, k, m]; [batch, k, n] or [batch, n, k]) and there is something to contract, else none.
std::optional<GemmFlags> in_place_flags(const KernelArgs& c, const DotLayout& d) {
  const DotDims& dims = c.node.attr<DotAttrs>().dims;
  const bool l_mk = is_identity(d.lhs_perm);
  const bool l_km =
      is_identity(contract_first_dims(c.in[0].shape.rank(), dims.lhs_batch, dims.lhs_contract));
  const bool r_nk = is_identity(d.rhs_perm);
  const bool r_kn =
      is_identity(contract_first_dims(c.in[1].shape.rank(), dims.rhs_batch, dims.rhs_contract));
  if (!(l_mk || l_km) || !(r_nk || r_kn) || d.k == 0) return std::nullopt;
  return GemmFlags{.trans_a = !l_mk, .trans_b = !r_kn};
}

template <class T>
bool dot_in_place(const KernelArgs& c, const DotLayout& d) {
  const auto flags = in_place_flags(c, d);
  if (!flags) return false;
  const T* l = reinterpret_cast<const T*>(c.in[0].data);
  const T* r = reinterpret_cast<const T*>(c.in[1].data);
  T* y = reinterpret_cast<T*>(c.out.data);
  for (std::int64_t b = 0; b < d.batch; ++b) {
    gemm(flags->trans_a, flags->trans_b, d.m, d.n, d.k, l + b * d.m * d.k, r + b * d.n * d.k,
         y + b * d.m * d.n);
  }
  return true;
}

template <class T>
void dot(const KernelArgs& c) {
  const DotLayout d = dot_layout(c.node.attr<DotAttrs>().dims, c.in[0].shape, c.in[1].shape);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (dot_in_place<T>(c, d)) return;
  }
  std::vector<Calc<T>> lhs_storage, rhs_storage;
  const Calc<T>* lhs = arrange<T>(c.in[0], d.lhs_perm, lhs_storage);
  const Calc<T>* rhs = arrange<T>(c.in[1], d.rhs_perm, rhs_storage);
  if constexpr (std::is_same_v<T, Calc<T>>) {
    batched_matmul(lhs, rhs, elems<T>(c.out), d);
  } else {
    std::vector<Calc<T>> result(static_cast<std::size_t>(c.out.shape.numel()));
    batched_matmul(lhs, rhs, result.data(), d);
    std::transform(result.begin(), result.end(), elems<T>(c.out), narrow<T, Calc<T>>);
  }
}

// The devices' dots with the same right operand (a replicated weight), each as dot_in_place
// would run it, as one GEMM call that packs the weight once for all of them (bitwise each
// device's own product: gemm_shared_b). Anything dot_in_place would not take, or devices whose
// blocks differ in shape, run one by one.
template <class T>
bool dot_shared_rhs(std::span<const KernelArgs> ks) {
  const KernelArgs& c = ks.front();
  for (const KernelArgs& o : ks) {
    if (!(o.in[0].shape == c.in[0].shape) || !(o.in[1].shape == c.in[1].shape)) return false;
  }
  const DotLayout d = dot_layout(c.node.attr<DotAttrs>().dims, c.in[0].shape, c.in[1].shape);
  const auto flags = in_place_flags(c, d);
  if (!flags || d.batch != 1) return false;
  std::vector<GemmRows<T>> parts;
  parts.reserve(ks.size());
  for (const KernelArgs& o : ks) {
    parts.push_back(
        {d.m, reinterpret_cast<const T*>(o.in[0].data), reinterpret_cast<T*>(o.out.data)});
  }
  gemm_shared_b<T>(flags->trans_a, flags->trans_b, d.n, d.k,
                   reinterpret_cast<const T*>(c.in[1].data), parts);
  return true;
}

bool dot_group_kernel(std::span<const KernelArgs> ks, int shared) {
  if (shared != 1 || ks.size() < 2) return false;
  switch (ks.front().in[0].dtype) {
    case DType::kF32:
      return ks.front().in[1].dtype == DType::kF32 && dot_shared_rhs<float>(ks);
    case DType::kF64:
      return ks.front().in[1].dtype == DType::kF64 && dot_shared_rhs<double>(ks);
    default:
      return false;
  }
}

void dot_kernel(const KernelArgs& k) {
  dispatch_if<IsNumeric>(k, k.in[0].dtype, [&]<class T>(Tag<T>) { dot<T>(k); });
}

}  // namespace

Shape dot_kept_shape(const DotDims& d, const Shape& operand, int which) {
  const std::vector<int>& contract = which == 0 ? d.lhs_contract : d.rhs_contract;
  std::vector<std::int64_t> dims;
  for (int i = 0; i < operand.rank(); ++i) {
    if (std::find(contract.begin(), contract.end(), i) == contract.end()) dims.push_back(operand[i]);
  }
  return Shape(dims);
}

std::vector<std::int64_t> dot_kept_offsets(const DotDims& d, const Shape& lhs, const Shape& rhs,
                                           int which) {
  const Shape& x = which == 0 ? lhs : rhs;
  const std::vector<int>& batch = which == 0 ? d.lhs_batch : d.rhs_batch;
  const std::vector<int>& contract = which == 0 ? d.lhs_contract : d.rhs_contract;
  // Each kept dimension's stride in the kept array (x's order without the contracting dims).
  std::vector<std::int64_t> stride(static_cast<std::size_t>(x.rank()), 0);
  std::int64_t s = 1;
  for (int i = x.rank() - 1; i >= 0; --i) {
    if (std::find(contract.begin(), contract.end(), i) != contract.end()) continue;
    stride[static_cast<std::size_t>(i)] = s;
    s *= x[i];
  }
  // The result's dimensions: batch (pair order), lhs free, rhs free; the other side's free
  // dimensions do not move this operand's offset.
  std::vector<std::int64_t> dims, strides;
  for (const int b : batch) {
    dims.push_back(x[b]);
    strides.push_back(stride[static_cast<std::size_t>(b)]);
  }
  for (int side = 0; side < 2; ++side) {
    const Shape& o = side == 0 ? lhs : rhs;
    const auto free = side == 0 ? free_dims(lhs.rank(), d.lhs_batch, d.lhs_contract)
                                : free_dims(rhs.rank(), d.rhs_batch, d.rhs_contract);
    for (const int f : free) {
      dims.push_back(o[f]);
      strides.push_back(side == which ? stride[static_cast<std::size_t>(f)] : 0);
    }
  }
  std::vector<std::int64_t> out;
  for_each_offset(dims, strides, [&](std::int64_t off) { out.push_back(off); });
  return out;
}

double dot_flops_of(const DotDims& dims, const Shape& lhs, const Shape& rhs) {
  const DotLayout d = dot_layout(dims, lhs, rhs);
  return 2.0 * static_cast<double>(d.batch) * static_cast<double>(d.m) * static_cast<double>(d.n) *
         static_cast<double>(d.k);
}

namespace {

double dot_flops(const Node& n, std::span<const Shape> in, const Shape&) {
  return dot_flops_of(n.attr<DotAttrs>().dims, in[0], in[1]);
}

// Gradient with respect to the lhs (rhs when `for_rhs`): a dot of the cotangent with the other
// operand over the other operand's free dimensions, put back in order.
Array dot_operand_vjp(const Array& g, const Array& lhs, const Array& rhs, const DotDims& d,
                      bool for_rhs) {
  const int nb = static_cast<int>(d.lhs_batch.size());
  const auto lfree = free_dims(lhs.shape().rank(), d.lhs_batch, d.lhs_contract);
  const auto rfree = free_dims(rhs.shape().rank(), d.rhs_batch, d.rhs_contract);
  const int nl = static_cast<int>(lfree.size());
  const int nr = static_cast<int>(rfree.size());
  // g dims: [batch (nb), lhs free (nl), rhs free (nr)].
  const std::vector<int> g_batch = int_range(0, nb);
  if (!for_rhs) {
    DotDims dd{g_batch, d.rhs_batch, int_range(nb + nl, nb + nl + nr), rfree};
    const Array r = dot_general(g, rhs, dd);
    // Result dims: batch, lhs free, then rhs's remaining dims (its contracting dims, ascending),
    // each standing for the lhs dimension paired with it.
    std::vector<std::pair<int, int>> rc;
    for (std::size_t j = 0; j < d.rhs_contract.size(); ++j)
      rc.emplace_back(d.rhs_contract[j], d.lhs_contract[j]);
    std::sort(rc.begin(), rc.end());
    std::vector<int> order = d.lhs_batch;
    order.insert(order.end(), lfree.begin(), lfree.end());
    for (const auto& [r_dim, l_dim] : rc) order.push_back(l_dim);
    return maybe_transpose(r, inverse_permutation(order));
  }
  // lhs first: the result is [batch, lhs's contracting dims, rhs free], which for x @ w (w [k, n])
  // is w's own order, so no transpose of the weight's gradient follows (one per device).
  DotDims dd{d.lhs_batch, g_batch, lfree, int_range(nb, nb + nl)};
  const Array r = dot_general(lhs, g, dd);
  // Result dims: batch, then lhs's remaining dims (its contracting dims, ascending), each standing
  // for the rhs dimension paired with it, then rhs free.
  std::vector<std::pair<int, int>> lc;
  for (std::size_t j = 0; j < d.lhs_contract.size(); ++j)
    lc.emplace_back(d.lhs_contract[j], d.rhs_contract[j]);
  std::sort(lc.begin(), lc.end());
  std::vector<int> order = d.rhs_batch;
  for (const auto& [l_dim, r_dim] : lc) order.push_back(r_dim);
  order.insert(order.end(), rfree.begin(), rfree.end());
  return maybe_transpose(r, inverse_permutation(order));
}

std::vector<Array> dot_vjp(const Node& n, const std::vector<Array>& in, const Array&,
                           const Array& g) {
  const DotDims& d = n.attr<DotAttrs>().dims;
  return {dot_operand_vjp(g, in[0], in[1], d, false), dot_operand_vjp(g, in[0], in[1], d, true)};
}

// ---- Test declaration (primitive_tests.hpp) ---------------------------------------------------

std::vector<TestCase> dot_cases(const Primitive&, DType t) {
  std::vector<TestCase> cases;
  for (DotTestCase& c : dot_test_cases()) {
    cases.push_back(
        {DotAttrs{std::move(c.dims)}, {{{std::move(c.lhs), t}}, {{std::move(c.rhs), t}}}});
  }
  return cases;
}

std::vector<double> dot_reference(const Node& n, std::span<const HostValues> in) {
  return dot_reference_of(n.attr<DotAttrs>().dims, n.type.shape, in[0], in[1]);
}

constexpr PrimitiveTests kDotTests{.public_ops = "dot_general matmul",
                                   .dtypes = kNumericTypes,
                                   .cases = dot_cases,
                                   .reference = dot_reference,
                                   .gradient = true};

}  // namespace

// A matmul, a batched one, both operands contracted on their other side, and two contracting
// dimensions paired out of order.
std::vector<DotTestCase> dot_test_cases() {
  return {{{{}, {}, {1}, {0}}, Shape{8, 4}, Shape{4, 6}},
          {{{0}, {0}, {2}, {1}}, Shape{2, 4, 3}, Shape{2, 3, 6}},
          {{{}, {}, {0}, {1}}, Shape{4, 8}, Shape{6, 4}},
          {{{}, {}, {1, 2}, {1, 0}}, Shape{2, 3, 4}, Shape{4, 3, 5}}};
}

// Each result element: batch, lhs free and rhs free indices from its index, summed over every
// index of the contracting dimensions.
std::vector<double> dot_reference_of(const DotDims& d, const Shape& result, const HostValues& lhs,
                                     const HostValues& rhs) {
  const Shape& ls = lhs.shape;
  const Shape& rs = rhs.shape;
  const auto lfree = free_dims(ls.rank(), d.lhs_batch, d.lhs_contract);
  const auto rfree = free_dims(rs.rank(), d.rhs_batch, d.rhs_contract);
  std::vector<std::int64_t> csizes;
  for (const int c : d.lhs_contract) csizes.push_back(ls[c]);
  const Shape contracted(csizes);
  std::vector<double> y(static_cast<std::size_t>(result.numel()));
  for (std::size_t o = 0; o < y.size(); ++o) {
    const auto r = unravel(static_cast<std::int64_t>(o), result);
    std::vector<std::int64_t> li(static_cast<std::size_t>(ls.rank()));
    std::vector<std::int64_t> ri(static_cast<std::size_t>(rs.rank()));
    std::size_t at = 0;
    for (std::size_t b = 0; b < d.lhs_batch.size(); ++b, ++at) {
      li[static_cast<std::size_t>(d.lhs_batch[b])] = r[at];
      ri[static_cast<std::size_t>(d.rhs_batch[b])] = r[at];
    }
    for (const int f : lfree) li[static_cast<std::size_t>(f)] = r[at++];
    for (const int f : rfree) ri[static_cast<std::size_t>(f)] = r[at++];
    for (std::int64_t c = 0; c < contracted.numel(); ++c) {
      const auto ci = unravel(c, contracted);
      for (std::size_t j = 0; j < ci.size(); ++j) {
        li[static_cast<std::size_t>(d.lhs_contract[j])] = ci[j];
        ri[static_cast<std::size_t>(d.rhs_contract[j])] = ci[j];
      }
      y[o] += lhs.v[static_cast<std::size_t>(ravel(li, ls))] *
              rhs.v[static_cast<std::size_t>(ravel(ri, rs))];
    }
  }
  return y;
}

namespace prim {
constinit const Primitive dot_general{.name = "dot_general",
                                      .arity = 2,
                                      .infer = dot_type,
                                      .factors = dot_factors,
                                      .kernel = dot_kernel,
                                      .flops = dot_flops,
                                      .vjp = dot_vjp,
                                      .group_kernel = dot_group_kernel,
                                      .partial = ReduceOp::kSum,
                                      .linearity = linear_in_each,
                                      .contraction = dot_contraction,
                                      .time_bound = TimeBound::kMatmul,
                                      .tests = &kDotTests};
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {

Array dot_general(const Array& a, const Array& b, const DotDims& dims) {
  return detail::apply(detail::prim::dot_general, detail::DotAttrs{dims}, {a, b});
}

Array matmul(const Array& a, const Array& b) {
  using detail::type_str;
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

}  // namespace shardplan
