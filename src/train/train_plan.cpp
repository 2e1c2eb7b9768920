// plan_training: the family's training step traced on abstract arguments (step_trace.cpp),
// whole or as a few small steps extrapolated from (step_scaling.cpp), and the plan's text and
// JSON.
#include "shardplan/train_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <variant>

#include "model_family.hpp"
#include "model_step.hpp"
#include "resolve_options.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "stack_remat.hpp"
#include "step_scaling.hpp"
#include "step_time.hpp"
#include "step_trace.hpp"

namespace shardplan {
namespace {

/// The role of mesh axis `axis`: as the rule file declares it (axis_roles:), else by its name.
AxisRole role_of(const TrainPlanOptions& o, std::string_view axis) {
  return o.activations ? o.activations->axis_role(axis) : default_axis_role(axis);
}

// Cost bounds (docs/training.md, "Sizing a training run"). The largest layer or micro-batch
// count traced as a sample; counts up to it are traced as they are.
constexpr std::int64_t kLargestSample = 8;
// The most layer units one plan traces: about 1 GB and some seconds (docs/performance.md).
constexpr std::int64_t kMaxTraceUnits = 512;
// A Mixtral layer counts one unit more per this many experts.
constexpr std::int64_t kExpertsPerUnit = 4;
// The most parameter tensors (leaves of the parameter tree) a model may have.
constexpr std::int64_t kMaxParameterTensors = std::int64_t{1} << 20;

}  // namespace

namespace {

/// The batch axes (the options', else every axis not named as a model axis) and the model
/// axes; throws when an axis is not the mesh's or the batch does not split over them.
train::Layout make_layout(const Mesh& mesh, const TrainPlanOptions& o,
                          std::vector<std::string>& batch_axes) {
  train::Layout layout;
  batch_axes = o.batch_axes;
  if (batch_axes.empty()) {
    for (const std::string& a : mesh.axis_names()) {
      const AxisRole role = role_of(o, a);
      if (role == AxisRole::kBatch || role == AxisRole::kExpert) batch_axes.push_back(a);
    }
  }
  for (const std::string& a : batch_axes) {
    mesh.axis_index(a);  // throws naming the axis and the mesh's axes
    layout.batch.push_back(a);
    layout.batch_ways *= mesh.axis_size(a);
  }
  if (o.activations) {  // a role declared for an axis the mesh lacks would apply to nothing
    for (const auto& [a, role] : o.activations->axis_roles) {
      if (!mesh.has_axis(a)) {
        throw SpecError(fmt::format("[train] axis_roles in {} names the axis '{}', which the mesh "
                                    "{} does not have",
                                    detail::printable(o.activations->source), detail::printable(a),
                                    detail::printable(mesh.to_string())));
      }
    }
  }
  for (const std::string& a : mesh.axis_names()) {
    if (std::find(batch_axes.begin(), batch_axes.end(), a) != batch_axes.end()) continue;
    if (role_of(o, a) == AxisRole::kPipeline) {
      throw SpecError(fmt::format(
          "[train] the mesh axis '{}' is a pipeline axis (axis_roles in {}): pipeline "
          "parallelism is not planned; give it the role batch or model",
          detail::printable(a), detail::printable(o.activations->source)));
    }
    if (role_of(o, a) == AxisRole::kContext) {
      if (!layout.context.empty()) {
        train::refuse(train::Refusal::kContextAxes,
                      fmt::format("context parallelism runs over one axis; the mesh {} has two "
                                  "({} and {})",
                                  detail::printable(mesh.to_string()),
                                  detail::printable(layout.context[0]), detail::printable(a)));
      }
      layout.context.push_back(a);
      layout.context_ways *= mesh.axis_size(a);
      layout.mesh = mesh;
      continue;
    }
    layout.model.push_back(a);
    layout.model_ways *= mesh.axis_size(a);
    layout.mesh = mesh;  // the vocabulary-parallel embedding's shard_map (ModelStep::lookup)
  }
  if (!layout.context.empty() && o.seq % (2 * layout.context_ways) != 0) {
    throw SpecError(fmt::format(
        "[train] a sequence of {} tokens does not split into 2 x {} chunks over the context axis "
        "'{}' (ring attention's load-balanced order)",
        o.seq, layout.context_ways, layout.context[0]));
  }
  const std::int64_t micro = o.batch / o.grad_accum;
  if (o.batch % o.grad_accum != 0 || micro % layout.batch_ways != 0) {
    throw SpecError(fmt::format(
        "[train] a batch of {} sequences does not split into {} micro-batch{} over the batch "
        "axes [{}] of {} devices (each micro-batch must be a multiple of {})",
        o.batch, o.grad_accum, o.grad_accum == 1 ? "" : "es", fmt::join(batch_axes, ", "),
        layout.batch_ways, layout.batch_ways));
  }
  return layout;
}

/// What to trace. What the step costs to trace is counted in layer units: one layer of one
/// micro-batch is one unit (the embedding and the head with its loss one more per
/// micro-batch), a Mixtral layer one more per kExpertsPerUnit experts (each expert's products
/// are traced). Many layers or micro-batches are not traced: the step's figures are affine in
/// each count (docs/training.md, "Sizing a training run"), so a few small counts are traced and
/// the figures extrapolated.
struct TraceChoice {
  std::int64_t layers = 0, accum = 0;  // the step's (T5: encoder and decoder layers)
  /// The layers as `offset` + `periods` runs of `period` layers, each run checkpointed alike
  /// (--remat-blocks: train::checkpoint_period; 1 and 0 when every layer is alike). A point's
  /// layer count is in runs: extrapolated along them, a sample never cuts a run.
  std::int64_t period = 1, offset = 0, periods = 0;
  std::int64_t layers_in(std::int64_t runs) const { return offset + runs * period; }
  bool by_layers = false, by_accum = false;
  std::vector<std::pair<std::int64_t, std::int64_t>> points;  // (runs, micro-batches) traced
  bool full = true;       // the whole step is traced (no extrapolation)
  double full_units = 0;  // of the whole step
  /// The error for a step too large to trace: `what` is traced, `units` of it.
  std::function<SpecError(const std::string& what, double units)> too_large;
};

TraceChoice choose_trace(const ModelConfig& config, const TrainPlanOptions& o) {
  TraceChoice c;
  const bool whole = config.family->encoder_decoder;
  c.layers = whole ? config.layers + config.decoder_layers : config.layers;
  c.accum = o.grad_accum;
  const double layer_units =
      config.experts > 0
          ? 1 + static_cast<double>(config.experts) / static_cast<double>(kExpertsPerUnit)
          : 1.0;
  const auto units = [=](std::int64_t l, std::int64_t k) {
    return static_cast<double>(k) * (static_cast<double>(l) * layer_units + 1);
  };
  // Layers alike: the samples' layers are the model's first ones, so a model whose layers
  // differ (Qwen2's sliding window from max_window_layers on, Gemma 2's on every other layer) is
  // traced whole. A window the sequence fits in is no window (the step's mask is causal then).
  const auto window = [&](std::size_t i) {
    const std::int64_t w = config.window(i);
    return w > 0 && w < o.seq ? w : 0;
  };
  bool layers_alike = true;
  for (std::size_t i = 1; i < static_cast<std::size_t>(std::max<std::int64_t>(c.layers, 0)); ++i) {
    if (window(i) != window(0)) layers_alike = false;
  }
  if (!whole) c.period = train::checkpoint_period(o, c.layers);
  c.offset = c.layers % c.period;
  c.periods = c.layers / c.period;
  c.by_layers = !whole && layers_alike && c.periods > kLargestSample;
  c.by_accum = c.accum > kLargestSample;
  if (c.by_layers && c.by_accum) {
    // The corners the function is fitted on, then checks along each count and across.
    c.points = {{2, 2}, {3, 2}, {2, 3}, {3, 3}, {4, 2}, {kLargestSample, 2}, {2, 4},
                {2, kLargestSample}, {4, 4},
                // Past the smallest counts, should the steps of 2 peak elsewhere (extrapolate).
                {4, 3}, {3, 4}, {kLargestSample, 3}, {3, kLargestSample}};
  } else if (c.by_layers) {
    for (const std::int64_t l : {std::int64_t{2}, std::int64_t{3}, std::int64_t{4}, kLargestSample})
      c.points.emplace_back(l, c.accum);
  } else if (c.by_accum) {
    for (const std::int64_t k : {std::int64_t{2}, std::int64_t{3}, std::int64_t{4}, kLargestSample})
      c.points.emplace_back(c.periods, k);
  }
  double sample_units = 0;
  for (const auto& [l, k] : c.points) sample_units += units(c.layers_in(l), k);
  c.full_units = units(c.layers, c.accum);
  c.full = c.points.empty() || c.full_units <= sample_units || !o.extrapolate;
  const bool experts = config.experts > 0;
  const std::string title(config.family->title);
  c.too_large = [=](const std::string& what, double u) {
    return SpecError(fmt::format(
        "[train] the step is too large to plan: {} make {:.0f} layer units to trace, over the "
        "limit of {} (a layer of one micro-batch is one unit{}); use fewer {}",
        what, u, kMaxTraceUnits,
        experts ? fmt::format(", a {} layer 1 + experts / {}", title, kExpertsPerUnit) : "",
        experts ? "experts or layers"
        : whole ? fmt::format("layers or micro-batches ({} is traced whole)", title)
                : "layers or micro-batches"));
  };
  const auto steps = [](std::int64_t l, std::int64_t k) {
    return fmt::format("{} layers x {} micro-batch{}", l, k, k == 1 ? "" : "es");
  };
  if (c.full && c.full_units > kMaxTraceUnits)
    throw c.too_large(steps(c.layers, c.accum), c.full_units);
  if (!c.full && sample_units > kMaxTraceUnits) {
    throw c.too_large(fmt::format("the {} small steps traced to extrapolate from", c.points.size()),
                      sample_units);
  }
  return c;
}

/// Refuses a parameter tree of more than kMaxParameterTensors tensors before it is built whole
/// (its shardings give the state's bytes). (T5's layers are bounded by the trace's limit.)
void check_parameter_tensors(const ModelConfig& config, const TrainPlanOptions& o,
                             std::int64_t layers) {
  const auto leaves_with = [&](std::int64_t l) {
    ModelConfig c = config;
    c.layers = l;
    return static_cast<double>(c.parameters(o.param_dtype).leaves().size());
  };
  const double tensors =
      config.family->encoder_decoder
          ? 0
          : leaves_with(1) + (leaves_with(2) - leaves_with(1)) * static_cast<double>(layers - 1);
  if (tensors > static_cast<double>(kMaxParameterTensors)) {
    throw SpecError(fmt::format(
        "[train] the model has {:.0f} parameter tensors ({} layers), over the limit of {}", tensors,
        config.layers, kMaxParameterTensors));
  }
}

/// The layers' activation layout with the annotations' shardings, and whether the sequence is
/// split (sequence parallelism).
struct Activations {
  train::Layout layout;
  std::map<std::string, RuleTree> annotations;
};

/// The named activations of `o.activations` on `mesh`: activation_batch bound to the batch
/// axes, activation_norm_length to nothing when sequence parallelism is off (`o` resolved:
/// resolve_options). Throws SpecError when the file lacks a name the layers use.
Activations activations_of(const ModelConfig& config, const Mesh& mesh, const TrainPlanOptions& o,
                           train::Layout layout) {
  Activations a;
  const RuleFile* file =
      o.activations && !o.activations->activations.empty() ? &*o.activations : nullptr;
  const std::string source = o.activations ? o.activations->source : std::string("none");
  RuleFile::LogicalMapping bind{{"activation_batch", layout.batch}};
  if (file != nullptr && train::support_of(config).annotated_regions) {
    for (const char* name : train::kActivationNames) {
      const auto given = [&](const RuleFile::Activation& x) { return x.name == name; };
      if (std::none_of(file->activations.begin(), file->activations.end(), given)) {
        throw SpecError(
            fmt::format("[train] the activations of {} give no '{}'; the layers annotate {}",
                        detail::printable(source), name, fmt::join(train::kActivationNames, ", ")));
      }
    }
    const bool on = o.sequence_parallel.value_or(false);
    if (!on) bind.emplace_back("activation_norm_length", std::nullopt);
    a.annotations = file->activation_shardings(mesh, bind);
    layout.annotate = true;
    layout.sequence_parallel = on;
  }
  a.layout = std::move(layout);
  return a;
}

/// The step's figures: extrapolated from the chosen small steps when they lie on the fitted
/// function, else from the whole step traced (`traced` then set). `what_traced` says which;
/// `timeline` is the whole step's, or the largest sample's.
train::StepFigures trace_figures(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                                 const TrainPlanOptions& o, const Activations& act,
                                 const TraceChoice& c, std::optional<train::TracedStep>& traced,
                                 std::string& what_traced, StepTimeline& timeline,
                                 train::ProgramFacts& facts) {
  const train::Layout& layout = act.layout;
  if (!c.full) {
    std::vector<train::StepSample> samples;
    std::int64_t largest = 0;
    for (const auto& [l, k] : c.points) {
      ModelConfig sc = config;
      sc.layers = c.layers_in(l);
      TrainPlanOptions so = o;
      so.grad_accum = static_cast<int>(k);
      so.batch = o.batch / o.grad_accum * k;
      train::TracedStep t = train::trace_step(sc, mesh, rules, so, layout, act.annotations);
      if (sc.layers * k > largest) {
        largest = sc.layers * k;
        timeline = {train::sample_name(sc.layers, k), std::move(t.timeline)};
        facts = t.facts;
      }
      samples.push_back({l, k, std::move(t.figures)});
    }
    // The caching allocator model's figures are not affine in the layers (its fragmentation
    // repeats every few layers): computed on the whole step, traced for them alone when asked
    // (TrainPlanOptions::reserved_whole), else not given (docs/training.md, "Reserved bytes").
    const train::ByteKey reserved[] = {train::ByteFigure::kReserved,
                                       train::ByteFigure::kReservedExpandable};
    for (train::StepSample& s : samples) {
      for (const train::ByteKey& k : reserved) s.figures.bytes.erase(k);
    }
    if (auto figures = train::extrapolate(samples, c.periods, c.accum)) {
      std::optional<train::TracedStep> whole;
      if (o.reserved_whole && c.full_units <= kMaxTraceUnits) {
        whole = train::trace_step(config, mesh, rules, o, layout, act.annotations);
      }
      for (const train::ByteKey& k : reserved) {
        figures->bytes[k] = whole ? whole->figures.bytes.at(k) : 0;
      }
      std::vector<std::string> steps;
      for (const auto& [l, k] : c.points) {
        steps.push_back(c.by_layers && c.by_accum
                            ? fmt::format("{}x{}", c.layers_in(l), k)
                            : fmt::format("{}", c.by_layers ? c.layers_in(l) : k));
      }
      what_traced = fmt::format("steps of {} {}", fmt::join(steps, ", "),
                                c.by_layers && c.by_accum ? "layers x micro-batches"
                                : c.by_layers             ? "layers"
                                                          : "micro-batches");
      return *figures;
    }
    if (c.full_units > kMaxTraceUnits) {
      throw c.too_large(fmt::format("its figures do not grow linearly with the layers and "
                                    "micro-batches of small steps, so it must be traced whole: {} "
                                    "layers x {} micro-batch{}",
                                    c.layers, c.accum, c.accum == 1 ? "" : "es"),
                        c.full_units);
    }
  }
  what_traced = "the whole step";
  traced = train::trace_step(config, mesh, rules, o, layout, act.annotations);
  timeline = {what_traced, traced->timeline};
  facts = traced->facts;
  return traced->figures;
}

/// The bytes a device holds of the parameters, gradients and optimizer state, from the whole
/// tree's shardings, resolved as sjit resolves them (for a step not traced whole).
void state_bytes_from_rules(const Mesh& mesh, const RulePtr& rules, const TrainPlanOptions& o,
                            const train::Layout& layout, const Tree<TensorSpec>& params,
                            TrainPlan& plan) {
  const MeshShardingHelper helper(mesh, o.uneven);
  const ShardingAssignment a = helper.resolve(RuleTree(rules), params);
  // The parameters and their gradients as the step takes them (ZeRO-1: whole over the data
  // axes, in param_dtype, the master weights with the state).
  const bool zero1 = o.optimizer_sharding == OptimizerSharding::kZero1;
  const ShardingAssignment held =
      helper.resolve(train::held_parameter_rule(params, mesh, rules, o, layout), params);
  const DType held_dtype = zero1 ? o.param_dtype : o.master_dtype.value_or(o.param_dtype);
  const std::vector<TensorSpec> p_leaves = params.leaves();
  std::int64_t moments = 0, master = 0;
  for (std::size_t i = 0; i < p_leaves.size(); ++i) {
    const MaybeSharding s = a.sharding_of(i), h = held.sharding_of(i);
    const Shape shard = s ? s->shard_shape(p_leaves[i].shape) : p_leaves[i].shape;
    const Shape held_shard = h ? h->shard_shape(p_leaves[i].shape) : p_leaves[i].shape;
    if (!detail::checked_add(plan.parameter_bytes, byte_size(held_shard, held_dtype),
                             &plan.parameter_bytes) ||
        !detail::checked_add(plan.gradient_bytes, byte_size(held_shard, o.grad_dtype),
                             &plan.gradient_bytes) ||
        !detail::checked_add(moments, byte_size(shard, o.optimizer_dtype), &moments) ||
        (zero1 && o.master_dtype &&
         !detail::checked_add(master, byte_size(shard, *o.master_dtype), &master))) {
      throw SpecError("[train] the bytes one device holds overflow int64");
    }
  }
  plan.optimizer_bytes = byte_size(Shape{}, DType::kF32) + master;  // the step count
  if (o.optimizer != OptimizerKind::kSgd &&
      (!detail::checked_mul(moments, 2, &moments) ||
       !detail::checked_add(plan.optimizer_bytes, moments, &plan.optimizer_bytes))) {
    throw SpecError("[train] the bytes one device holds overflow int64");
  }
}

/// The plan's description of the model and the step (what was asked, not what it costs).
void describe_step(const ModelConfig& config, const Mesh& mesh, const TrainPlanOptions& o,
                   const Tree<TensorSpec>& params, const std::vector<std::string>& batch_axes,
                   TrainPlan& plan) {
  std::int64_t parameter_count = 0;  // from the tree already built, not a second one
  for (const TensorSpec& t : params.leaves()) {
    if (!detail::checked_add(parameter_count, t.shape.numel(), &parameter_count)) {
      throw SpecError("[train] the parameter count overflows int64");
    }
  }
  const auto count = static_cast<double>(parameter_count);
  plan.model = fmt::format(
      "{} ({}), {} parameters", config.family_name(), config.model_type,
      count >= 1e9 ? fmt::format("{:.3g}B", count / 1e9) : fmt::format("{:.3g}M", count / 1e6));
  plan.mesh = mesh.to_string();
  plan.devices = mesh.size();
  plan.parameter_count = parameter_count;
  plan.batch_axes = batch_axes;
  plan.batch = o.batch;
  plan.seq = o.seq;
  if (!train::support_of(config).decoder_only) plan.target_seq = o.target_seq > 0 ? o.target_seq : o.seq;
  plan.grad_accum = o.grad_accum;
  plan.recompute = train::effective_remat(o).has_value();
  plan.remat = remat_name(train::effective_remat(o));
  plan.remat_blocks = remat_blocks_name(o.remat_blocks);
  const std::vector<bool> checkpointed = train::checkpointed_layers(o, config.layers);
  plan.remat_layers = std::count(checkpointed.begin(), checkpointed.end(), true);
  plan.eager = o.eager;
  plan.optimizer = std::string(name(o.optimizer));
  plan.param_dtype = o.param_dtype;
  plan.master_dtype = o.master_dtype.value_or(o.param_dtype);
  plan.reduce_dtype = o.reduce_dtype.value_or(o.param_dtype);
  plan.grad_dtype = o.grad_dtype;
  plan.optimizer_dtype = o.optimizer_dtype;
}

/// The figures' part of the plan: the peak and its split, the batch, FLOPs, bytes moved.
void read_figures(const train::StepFigures& figures, TrainPlan& plan) {
  using train::ByteFigure;
  const std::map<train::ByteKey, std::int64_t>& bytes = figures.bytes;
  plan.batch_bytes = bytes.at(ByteFigure::kBatch);
  plan.peak_bytes = bytes.at(ByteFigure::kPeak);
  plan.transient_bytes =
      plan.peak_bytes - plan.parameter_bytes - plan.optimizer_bytes - plan.batch_bytes;
  plan.peak_held_bytes = bytes.at(ByteFigure::kPeakHeld);
  plan.peak_gathered_bytes = bytes.at(ByteFigure::kPeakGathered);
  plan.peak_computed_bytes = bytes.at(ByteFigure::kPeakComputed);
  plan.reserved_bytes = bytes.at(ByteFigure::kReserved);
  plan.reserved_bytes_expandable = bytes.at(ByteFigure::kReservedExpandable);
  plan.flops = figures.flops.at(train::FlopFigure::kBusiest);
  plan.total_flops = figures.flops.at(train::FlopFigure::kTotal);
  plan.matmul_flops = figures.flops.at(train::FlopFigure::kMatmul);
  plan.attention_flops = figures.flops.at(train::FlopFigure::kAttention);
  plan.matmul_fp8_flops = figures.flops.at(train::FlopFigure::kMatmulFp8);
  plan.memory_traffic = bytes.at(ByteFigure::kMemoryTraffic);
  plan.launched_ops = bytes.at(ByteFigure::kLaunchedOps);
  for (const auto& [key, b] : bytes) {
    if (const auto* kind = std::get_if<CollectiveKind>(&key)) plan.bytes_by_collective[*kind] = b;
    if (const auto* on = std::get_if<CollectiveOn>(&key)) plan.bytes_by_axes[*on] = b;
    if (const auto* kind = std::get_if<TpOverlapKind>(&key)) {
      plan.tp_overlaps.push_back(TpOverlap{*kind, b});
    }
  }
}

// Megatron's DDP buckets, for a time model that runs them (--dp-overlap buckets, grad-buckets).
void add_dp_buckets(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                    const TrainPlanOptions& o, const train::Layout& layout,
                    train::TimeInputs& in) {
  if (in.dp_overlap != DpOverlap::kBuckets && in.dp_overlap != DpOverlap::kGradBuckets) return;
  in.dp_bucket_size = train::dp_bucket_size(o, layout);
  in.dp_bucket_elements = train::dp_buckets(config, mesh, rules, o, layout, in.dp_bucket_size);
}

}  // namespace

TrainPlan plan_training(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                        const TrainPlanOptions& asked) {
  const auto start = std::chrono::steady_clock::now();
  train::check_options(config, asked);
  std::vector<std::string> batch_axes;
  const train::Layout layout = make_layout(mesh, asked, batch_axes);
  // From here on the options as the step runs them (each applies, or was refused).
  const TrainPlanOptions o = train::resolve_options(config, mesh, layout, asked);
  train::check_optimizer_sharding(config, mesh, rules, o, layout);
  train::check_tp_plan(config, mesh, rules, o, layout);
  train::check_dp_overlap(config, mesh, rules, o, layout);
  const Activations act = activations_of(config, mesh, o, layout);
  const TraceChoice choice = choose_trace(config, o);
  check_parameter_tensors(config, o, choice.layers);

  std::optional<train::TracedStep> traced;
  std::string what_traced;
  StepTimeline timeline;
  train::ProgramFacts facts;
  const train::StepFigures figures =
      trace_figures(config, mesh, rules, o, act, choice, traced, what_traced, timeline, facts);
  const Tree<TensorSpec> params = config.parameters(o.param_dtype);
  TrainPlan plan;
  describe_step(config, mesh, o, params, batch_axes, plan);
  plan.fsdp_root = train::fsdp_root_applies(o, act.layout);
  plan.last_block_kept_gathered = train::keeps_last_gathered(o, act.layout);
  // The last block may keep its gathered weights (ModelStep::forward_loss): then the layers
  // resharded after forward, or kept for their recomputation, are the others. A step traced
  // whole (T5) has no layer a unit.
  const std::int64_t others = config.layers - (plan.last_block_kept_gathered ? 1 : 0);
  const bool units = others > 0 && !config.family->step.whole;
  plan.reshard_after_forward = units && train::reshards_after_forward(o, act.layout, others);
  plan.kept_gathered_for_recompute =
      units && train::keeps_gathered_for_recompute(o, act.layout, others);
  if (traced) {
    plan.parameter_bytes = traced->parameter_bytes;
    plan.gradient_bytes = traced->gradient_bytes;
    plan.optimizer_bytes = traced->optimizer_bytes;
  } else {
    state_bytes_from_rules(mesh, rules, o, act.layout, params, plan);
  }
  read_figures(figures, plan);
  plan.device_memory =
      o.device_memory == 0 && o.hardware ? o.hardware->memory_bytes : o.device_memory;
  // MFU's model FLOPs count the parameters a token runs through (a mixture of experts: its k
  // routed experts, not all of them).
  plan.active_parameter_count = config.active_parameter_count();
  if (o.hardware) {
    train::TimeInputs in{
        .model_axes = layout.model,
        .context_axes = layout.context,
        .layer_steps = choice.layers * choice.accum,
        .model_flops_per_token =
            train::model_flops_per_token(config, plan.active_parameter_count, o.seq),
        .tokens_per_step = o.batch * o.seq,
        .dp_overlap = o.dp_overlap.value_or(DpOverlap::kFsdp),
        .micro_batches = choice.accum,
        .zero1 = o.optimizer_sharding == OptimizerSharding::kZero1,
        // Eager tensor parallelism: every op of the blocks dispatched through DTensor.
        .dispatch_seconds_per_op =
            o.eager && layout.model_ways > 1 ? train::kDTensorDispatch.seconds : 0.0};
    add_dp_buckets(config, mesh, rules, o, layout, in);
    plan.time = train::step_time(plan, mesh, *o.hardware, in);
  }
  plan.headroom = o.headroom;
  plan.not_modelled = config.not_modelled;
  plan.stack = o.stack;
  plan.extrapolated = !traced;
  plan.traced = what_traced;
  plan.timeline = std::move(timeline);
  // What the program ran, read from it (never the options).
  plan.fused_attention = facts.fused_attention;
  plan.fused_loss = facts.fused_loss;
  plan.loss_dtype = facts.loss_dtype;
  plan.optimizer_kernel = facts.optimizer_kernel;
  plan.optimizer_sharding = facts.zero1 ? "zero1" : "rules";
  plan.float8 = facts.float8;
  plan.float8_recipe = facts.float8_recipe;
  plan.float8_all_gather = facts.float8_all_gather;
  plan.tp_modules = facts.tp_modules;
  plan.sequence_parallel = !facts.sequence_axes.empty();
  plan.sequence_axes = facts.sequence_axes;
  plan.context_axes = facts.context_axes;
  plan.context_gathered = facts.context_gathered;
  plan.context_kernel = facts.context_kernel;
  plan.seconds_to_plan =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

}  // namespace shardplan
