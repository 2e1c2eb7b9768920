#pragma once
// A primitive, defined once: its name, arity, attributes, shape and dtype rule, factor (sharding)
// rule, per-device kernel, FLOP count and VJP together, in the spirit of MLX's Primitive and
// JAX's primitive registrations. Every primitive is a `const Primitive` in one file of
// src/program/primitives/, listed in primitives.hpp, with its test declaration (Primitive::tests);
// DEVELOPERS.md ("Recipe: a new primitive") says how to add one. The required parts have no
// default: leaving one out of a definition does not compile, and giving a null function fails the
// build too (the definitions are constexpr).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "factors.hpp"
#include "graph.hpp"
#include "shardplan/array.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/partition_spec.hpp"

namespace shardplan::detail {

struct PrimitiveTests;

/// One device's block of a value: row-major, `shape` is the local (block) shape.
struct ConstBlock {
  const std::byte* data;
  Shape shape;
  DType dtype;
};
struct MutBlock {
  std::byte* data;
  Shape shape;
  DType dtype;
};

/// What a kernel computes: `node` with local attributes and result shape (see Primitive::localize),
/// in[i] operand i's block, `out` the result block (preallocated, contents undefined), and
/// `out_offset` the global index of out's first element along each result dimension.
struct KernelArgs {
  const Node& node;
  const std::vector<ConstBlock>& in;
  const MutBlock& out;
  const std::vector<std::int64_t>& out_offset;
};

/// A function every primitive must give: no default constructor (leaving it out of a definition
/// is a compile error) and no constructor from `nullptr` (a compile error too). The pointer is not
/// compared with null while the constexpr definition is built: GCC cannot fold the address of a
/// template instance against null under -fsanitize=undefined, so the registry test checks
/// `is_set()` for every listed primitive instead.
template <class F>
class Required {
 public:
  constexpr Required(F* f) : f_(f) {}  // NOLINT: built from the function it names
  Required(std::nullptr_t) = delete;
  bool is_set() const { return f_ != nullptr; }
  template <class... A>
  decltype(auto) operator()(A&&... a) const {
    return f_(std::forward<A>(a)...);
  }

 private:
  F* f_;
};

/// The result type of `node` (its op and attributes set, its type not yet) for these operand
/// types; throws SpecError naming the op, the operands and what is wrong (a dtype the op does not
/// take, shapes that do not fit).
using InferFn = TensorType(const Node& node, std::span<const TensorType> operands);
/// The op's sharding rule as factors (factors.hpp), given the operand shapes.
using FactorsFn = OpFactors(const Node& node, std::span<const Shape> operands);
/// Computes the node on one device's blocks.
using KernelFn = void(const KernelArgs& k);
/// The kernels of several devices (two or more) run by one thread, all of which hold the same
/// values of operand `shared` (a block of a replicated weight): a chance to do once what each
/// device's kernel would repeat (the dot packs the weight once for all of them). Each device's
/// result must be bitwise what its own kernel gives. Returns false, having written nothing, to
/// have each device's kernel run instead.
using GroupKernelFn = bool(std::span<const KernelArgs> devices, int shared);
/// Floating-point operations of the kernel on these local shapes.
using FlopsFn = double(const Node& node, std::span<const Shape> operands, const Shape& result);
/// The cotangents of the operands (an empty Array where none flows) given the operands, the
/// result and the result's cotangent `g`, written with the public ops (so they are traced,
/// sharded and differentiated again like any code).
using VjpFn = std::vector<Array>(const Node& node, const std::vector<Array>& operands,
                                 const Array& result, const Array& g);
/// The node a device runs: attributes that depend on the block made local (slice limits of a
/// sharded dimension). `local` starts as a copy of the node with the block's result shape; the
/// operands' global and block shapes are given.
using LocalizeFn = void(Node& local, std::span<const Shape> global_operands,
                        std::span<const Shape> local_operands);

/// For fusion (fuse.hpp): the result, in row-major order, is the operand's elements each repeated
/// `inner` times, the whole repeated: result element i is operand element (i / inner) mod period.
/// A bias [n] broadcast to [m, n] has period n and inner 1, a row's statistic [m, 1] broadcast to
/// [m, n] period m and inner n, a reshape period = its elements and inner 1.
struct Repetition {
  std::int64_t period = 0;  // 0: not a repetition for these shapes
  std::int64_t inner = 1;
};
/// The repetition for these local shapes (period 0 if the result is not one). A fused step then
/// reads the operand instead of materialising the result.
using RepeatFn = Repetition(const Node& local, const Shape& local_operand);

/// How a pending sum (each device holds a summand of the value: DTensor's Partial, JAX's
/// "unreduced") flows through an op: the result is linear in the operands of `operands`, so the
/// devices may apply the op to their summands and leave the sum of the results pending (reduced
/// once, later) instead of reducing the operand first. The partitioner decides where to reduce
/// from this and the cost; no pass names an op.
struct Linearity {
  enum class Kind : std::uint8_t {
    kNone,  // not linear: a pending operand is reduced first
    // Linear in the operands of `operands` taken together (add, sub, the branches of select,
    // concatenate, a unary linear op): they flow pending only when all are pending alike; the
    // other operands must be whole (the same on every device of the sum).
    kJointly,
    // Linear in each operand of `operands` while the others are held fixed (mul, dot_general):
    // one of them may be pending, the others must be whole.
    kSeparately,
  };
  Kind kind = Kind::kNone;
  std::uint32_t operands = 0;  // bit k: operand k (kAllOperands: all, for a variadic op)
  /// A pending sum is carried through whenever it can be, even when reducing it first would move
  /// fewer bytes (convert_pending: the sum reduced in the wider dtype the user asked for).
  bool carry = false;

  bool covers(std::size_t operand) const {
    return kind != Kind::kNone && operand < 32 && ((operands >> operand) & 1u) != 0;
  }
};
inline constexpr std::uint32_t kAllOperands = ~std::uint32_t{0};
/// The op's linearity for this node and operand types (a convert is linear between float types
/// only).
using LinearityFn = Linearity(const Node& node, std::span<const TensorType> operands);

/// What remat policies (remat.hpp) ask of an op: is it a contraction (a matmul, dots_saveable),
/// and with batch dimensions (attention's scores) or without (a weight's matmul)?
enum class Contraction : std::uint8_t { kNone, kUnbatched, kBatched };
using ContractionFn = Contraction(const Node& node);

/// shard_map (shard_map.hpp): the shardings an op reads its operands in and gives its result in,
/// whatever propagation says (shard_map's boundaries, which take a global array's blocks as
/// per-device values and back; the collectives, whose per-device values are replicated arrays
/// whose devices hold different values). Propagation carries nothing through such an op.
struct FixedLayout {
  std::vector<PartitionSpec> operands;
  PartitionSpec result;
  std::string origin;  // what the program text says fixed the result ("shard_map's out_specs")
};
using FixedLayoutFn = FixedLayout(const Node& node);

/// A collective inside shard_map, run across devices on whole arrays instead of a kernel per
/// device: the operand's per-device blocks seen as one array of global shape `view`, sharded
/// `from` and pending `pending`, resharded to `to` (reshard() picks all-reduce, all-gather,
/// reduce-scatter or all-to-all); or, with `permute_axis` set, permuted along that axis by
/// `pairs` (source, destination). The result's per-device values are the blocks that gives.
/// The program's static cost is plan_reshard's for the same (collectives.hpp).
struct CollectivePlan {
  Shape view;
  PartitionSpec from;
  Pending pending;
  PartitionSpec to;
  std::string permute_axis;
  std::vector<std::pair<int, int>> pairs;
};
using CollectiveFn = CollectivePlan(const Node& node, const TensorType& operand);

/// Inside shard_map every value carries the mesh axes it varies over (JAX's vma), a bitmask over
/// the mesh's axes, or kNotManual for a global value. The result's, from the operands' (optional:
/// by default the union of the operands', with the operands that vary over fewer axes made to vary
/// first, pvary). The mesh is the trace's.
inline constexpr std::int64_t kNotManual = -1;
using VaryFn = std::int64_t(const Node& node, const Mesh& mesh, std::span<const std::int64_t> operands);

/// What bounds an op's time on an accelerator, as a time model reads ProgramCost: its FLOPs on
/// the matrix units at the rate of large products (dot_general) or of the fused attention
/// kernel (attention and its gradients), or, for every other op, the bytes it reads and writes
/// at memory bandwidth; products of float8 operands at the fp8 rate (scaled_dot).
enum class TimeBound : std::uint8_t { kMemory, kMatmul, kAttention, kMatmulFp8 };

/// Checks a device's block of a view's operand when the step runs, before the view is made, and
/// throws what is wrong (check_labels: a label outside its range). `offset` is the index of the
/// block's first element in the whole array.
using CheckFn = void(const Node& node, const ConstBlock& operand,
                     std::span<const std::int64_t> offset);

/// What the backward pass keeps of a result that the kernel writes wider than the backward pass
/// needs it (Primitive::kept). FlashAttention-2 keeps its output in the operands' dtype and the
/// f32 log-sum-exp per query row; the fused attention here writes both packed in f32.
struct KeptResult {
  /// The kept values, made from `result` with the public ops (right after the node: the op's
  /// public function reads its own output from them, so that a kept value is one value).
  std::vector<Array> (*keep)(const Node& node, const std::vector<Array>& operands,
                             const Array& result);
  /// The result as the VJP reads it, made again from the kept values in the backward pass.
  Array (*restore)(const Node& node, const std::vector<Array>& kept);
};

/// The bytes a kernel reads and writes on a device, declared by an op whose kernel is several
/// passes over whole arrays (adamw_foreach: torch's foreach passes, each reading and writing its
/// arrays in place), from the bytes of its result on that device.
using TrafficFn = std::int64_t(const Node& node, std::int64_t result_bytes);

/// Operand count of a variadic primitive (concatenate).
inline constexpr int kVariadic = -1;

struct Primitive {
  std::string_view name;
  int arity;  // operands, or kVariadic (one or more)
  Required<InferFn> infer;
  Required<FactorsFn> factors;
  Required<KernelFn> kernel;
  Required<FlopsFn> flops;
  Required<VjpFn> vjp;
  /// Optional: most kernels take the global attributes as they are.
  LocalizeFn* localize = nullptr;
  /// Optional: the op is a repetition of its one operand (see RepeatFn).
  RepeatFn* repeat = nullptr;
  /// Optional: runs the kernels of several devices sharing a thread (see GroupKernelFn).
  GroupKernelFn* group_kernel = nullptr;
  /// The result's dimensions are the operands' (all of the result's shape): propagation settles
  /// these first, to a fixed point (elementwise ops, select, convert, the sharding identities).
  /// The kernel of a pointwise op must compute element i from the operands' elements i alone,
  /// whatever the blocks' shapes: fusion runs it on flat chunks, and a pointwise op whose
  /// operands have its shape runs on padded splits as they are (takes_padded, propagate.hpp;
  /// every other op reads a padded dimension gathered).
  bool pointwise = false;
  /// Element i of each result is computed from element i of each operand of the result's shape
  /// and from the scalar (rank 0) operands alone, as a pointwise op's but with scalars beside
  /// (a fused optimizer update and its learning rate): it too runs on padded splits as they are
  /// (takes_padded). Not fused with pointwise ops (fusion runs only those).
  bool per_element = false;
  /// An identity that only fixes a sharding (constraint, annotation): no kernel step runs.
  bool sharding_identity = false;
  /// A value with no operands that is the same on every call (constant, iota): computed once per
  /// executor by a program and kept.
  bool cacheable = false;
  /// How the partial results of this op's reduce factors combine (dot, reduce_sum: sum).
  ReduceOp partial = ReduceOp::kSum;
  /// An optimization barrier (jax.lax.optimization_barrier): the result is its operand, taken in
  /// the layout it has (no reshard, no step, no FLOPs), but a value of its own, so that what its
  /// users need of it (a gathered copy) is made anew where they use it instead of shared with
  /// the operand's earlier users. The explicit rematerialisation mechanism.
  bool barrier = false;
  /// The backward pass never keeps the result from the forward pass: where a VJP reads it, it is
  /// made again from its (smaller) operand, which is what is kept. A broadcast: PyTorch's expand
  /// is a view that holds no bytes, and XLA remakes broadcasts beside the ops that read them, so
  /// neither holds a broadcast for the backward pass (a norm's `x * rsqrt(ms) * scale` keeps x
  /// and x * rsqrt(ms), not [b, t, d] copies of rsqrt(ms) and scale). Eagerly (no trace) the
  /// forward value is read as it is.
  bool remade_for_backward = false;
  /// Optional: the backward pass keeps values made from the result, not the result itself (see
  /// KeptResult); value_and_grad reads them where keep_for_backward recorded them, else makes
  /// them from the result in the backward pass (which then holds the result).
  const KeptResult* kept = nullptr;
  /// The result's blocks are the operand's bytes as they are, under another shape and sharding
  /// (shard_map's boundaries: a block of a global array is a device's value and back): the
  /// program makes the result from the operand's buffers and runs no kernel; the memory pass
  /// counts the two as one buffer (memory.hpp, shares_operand_buffers).
  bool view = false;
  /// Optional, for a view: its operand's values are checked on every device when the step runs
  /// (see CheckFn); a failure on one device fails the step, as a kernel's does (over processes,
  /// every process throws it: Program::run). The view still costs no bytes, no FLOPs and no
  /// memory traffic (the check is part of the kernel that reads the values next, as PyTorch's
  /// nll_loss checks its targets).
  CheckFn* check = nullptr;
  /// Its operands after the first are held, not computed on (keep_alive): the partitioner reads
  /// each as it is, in whatever sharding and pending sum it has (no reshard, no collective), and
  /// its factors link none of their dimensions.
  bool holds_operands = false;
  /// A multi-result op, one node per result (its attributes name which: adamw_update's part):
  /// the nodes of it that read the same operand blocks are one kernel, which reads those blocks
  /// once, so the memory traffic counts them once among the nodes (memory.cpp count_traffic).
  bool shared_reads = false;
  /// Optional: the bytes its kernel reads and writes on a device, from its result's bytes there,
  /// when that is not each operand and the result once (see TrafficFn); the memory traffic then
  /// counts this (memory.cpp count_traffic).
  TrafficFn* traffic = nullptr;
  /// Optional: how a pending sum flows through the op (see Linearity); none: not linear.
  LinearityFn* linearity = nullptr;
  /// Optional: the op is a contraction (see Contraction); none: it is not.
  ContractionFn* contraction = nullptr;
  /// What bounds its time on an accelerator (see TimeBound).
  TimeBound time_bound = TimeBound::kMemory;
  /// Optional (shard_map's ops): the layouts it reads and gives (see FixedLayout), how it runs
  /// across devices (see CollectivePlan), the axes its result varies over (see VaryFn).
  FixedLayoutFn* fixed_layout = nullptr;
  CollectiveFn* collective = nullptr;
  VaryFn* vary = nullptr;
  /// What the registry test needs to check it (primitive_tests.hpp): every listed primitive
  /// declares one, or that test fails naming it.
  const PrimitiveTests* tests = nullptr;
};

// ---- Pieces shared by definitions -----------------------------------------------------------

/// No cotangent for any operand (comparisons, iota, constants, random values, inputs).
std::vector<Array> no_gradient(const Node& node, const std::vector<Array>& operands,
                               const Array& result, const Array& g);
/// No floating-point work (data movement).
double no_flops(const Node& node, std::span<const Shape> operands, const Shape& result);
/// One operation per result element (elementwise).
double flops_per_result(const Node& node, std::span<const Shape> operands, const Shape& result);
/// A kernel for primitives that never run one: inputs are bound, not computed; the sharding
/// identities are removed by the partitioner.
void no_kernel(const KernelArgs& k);

/// "f32[8, 16]" of each operand, joined: "f32[8], i32[3]".
std::string describe(std::span<const TensorType> operands);
/// Throws SpecError "[op] ...: <why>" naming the operands.
[[noreturn]] void reject(std::string_view op, std::span<const TensorType> operands,
                         std::string_view why);

/// Linearities shared by definitions.
Linearity linear_in_all(const Node&,
                        std::span<const TensorType>);  // add, sub, neg, reshape, concatenate, ...
Linearity linear_in_first(const Node&,
                          std::span<const TensorType>);  // div (the numerator), take (the table)
Linearity linear_in_each(const Node&, std::span<const TensorType>);  // mul, dot_general
Linearity linear_in_branches(
    const Node&, std::span<const TensorType>);  // select: the two values, not the predicate

/// The sum a node's result is pending over when its operands are pending as `operands` say (one
/// per operand; empty: whole) and it is linear in them as `lin` says: the pending operands' sum
/// when they are the ones it is linear in (jointly: all of them, pending alike; separately: one)
/// and every other operand is whole. Nothing when no operand is pending or the op cannot carry
/// them (they are reduced first). Propagation's estimate and the partitioner's choice both ask
/// this.
std::optional<Pending> carried_pending(const Linearity& lin, std::span<const Pending> operands);

/// `p` with `linearity` (for definitions built by a helper: unary("neg", ...)).
constexpr Primitive with_linearity(Primitive p, LinearityFn* linearity) {
  p.linearity = linearity;
  return p;
}

/// For nodes of a primitive without attributes.
struct NoAttrs {};
inline std::string format_attrs(const NoAttrs&) { return {}; }

}  // namespace shardplan::detail
