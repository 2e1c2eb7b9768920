// scaled_dot: a dot of two float8 operands, scaled, as torch._scaled_mm and the cuBLASLt fp8 GEMM
// compute it: (a . b) * scale_a * scale_b, the products summed in f32 and the result written in
// `out_dtype`. The scales are the inverses of the ones the operands were multiplied by before
// the cast to 8 bits: f32 scalars (tensorwise scaling), or one per row of each operand, i.e. per
// element of its batch and free dimensions (rowwise scaling: torch._scaled_mm's scale_a [M, 1]
// and scale_b [1, N]), split as those dimensions are. Dimensions, shapes, factors and FLOPs are
// dot_general's (dot.hpp).
#include <algorithm>

#include "../../../runtime/gemm.hpp"
#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "dot.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

/// scaled_dot's dimensions and result dtype.
struct ScaledDotAttrs {
  DotDims dims;
  DType out_dtype = DType::kBF16;
};
std::string format_attrs(const ScaledDotAttrs& a) {  // the result type says out_dtype
  const DotDims& d = a.dims;
  return fmt::format(" batch=[{}]x[{}] contract=[{}]x[{}]", fmt::join(d.lhs_batch, ","),
                     fmt::join(d.rhs_batch, ","), fmt::join(d.lhs_contract, ","),
                     fmt::join(d.rhs_contract, ","));
}

namespace {

bool is_f8(DType d) { return f8_format(d) != nullptr; }

TensorType scaled_dot_type(const Node& n, std::span<const TensorType> in) {
  const ScaledDotAttrs& a = n.attr<ScaledDotAttrs>();
  if (!is_f8(in[0].dtype) || !is_f8(in[1].dtype)) {
    reject(n.op->name, in, "a and b must be float8 (f8_e4m3 or f8_e5m2; cast with astype)");
  }
  for (int i = 2; i < 4; ++i) {
    const Shape rows = dot_kept_shape(a.dims, in[i - 2].shape, i - 2);
    if (in[i].dtype != DType::kF32 || (in[i].shape.rank() != 0 && in[i].shape != rows)) {
      reject(n.op->name, in,
             fmt::format("scale_{} must be f32 of shape [] (tensorwise) or {} (one per row of {})",
                         "ab"[i - 2], rows.to_string(), "ab"[i - 2]));
    }
  }
  if (a.out_dtype != DType::kBF16 && a.out_dtype != DType::kF32) {
    reject(n.op->name, in, fmt::format("out_dtype must be bf16 or f32, got {}", name(a.out_dtype)));
  }
  return TensorType{dot_shape(n.op->name, a.dims, in[0], in[1]), a.out_dtype};
}

OpFactors scaled_dot_factors(const Node& n, std::span<const Shape> in) {
  const DotDims& d = n.attr<ScaledDotAttrs>().dims;
  OpFactors f = dot_factors_of(d, in[0], in[1]);
  // A scalar scale is whole on every device; a per-row one is split as its operand's rows.
  for (int i = 0; i < 2; ++i) {
    std::vector<int> kept;
    if (in[static_cast<std::size_t>(i) + 2].rank() != 0) {
      const std::vector<int>& contract = i == 0 ? d.lhs_contract : d.rhs_contract;
      for (int dim = 0; dim < in[static_cast<std::size_t>(i)].rank(); ++dim) {
        if (std::find(contract.begin(), contract.end(), dim) == contract.end()) {
          kept.push_back(f.operands[static_cast<std::size_t>(i)][static_cast<std::size_t>(dim)]);
        }
      }
    }
    f.operands.push_back(std::move(kept));
  }
  return f;
}

double scaled_dot_flops(const Node& n, std::span<const Shape> in, const Shape&) {
  return dot_flops_of(n.attr<ScaledDotAttrs>().dims, in[0], in[1]);
}

Contraction scaled_dot_contraction(const Node& n) {
  return dot_contraction_of(n.attr<ScaledDotAttrs>().dims);
}

// The 256 values of a float8 format, decoded once per call (a block's elements are many more).
std::array<float, 256> decode_table(DType d) {
  std::array<float, 256> t{};
  const F8Format& f = *f8_format(d);
  for (int c = 0; c < 256; ++c)
    t[static_cast<std::size_t>(c)] = f8_decode(f, static_cast<std::uint8_t>(c));
  return t;
}

// The operand's values as floats (exact), its dimensions in the order `perm`.
std::vector<float> arrange_decoded(const ConstBlock& b, const std::vector<int>& perm) {
  const std::array<float, 256> table = decode_table(b.dtype);
  const std::vector<std::int64_t> strides = row_major_strides(b.shape);
  std::vector<std::int64_t> dims, perm_strides;
  for (const int d : perm) {
    dims.push_back(b.shape[d]);
    perm_strides.push_back(strides[d]);
  }
  std::vector<float> out(static_cast<std::size_t>(b.shape.numel()));
  const auto* x = reinterpret_cast<const std::uint8_t*>(b.data);
  float* y = out.data();
  for_each_offset(dims, perm_strides, [&](std::int64_t off) { *y++ = table[x[off]]; });
  return out;
}

// Each result element's scale_a * scale_b (one f32 product, as the GEMM's epilogue forms it).
std::vector<float> result_scales(const DotDims& dims, std::span<const ConstBlock> in,
                                 std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n), 1.0f);
  for (int i = 0; i < 2; ++i) {
    const ConstBlock& s = in[static_cast<std::size_t>(i) + 2];
    const float* v = elems<float>(s);
    if (s.shape.rank() == 0) {
      for (float& x : out) x *= v[0];
      continue;
    }
    const std::vector<std::int64_t> at = dot_kept_offsets(dims, in[0].shape, in[1].shape, i);
    for (std::size_t e = 0; e < out.size(); ++e) out[e] *= v[at[e]];
  }
  return out;
}

// Each product summed in f32 (the GEMM over the decoded values: every float8 product is exact in
// f32), then multiplied by scale_a * scale_b and rounded once to the result's dtype.
void scaled_dot_kernel(const KernelArgs& k) {
  const DotDims& dims = k.node.attr<ScaledDotAttrs>().dims;
  const DotLayout d = dot_layout(dims, k.in[0].shape, k.in[1].shape);
  const std::vector<float> lhs = arrange_decoded(k.in[0], d.lhs_perm);
  const std::vector<float> rhs = arrange_decoded(k.in[1], d.rhs_perm);
  const std::vector<float> scale = result_scales(dims, k.in, k.out.shape.numel());
  std::vector<float> acc(static_cast<std::size_t>(k.out.shape.numel()), 0.0f);
  if (d.k > 0) {
    for (std::int64_t b = 0; b < d.batch; ++b) {
      gemm(false, true, d.m, d.n, d.k, lhs.data() + b * d.m * d.k, rhs.data() + b * d.n * d.k,
           acc.data() + b * d.m * d.n);
    }
  }
  dispatch_if<IsFloating>(k, k.out.dtype, [&]<class T>(Tag<T>) {
    T* y = elems<T>(k.out);
    for (std::size_t i = 0; i < acc.size(); ++i) y[i] = narrow<T>(acc[i] * scale[i]);
  });
}

// ---- Test declaration (primitive_tests.hpp) ---------------------------------------------------

// dot_general's dots with a of `dtype` and b of each float8 format, written in bf16 and f32;
// scales of [0.25, 4], scalars; and each dot in f32 with a scale per row of each operand.
std::vector<TestCase> scaled_dot_cases(const Primitive&, DType dtype) {
  std::vector<TestCase> cases;
  const CaseOperand scale{{Shape{}, DType::kF32}, kPositive};
  for (const DotTestCase& c : dot_test_cases()) {
    for (const DType b : {DType::kF8E4M3, DType::kF8E5M2}) {
      for (const DType out : {DType::kF32, DType::kBF16}) {
        cases.push_back(
            {ScaledDotAttrs{c.dims, out}, {{{c.lhs, dtype}}, {{c.rhs, b}}, scale, scale}});
      }
    }
    const CaseOperand rows_a{{dot_kept_shape(c.dims, c.lhs, 0), DType::kF32}, kPositive};
    const CaseOperand rows_b{{dot_kept_shape(c.dims, c.rhs, 1), DType::kF32}, kPositive};
    cases.push_back({ScaledDotAttrs{c.dims, DType::kF32},
                     {{{c.lhs, dtype}}, {{c.rhs, DType::kF8E4M3}}, rows_a, rows_b}});
  }
  return cases;
}

// The dot of the operands' (float8) values in double, times both scales (each element's own
// row's, by index from the result's, computed apart from the kernel's offsets).
std::vector<double> scaled_dot_reference(const Node& n, std::span<const HostValues> in) {
  const DotDims& d = n.attr<ScaledDotAttrs>().dims;
  std::vector<double> y = dot_reference_of(d, n.type.shape, in[0], in[1]);
  const std::vector<int> lfree = free_dims(in[0].shape.rank(), d.lhs_batch, d.lhs_contract);
  const std::vector<int> rfree = free_dims(in[1].shape.rank(), d.rhs_batch, d.rhs_contract);
  const std::vector<std::int64_t> out_strides = row_major_strides(n.type.shape);
  for (std::size_t e = 0; e < y.size(); ++e) {
    // The result's index, then each operand's index in its kept dimensions.
    std::vector<std::int64_t> r(out_strides.size());
    for (std::size_t i = 0; i < r.size(); ++i) {
      r[i] = (static_cast<std::int64_t>(e) / out_strides[i]) % n.type.shape[static_cast<int>(i)];
    }
    for (int side = 0; side < 2; ++side) {
      const HostValues& s = in[static_cast<std::size_t>(side) + 2];
      if (s.shape.rank() == 0) {
        y[e] *= s.v[0];
        continue;
      }
      const HostValues& x = in[static_cast<std::size_t>(side)];
      std::vector<std::int64_t> idx(static_cast<std::size_t>(x.shape.rank()), -1);
      const std::vector<int>& batch = side == 0 ? d.lhs_batch : d.rhs_batch;
      for (std::size_t p = 0; p < batch.size(); ++p) idx[static_cast<std::size_t>(batch[p])] = r[p];
      const std::size_t first = batch.size() + (side == 0 ? 0 : lfree.size());
      const std::vector<int>& free = side == 0 ? lfree : rfree;
      for (std::size_t f = 0; f < free.size(); ++f) {
        idx[static_cast<std::size_t>(free[f])] = r[first + f];
      }
      std::int64_t off = 0;
      for (std::size_t i = 0; i < idx.size(); ++i) {
        if (idx[i] >= 0) off = off * x.shape[static_cast<int>(i)] + idx[i];
      }
      y[e] *= s.v[static_cast<std::size_t>(off)];
    }
  }
  return y;
}

constexpr PrimitiveTests kScaledDotTests{.public_ops = "scaled_dot",
                                         .dtypes = {DType::kF8E4M3, DType::kF8E5M2},
                                         .cases = scaled_dot_cases,
                                         .reference = scaled_dot_reference};

}  // namespace

namespace prim {
// No cotangent flows through it: the scales are constants of the cast (torchao computes them
// from detached amaxes) and no op computes in 8 bits; float8_linear differentiates itself.
constinit const Primitive scaled_dot{.name = "scaled_dot",
                                     .arity = 4,
                                     .infer = scaled_dot_type,
                                     .factors = scaled_dot_factors,
                                     .kernel = scaled_dot_kernel,
                                     .flops = scaled_dot_flops,
                                     .vjp = no_gradient,
                                     .partial = ReduceOp::kSum,
                                     .contraction = scaled_dot_contraction,
                                     .time_bound = TimeBound::kMatmulFp8,
                                     .tests = &kScaledDotTests};
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {

Array scaled_dot(const Array& a, const Array& b, const Array& scale_a, const Array& scale_b,
                 const DotDims& dims, DType out_dtype) {
  return detail::apply(detail::prim::scaled_dot, detail::ScaledDotAttrs{dims, out_dtype},
                       {a, b, scale_a, scale_b});
}

}  // namespace shardplan
