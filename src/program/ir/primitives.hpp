#pragma once
// Every primitive of the program layer, one line each (the definitions are in
// src/program/primitives/), the attributes the compiler itself reads, and `apply`, the one way an
// op becomes a node: recorded inside a trace, run at once outside.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "primitive.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/tensor.hpp"

namespace shardplan::detail {

// X(name): the `const Primitive prim::name` defined in src/program/primitives/.
// clang-format off
#define SHARDPLAN_PRIMITIVES(X)                                                               \
  /* elementwise.cpp */                                                                       \
  X(neg) X(exp) X(log) X(sqrt) X(rsqrt) X(sin) X(cos) X(tanh) X(relu) X(gelu) X(sigmoid)      \
  X(abs) X(erf) X(add) X(sub) X(mul) X(div) X(max) X(min) X(pow) X(eq) X(ne) X(lt) X(le)      \
  X(gt) X(ge) X(select) X(convert)                                                            \
  /* dot.cpp */ X(dot_general) /* scaled_dot.cpp */ X(scaled_dot)                            \
  /* attention.cpp */ X(attention) X(attention_grad_q) X(attention_grad_kv)                   \
  /* reduce.cpp */ X(reduce_sum) X(reduce_max) X(reduce_min)                                  \
  /* movement.cpp */ X(reshape) X(transpose) X(broadcast_in_dim) /* movement_index.cpp */     \
  X(slice) X(concatenate) X(take) /* rows.cpp */ X(fused_log_softmax) X(take_along_axis)      \
  X(check_labels) /* sources.cpp */ X(iota) X(constant) X(random) X(input)                    \
  /* sharding.cpp */ X(sharding_constraint) X(sharding_annotation) X(optimization_barrier)    \
  X(keep_alive)                                                                               \
  /* shard_map_ops.cpp */ X(shard_map_in) X(shard_map_out) X(pvary) X(preduce) X(pall_gather) \
  X(psum_scatter) X(ppermute) X(pall_to_all)                                                \
  /* optim_update.cpp */ X(adamw_update) /* optim_foreach.cpp */ X(adamw_foreach)
// clang-format on

namespace prim {
#define SHARDPLAN_DECLARE_PRIMITIVE(n) extern const Primitive n;
SHARDPLAN_PRIMITIVES(SHARDPLAN_DECLARE_PRIMITIVE)
#undef SHARDPLAN_DECLARE_PRIMITIVE
}  // namespace prim

/// Every primitive, in the order listed above.
std::span<const Primitive* const> all_primitives();

// ---- Attributes the compiler reads ----------------------------------------------------------

/// input: argument `index` of the traced function (-1 for an array captured from outside, until
/// the trace is finished and numbers it after the arguments), of type `type`.
struct InputAttrs {
  int index = -1;
  TensorType type;
};
/// sharding_constraint: the result has the sharding `spec`; or, without one, the sharding `like`
/// gets when compiled (a gradient sharded like its parameter). `origin` is what the program's
/// text says it came from ("output 0 (out_shardings)"; empty: with_sharding_constraint).
struct ConstraintAttrs {
  std::optional<PartitionSpec> spec;
  std::optional<ValueId> like;
  std::string origin;
  /// Its readers read the value as it is, never resharded (pin_sharding: a module's weight as
  /// Megatron's column/row-parallel layers use it): the partitioner prices any reshard of it as
  /// impossible, so each reader chooses what it computes around this layout.
  bool readers_keep = false;
  /// The sharding pads (Uneven::kPad) a dimension its axes do not divide (SjitOptions::uneven):
  /// fixed so, padded, instead of refused.
  bool padded = false;
};
/// x constrained to `sharding` (its spec, and padded when it pads: ConstraintAttrs::padded);
/// eagerly, resharded to it.
Array constrain_to(const Array& x, const NamedSharding& sharding, std::string origin = {});
/// with_sharding_constraint(x, spec) whose readers read it as it is (ConstraintAttrs::
/// readers_keep). Eagerly, the constraint alone.
Array pin_sharding(const Array& x, const PartitionSpec& spec);
/// What pin_sharding pinned: the value as it was (before the pin), the spec, and the names the
/// pinned value carries (checkpoint_name).
struct Pinned {
  Array value;
  PartitionSpec spec;
  std::vector<std::string> names;
};
/// When `x` is, in the trace being recorded, pin_sharding's result: what it pinned; otherwise
/// (not pinned, or no trace) none. An op that casts a pinned operand (float8_linear's weight)
/// casts the value as it was and pins the cast instead, so that the cast is what is gathered.
std::optional<Pinned> pinned(const Array& x);
/// Whether `n` is the constraint value_and_grad puts on a gradient ("sharded like its
/// parameter", ConstraintAttrs::like): it guides the propagation, but a gradient still pending
/// there stays pending for its users (the update) to reduce where they need it, as XLA treats
/// the gradient all-reduce and the update together. A user's with_sharding_constraint, an
/// output's sharding and an annotation are resolved where they stand.
bool is_gradient_constraint(const Node& n);
/// sharding_annotation: with_sharding_annotation(x, name), and the spec the name resolved to
/// while tracing (none: left to propagation).
struct AnnotationAttrs {
  std::string name;
  std::optional<PartitionSpec> spec;
};
/// constant: a host tensor, the same on every device (compared by value).
struct ConstantAttrs {
  std::shared_ptr<const Tensor> value;
};
std::string format_attrs(const InputAttrs&);
std::string format_attrs(const ConstraintAttrs&);
std::string format_attrs(const AnnotationAttrs&);
std::string format_attrs(const ConstantAttrs&);

/// "f32[8, 16]".
std::string type_str(const Array& a);

/// `axis` counted from the end when negative; throws SpecError "[op] axis 5 is out of range for
/// f32[2, 3]".
int normalize_axis(int axis, const Array& x, std::string_view op);
/// Each axis normalized, sorted; throws SpecError for one out of range or repeated.
std::vector<int> normalize_axes(std::vector<int> axes, const Array& x, std::string_view op);

/// The permutation that puts a result whose dimension t is operand dimension order[t] back in
/// operand order (the inverse permutation).
std::vector<int> inverse_permutation(const std::vector<int>& order);
/// transpose(x, perm), or x itself when perm is the identity.
Array maybe_transpose(const Array& x, const std::vector<int>& perm);
/// from, from + 1, ..., to - 1.
std::vector<int> int_range(int from, int to);
/// The per-token cross-entropy of logits [..., C] against labels that check_labels has passed
/// (cross_entropy without the check: linear_cross_entropy checks its labels once, whole).
Array cross_entropy_of_checked(const Array& logits, const Array& labels,
                               std::int64_t ignore_index);
/// Indices clamped into [0, size - 1] as the gathers' kernels clamp them (take,
/// take_along_axis): what their VJPs scatter the cotangent to.
Array clamped_indices(const Array& indices, std::int64_t size);

/// The result type `op` gives these operands (arity and the primitive's checks; nothing runs).
TensorType infer_type(const Primitive& op, const Attrs& attrs, const std::vector<Array>& operands);

/// x annotated with `name` (sharding_annotation), with the spec the name resolved to, if any.
Array annotate(const Array& x, const std::string& name, std::optional<PartitionSpec> spec);

/// Inside a trace: the values 0, 1, ... along `axis` of `shape` (an iota node).
Array traced_iota(const Shape& shape, DType dtype, int axis);

/// The one way an op is applied: checks the operand count, infers the result type (the
/// primitive's checks throw SpecError at the op, before anything runs), then records a node in
/// the current trace, or, outside any trace, runs a one-op program on the operands' devices
/// (`placement` gives mesh and executor to an op without operands). Throws ArrayError for a
/// tracer used outside its trace.
Array apply(const Primitive& op, Attrs attrs, const std::vector<Array>& operands,
            const Array* placement = nullptr);
/// The values the backward pass keeps of `result`, made by apply(op, attrs, operands)
/// (Primitive::kept, which `op` must have): made now with the public ops and, in a trace,
/// recorded for result's node, so that value_and_grad's backward pass reads them (restored by
/// the primitive) instead of holding the result from the forward pass.
std::vector<Array> keep_for_backward(const Primitive& op, const Attrs& attrs,
                                     const std::vector<Array>& operands, const Array& result);
/// The most one-op programs an executor keeps for apply() outside a trace; with one more, the
/// least recently used is dropped.
constexpr std::size_t kEagerProgramsKept = 4096;

}  // namespace shardplan::detail
