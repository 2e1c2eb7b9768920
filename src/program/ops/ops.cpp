// The ops built from primitives (softmax, layer norm, cross-entropy, scalar arithmetic...) and
// the tree forms of the sharding annotations. Each primitive's own public function is defined
// with the primitive, in src/program/primitives/.
#include "shardplan/ops.hpp"

#include <fmt/format.h>

#include "../ir/primitives.hpp"
#include "../compiler/resolve_rules.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/error.hpp"
#include "shardplan/sjit.hpp"
#include "../frontend/trace.hpp"

namespace shardplan {
namespace {

using detail::TraceContext;

// A scalar of `dtype` broadcast to `shape`, placed like `like`.
Array scalar(double value, DType dtype, const Shape& shape, const Array& like) {
  auto t = std::make_shared<Tensor>(Shape{}, dtype);
  t->set(0, value);
  Array s;
  if (detail::current_trace() != nullptr || like.is_tracer()) {
    s = detail::apply(detail::prim::constant, detail::ConstantAttrs{t}, {}, &like);
    const TraceContext* ctx = detail::current_trace();
    if (ctx != nullptr && ctx->vary_of(like) != detail::kNotManual) s = detail::per_device(s);
  } else {
    s = device_put(*t, NamedSharding(like.mesh(), PartitionSpec()), like.executor());
  }
  return broadcast_in_dim(s, shape, {});
}

}  // namespace

Array operator-(const Array& x) { return neg(x); }
Array operator+(const Array& a, const Array& b) { return add(a, b); }
Array operator-(const Array& a, const Array& b) { return subtract(a, b); }
Array operator*(const Array& a, const Array& b) { return multiply(a, b); }
Array operator/(const Array& a, const Array& b) { return divide(a, b); }
Array full_like(const Array& x, double value) { return scalar(value, x.dtype(), x.shape(), x); }
Array full(const Shape& shape, DType dtype, double value, const Array& placement) {
  return scalar(value, dtype, shape, placement);
}
Array constant(const Tensor& value, const Array& placement) {
  if (detail::current_trace() != nullptr || placement.is_tracer()) {
    return detail::apply(detail::prim::constant,
                         detail::ConstantAttrs{std::make_shared<const Tensor>(value)}, {}, &placement);
  }
  return device_put(value, NamedSharding(placement.mesh(), PartitionSpec()), placement.executor());
}
Array operator+(const Array& a, double b) { return add(a, full_like(a, b)); }
Array operator-(const Array& a, double b) { return subtract(a, full_like(a, b)); }
Array operator*(const Array& a, double b) { return multiply(a, full_like(a, b)); }
Array operator/(const Array& a, double b) { return divide(a, full_like(a, b)); }
Array operator+(double a, const Array& b) { return add(full_like(b, a), b); }
Array operator-(double a, const Array& b) { return subtract(full_like(b, a), b); }
Array operator*(double a, const Array& b) { return multiply(full_like(b, a), b); }
Array operator/(double a, const Array& b) { return divide(full_like(b, a), b); }

Array one_hot(const Array& labels, std::int64_t n, DType dtype) {
  if (labels.dtype() != DType::kI32) {
    throw SpecError(fmt::format("[one_hot] labels must be i32, got {}", detail::type_str(labels)));
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
  axis = detail::normalize_axis(axis, x, "softmax");
  // Differentiated as PyTorch's kernel and jax.nn.softmax are: only the result y is kept for the
  // backward pass, whose cotangent is y * (g - sum(g * y)). (Through its ops, the max's VJP would
  // keep x, exp its result and the division both its operands: three arrays of x's size.)
  const auto fwd = [axis](const std::vector<Array>& in) {
    const Array e = exp(in[0] - max(in[0], {axis}, true));
    const Array y = e / sum(e, {axis}, true);
    return CustomVjpForward{{y}, {y}};
  };
  const auto bwd = [axis](const std::vector<Array>& res, const std::vector<Array>& cts) {
    const Array& y = res[0];
    return std::vector<Array>{y * (cts[0] - sum(cts[0] * y, {axis}, true))};
  };
  return custom_vjp(fwd, bwd, {x}).at(0);
}

Array log_softmax(const Array& x, int axis) {
  axis = detail::normalize_axis(axis, x, "log_softmax");
  // Differentiated as PyTorch's kernel is: only the result is kept for the backward pass, whose
  // cotangent is g - exp(result) * sum(g). (Through its ops, the max's VJP would keep the input
  // and its broadcast max, and exp its result: three arrays of x's size.)
  const auto fwd = [axis](const std::vector<Array>& in) {
    const Array shifted = in[0] - max(in[0], {axis}, true);
    const Array result = shifted - log(sum(exp(shifted), {axis}, true));
    return CustomVjpForward{{result}, {result}};
  };
  const auto bwd = [axis](const std::vector<Array>& res, const std::vector<Array>& cts) {
    return std::vector<Array>{cts[0] - exp(res[0]) * sum(cts[0], {axis}, true)};
  };
  return custom_vjp(fwd, bwd, {x}).at(0);
}

Array silu(const Array& x) {
  // Through its ops, x * sigmoid(x) would keep x, sigmoid(x) and keep nothing less: two arrays
  // of x's size for the backward pass where PyTorch's kernel keeps one.
  const auto fwd = [](const std::vector<Array>& in) {
    return CustomVjpForward{{in[0] * sigmoid(in[0])}, {in[0]}};
  };
  const auto bwd = [](const std::vector<Array>& res, const std::vector<Array>& cts) {
    const Array s = sigmoid(res[0]);
    // d/dx x s(x) = s + x s (1 - s) = s (1 + x (1 - s))
    return std::vector<Array>{cts[0] * (s * (1.0 + res[0] * (1.0 - s)))};
  };
  return custom_vjp(fwd, bwd, {x}).at(0);
}

namespace detail {

// Labels already through check_labels: the ignore_index names no class (one that would is
// replaced by -1 first), so its one-hot row is zeros: its loss is 0 and its logits' gradient 0.
Array cross_entropy_of_checked(const Array& logits, const Array& labels,
                               std::int64_t ignore_index) {
  const std::int64_t classes = logits.shape()[logits.shape().rank() - 1];
  Array named = labels;
  if (ignore_index >= 0 && ignore_index < classes) {
    const Array ignored =
        equal(labels, full(labels.shape(), DType::kI32, static_cast<double>(ignore_index), labels));
    named = where(ignored, full(labels.shape(), DType::kI32, -1, labels), labels);
  }
  const Array lp = log_softmax(logits, -1);
  return -sum(lp * one_hot(named, classes, logits.dtype()), {-1});
}

}  // namespace detail

Array cross_entropy(const Array& logits, const Array& labels, std::int64_t ignore_index) {
  const int r = logits.shape().rank();
  if (r < 1 || labels.shape().rank() != r - 1) {
    throw SpecError(fmt::format("[cross_entropy] logits {} need labels of rank {}, got {}",
                                detail::type_str(logits), r - 1, detail::type_str(labels)));
  }
  return detail::cross_entropy_of_checked(
      logits, check_labels(labels, logits.shape()[r - 1], ignore_index, "cross_entropy"),
      ignore_index);
}

Array mean_over_labels(const Array& losses, const Array& labels, std::int64_t ignore_index) {
  if (losses.shape() != labels.shape() || labels.dtype() != DType::kI32 ||
      !is_floating(losses.dtype())) {
    throw SpecError(fmt::format("[mean_over_labels] needs float losses and i32 labels of one "
                                "shape, got {} and {}",
                                detail::type_str(losses), detail::type_str(labels)));
  }
  const Array ignore = full(labels.shape(), DType::kI32, static_cast<double>(ignore_index), labels);
  const Array counted = astype(not_equal(labels, ignore), losses.dtype());
  return sum(losses) / sum(counted);
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
        fmt::format("[causal_mask] needs scores [..., T, T], got {}", detail::type_str(scores)));
  }
  const Array i = iota_like(scores, r - 2);
  const Array j = iota_like(scores, r - 1);
  return where(less_equal(j, i), scores, full_like(scores, -1e30));
}

Array with_sharding_annotation(const Array& x, const std::string& name) {
  return with_sharding_annotation(Tree<Array>(x), name).leaf();
}

Tree<Array> with_sharding_constraint(const Tree<Array>& tree, const RuleTree& rules) {
  const auto leaves = tree.leaves();
  if (leaves.empty()) return tree;
  TraceContext* ctx = detail::current_trace();
  const Mesh mesh = ctx != nullptr ? ctx->mesh : leaves.front().mesh();
  const auto shardings = detail::resolve_rules(mesh, rules, tree, "",
                                               ctx != nullptr ? ctx->uneven : Uneven::kRefuse);
  std::size_t k = 0;
  return tree.map([&](const Array& a) {
    const MaybeSharding& s = shardings[k++];
    return s ? detail::constrain_to(a, *s) : a;
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
  if (rule != nullptr) shardings = detail::resolve_rules(ctx->mesh, *rule, tree, "");
  std::size_t k = 0;
  return tree.map([&](const Array& a) {
    std::optional<PartitionSpec> spec;
    if (rule != nullptr && shardings[k]) spec = shardings[k]->spec();
    ++k;
    return detail::annotate(a, name, std::move(spec));
  });
}

}  // namespace shardplan
