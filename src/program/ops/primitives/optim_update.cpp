// The fused Adam(W) update (torch.optim.AdamW(fused=True), Apex's and Transformer Engine's
// FusedAdam): one kernel reads each element of the parameter, its gradient and its two moments
// once and writes the new parameter and moments once. A node has one result, so the kernel's
// three results are three nodes of one primitive, each naming its part; the nodes reading the
// same operand blocks are one launch (Primitive::shared_reads), which the memory traffic counts
// once: 28 bytes per f32 element (4 reads, 3 writes of 4 bytes), where the update as ops reads
// and writes each intermediate.
#include <cmath>

#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {
namespace {

/// adamw_update: the part of the update this node gives (0: the parameter, 1: the first moment,
/// 2: the second), Adam's constants and the decoupled weight decay (0: Adam).
struct AdamwAttrs {
  int part = 0;
  double b1 = 0.9, b2 = 0.999, eps = 1e-8, weight_decay = 0;
};
std::string format_attrs(const AdamwAttrs& a) {
  static constexpr const char* kParts[] = {"param", "mu", "nu"};
  return fmt::format(" part={} b1={} b2={} eps={} weight_decay={}", kParts[a.part], a.b1, a.b2,
                     a.eps, a.weight_decay);
}

// Operands: param, grad, mu, nu (one float dtype and shape), lr and count (float scalars: the
// rate and the step count after this step, from which the bias corrections 1 - b^count come).
TensorType adamw_type(const Node& n, std::span<const TensorType> in) {
  const AdamwAttrs& a = n.attr<AdamwAttrs>();
  if (a.part < 0 || a.part > 2) {
    reject(n.op->name, in, fmt::format("part {} is not 0 (param), 1 (mu) or 2 (nu)", a.part));
  }
  for (const TensorType& t : in) {
    if (!computable_float(t.dtype)) reject(n.op->name, in, "every operand must be a float array");
  }
  for (std::size_t i = 1; i < 4; ++i) {
    if (in[i].dtype != in[0].dtype || in[i].shape != in[0].shape) {
      reject(n.op->name, in, "param, grad, mu and nu must have one dtype and shape");
    }
  }
  if (in[4].shape.rank() != 0 || in[5].shape.rank() != 0) {
    reject(n.op->name, in, "lr and count must be scalars");
  }
  return in[0];
}

OpFactors adamw_factors(const Node& n, std::span<const Shape> in) {
  OpFactors f = same_dims(n.type.shape, in.first(4));
  f.operands.emplace_back();  // lr: no dimensions
  f.operands.emplace_back();  // count
  return f;
}

void adamw_kernel(const KernelArgs& k) {
  const AdamwAttrs& a = k.node.attr<AdamwAttrs>();
  const double lr = scalar_of(k.in[4]), count = scalar_of(k.in[5]);
  dispatch_if<IsFloating>(k, k.out.dtype, [&]<class T>(Tag<T>) {
    using C = Calc<T>;
    const C b1 = static_cast<C>(a.b1), b2 = static_cast<C>(a.b2), eps = static_cast<C>(a.eps);
    const C c1 = static_cast<C>(1 - std::pow(a.b1, count));
    const C c2 = static_cast<C>(1 - std::pow(a.b2, count));
    const C rate = static_cast<C>(lr), wd = static_cast<C>(a.weight_decay);
    const T* p = elems<T>(k.in[0]);
    const T* g = elems<T>(k.in[1]);
    const T* m = elems<T>(k.in[2]);
    const T* v = elems<T>(k.in[3]);
    T* y = elems<T>(k.out);
    const std::int64_t n = k.out.shape.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      const C gi = widen(g[i]);
      const C mi = b1 * widen(m[i]) + (1 - b1) * gi;
      const C vi = b2 * widen(v[i]) + (1 - b2) * gi * gi;
      C out = a.part == 1 ? mi : vi;
      if (a.part == 0) {
        const C pi = widen(p[i]);
        out = pi - rate * ((mi / c1) / (std::sqrt(vi / c2) + eps) + wd * pi);
      }
      y[i] = narrow<T>(out);
    }
  });
}

// The operations per element of each part: the moments 3 and 4, the parameter 9 (the bias
// corrections, the square root, eps, the division, the decay and the step).
double adamw_flops(const Node& n, std::span<const Shape>, const Shape& result) {
  static constexpr double kPerElement[] = {9, 3, 4};
  return kPerElement[n.attr<AdamwAttrs>().part] * static_cast<double>(result.numel());
}

std::vector<Array> adamw_vjp(const Node& n, const std::vector<Array>&, const Array&, const Array&) {
  refuse_update_gradient(n, "Optimizer::fused()");
}

// ---- Test declaration ---------------------------------------------------------------------------

std::vector<TestCase> adamw_cases(const Primitive&, DType dtype) {
  std::vector<TestCase> cases;
  const Domain count{.low = 1, .high = 6, .whole = true};
  for (const Shape& s : {Shape{8, 6}, Shape{}, Shape{3, 5}}) {
    for (int part = 0; part < 3; ++part) {
      for (const double wd : {0.0, 0.1}) {
        cases.push_back({AdamwAttrs{.part = part, .weight_decay = wd},
                         {{{s, dtype}},
                          {{s, dtype}},
                          {{s, dtype}},
                          {{s, dtype}, kPositive},
                          {{Shape{}, dtype}, {.low = 0.01, .high = 0.5}},
                          {{Shape{}, dtype}, count}}});
      }
    }
  }
  return cases;
}

// torch.optim.AdamW's update (decoupled decay), in double.
std::vector<double> adamw_reference(const Node& n, std::span<const HostValues> in) {
  const AdamwAttrs& a = n.attr<AdamwAttrs>();
  const double lr = in[4].v[0], t = in[5].v[0];
  std::vector<double> out(in[0].v.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double g = in[1].v[i], p = in[0].v[i];
    const double m = a.b1 * in[2].v[i] + (1 - a.b1) * g;
    const double v = a.b2 * in[3].v[i] + (1 - a.b2) * g * g;
    const double mhat = m / (1 - std::pow(a.b1, t)), vhat = v / (1 - std::pow(a.b2, t));
    const double param = p - lr * (mhat / (std::sqrt(vhat) + a.eps) + a.weight_decay * p);
    out[i] = a.part == 0 ? param : a.part == 1 ? m : v;
  }
  return out;
}

constexpr PrimitiveTests kAdamwTests{.public_ops = "adamw_update",
                                     .dtypes = kFloatTypes,
                                     .cases = adamw_cases,
                                     .reference = adamw_reference,
                                     .gradient_refused = true};

}  // namespace

namespace prim {
constinit const Primitive adamw_update{.name = "adamw_update",
                                       .arity = 6,
                                       .infer = adamw_type,
                                       .factors = adamw_factors,
                                       .kernel = adamw_kernel,
                                       .flops = adamw_flops,
                                       .vjp = adamw_vjp,
                                       .per_element = true,
                                       .shared_reads = true,
                                       .tests = &kAdamwTests};
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {

AdamwUpdate adamw_update(const Array& param, const Array& grad, const Array& mu, const Array& nu,
                         const Array& lr, const Array& count, double b1, double b2, double eps,
                         double weight_decay) {
  const auto part = [&](int k) {
    return detail::apply(
        detail::prim::adamw_update,
        detail::AdamwAttrs{.part = k, .b1 = b1, .b2 = b2, .eps = eps, .weight_decay = weight_decay},
        {param, grad, mu, nu, lr, count});
  };
  return {part(0), part(1), part(2)};
}

}  // namespace shardplan
