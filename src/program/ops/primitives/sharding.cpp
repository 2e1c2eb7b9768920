// The identities the partitioner reads: sharding_constraint (with_sharding_constraint, in/out
// shardings, gradients sharded like their parameters) and sharding_annotation
// (with_sharding_annotation), which compute nothing: the partitioner gives the operand the fixed
// sharding and runs no kernel; optimization_barrier, a value of its own taken as its operand
// is (the explicit rematerialisation mechanism); and keep_alive, its first operand's bytes as
// they are, which reads the others so that they stay live until it.
#include <fmt/format.h>

#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/array_access.hpp"
#include "../../ir/primitives.hpp"
#include "../../frontend/trace.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

std::string format_attrs(const ConstraintAttrs& a) {
  std::string s;
  if (a.spec) s += " spec=" + a.spec->to_string();
  if (a.like) s += " like=" + value_name(*a.like);
  if (a.readers_keep) s += " readers_keep";
  if (a.padded) s += " padded";
  return s;
}
std::string format_attrs(const AnnotationAttrs& a) {
  std::string s;
  if (a.spec) s += " spec=" + a.spec->to_string();
  return s + fmt::format(" name='{}'", a.name);
}

namespace {

TensorType identity_type(const Node&, std::span<const TensorType> in) { return in[0]; }

OpFactors identity_factors(const Node& n, std::span<const Shape> in) {
  return same_dims(n.type.shape, in);
}

// Run only when a node is computed on its own (a kernel test): the value unchanged.
void copy_kernel(const KernelArgs& k) {
  const auto bytes = static_cast<std::size_t>(k.out.shape.numel()) * size_of(k.out.dtype);
  if (bytes > 0) std::memcpy(k.out.data, k.in[0].data, bytes);
}

// The cotangent is constrained like the value (a fixed spec; a "like" constraint is the
// gradient's own, nothing to carry back).
std::vector<Array> constraint_vjp(const Node& n, const std::vector<Array>&, const Array&,
                                  const Array& g) {
  const ConstraintAttrs& c = n.attr<ConstraintAttrs>();
  // A value read as it is (a module's weight as used): its cotangent is left to the gradient's
  // own constraint (FSDP reduce-scatters it to the parameter's shard).
  if (c.readers_keep) return {g};
  if (!c.spec) return {g};
  const NamedSharding s(g.mesh(), *c.spec, c.padded ? Uneven::kPad : Uneven::kRefuse);
  return {constrain_to(g, s)};
}

std::vector<Array> annotation_vjp(const Node&, const std::vector<Array>&, const Array&,
                                  const Array& g) {
  return {g};
}

// ---- Test declarations (primitive_tests.hpp): the value and its cotangent pass unchanged
// ----------

std::vector<TestCase> identity_cases(Attrs a, Attrs b, DType t) {
  return {{std::move(a), {{{Shape{8, 6}, t}}}}, {std::move(b), {{{Shape{8, 6}, t}}}}};
}
std::vector<TestCase> constraint_cases(const Primitive&, DType t) {
  return identity_cases(ConstraintAttrs{.spec = P("x")}, ConstraintAttrs{.spec = P("x", "y")}, t);
}
std::vector<TestCase> annotation_cases(const Primitive&, DType t) {
  return identity_cases(AnnotationAttrs{"h", P(nullptr, "y")}, AnnotationAttrs{"h", std::nullopt},
                        t);
}
constexpr PrimitiveTests identity_tests(std::string_view op, CasesFn* cases) {
  return {.public_ops = op,
          .dtypes = kMovedTypes,
          .cases = cases,
          .elementwise = [](std::span<const double> x) { return x[0]; },
          .gradient = true};
}
constexpr PrimitiveTests kConstraintTests =
    identity_tests("with_sharding_constraint", constraint_cases);
constexpr PrimitiveTests kAnnotationTests =
    identity_tests("with_sharding_annotation", annotation_cases);
std::vector<TestCase> barrier_cases(const Primitive&, DType t) {
  return {{NoAttrs{}, {{{Shape{8, 6}, t}}}}};
}
constexpr PrimitiveTests kBarrierTests = identity_tests("optimization_barrier", barrier_cases);

constexpr Primitive identity(std::string_view name, VjpFn* vjp, const PrimitiveTests* tests) {
  return Primitive{.name = name,
                   .arity = 1,
                   .infer = identity_type,
                   .factors = identity_factors,
                   .kernel = copy_kernel,
                   .flops = no_flops,
                   .vjp = vjp,
                   .pointwise = true,
                   .sharding_identity = true,
                   .tests = tests};
}

std::vector<Array> barrier_vjp(const Node&, const std::vector<Array>&, const Array&,
                               const Array& g) {
  return {g};
}

// keep_alive: the value's dimensions are the result's; the held operands' are linked to nothing
// (read as they are: Primitive::holds_operands).
OpFactors keep_alive_factors(const Node& n, std::span<const Shape> in) {
  OpFactors f = same_dims(n.type.shape, in.subspan(0, 1));
  for (std::size_t k = 1; k < in.size(); ++k) {
    f.operands.emplace_back(static_cast<std::size_t>(in[k].rank()), -1);
  }
  return f;
}

// keep_alive: the cotangent flows to the value; the values held to this point get zero (the
// result does not depend on them).
std::vector<Array> keep_alive_vjp(const Node&, const std::vector<Array>& in, const Array&,
                                  const Array& g) {
  std::vector<Array> out(in.size());
  out[0] = g;
  for (std::size_t k = 1; k < in.size(); ++k) {
    if (is_floating(in[k].dtype())) out[k] = full_like(in[k], 0);
  }
  return out;
}

// A pending sum of the value is carried through, whatever the cost: keep_alive holds, it does
// not decide where a sum is reduced (a gradient's sum reduced after it in the wider dtype a
// convert_pending asks for stays so).
Linearity keep_alive_linearity(const Node&, std::span<const TensorType>) {
  return {.kind = Linearity::Kind::kJointly, .operands = 1u, .carry = true};
}

TensorType keep_alive_type(const Node&, std::span<const TensorType> in) {
  for (std::size_t k = 1; k < in.size(); ++k) {
    if (in[k].shape != in[0].shape) {
      throw SpecError(fmt::format("[keep_alive] the values held must have the value's shape {}, "
                                  "operand {} is {}",
                                  in[0].shape.to_string(), k, in[k].shape.to_string()));
    }
  }
  return in[0];
}

std::vector<TestCase> keep_alive_cases(const Primitive&, DType t) {
  return {{NoAttrs{}, {{{Shape{8, 6}, t}}}},
          {NoAttrs{}, {{{Shape{8, 6}, t}}, {{Shape{8, 6}, t}}, {{Shape{8, 6}, DType::kF32}}}}};
}
constexpr PrimitiveTests kKeepAliveTests = identity_tests("keep_alive", keep_alive_cases);

}  // namespace

namespace prim {
// A view of its first operand (no kernel, no bytes of its own) that reads the others as they are
// (no reshard: holds_operands): the memory pass holds them until this step, as autograd holds a
// node's saved tensors until the node has run. Not pointwise, so that fusion never takes it into
// a kernel; linear in the value, whose pending sum is always carried through.
constinit const Primitive keep_alive{.name = "keep_alive",
                                     .arity = kVariadic,
                                     .infer = keep_alive_type,
                                     .factors = keep_alive_factors,
                                     .kernel = copy_kernel,
                                     .flops = no_flops,
                                     .vjp = keep_alive_vjp,
                                     .view = true,
                                     .holds_operands = true,
                                     .linearity = keep_alive_linearity,
                                     .tests = &kKeepAliveTests};
constinit const Primitive optimization_barrier{.name = "optimization_barrier",
                                               .arity = 1,
                                               .infer = identity_type,
                                               .factors = identity_factors,
                                               .kernel = copy_kernel,
                                               .flops = no_flops,
                                               .vjp = barrier_vjp,
                                               .pointwise = true,
                                               .barrier = true,
                                               .linearity = linear_in_all,
                                               .tests = &kBarrierTests};
constinit const Primitive sharding_constraint =
    identity("sharding_constraint", constraint_vjp, &kConstraintTests);
constinit const Primitive sharding_annotation =
    identity("sharding_annotation", annotation_vjp, &kAnnotationTests);
}  // namespace prim

bool is_gradient_constraint(const Node& n) {
  return n.is(prim::sharding_constraint) && n.attr<ConstraintAttrs>().like.has_value();
}

Array with_sharding_like(const Array& x, const Array& like) {
  TraceContext* ctx = current_trace();
  if (ctx == nullptr) return with_sharding_constraint(x, like.sharding().spec());
  return apply(prim::sharding_constraint, ConstraintAttrs{.like = ctx->node_of(like)}, {x});
}

Array pin_sharding(const Array& x, const PartitionSpec& spec) {
  if (current_trace() == nullptr && !x.is_tracer()) return with_sharding_constraint(x, spec);
  return apply(prim::sharding_constraint, ConstraintAttrs{.spec = spec, .readers_keep = true},
               {x});
}

std::optional<Pinned> pinned(const Array& x) {
  TraceContext* ctx = current_trace();
  if (ctx == nullptr || !x.is_tracer() || ArrayAccess::trace(x) != ctx) return std::nullopt;
  const ValueId v = ctx->node_of(x);
  const Node& n = ctx->graph[v];
  if (!n.is(prim::sharding_constraint)) return std::nullopt;
  const ConstraintAttrs& a = n.attr<ConstraintAttrs>();
  if (!a.readers_keep || !a.spec) return std::nullopt;
  const ValueId held = n.operands.at(0);
  const auto names = ctx->value_names.find(v);
  return Pinned{.value = ArrayAccess::tracer(ctx->executor, ctx->mesh, ctx->graph[held].type, ctx,
                                             static_cast<int>(index(held))),
                .spec = *a.spec,
                .names = names == ctx->value_names.end() ? std::vector<std::string>{}
                                                         : names->second};
}

Array constrain_to(const Array& x, const NamedSharding& sharding, std::string origin) {
  if (current_trace() == nullptr && !x.is_tracer()) return reshard(x, sharding).array;
  return apply(prim::sharding_constraint,
               ConstraintAttrs{.spec = sharding.spec(),
                               .origin = std::move(origin),
                               .padded = sharding.uneven() == Uneven::kPad},
               {x});
}

Array annotate(const Array& x, const std::string& name, std::optional<PartitionSpec> spec) {
  return apply(prim::sharding_annotation, AnnotationAttrs{name, std::move(spec)}, {x});
}

}  // namespace shardplan::detail

namespace shardplan {

Array optimization_barrier(const Array& x) {
  if (detail::current_trace() == nullptr && !x.is_tracer()) return x;
  return detail::apply(detail::prim::optimization_barrier, detail::NoAttrs{}, {x});
}

Array keep_alive(const Array& x, const std::vector<Array>& held) {
  if (held.empty() || (detail::current_trace() == nullptr && !x.is_tracer())) return x;
  std::vector<Array> operands{x};
  operands.insert(operands.end(), held.begin(), held.end());
  return detail::apply(detail::prim::keep_alive, detail::NoAttrs{}, operands);
}

Array with_sharding_constraint(const Array& x, const PartitionSpec& spec) {
  if (detail::current_trace() != nullptr || x.is_tracer()) {
    return detail::apply(detail::prim::sharding_constraint, detail::ConstraintAttrs{.spec = spec},
                         {x});
  }
  return reshard(x, NamedSharding(x.mesh(), spec)).array;
}

}  // namespace shardplan
