// torch's foreach AdamW (torch.optim.AdamW with foreach, the default on CUDA when neither fused
// nor foreach is given: _multi_tensor_adamw in torch/optim/adamw.py, PyTorch 2.5; 2.6's
// _multi_tensor_adam with decoupled decay runs the same passes). Each pass is one torch._foreach_*
// op over the list of every parameter (or moment) of a group, in place: it reads whole arrays and
// writes one whole array, so the update's memory traffic is the sum of its passes':
//
//   pass (torch, in order)                                  reads      writes   f32 B/element
//   _foreach_mul_(params, 1 - lr * wd)     (wd != 0 only)   p          p        8
//   _foreach_lerp_(exp_avgs, grads, 1 - b1)                 m, g       m        12
//   _foreach_mul_(exp_avg_sqs, b2)                          v          v        8
//   _foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - b2)    v, g       v        12
//   exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)            v          s (new)  8
//   _foreach_div_(exp_avg_sq_sqrt, bias_correction2_sqrt)   s          s        8
//   _foreach_add_(exp_avg_sq_sqrt, eps)                     s          s        8
//   _foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt,    p, m, s    p        16
//                     step_size = -lr / bias_correction1)
//
// 80 B per f32 element with decay, 72 without (the fused kernel: 28; addcmul_ reads the gradient
// list given twice as one array). The square roots are one new list, alive from _foreach_sqrt to
// the addcdiv_. The passes are four nodes here, each a part naming the passes it runs (its
// declared traffic: Primitive::traffic): the first moment (lerp_), the second (mul_, addcmul_),
// the denominator (sqrt, div_, add_: the list s), the parameter (mul_, addcdiv_). Each pass
// stores its result in the arrays' dtype, as torch's in-place ops do; the bias corrections are
// computed in double from the step count, as Python does.
#include <cmath>

#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {
namespace {

enum ForeachPart : int { kExpAvg, kExpAvgSq, kDenom, kParam };

/// adamw_foreach: the part this node is (see ForeachPart), Adam's constants and the decoupled
/// weight decay of its parameter (0: none; its mul_ pass is then not run).
struct ForeachAttrs {
  int part = kExpAvg;
  double b1 = 0.9, b2 = 0.999, eps = 1e-8, weight_decay = 0;
};
std::string format_attrs(const ForeachAttrs& a) {
  static constexpr const char* kParts[] = {"exp_avg", "exp_avg_sq", "denom", "param"};
  return fmt::format(" part={} b1={} b2={} eps={} weight_decay={}", kParts[a.part], a.b1, a.b2,
                     a.eps, a.weight_decay);
}

// Operands per part: the arrays (one float dtype and shape), then float scalars.
//   exp_avg: mu, grad | exp_avg_sq: nu, grad | denom: nu (new), count |
//   param: param, mu (new), denom, lr, count.
constexpr int kArrays[] = {2, 2, 1, 3};
constexpr int kArity[] = {2, 2, 2, 5};

TensorType foreach_type(const Node& n, std::span<const TensorType> in) {
  const ForeachAttrs& a = n.attr<ForeachAttrs>();
  if (a.part < kExpAvg || a.part > kParam) {
    reject(n.op->name, in, fmt::format("part {} is not 0 to 3", a.part));
  }
  if (static_cast<int>(in.size()) != kArity[a.part]) {
    reject(n.op->name, in, fmt::format("part {} takes {} operands", a.part, kArity[a.part]));
  }
  for (const TensorType& t : in) {
    if (!computable_float(t.dtype)) reject(n.op->name, in, "every operand must be a float array");
  }
  for (int i = 1; i < kArrays[a.part]; ++i) {
    if (in[i].dtype != in[0].dtype || in[i].shape != in[0].shape) {
      reject(n.op->name, in, "the arrays must have one dtype and shape");
    }
  }
  for (std::size_t i = kArrays[a.part]; i < in.size(); ++i) {
    if (in[i].shape.rank() != 0) reject(n.op->name, in, "lr and count must be scalars");
  }
  return in[0];
}

OpFactors foreach_factors(const Node& n, std::span<const Shape> in) {
  const int arrays = kArrays[n.attr<ForeachAttrs>().part];
  OpFactors f = same_dims(n.type.shape, in.first(arrays));
  for (std::size_t i = arrays; i < in.size(); ++i) f.operands.emplace_back();
  return f;
}

// The passes of one part on element i, each rounded to T as torch's in-place op stores it.
template <class T>
struct ForeachPasses {
  using C = Calc<T>;
  ForeachAttrs a;
  double lr = 0, count = 0;
  C store(C x) const { return widen(narrow<T>(x)); }
  C exp_avg(C m, C g) const {  // lerp_: weight 1 - b1, ATen's two-sided formula
    const C w = static_cast<C>(1 - a.b1);
    return store(std::abs(w) < C(0.5) ? m + w * (g - m) : g - (g - m) * (1 - w));
  }
  C exp_avg_sq(C v, C g) const {  // mul_, addcmul_
    const C scaled = store(v * static_cast<C>(a.b2));
    return store(scaled + static_cast<C>(1 - a.b2) * g * g);
  }
  C denom(C v) const {  // sqrt, div_, add_
    const C root = store(std::sqrt(v));
    const C divided = store(root / static_cast<C>(std::sqrt(1 - std::pow(a.b2, count))));
    return store(divided + static_cast<C>(a.eps));
  }
  C param(C p, C m, C s) const {  // mul_ (decay), addcdiv_
    if (a.weight_decay != 0) p = store(p * static_cast<C>(1 - lr * a.weight_decay));
    const C step_size = static_cast<C>(-(lr / (1 - std::pow(a.b1, count))));
    return store(p + step_size * (m / s));
  }
};

void foreach_kernel(const KernelArgs& k) {
  const ForeachAttrs& a = k.node.attr<ForeachAttrs>();
  const double count = scalar_of(k.in[k.in.size() - 1]);
  const double lr = a.part == kParam ? scalar_of(k.in[3]) : 0;
  dispatch_if<IsFloating>(k, k.out.dtype, [&]<class T>(Tag<T>) {
    const ForeachPasses<T> f{a, lr, count};
    const T* x = elems<T>(k.in[0]);
    const T* y = kArrays[a.part] > 1 ? elems<T>(k.in[1]) : nullptr;
    const T* z = kArrays[a.part] > 2 ? elems<T>(k.in[2]) : nullptr;
    T* out = elems<T>(k.out);
    const std::int64_t n = k.out.shape.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      Calc<T> r{};
      switch (a.part) {
        case kExpAvg: r = f.exp_avg(widen(x[i]), widen(y[i])); break;
        case kExpAvgSq: r = f.exp_avg_sq(widen(x[i]), widen(y[i])); break;
        case kDenom: r = f.denom(widen(x[i])); break;
        default: r = f.param(widen(x[i]), widen(y[i]), widen(z[i])); break;
      }
      out[i] = narrow<T>(r);
    }
  });
}

// The arrays each part's passes read and write, per element (the table above).
int passes_traffic(const ForeachAttrs& a) {
  switch (a.part) {
    case kExpAvg: return 3;                                  // lerp_: m, g -> m
    case kExpAvgSq: return 2 + 3;                            // mul_: v -> v; addcmul_: v, g -> v
    case kDenom: return 2 + 2 + 2;                           // sqrt, div_, add_
    default: return (a.weight_decay != 0 ? 2 : 0) + 4;       // mul_; addcdiv_: p, m, s -> p
  }
}
std::int64_t foreach_traffic(const Node& n, std::int64_t result_bytes) {
  return passes_traffic(n.attr<ForeachAttrs>()) * result_bytes;
}

// Operations per element: lerp 3; mul, mul, mul, add 4; sqrt, div, add 3; (mul), div, mul, add.
double foreach_flops(const Node& n, std::span<const Shape>, const Shape& result) {
  const ForeachAttrs& a = n.attr<ForeachAttrs>();
  static constexpr double kPerElement[] = {3, 4, 3, 3};
  const double decay = a.part == kParam && a.weight_decay != 0 ? 1 : 0;
  return (kPerElement[a.part] + decay) * static_cast<double>(result.numel());
}

std::vector<Array> foreach_vjp(const Node& n, const std::vector<Array>&, const Array&,
                               const Array&) {
  refuse_update_gradient(n, "Optimizer::foreach()");
}

// ---- Test declaration ---------------------------------------------------------------------------

std::vector<TestCase> foreach_cases(const Primitive&, DType dtype) {
  std::vector<TestCase> cases;
  const Domain count{.low = 1, .high = 6, .whole = true};
  const CaseOperand lr{{Shape{}, dtype}, {.low = 0.01, .high = 0.5}};
  for (const Shape& s : {Shape{8, 6}, Shape{}, Shape{3, 5}}) {
    const CaseOperand any{{s, dtype}}, positive{{s, dtype}, kPositive};
    const CaseOperand steps{{Shape{}, dtype}, count};
    cases.push_back({ForeachAttrs{.part = kExpAvg}, {any, any}});
    cases.push_back({ForeachAttrs{.part = kExpAvg, .b1 = 0.3}, {any, any}});  // lerp's other side
    cases.push_back({ForeachAttrs{.part = kExpAvgSq}, {positive, any}});
    cases.push_back({ForeachAttrs{.part = kDenom}, {positive, steps}});
    for (const double wd : {0.0, 0.1}) {
      cases.push_back({ForeachAttrs{.part = kParam, .weight_decay = wd},
                       {any, any, positive, lr, steps}});
    }
  }
  return cases;
}

// AdamW's update in double, each part as its formula: the same values as the passes to rounding.
std::vector<double> foreach_reference(const Node& n, std::span<const HostValues> in) {
  const ForeachAttrs& a = n.attr<ForeachAttrs>();
  const double t = in.back().v[0];
  std::vector<double> out(in[0].v.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double x = in[0].v[i];
    switch (a.part) {
      case kExpAvg: out[i] = a.b1 * x + (1 - a.b1) * in[1].v[i]; break;
      case kExpAvgSq: out[i] = a.b2 * x + (1 - a.b2) * in[1].v[i] * in[1].v[i]; break;
      case kDenom: out[i] = std::sqrt(x / (1 - std::pow(a.b2, t))) + a.eps; break;
      default: {
        const double lr = in[3].v[0];
        const double mhat = in[1].v[i] / (1 - std::pow(a.b1, t));
        out[i] = x - lr * (mhat / in[2].v[i] + a.weight_decay * x);
      }
    }
  }
  return out;
}

constexpr PrimitiveTests kForeachTests{.public_ops = "adamw_foreach",
                                       .dtypes = kFloatTypes,
                                       .cases = foreach_cases,
                                       .reference = foreach_reference,
                                       .gradient_refused = true};

}  // namespace

namespace prim {
constinit const Primitive adamw_foreach{.name = "adamw_foreach",
                                        .arity = kVariadic,
                                        .infer = foreach_type,
                                        .factors = foreach_factors,
                                        .kernel = foreach_kernel,
                                        .flops = foreach_flops,
                                        .vjp = foreach_vjp,
                                        .per_element = true,
                                        .traffic = foreach_traffic,
                                        .tests = &kForeachTests};
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {

AdamwForeach adamw_foreach(const std::vector<Array>& params, const std::vector<Array>& grads,
                           const std::vector<Array>& mu, const std::vector<Array>& nu,
                           const Array& lr, const Array& count, double b1, double b2, double eps,
                           const std::vector<double>& weight_decay) {
  const std::size_t n = params.size();
  if (grads.size() != n || mu.size() != n || nu.size() != n || weight_decay.size() != n) {
    throw SpecError(fmt::format(
        "[adamw_foreach] {} params, {} grads, {} mu, {} nu and {} weight decays: one of each "
        "per parameter",
        n, grads.size(), mu.size(), nu.size(), weight_decay.size()));
  }
  using detail::ForeachAttrs;
  const auto pass = [&](int part, std::size_t j, std::vector<Array> operands) {
    const ForeachAttrs a{.part = part, .b1 = b1, .b2 = b2, .eps = eps,
                         .weight_decay = weight_decay[j]};
    return detail::apply(detail::prim::adamw_foreach, a, std::move(operands));
  };
  // Pass by pass over the whole list, as torch runs them: every square root is made (and held)
  // before the first parameter is updated.
  AdamwForeach out;
  std::vector<Array> denom;
  for (std::size_t j = 0; j < n; ++j) out.mu.push_back(pass(detail::kExpAvg, j, {mu[j], grads[j]}));
  for (std::size_t j = 0; j < n; ++j) {
    out.nu.push_back(pass(detail::kExpAvgSq, j, {nu[j], grads[j]}));
  }
  for (std::size_t j = 0; j < n; ++j) denom.push_back(pass(detail::kDenom, j, {out.nu[j], count}));
  for (std::size_t j = 0; j < n; ++j) {
    out.params.push_back(pass(detail::kParam, j, {params[j], out.mu[j], denom[j], lr, count}));
  }
  return out;
}

}  // namespace shardplan
