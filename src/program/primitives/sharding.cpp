// The identities the partitioner reads: sharding_constraint (with_sharding_constraint, in/out
// shardings, gradients sharded like their parameters) and sharding_annotation
// (with_sharding_annotation), which compute nothing: the partitioner gives the operand the fixed
// sharding and runs no kernel; and optimization_barrier, a value of its own taken as its operand
// is (the explicit rematerialisation mechanism).
#include <fmt/format.h>

#include "../kernel_util.hpp"
#include "../primitive_tests.hpp"
#include "../primitives.hpp"
#include "../trace.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

std::string format_attrs(const ConstraintAttrs& a) {
  std::string s;
  if (a.spec) s += " spec=" + a.spec->to_string();
  if (a.like) s += " like=" + value_name(*a.like);
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
  const auto& spec = n.attr<ConstraintAttrs>().spec;
  return {spec ? with_sharding_constraint(g, *spec) : g};
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

}  // namespace

namespace prim {
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

Array annotate(const Array& x, const std::string& name, std::optional<PartitionSpec> spec) {
  return apply(prim::sharding_annotation, AnnotationAttrs{name, std::move(spec)}, {x});
}

}  // namespace shardplan::detail

namespace shardplan {

Array optimization_barrier(const Array& x) {
  if (detail::current_trace() == nullptr && !x.is_tracer()) return x;
  return detail::apply(detail::prim::optimization_barrier, detail::NoAttrs{}, {x});
}

Array with_sharding_constraint(const Array& x, const PartitionSpec& spec) {
  if (detail::current_trace() != nullptr || x.is_tracer()) {
    return detail::apply(detail::prim::sharding_constraint, detail::ConstraintAttrs{.spec = spec},
                         {x});
  }
  return reshard(x, NamedSharding(x.mesh(), spec)).array;
}

}  // namespace shardplan
