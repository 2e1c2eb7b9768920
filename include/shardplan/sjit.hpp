#pragma once
// sjit: wraps a step function so that it runs SPMD over a mesh, as scalax's
// MeshShardingHelper.sjit (jax.jit with shardings from rules). The function is traced once per
// signature (tree structures, shapes, dtypes, input shardings, static values), its shardings are
// propagated and the program partitioned into per-device kernels and collectives, cached, run.
//
//   auto step = sjit(mesh, [](const Tree<Array>& params, const Array& x) {
//     return relu(matmul(x, params.at("w").leaf()));
//   }, {.in_shardings = RuleTree::list({RuleTree(P(nullptr, "model")), RuleTree(P("data"))})});
//   Array y = step(params, x);          // runs
//   std::cout << step.lower(params, x).text();  // the program, its shardings and its cost

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/detail/sjit_call.hpp"
#include "shardplan/links.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/program_cost.hpp"

namespace shardplan {

/// sjit's options (names as scalax). Each sharding tree is a prefix of what it shards, with a
/// rule, a PartitionSpec, Replicated or Unspecified at its leaves (resolved by the planner).
struct SjitOptions {
  /// Over the list of array arguments (statics left out), e.g. RuleTree::list({rules, P("data")}).
  /// Unspecified: an argument keeps the sharding it arrives with.
  std::optional<RuleTree> in_shardings = std::nullopt;
  /// Over the function's output tree. Unspecified: left to propagation.
  std::optional<RuleTree> out_shardings = std::nullopt;
  /// Over the list of array arguments: constraints applied as the function starts.
  std::optional<RuleTree> args_sharding_constraint = std::nullopt;
  /// What the shardings resolved from in_shardings, out_shardings, args_sharding_constraint and
  /// with_sharding_constraint's rules inside do with a dimension their axes do not divide: a
  /// SpecError (kRefuse, the default), or padded as JAX splits it (kPad; each op reads a padded
  /// dimension gathered, docs/sjit.md "Padded arrays").
  Uneven uneven = Uneven::kRefuse;
  /// name -> sharding for with_sharding_annotation(x, name) inside the function.
  std::map<std::string, RuleTree> annotation_shardings = {};
  /// Positions of static arguments; any argument that is not an Array, a Tree<Array>, a
  /// registered struct of Arrays or a TensorSpec (tree) is static anyway. Statics are part of the
  /// cache key (they need std::hash or operator<<).
  std::vector<int> static_argnums = {};
  /// Positions of arguments whose buffers the program may reuse for its outputs; the arrays
  /// passed there cannot be used afterwards (ArrayError).
  std::vector<int> donate_argnums = {};
  /// Positions of arguments holding a batch of examples, split along their first dimension over
  /// some mesh axes (the batch axes). Values computed from them are never moved between devices
  /// of those axes, only their sums reduced: as data-parallel stacks (DDP, FSDP) run a step,
  /// where the partitioner would otherwise move activations when that moves fewer bytes than
  /// gathering the weights. Empty: nothing is held in place.
  std::vector<int> batch_argnums = {};
  /// Let with_sharding_annotation names without a sharding pass (as scalax does); otherwise an
  /// unknown name is an error listing the known ones.
  bool allow_unknown_annotations = false;
  /// The executor for calls without array arguments (else the arguments' own).
  std::optional<Executor> executor = std::nullopt;
  /// Run each group of pointwise ops whose intermediates nothing else reads as one fused step
  /// (docs/sjit.md, "How a step runs"). false compiles them one step each, to measure or rule
  /// out fusion; the results are bitwise the same either way.
  bool fuse = true;
  /// With `fuse`, fuse as an eager framework runs (PyTorch without torch.compile): every op
  /// writes its result, and only a broadcast or reshape that repeats its operand is read in place
  /// by its reader (PyTorch's expand and view allocate nothing). Plans the memory and the
  /// memory-bound time of an eager step; results are bitwise the same.
  bool eager = false;
  /// The most bytes per device of constant results (values that depend on no argument: a mask,
  /// a rotary table; each under 1 MiB) kept for the next call, the first ones first; the others
  /// are made again each call (docs/sjit.md). Kept ones count in the peak. 0 keeps none.
  /// train-plan keeps them all (no bound): a step's figures then grow with its layers in a
  /// straight line, not up to the bound.
  std::int64_t kept_constant_bytes = detail::kDefaultKeptConstantBytes;
  /// Count the results of constant steps in the cost (the peak, the kernels' memory traffic).
  /// false (train-plan) plans them as an accelerator's compiler does: folded into the kernels
  /// that read them (an iota, a mask, a rotary table), holding no memory of their own. The
  /// program still makes them to run.
  bool count_constants = true;
  /// Rank the ways to partition the step by estimated time on these links (links.hpp; every
  /// mesh axis needs a figure) instead of by the bytes a device receives. link_figures
  /// (hardware.hpp) gives a hardware entry's; train-plan ranks by bytes (docs/design.md says
  /// why). Refused at construction when an axis is not the mesh's, a mesh axis has none, or a
  /// figure is not a finite number in range.
  std::optional<LinkFigures> links = std::nullopt;
};

/// The library's composite ops, as LoweredOp::composite names them: each op's definition
/// declares its name on every op it traces (and on their backward ops), so a program says it
/// holds one whatever the user's own scopes and collectives are called.
namespace composite {
inline constexpr char kLinearCrossEntropy[] = "linear_cross_entropy";
inline constexpr char kRingAttention[] = "ring_attention";
inline constexpr char kAllGatherKvAttention[] = "allgather_kv_attention";
inline constexpr char kUlyssesAttention[] = "ulysses_attention";
}  // namespace composite

/// One operation of a compiled program, as it runs: its primitive's name ("dot_general",
/// "attention", "ppermute"), its result's global type, the sharding that result is computed in
/// and, for with_sharding_annotation, the annotation's name (else empty); the named scope it was
/// traced in ("" for none); the library composite op it belongs to (`composite::`, innermost;
/// "" for none). What a report reads to say what a program holds rather than what it was asked
/// for.
struct LoweredOp {
  std::string primitive;
  TensorSpec type;
  PartitionSpec spec;
  std::string annotation;
  std::string scope;
  std::string composite;
  friend bool operator==(const LoweredOp&, const LoweredOp&) = default;
};

class Lowered;
namespace detail {
class Program;
/// The program `lowered` holds: for the library's own analyses of it (src/train).
const Program& program_of(const Lowered& lowered);
}  // namespace detail

/// A compiled program, not run: what `lower()` returns.
class Lowered {
 public:
  explicit Lowered(std::shared_ptr<const detail::Compiled> c) : c_(std::move(c)) {}
  /// Every value with its sharding and where that sharding came from, every kernel and
  /// collective (with axes and bytes), then the cost.
  std::string text() const;
  /// The traced program, jaxpr-like.
  std::string jaxpr() const;
  const ProgramCost& cost() const;
  /// The shardings of the array arguments' leaves (in order) and of the outputs' leaves.
  std::vector<NamedSharding> input_shardings() const;
  std::vector<NamedSharding> output_shardings() const;
  /// The traced program's operations in order (the forward and backward passes, the update,
  /// shard_map bodies), each with the sharding the partitioner computes it in.
  std::vector<LoweredOp> ops() const;
  /// The outputs' shapes and dtypes, in the output tree's shape (jax.eval_shape).
  Tree<TensorSpec> output_specs() const;
  /// True when both are the same compiled program (the same cache entry).
  friend bool operator==(const Lowered& a, const Lowered& b) { return a.c_ == b.c_; }

 private:
  friend const detail::Program& detail::program_of(const Lowered& lowered);
  std::shared_ptr<const detail::Compiled> c_;
};

/// The wrapped function: call it like the function; `lower(args...)` compiles without running
/// (arguments may be TensorSpec trees: plan a step for a model too large for this machine).
template <class F>
class Sjit {
 public:
  Sjit(F f, Mesh mesh, SjitOptions options)
      : f_(std::move(f)),
        core_(std::make_shared<detail::SjitCore>(std::move(mesh), std::move(options))) {}

  template <class... Args>
  auto operator()(const Args&... args) {
    using R = detail::sjit_result_t<F, Args...>;
    const detail::CallArgs call = detail::collect_args(args...);
    if (detail::tracing()) {  // nested in another sjit: traced inline, as a nested jax.jit
      return detail::from_array_tree<R>(core_->trace_inline(call, detail::trace_fn(f_, args...)));
    }
    auto compiled = core_->get(call, detail::trace_fn(f_, args...));
    return detail::from_array_tree<R>(core_->run(*compiled, call));
  }

  template <class... Args>
  Lowered lower(const Args&... args) {
    const detail::CallArgs call = detail::collect_args(args...);
    return Lowered(core_->get(call, detail::trace_fn(f_, args...)));
  }

  /// The compiled program a call with these arguments runs: the cache entry the call would use
  /// (compiled now when missing). Throws as a call does before running.
  template <class... Args>
  Lowered compiled(const Args&... args) {
    return lower(args...);
  }
  /// scalax's name for compiled().
  template <class... Args>
  Lowered get_jitted_function_by_args(const Args&... args) {
    return compiled(args...);
  }

  /// Programs compiled so far (one per signature).
  std::size_t cache_size() const { return core_->cache_size(); }

 private:
  F f_;
  std::shared_ptr<detail::SjitCore> core_;
};

/// Wraps `f` to run over `mesh`.
template <class F>
Sjit<F> sjit(const Mesh& mesh, F f, SjitOptions options = {}) {
  return Sjit<F>(std::move(f), mesh, std::move(options));
}

/// Wraps `f` to run over the mesh of this thread's MeshContext (scalax's global mesh). Throws
/// SpecError when no context is active.
template <class F>
Sjit<F> sjit(F f, SjitOptions options = {}) {
  return Sjit<F>(std::move(f), get_global_mesh(), std::move(options));
}

/// scalax's mesh.sjit: `f` wrapped to run over the helper's mesh, as sjit(helper.mesh(), f).
template <class F>
Sjit<F> sjit(const MeshShardingHelper& helper, F f, SjitOptions options = {}) {
  return Sjit<F>(std::move(f), helper.mesh(), std::move(options));
}

/// jax.eval_shape: the shapes and dtypes `f` returns for these arguments (arrays or TensorSpec
/// trees), found by tracing it; nothing is allocated or run.
template <class F, class... Args>
Tree<TensorSpec> eval_shape(const Mesh& mesh, F f, const Args&... args) {
  SjitOptions options;
  options.allow_unknown_annotations = true;
  return sjit(mesh, std::move(f), std::move(options)).lower(args...).output_specs();
}

/// Inside sjit: the ops traced from here on belong to `phase` (the program's
/// ProgramCost::timeline says where each phase begins); outside a trace it does nothing.
/// value_and_grad records its forward and backward passes itself. Thread-safe (the trace is the
/// thread's).
void begin_phase(StepPhase phase);

/// with_sharding_constraint on every leaf of a tree, the specs resolved from a rule tree (a
/// prefix of `tree`; Unspecified leaves are left alone).
Tree<Array> with_sharding_constraint(const Tree<Array>& tree, const RuleTree& rules);
/// with_sharding_annotation on every leaf of a tree: inside sjit, the rule given for `name` is
/// resolved against the tree; outside, the active MeshContext's rule for `name` (if any) is.
Tree<Array> with_sharding_annotation(const Tree<Array>& tree, const std::string& name);

}  // namespace shardplan
