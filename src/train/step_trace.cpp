// The training step under sjit on abstract arguments: the model's loss and gradients (over
// micro-batches when accumulating), the optimizer's update one parameter at a time, lowered for
// the mesh and its cost read off the compiled program.
#include "step_trace.hpp"
#include "model_family.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "../program/ir/primitives.hpp"
#include "../runtime/numeric.hpp"
#include "allocation_events.hpp"
#include "resolve_options.hpp"
#include "step_layouts.hpp"
#include "tp_overlap.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/sjit.hpp"

namespace shardplan::train {
namespace {

Optimizer make_optimizer(OptimizerKind kind, OptimizerKernel kernel) {
  // The rates do not change the program's shape or cost; any value would do.
  switch (kind) {
    case OptimizerKind::kSgd:
      return Optimizer::sgd(1e-3);  // a fused or foreach kernel is refused (check_options)
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamw:
      break;
  }
  const Optimizer adam = kind == OptimizerKind::kAdam
                             ? Optimizer::adam(1e-3)
                             : Optimizer::adamw(constant_schedule(1e-3), 0.1);
  switch (kernel) {
    case OptimizerKernel::kFused:
      return adam.fused();
    case OptimizerKernel::kForeach:
      return adam.foreach();
    case OptimizerKernel::kOps:
      break;
  }
  return adam;
}

Tree<Array> cast(const Tree<Array>& t, DType dtype) {
  return t.map([&](const Array& a) { return a.dtype() == dtype ? a : astype(a, dtype); });
}

/// Gradients whose sums over the batch axes are reduced in `dtype` (mixed precision).
Tree<Array> reduced_in(const Tree<Array>& t, DType dtype) {
  return t.map([&](const Array& a) { return convert_pending(a, dtype); });
}

/// Bytes one device holds of each leaf (every device holds the same: shapes must divide).
std::int64_t shard_bytes(const std::vector<NamedSharding>& shardings, std::size_t first,
                         const std::vector<TensorSpec>& leaves, DType as = DType::kBool,
                         bool use_as = false) {
  // The program's memory plan has already summed these (with the rest) without overflowing;
  // checked all the same, so a change there cannot turn this into a wrapped number.
  std::int64_t total = 0;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const Shape shard = shardings[first + i].shard_shape(leaves[i].shape);
    if (!detail::checked_add(total, byte_size(shard, use_as ? as : leaves[i].dtype), &total)) {
      throw SpecError("[train] the bytes one device holds overflow int64");
    }
  }
  return total;
}

/// The optimizer's state for `params` (the step count, and Adam's moments like the parameters)
/// and its rules.
std::pair<Tree<TensorSpec>, RuleTree> optimizer_state(const Tree<TensorSpec>& params,
                                                      const RulePtr& rules,
                                                      const TrainPlanOptions& o) {
  const auto moments = [&] {
    return params.map([&](const TensorSpec& t) { return TensorSpec{t.shape, o.optimizer_dtype}; });
  };
  std::vector<Tree<TensorSpec>::DictEntry> state_entries{
      {"count", Tree<TensorSpec>(TensorSpec{Shape{}, DType::kF32})}};
  std::vector<RuleTree::DictEntry> state_rules{{"count", RuleTree(Replicated{})}};
  // ZeRO-1 with mixed precision: the master weights are the optimizer's (Megatron's main
  // parameters), sharded as the rules say; the parameters held are param_dtype's.
  if (o.optimizer_sharding == OptimizerSharding::kZero1 && o.master_dtype) {
    state_entries.emplace_back(
        "master", params.map([&](const TensorSpec& t) { return TensorSpec{t.shape, *o.master_dtype}; }));
    state_rules.emplace_back("master", RuleTree(rules));
  }
  if (o.optimizer != OptimizerKind::kSgd) {
    for (const char* key : {"mu", "nu"}) {
      state_entries.emplace_back(key, moments());
      state_rules.emplace_back(key, RuleTree(rules));
    }
  }
  return {Tree<TensorSpec>::dict(std::move(state_entries)), RuleTree::dict(std::move(state_rules))};
}

/// The step's abstract arguments (parameters, optimizer state, tokens, targets) and how the
/// state and the batch are sharded.
struct StepArguments {
  Tree<TensorSpec> params, state;
  RuleTree param_rule, state_rule;
  TensorSpec tokens, targets;
  PartitionSpec batch_spec;
};

StepArguments step_arguments(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                             const TrainPlanOptions& o, const Layout& layout) {
  const std::int64_t micro = o.batch / o.grad_accum;
  StepArguments a;
  const bool zero1 = o.optimizer_sharding == OptimizerSharding::kZero1;
  a.params = config.parameters(zero1 ? o.param_dtype : o.master_dtype.value_or(o.param_dtype));
  a.param_rule = held_parameter_rule(a.params, mesh, rules, o, layout);
  std::tie(a.state, a.state_rule) = optimizer_state(a.params, rules, o);
  // The sequence over the context axes (in the load-balanced order the ring expects).
  a.batch_spec = o.grad_accum == 1 ? PartitionSpec({layout.batch, layout.context})
                                   : PartitionSpec({AxisNames{}, layout.batch, layout.context});
  // T5 reads the encoder's tokens and then the decoder's from one array; its targets are the
  // decoder's.
  const std::int64_t target_seq = o.target_seq > 0 ? o.target_seq : o.seq;
  const std::int64_t input_seq = !support_of(config).decoder_only ? o.seq + target_seq : o.seq;
  const auto batch_of = [&](std::int64_t len) {
    return TensorSpec{o.grad_accum == 1 ? Shape{o.batch, len} : Shape{o.grad_accum, micro, len},
                      DType::kI32};
  };
  a.tokens = batch_of(input_seq);
  a.targets = batch_of(!support_of(config).decoder_only ? target_seq : o.seq);
  return a;
}

/// The loss and the gradients of micro-batch after micro-batch (the activations of one at a
/// time), the gradients summed, both averaged over the micro-batches.
std::pair<Array, Tree<Array>> accumulated_loss_and_grads(const ModelStep& model,
                                                         const Tree<Array>& p, const Array& x,
                                                         const Array& y, const RulePtr& rules,
                                                         const TrainPlanOptions& o) {
  const std::int64_t micro = o.batch / o.grad_accum;
  const auto piece = [&](const Array& a, std::int64_t k) {
    const std::int64_t len = a.shape()[2];
    return reshape(slice(a, {k, 0, 0}, {k + 1, micro, len}), Shape{micro, len});
  };
  Array loss;
  Tree<Array> grads;
  for (std::int64_t k = 0; k < o.grad_accum; ++k) {
    // With recomputation each micro-batch gathers its weights again: otherwise the first
    // one's gathered copies are used by every later one and the whole model stays gathered.
    ModelStep m = model;
    m.regather = m.remat.has_value() || m.reshard_after_forward;
    auto [l, g_pending] = loss_and_grads(m, p, piece(x, k), piece(y, k));
    // Each micro-batch's gradients are reduced to their shards (as FSDP does), so the sum
    // is held sharded rather than as every device's unreduced full-size partial sums.
    // In the reduce dtype when one is asked for (mixed precision).
    // ZeRO-1 (Megatron's distributed optimizer) accumulates into its whole gradient buffer
    // and reduce-scatters once after the last micro-batch (trace_step's step).
    const Tree<Array> pending =
        o.reduce_dtype ? reduced_in(g_pending, *o.reduce_dtype) : g_pending;
    const Tree<Array> g = o.optimizer_sharding == OptimizerSharding::kZero1
                              ? pending
                              : with_sharding_constraint(pending, RuleTree(rules));
    if (k == 0) {
      loss = l;
      grads = g;
    } else {
      loss = loss + l;
      std::vector<Array> sum_leaves = grads.leaves();
      const std::vector<Array> add = g.leaves();
      for (std::size_t i = 0; i < sum_leaves.size(); ++i) sum_leaves[i] = sum_leaves[i] + add[i];
      grads = grads.unflatten(std::move(sum_leaves));
    }
  }
  const double inv = 1.0 / static_cast<double>(o.grad_accum);
  loss = loss * inv;
  grads = grads.map([&](const Array& g) { return g * inv; });
  return {loss, grads};
}

/// The update one parameter at a time (as optimizers fused per tensor run), so that only one
/// parameter's widened copies and new moments are live beside the state, not every one's.
/// Returns the new parameters and optimizer state (without ZeRO-1's master weights).
std::pair<Tree<Array>, Tree<Array>> update_each_parameter(const Optimizer& optimizer,
                                                          const Tree<Array>& grads,
                                                          const Tree<Array>& p,
                                                          const Tree<Array>& s,
                                                          const TrainPlanOptions& o) {
  const std::vector<Array> g_leaves = grads.leaves(), p_leaves = p.leaves();
  const bool has_moments = s.find("mu") != nullptr;
  const std::vector<Array> mu = has_moments ? s.at("mu").leaves() : std::vector<Array>{};
  const std::vector<Array> nu = has_moments ? s.at("nu").leaves() : std::vector<Array>{};
  std::vector<Array> new_p(p_leaves.size()), new_mu(mu.size()), new_nu(nu.size());
  Array count;
  for (std::size_t i = 0; i < p_leaves.size(); ++i) {
    std::vector<Tree<Array>::DictEntry> entries{{"count", s.at("count")}};
    if (has_moments) {
      entries.emplace_back("mu", Tree<Array>(mu[i]));
      entries.emplace_back("nu", Tree<Array>(nu[i]));
    }
    const auto [np, ns] = optimizer.update(Tree<Array>(astype(g_leaves[i], o.optimizer_dtype)),
                                           Tree<Array>::dict(std::move(entries)),
                                           Tree<Array>(astype(p_leaves[i], o.optimizer_dtype)));
    new_p[i] = astype(np.leaf(), o.master_dtype.value_or(o.param_dtype));
    if (has_moments) {
      new_mu[i] = ns.at("mu").leaf();
      new_nu[i] = ns.at("nu").leaf();
    }
    if (i == 0) count = ns.at("count").leaf();
  }
  std::vector<Tree<Array>::DictEntry> next{{"count", Tree<Array>(count)}};
  if (has_moments) {
    next.emplace_back("mu", s.at("mu").unflatten(std::move(new_mu)));
    next.emplace_back("nu", s.at("nu").unflatten(std::move(new_nu)));
  }
  return {p.unflatten(std::move(new_p)), Tree<Array>::dict(std::move(next))};
}

/// The values live at the peak named for the step: the program names an argument by its
/// position and path ("argument 1 'mu/layers/0/w'").
void name_live_values(const StepArguments& args, MemoryTimeline& timeline) {
  const std::vector<std::string> p_paths = args.params.paths(), s_paths = args.state.paths();
  for (LiveValue& v : timeline.live_at_peak) {
    if (v.input < 0) continue;
    const auto k = static_cast<std::size_t>(v.input);
    // What the program added after the name: " as bf16" for a cast before its gather.
    const std::size_t quote = v.what.rfind('\'');
    const std::string rest = quote == std::string::npos ? "" : v.what.substr(quote + 1);
    std::string what;
    if (k < p_paths.size()) {
      what = "parameter " + p_paths[k];
    } else if (k < p_paths.size() + s_paths.size()) {
      what = "optimizer state " + s_paths[k - p_paths.size()];
    } else if (k == p_paths.size() + s_paths.size()) {
      what = "tokens";
    } else {
      what = "targets";
    }
    v.what = what + (v.resharded ? " resharded" : "") + rest;
  }
}

/// ZeRO-1 read off the program's input shardings: some parameter is taken with fewer data axes
/// than the optimizer state's first per-parameter tree (the master weights or the first moment,
/// after the step count) holds it with.
bool held_replicated_beside_split_state(const Lowered& low, const StepArguments& args,
                                        const Layout& layout, const Mesh& mesh) {
  const std::vector<NamedSharding> in = low.input_shardings();
  const std::size_t n = args.params.num_leaves();
  if (args.state.num_leaves() < n + 1) return false;  // no per-parameter state
  for (std::size_t i = 0; i < n; ++i) {
    // State leaves in flatten order: "count" (a scalar), then the first per-parameter tree.
    if (data_axes_of(in[i].spec(), layout, mesh).size() <
        data_axes_of(in[n + 1 + i].spec(), layout, mesh).size()) {
      return true;
    }
  }
  return false;
}

/// The float8 recipe its float8 products' scales say (ProgramFacts::float8_recipe).
std::string float8_recipe_of(const detail::Graph& g) {
  bool whole = false, rows = false, mixed = false;
  for (const detail::Node& n : g.nodes) {
    if (!n.is(detail::prim::scaled_dot)) continue;
    const bool a_rows = g[n.operands[2]].type.shape.rank() > 0;
    const bool b_rows = g[n.operands[3]].type.shape.rank() > 0;
    whole = whole || !a_rows || !b_rows;
    rows = rows || a_rows || b_rows;
    mixed = mixed || a_rows != b_rows;
  }
  if (mixed) return std::string(name(Float8Scaling::kRowwiseWithGwHp));
  if (rows) return std::string(name(Float8Scaling::kRowwise));
  return whole ? std::string(name(Float8Scaling::kTensorwise)) : std::string();
}

/// The dtype the program all-gathers its arguments in (ProgramFacts::float8_all_gather).
std::string argument_gather_dtype(const detail::Program& program) {
  std::optional<DType> seen;
  for (const detail::Step& st : program.steps()) {
    if (st.kind != detail::Step::Kind::kReshard ||
        !detail::argument_read(program.graph(), st.node).has_value()) {
      continue;
    }
    const bool gathers = std::any_of(st.cost.begin(), st.cost.end(), [](const auto& c) {
      return c.kind == CollectiveKind::kAllGather && c.max_bytes_in() > 0;
    });
    if (!gathers) continue;
    if (detail::f8_format(st.type.dtype) != nullptr) return "float8";
    if (!seen) seen = st.type.dtype;
  }
  return seen ? std::string(name(*seen)) : "none";
}

/// What the lowered step holds (ProgramFacts), from its operations and the tokens' sharding.
ProgramFacts read_facts(const Lowered& low, const StepArguments& args, const Layout& layout,
                        const Mesh& mesh) {
  ProgramFacts f;
  bool ring = false;
  for (const LoweredOp& op : low.ops()) {
    if (op.primitive == "attention") f.fused_attention = true;
    if (op.primitive == "scaled_dot") f.float8 = true;
    if (op.primitive == "adamw_update") f.optimizer_kernel = "fused";
    if (op.primitive == "adamw_foreach") f.optimizer_kernel = "foreach";
    if (op.composite == composite::kRingAttention) {
      ring = true;
      if (op.primitive == "pall_gather") f.context_gathered = true;
    } else if (op.composite == composite::kAllGatherKvAttention) {
      ring = true;
      f.context_kernel = ContextKernel::kAllGatherKv;
    } else if (op.composite == composite::kUlyssesAttention) {
      ring = true;
      f.context_kernel = ContextKernel::kUlysses;
    }
    if (op.composite == composite::kLinearCrossEntropy) f.fused_loss = true;
    // A region [b, t, d]: the model axes its sequence is split over.
    if (!op.annotation.empty() && op.type.shape.rank() == 3 && op.spec.dims().size() > 1) {
      for (const std::string& a : op.spec.dims()[1]) {
        if (has_axis(layout.model, a) && mesh.axis_size(a) > 1 && !has_axis(f.sequence_axes, a)) {
          f.sequence_axes.push_back(a);
        }
      }
    }
  }
  f.zero1 = held_replicated_beside_split_state(low, args, layout, mesh);
  f.loss_dtype = low.output_specs().at("loss").leaf().dtype;
  if (ring) {
    // The tokens' sequence dimension as the program takes them ([b, t] or [k, b, t]).
    const std::vector<NamedSharding> in = low.input_shardings();
    const NamedSharding& tokens = in.at(args.params.num_leaves() + args.state.num_leaves());
    const auto& dims = tokens.spec().dims();
    if (!dims.empty()) {
      for (const std::string& a : dims.back()) {
        if (has_axis(layout.context, a) && mesh.axis_size(a) > 1) f.context_axes.push_back(a);
      }
    }
  }
  if (f.float8) {
    const detail::Program& program = detail::program_of(low);
    f.float8_recipe = float8_recipe_of(program.graph());
    f.float8_all_gather = argument_gather_dtype(program);
  }
  return f;
}

/// The operations the forward and backward passes launch one by one when run eagerly: each
/// kernel step (a view too: eager PyTorch dispatches it as an op) and each collective of a
/// reshard that moves bytes. Constant steps (folded into their readers, never run per step)
/// and the update (a foreach or fused optimizer launches a few kernels for all the parameters,
/// not its elementwise ops one by one per parameter) are not counted.
std::int64_t launched_ops(const detail::Program& program, const MemoryTimeline& timeline) {
  std::size_t end = program.steps().size();
  for (const PhaseStart& p : timeline.phases) {
    if (p.phase == StepPhase::kUpdate) end = std::min(end, p.step);
  }
  std::int64_t n = 0;
  for (std::size_t i = 0; i < end; ++i) {
    const detail::Step& step = program.steps()[i];
    if (step.kind == detail::Step::Kind::kKernel) {
      n += step.constant ? 0 : 1;
      continue;
    }
    for (const CollectiveRecord& c : step.cost) n += c.max_bytes_in() > 0 ? 1 : 0;
  }
  return n;
}

/// The figures and the state's bytes read off the lowered step.
/// `async_tp`: also async TP's pairs over the model axes (tp_overlap_pairs).
TracedStep read_cost(const Lowered& low, const StepArguments& args, DType grad_dtype,
                     const AxisNames* async_tp) {
  TracedStep out;
  const std::vector<NamedSharding> in = low.input_shardings();
  const std::vector<TensorSpec> p_leaves = args.params.leaves(), s_leaves = args.state.leaves();
  out.parameter_bytes = shard_bytes(in, 0, p_leaves);
  out.gradient_bytes = shard_bytes(in, 0, p_leaves, grad_dtype, true);
  out.optimizer_bytes = shard_bytes(in, p_leaves.size(), s_leaves);
  std::map<ByteKey, std::int64_t>& bytes = out.figures.bytes;
  bytes[ByteFigure::kBatch] =
      shard_bytes(in, p_leaves.size() + s_leaves.size(), {args.tokens, args.targets});
  const ProgramCost& cost = low.cost();
  bytes[ByteFigure::kPeak] = *std::max_element(cost.peak_bytes.begin(), cost.peak_bytes.end());
  bytes[ByteFigure::kPeakHeld] = cost.peak_by_kind.inputs;
  bytes[ByteFigure::kPeakGathered] = cost.peak_by_kind.resharded_inputs;
  bytes[ByteFigure::kPeakComputed] = cost.peak_by_kind.computed;
  const detail::ReservedBytes reserved = detail::reserved_bytes(detail::program_of(low));
  bytes[ByteFigure::kReserved] = reserved.segments;
  bytes[ByteFigure::kReservedExpandable] = reserved.expandable;
  for (const auto& [kind, b] : cost.bytes_by_kind) bytes[kind] = b;
  for (const auto& [on, b] : cost.bytes_by_axes) bytes[on] = b;
  bytes[ByteFigure::kMemoryTraffic] = cost.memory_traffic;
  bytes[ByteFigure::kLaunchedOps] = launched_ops(detail::program_of(low), cost.timeline);
  if (async_tp != nullptr) {
    for (const auto& [kind, n] :
         tp_overlap_pairs(detail::program_of(low), cost.timeline, *async_tp)) {
      bytes[kind] = n;
    }
  }
  out.figures.flops[FlopFigure::kBusiest] = *std::max_element(cost.flops.begin(), cost.flops.end());
  out.figures.flops[FlopFigure::kMatmul] =
      *std::max_element(cost.matmul_flops.begin(), cost.matmul_flops.end());
  out.figures.flops[FlopFigure::kAttention] =
      *std::max_element(cost.attention_flops.begin(), cost.attention_flops.end());
  out.figures.flops[FlopFigure::kMatmulFp8] =
      *std::max_element(cost.matmul_fp8_flops.begin(), cost.matmul_fp8_flops.end());
  double total = 0;
  for (double f : cost.flops) total += f;
  out.figures.flops[FlopFigure::kTotal] = total;
  out.timeline = cost.timeline;
  name_live_values(args, out.timeline);
  return out;
}

}  // namespace

std::string sample_name(std::int64_t layers, std::int64_t micro_batches) {
  if (micro_batches == 1) return fmt::format("the {}-layer sample step", layers);
  return fmt::format("the {}-layer x {} micro-batch sample step", layers, micro_batches);
}

namespace {

// How the step is compiled: its arguments' and results' shardings, the donated state.
SjitOptions step_sjit_options(const StepArguments& args, const TrainPlanOptions& o,
                              const std::map<std::string, RuleTree>& annotations) {
  SjitOptions options;
  options.in_shardings = RuleTree::list(
      {args.param_rule, args.state_rule, RuleTree(args.batch_spec), RuleTree(args.batch_spec)});
  options.out_shardings = RuleTree::dict(
      {{"loss", RuleTree(Replicated{})}, {"params", args.param_rule}, {"state", args.state_rule}});
  options.donate_argnums = {0, 1};
  options.batch_argnums = {2, 3};  // tokens and targets: a data-parallel step moves no example
  // Constants (iotas, masks, rotary tables) planned as an accelerator's compiler runs them:
  // folded into the kernels that read them, neither kept between steps nor counted. (Kept up to
  // a bound, they grew with the first layers only, so the figures were not affine in the layer
  // count; kept without one, every micro-batch's and layer's stayed resident.)
  options.kept_constant_bytes = 0;
  options.count_constants = false;
  options.annotation_shardings = annotations;
  options.eager = o.eager;
  options.uneven = o.uneven;
  return options;
}

}  // namespace

TracedStep trace_step(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                      const TrainPlanOptions& o, const Layout& layout,
                      const std::map<std::string, RuleTree>& annotations) {
  const StepArguments args = step_arguments(config, mesh, rules, o, layout);
  const bool zero1 = o.optimizer_sharding == OptimizerSharding::kZero1;
  const Optimizer optimizer = make_optimizer(o.optimizer, o.optimizer_kernel);
  // ZeRO-1 holds param_dtype parameters whole over the data axes: no cast, gather or reshard.
  const DType held = zero1 ? o.param_dtype : o.master_dtype.value_or(o.param_dtype);
  const bool gather_bf16 = o.float8 && effective_float8_gather(o) == Float8Gather::kBf16;
  std::vector<std::map<std::string, PartitionSpec>> in_use =
      o.tp_plan == TpPlan::kModules ? layer_in_use(config, mesh, rules, args.params, layout)
                                    : std::vector<std::map<std::string, PartitionSpec>>{};
  std::vector<std::map<std::string, PartitionSpec>> gathered =
      gather_bf16 ? layer_gathered(config, mesh, rules, args.params, layout, in_use)
                  : std::vector<std::map<std::string, PartitionSpec>>{};
  const ModelStep base{
      .config = config,
      .layout = layout,
      .remat = effective_remat(o),
      .remat_blocks = o.remat_blocks,
      .fused_attention = o.fused_attention.value_or(true),
      .ring_rotate = o.cp_rotate.value_or(RingRotate::kPermute),
      .context_kernel = o.cp_kernel,
      .fused_loss = o.fused_loss.value_or(true),
      .loss_dtype = o.loss_dtype,
      .compute_dtype = held == o.param_dtype ? std::nullopt : std::optional(o.param_dtype),
      .reduce_in_held = o.reduce_dtype == held,
      .reshard_after_forward = reshards_after_forward(o, layout, config.layers),
      .keep_gathered = keeps_gathered_for_recompute(o, layout, config.layers),
      .float8 = o.float8,
      .float8_options = {.scaling = o.float8_recipe.value_or(Float8Scaling::kTensorwise),
                         .cast_before_pin = !gather_bf16},
      .fsdp_root = fsdp_root_applies(o, layout),
      .keep_last_gathered = keeps_last_gathered(o, layout),
      .root_in_use = fsdp_root_applies(o, layout)
                         ? root_in_use(config, mesh, rules, args.params, layout)
                         : std::map<std::string, PartitionSpec>{},
      .layer_in_use = std::move(in_use),
      .outside_in_use = o.tp_plan == TpPlan::kModules
                            ? outside_in_use(config, mesh, rules, args.params, layout)
                            : std::map<std::string, PartitionSpec>{},
      .layer_gathered = std::move(gathered)};
  const auto step = [&](const Tree<Array>& p, const Tree<Array>& s, const Array& x,
                        const Array& y) {
    // Mixed precision: the model casts the held weights where it uses them (ModelStep::
    // compute_dtype); the gradients reduced in the reduce dtype.
    auto [loss, grads] = o.grad_accum == 1 ? loss_and_grads(base, p, x, y)
                                           : accumulated_loss_and_grads(base, p, x, y, rules, o);
    if (zero1) {
      // The gradients reduce-scattered to the master weights' shards (the rules').
      grads = with_sharding_constraint(o.reduce_dtype ? reduced_in(grads, *o.reduce_dtype) : grads,
                                       RuleTree(rules));
    } else if (o.grad_accum == 1 && o.reduce_dtype) {
      grads = with_sharding_constraint(reduced_in(grads, *o.reduce_dtype), RuleTree(rules));
    }
    grads = cast(grads, o.grad_dtype);
    begin_phase(StepPhase::kUpdate);
    if (!zero1) {
      auto [new_params, new_state] = update_each_parameter(optimizer, grads, p, s, o);
      return Tree<Array>::dict({{"loss", Tree<Array>(loss)},
                                {"params", std::move(new_params)},
                                {"state", std::move(new_state)}});
    }
    // ZeRO-1: the update on each device's shard of the master weights (the parameters' own
    // shard when they are the master: a slice, no transfer); the new parameters cast to
    // param_dtype there and all-gathered over the data axes (out_shardings: param_rule).
    const Tree<Array>* master = s.find("master");
    const Tree<Array> weights =
        master != nullptr ? *master : with_sharding_constraint(p, RuleTree(rules));
    auto [new_weights, new_state] = update_each_parameter(optimizer, grads, weights, s, o);
    Tree<Array> new_params = cast(new_weights, o.param_dtype);
    if (master != nullptr) {
      std::vector<Tree<Array>::DictEntry> next{{"master", std::move(new_weights)}};
      for (const char* key : {"count", "mu", "nu"}) {
        if (const Tree<Array>* t = new_state.find(key)) next.emplace_back(key, *t);
      }
      new_state = Tree<Array>::dict(std::move(next));
    }
    return Tree<Array>::dict({{"loss", Tree<Array>(loss)},
                              {"params", std::move(new_params)},
                              {"state", std::move(new_state)}});
  };
  const Lowered low = sjit(mesh, step, step_sjit_options(args, o, annotations))
                          .lower(args.params, args.state, args.tokens, args.targets);
  TracedStep out = read_cost(low, args, o.grad_dtype, o.async_tp ? &layout.model : nullptr);
  out.facts = read_facts(low, args, layout, mesh);
  out.facts.tp_modules = pins_some_layer(base.layer_in_use);
  return out;
}

}  // namespace shardplan::train
