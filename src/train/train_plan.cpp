// plan_training: the family's training step traced on abstract arguments, lowered for a mesh,
// and its per-device cost read off the compiled program.
#include "shardplan/train_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "model_step.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/sjit.hpp"
#include "step_scaling.hpp"

namespace shardplan {
namespace {

/// Mesh axes that are tensor (model) parallel by name: the batch is not split over them.
bool is_model_axis(std::string_view name) {
  return name == "tp" || name == "model" || name == "mp" || name == "tensor";
}

Optimizer make_optimizer(OptimizerKind kind) {
  // The rates do not change the program's shape or cost; any value would do.
  switch (kind) {
    case OptimizerKind::kSgd:
      return Optimizer::sgd(1e-3);
    case OptimizerKind::kAdam:
      return Optimizer::adam(1e-3);
    case OptimizerKind::kAdamw:
      break;
  }
  return Optimizer::adamw(constant_schedule(1e-3), 0.1);
}

Tree<Array> cast(const Tree<Array>& t, DType dtype) {
  return t.map([&](const Array& a) { return a.dtype() == dtype ? a : astype(a, dtype); });
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

std::string flops_text(double f) {
  if (f <= 0) return "0";
  return fmt::format("{:.3g}", f);
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

/// The prefix of a collective kind's bytes among a traced step's figures.
constexpr std::string_view kCollective = "collective ";

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
  if (o.optimizer != OptimizerKind::kSgd) {
    for (const char* key : {"mu", "nu"}) {
      state_entries.emplace_back(key, moments());
      state_rules.emplace_back(key, RuleTree(rules));
    }
  }
  return {Tree<TensorSpec>::dict(std::move(state_entries)), RuleTree::dict(std::move(state_rules))};
}

/// What one trace of the step gives: the figures that grow with the layers and micro-batches,
/// and the state each device holds (from the traced program's input shardings).
struct TracedStep {
  train::StepFigures figures;
  std::int64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
};

/// Traces the whole step of `config` with `o.grad_accum` micro-batches and lowers it for `mesh`.
TracedStep trace_step(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                      const TrainPlanOptions& o, const train::Layout& layout) {
  const std::int64_t micro = o.batch / o.grad_accum;
  const Tree<TensorSpec> params = config.parameters(o.param_dtype);
  const Optimizer optimizer = make_optimizer(o.optimizer);
  const std::pair<Tree<TensorSpec>, RuleTree> state_and_rule = optimizer_state(params, rules, o);
  const Tree<TensorSpec>& state = state_and_rule.first;
  const RuleTree& state_rule = state_and_rule.second;
  const PartitionSpec batch_spec = o.grad_accum == 1 ? PartitionSpec({layout.batch})
                                                     : PartitionSpec({AxisNames{}, layout.batch});
  // T5 reads the encoder's tokens and then the decoder's from one array; its targets are the
  // decoder's.
  const std::int64_t target_seq = o.target_seq > 0 ? o.target_seq : o.seq;
  const std::int64_t input_seq = config.family == ModelFamily::kT5 ? o.seq + target_seq : o.seq;
  const auto batch_of = [&](std::int64_t len) {
    return TensorSpec{o.grad_accum == 1 ? Shape{o.batch, len} : Shape{o.grad_accum, micro, len},
                      DType::kI32};
  };
  const TensorSpec tokens = batch_of(input_seq);
  const TensorSpec targets = batch_of(config.family == ModelFamily::kT5 ? target_seq : o.seq);

  const train::ModelStep base{config, layout};
  // A parameter copied and held as the parameter is (its rule's sharding): each micro-batch
  // gathers its weights from such copies, so none reuses (and keeps alive) another's gathers.
  // (The copy alone would not do: it would be made from the gathered parameter.)
  std::map<std::string, std::optional<PartitionSpec>> param_specs;
  if (o.recompute && o.grad_accum > 1) {
    const ShardingAssignment a = MeshShardingHelper(mesh).resolve(RuleTree(rules), params);
    const auto paths = params.flatten();
    for (std::size_t i = 0; i < paths.size(); ++i) {
      const MaybeSharding s = a.sharding_of(i);
      param_specs.emplace(paths[i].first, s ? std::optional(s->spec()) : std::nullopt);
    }
  }
  const train::Refresh refresh = [&](const std::string& path, const Array& a) {
    const auto it = param_specs.find(path);
    if (it == param_specs.end()) {
      throw std::logic_error(fmt::format("[train] no sharding for the parameter '{}'", path));
    }
    return it->second ? with_sharding_constraint(a * 1.0, *it->second) : a * 1.0;
  };
  const auto step = [&](const Tree<Array>& p, const Tree<Array>& s, const Array& x,
                        const Array& y) {
    // The rotary tables made once for the whole step, not per layer and micro-batch. Only with
    // recomputation, whose forward pass runs in this trace: an array made inside one
    // value_and_grad (the whole-graph differentiation) is not valid in the next one.
    train::SharedTables shared;
    train::ModelStep model = base;
    if (o.recompute) model.tables = &shared;
    Array loss;
    Tree<Array> grads;
    if (o.grad_accum == 1) {
      std::tie(loss, grads) = train::loss_and_grads(model, p, x, y, o.recompute);
    } else {
      // Micro-batches one after another, gradients summed: the activations of one at a time.
      const auto piece = [&](const Array& a, std::int64_t k) {
        const std::int64_t len = a.shape()[2];
        return reshape(slice(a, {k, 0, 0}, {k + 1, micro, len}), Shape{micro, len});
      };
      for (std::int64_t k = 0; k < o.grad_accum; ++k) {
        // With recomputation each micro-batch gathers its weights again: otherwise the first
        // one's gathered copies are used by every later one and the whole model stays gathered.
        auto [l, g_pending] =
            train::loss_and_grads(model, p, piece(x, k), piece(y, k), o.recompute, &refresh);
        // Each micro-batch's gradients are reduced to their shards (as FSDP does), so the sum
        // is held sharded rather than as every device's unreduced full-size partial sums.
        const Tree<Array> g = with_sharding_constraint(g_pending, RuleTree(rules));
        if (k == 0) {
          loss = l;
          grads = g;
        } else {
          loss = loss + l;
          std::vector<Array> sum_leaves = grads.leaves();
          const std::vector<Array> add = g.leaves();
          for (std::size_t i = 0; i < sum_leaves.size(); ++i)
            sum_leaves[i] = sum_leaves[i] + add[i];
          grads = grads.unflatten(std::move(sum_leaves));
        }
      }
      const double inv = 1.0 / static_cast<double>(o.grad_accum);
      loss = loss * inv;
      grads = grads.map([&](const Array& g) { return g * inv; });
    }
    grads = cast(grads, o.grad_dtype);
    // The update one parameter at a time (as optimizers fused per tensor run), so that only one
    // parameter's widened copies and new moments are live beside the state, not every one's.
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
      new_p[i] = astype(np.leaf(), o.param_dtype);
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
    return Tree<Array>::dict({{"loss", Tree<Array>(loss)},
                              {"params", p.unflatten(std::move(new_p))},
                              {"state", Tree<Array>::dict(std::move(next))}});
  };
  SjitOptions options;
  options.in_shardings =
      RuleTree::list({RuleTree(rules), state_rule, RuleTree(batch_spec), RuleTree(batch_spec)});
  options.out_shardings = RuleTree::dict(
      {{"loss", RuleTree(Replicated{})}, {"params", RuleTree(rules)}, {"state", state_rule}});
  options.donate_argnums = {0, 1};
  const Lowered low = sjit(mesh, step, std::move(options)).lower(params, state, tokens, targets);

  TracedStep out;
  const std::vector<NamedSharding> in = low.input_shardings();
  const std::vector<TensorSpec> p_leaves = params.leaves(), s_leaves = state.leaves();
  out.parameter_bytes = shard_bytes(in, 0, p_leaves);
  out.gradient_bytes = shard_bytes(in, 0, p_leaves, o.grad_dtype, true);
  out.optimizer_bytes = shard_bytes(in, p_leaves.size(), s_leaves);
  std::map<std::string, std::int64_t>& bytes = out.figures.bytes;
  bytes["batch"] = shard_bytes(in, p_leaves.size() + s_leaves.size(), {tokens, targets});
  const ProgramCost& cost = low.cost();
  bytes["peak"] = *std::max_element(cost.peak_bytes.begin(), cost.peak_bytes.end());
  const auto by_kind = [&](const char* kind) {
    const auto it = cost.peak_by_kind.find(kind);
    return it == cost.peak_by_kind.end() ? std::int64_t{0} : it->second;
  };
  bytes["peak held"] = by_kind("inputs");
  bytes["peak gathered"] = by_kind("resharded inputs");
  bytes["peak computed"] = by_kind("computed");
  for (const auto& [kind, b] : cost.bytes_by_kind) bytes[std::string(kCollective) + kind] = b;
  out.figures.flops["flops"] = *std::max_element(cost.flops.begin(), cost.flops.end());
  double total = 0;
  for (double f : cost.flops) total += f;
  out.figures.flops["total"] = total;
  return out;
}

}  // namespace

OptimizerKind parse_optimizer(std::string_view n) {
  if (n == "sgd") return OptimizerKind::kSgd;
  if (n == "adam") return OptimizerKind::kAdam;
  if (n == "adamw") return OptimizerKind::kAdamw;
  throw SpecError(fmt::format("[train] unknown optimizer '{}' (known: sgd, adam, adamw)", n));
}

std::string_view name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamw:
      break;
  }
  return "adamw";
}

std::int64_t parse_bytes(std::string_view text) {
  const auto fail = [&](std::string_view why) -> std::int64_t {
    throw SpecError(fmt::format(
        "[bytes] '{}' {} (write a size like 80GiB, 80GB, 1.5TiB or 1000000)", text, why));
  };
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  const std::string number(text.substr(0, i));
  if (std::count(number.begin(), number.end(), '.') == static_cast<long>(number.size()) ||
      std::count(number.begin(), number.end(), '.') > 1) {  // no digit, or two points
    return fail("is not a size");
  }
  std::string unit(text.substr(i));
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  double scale = 0;
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"", 1},       {"b", 1},        {"kb", 1e3},     {"mb", 1e6},     {"gb", 1e9},
      {"tb", 1e12},  {"kib", 0x1p10}, {"mib", 0x1p20}, {"gib", 0x1p30}, {"tib", 0x1p40},
      {"k", 0x1p10}, {"m", 0x1p20},   {"g", 0x1p30},   {"t", 0x1p40},
  };
  for (const auto& [u, s] : kUnits) {
    if (unit == u) scale = s;
  }
  if (scale == 0) return fail("has an unknown unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  // strtod, not stod: a number too large for a double is +inf (refused below), not an
  // exception.
  const double value = std::strtod(number.c_str(), nullptr) * scale;
  if (!(value >= 1) || value >= 0x1p62) return fail("is out of range (1 byte to 4 EiB)");
  return static_cast<std::int64_t>(std::llround(value));
}

std::int64_t TrainPlan::bytes_moved() const {
  std::int64_t total = 0;
  for (const auto& [kind, bytes] : bytes_by_collective) total += bytes;
  return total;
}

std::int64_t TrainPlan::usable_bytes() const {
  if (device_memory <= 0) return 0;
  return static_cast<std::int64_t>(static_cast<double>(device_memory) * (1 - headroom));
}

std::optional<bool> TrainPlan::fits() const {
  if (device_memory <= 0) return std::nullopt;
  return peak_bytes <= usable_bytes();
}

TrainPlan plan_training(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                        const TrainPlanOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  if (o.batch < 1 || o.seq < 1 || o.grad_accum < 1) {
    throw SpecError(fmt::format(
        "[train] batch {}, sequence length {} and gradient accumulation {} must be positive",
        o.batch, o.seq, o.grad_accum));
  }
  if (o.target_seq < 0) {
    throw SpecError(fmt::format("[train] target sequence length {} is negative", o.target_seq));
  }
  if (config.family == ModelFamily::kT5 && o.recompute) {
    throw SpecError(
        "[train] recomputation is written for decoder-only models (llama, mixtral, gpt2); plan "
        "T5 without --recompute");
  }
  if (!(o.headroom >= 0 && o.headroom < 1)) {  // NaN too
    throw SpecError(fmt::format("[train] headroom {} is not a fraction in [0, 1)", o.headroom));
  }
  if (config.family == ModelFamily::kGpt2 && o.seq > config.positions) {
    throw SpecError(
        fmt::format("[train] sequence length {} is longer than the model's {} learned positions "
                    "(n_positions)",
                    o.seq, config.positions));
  }
  train::Layout layout;
  std::vector<std::string> batch_axes = o.batch_axes;
  if (batch_axes.empty()) {
    for (const std::string& a : mesh.axis_names()) {
      if (!is_model_axis(a)) batch_axes.push_back(a);
    }
  }
  for (const std::string& a : batch_axes) {
    mesh.axis_index(a);  // throws naming the axis and the mesh's axes
    layout.batch.push_back(a);
    layout.batch_ways *= mesh.axis_size(a);
  }
  for (const std::string& a : mesh.axis_names()) {
    if (std::find(batch_axes.begin(), batch_axes.end(), a) != batch_axes.end()) continue;
    layout.model.push_back(a);
    layout.model_ways *= mesh.axis_size(a);
  }
  const std::int64_t micro = o.batch / o.grad_accum;
  if (o.batch % o.grad_accum != 0 || micro % layout.batch_ways != 0) {
    throw SpecError(fmt::format(
        "[train] a batch of {} sequences does not split into {} micro-batch{} over the batch "
        "axes [{}] of {} devices (each micro-batch must be a multiple of {})",
        o.batch, o.grad_accum, o.grad_accum == 1 ? "" : "es", fmt::join(batch_axes, ", "),
        layout.batch_ways, layout.batch_ways));
  }

  // What the step costs to trace, in layer units: one layer of one micro-batch is one unit (the
  // embedding and the head with its loss one more per micro-batch), a Mixtral layer one more per
  // kExpertsPerUnit experts (each expert's products are traced). Many layers or micro-batches
  // are not traced: the step's figures are affine in each count (docs/training.md, "Sizing a
  // training run"), so a few small counts are traced and the figures extrapolated.
  const bool t5 = config.family == ModelFamily::kT5;
  const std::int64_t layers = t5 ? config.layers + config.decoder_layers : config.layers;
  const std::int64_t accum = o.grad_accum;
  const double layer_units =
      config.family == ModelFamily::kMixtral
          ? 1 + static_cast<double>(config.experts) / static_cast<double>(kExpertsPerUnit)
          : 1.0;
  const auto units = [&](std::int64_t l, std::int64_t k) {
    return static_cast<double>(k) * (static_cast<double>(l) * layer_units + 1);
  };
  // Layers alike: the samples' layers are the model's first ones, so a model whose layers
  // differ (Qwen2's sliding window from max_window_layers on) is traced whole.
  bool layers_alike = true;
  for (std::size_t i = 1; i < static_cast<std::size_t>(std::max<std::int64_t>(layers, 0)); ++i) {
    if (config.window(i) != config.window(0)) layers_alike = false;
  }
  const bool by_layers = !t5 && layers_alike && layers > kLargestSample;
  const bool by_accum = accum > kLargestSample;
  std::vector<std::pair<std::int64_t, std::int64_t>> points;  // (layers, micro-batches) traced
  if (by_layers && by_accum) {
    // The corners the function is fitted on, then checks along each count and across.
    points = {
        {2, 2}, {3, 2}, {2, 3}, {3, 3}, {4, 2}, {kLargestSample, 2}, {2, 4}, {2, kLargestSample},
        {4, 4}};
  } else if (by_layers) {
    for (const std::int64_t l : {std::int64_t{2}, std::int64_t{3}, std::int64_t{4}, kLargestSample})
      points.emplace_back(l, accum);
  } else if (by_accum) {
    for (const std::int64_t k : {std::int64_t{2}, std::int64_t{3}, std::int64_t{4}, kLargestSample})
      points.emplace_back(layers, k);
  }
  double sample_units = 0;
  for (const auto& [l, k] : points) sample_units += units(l, k);
  const double full_units = units(layers, accum);
  const bool full = points.empty() || full_units <= sample_units || !o.extrapolate;
  const auto too_large = [&](const std::string& what, double u) {
    return SpecError(fmt::format(
        "[train] the step is too large to plan: {} make {:.0f} layer units to trace, over the "
        "limit of {} (a layer of one micro-batch is one unit{}); use fewer {}",
        what, u, kMaxTraceUnits,
        config.family == ModelFamily::kMixtral
            ? fmt::format(", a Mixtral layer 1 + experts / {}", kExpertsPerUnit)
            : "",
        config.family == ModelFamily::kMixtral ? "experts or layers"
        : t5                                   ? "layers or micro-batches (T5 is traced whole)"
                                               : "layers or micro-batches"));
  };
  if (full && full_units > kMaxTraceUnits) {
    throw too_large(
        fmt::format("{} layers x {} micro-batch{}", layers, accum, accum == 1 ? "" : "es"),
        full_units);
  }
  if (!full && sample_units > kMaxTraceUnits) {
    throw too_large(fmt::format("the {} small steps traced to extrapolate from", points.size()),
                    sample_units);
  }
  // The parameter tree is built whole (its shardings give the state's bytes): bounded too. (T5's
  // layers are bounded by the trace's limit above.)
  const auto leaves_with = [&](std::int64_t l) {
    ModelConfig c = config;
    c.layers = l;
    return static_cast<double>(c.parameters(o.param_dtype).leaves().size());
  };
  const double tensors =
      t5 ? 0 : leaves_with(1) + (leaves_with(2) - leaves_with(1)) * static_cast<double>(layers - 1);
  if (tensors > static_cast<double>(kMaxParameterTensors)) {
    throw SpecError(fmt::format(
        "[train] the model has {:.0f} parameter tensors ({} layers), over the limit of {}", tensors,
        config.layers, kMaxParameterTensors));
  }

  std::optional<train::StepFigures> figures;
  std::optional<TracedStep> traced;
  if (!full) {
    std::vector<train::StepSample> samples;
    for (const auto& [l, k] : points) {
      ModelConfig c = config;
      c.layers = l;
      TrainPlanOptions so = o;
      so.grad_accum = static_cast<int>(k);
      so.batch = micro * k;
      samples.push_back({l, k, trace_step(c, mesh, rules, so, layout).figures});
    }
    figures = train::extrapolate(samples, layers, accum);
    if (!figures && full_units > kMaxTraceUnits) {
      throw too_large(fmt::format("its figures do not grow linearly with the layers and "
                                  "micro-batches of small steps, so it must be traced whole: {} "
                                  "layers x {} micro-batch{}",
                                  layers, accum, accum == 1 ? "" : "es"),
                      full_units);
    }
  }
  std::string what_traced = "the whole step";
  if (figures) {
    std::vector<std::string> steps;
    for (const auto& [l, k] : points) {
      steps.push_back(by_layers && by_accum ? fmt::format("{}x{}", l, k)
                                            : fmt::format("{}", by_layers ? l : k));
    }
    what_traced = fmt::format("steps of {} {}", fmt::join(steps, ", "),
                              by_layers && by_accum ? "layers x micro-batches"
                              : by_layers           ? "layers"
                                                    : "micro-batches");
  } else {
    traced = trace_step(config, mesh, rules, o, layout);
    figures = traced->figures;
  }

  const Tree<TensorSpec> params = config.parameters(o.param_dtype);
  TrainPlan plan;
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
  if (config.family == ModelFamily::kT5) plan.target_seq = o.target_seq > 0 ? o.target_seq : o.seq;
  plan.grad_accum = o.grad_accum;
  plan.recompute = o.recompute;
  plan.optimizer = std::string(name(o.optimizer));
  plan.param_dtype = o.param_dtype;
  plan.grad_dtype = o.grad_dtype;
  plan.optimizer_dtype = o.optimizer_dtype;
  if (traced) {
    plan.parameter_bytes = traced->parameter_bytes;
    plan.gradient_bytes = traced->gradient_bytes;
    plan.optimizer_bytes = traced->optimizer_bytes;
  } else {  // from the whole tree's shardings, resolved as sjit resolves them
    const ShardingAssignment a = MeshShardingHelper(mesh).resolve(RuleTree(rules), params);
    const std::vector<TensorSpec> p_leaves = params.leaves();
    std::int64_t moments = 0;
    for (std::size_t i = 0; i < p_leaves.size(); ++i) {
      const MaybeSharding s = a.sharding_of(i);
      const Shape shard = s ? s->shard_shape(p_leaves[i].shape) : p_leaves[i].shape;
      if (!detail::checked_add(plan.parameter_bytes, byte_size(shard, o.param_dtype),
                               &plan.parameter_bytes) ||
          !detail::checked_add(plan.gradient_bytes, byte_size(shard, o.grad_dtype),
                               &plan.gradient_bytes) ||
          !detail::checked_add(moments, byte_size(shard, o.optimizer_dtype), &moments)) {
        throw SpecError("[train] the bytes one device holds overflow int64");
      }
    }
    plan.optimizer_bytes = byte_size(Shape{}, DType::kF32);  // the step count
    if (o.optimizer != OptimizerKind::kSgd &&
        (!detail::checked_mul(moments, 2, &moments) ||
         !detail::checked_add(plan.optimizer_bytes, moments, &plan.optimizer_bytes))) {
      throw SpecError("[train] the bytes one device holds overflow int64");
    }
  }
  const std::map<std::string, std::int64_t>& bytes = figures->bytes;
  plan.batch_bytes = bytes.at("batch");
  plan.peak_bytes = bytes.at("peak");
  plan.transient_bytes =
      plan.peak_bytes - plan.parameter_bytes - plan.optimizer_bytes - plan.batch_bytes;
  plan.peak_held_bytes = bytes.at("peak held");
  plan.peak_gathered_bytes = bytes.at("peak gathered");
  plan.peak_computed_bytes = bytes.at("peak computed");
  plan.flops = figures->flops.at("flops");
  plan.total_flops = figures->flops.at("total");
  for (const auto& [key, b] : bytes) {
    if (key.starts_with(kCollective)) plan.bytes_by_collective[key.substr(kCollective.size())] = b;
  }
  plan.device_memory = o.device_memory;
  plan.headroom = o.headroom;
  plan.not_modelled = config.not_modelled;
  plan.extrapolated = !traced;
  plan.traced = what_traced;
  plan.seconds_to_plan =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

std::string TrainPlan::table() const {
  std::string out;
  out += fmt::format("{} on {} ({} devices), rules {}{}\n", model, detail::printable(mesh), devices,
                     detail::printable(rules),
                     rules_note.empty() ? "" : fmt::format(" ({})", rules_note));
  if (!not_modelled.empty()) {
    out += fmt::format("not modelled: {}\n", fmt::join(not_modelled, "; "));
  }
  const std::string tokens = target_seq > 0
                                 ? fmt::format("{} encoder + {} decoder", seq, target_seq)
                                 : fmt::format("{}", seq);
  out += fmt::format(
      "step: batch {} x {} tokens over [{}] ({} micro-batch{}), {}, parameters {}, gradients {}, "
      "optimizer state {}, recompute {}\n\n",
      batch, tokens, fmt::join(batch_axes, ", "), grad_accum, grad_accum == 1 ? "" : "es",
      optimizer, name(param_dtype), name(grad_dtype), name(optimizer_dtype),
      recompute ? "on" : "off");
  out += "per device\n";
  const auto row = [&](std::string_view what, std::int64_t bytes) {
    out += fmt::format("  {:<40} {:>12}\n", what, format_bytes(bytes));
  };
  row("parameters", parameter_bytes);
  row("gradients", gradient_bytes);
  row("optimizer state", optimizer_bytes);
  row("batch (tokens, targets)", batch_bytes);
  row("peak", peak_bytes);
  out += "  of which, at the peak\n";
  row("  parameters, state, batch still held", peak_held_bytes);
  row("  parameters gathered for use", peak_gathered_bytes);
  row("  activations, gradients, temporaries", peak_computed_bytes);
  if (const auto f = fits()) {
    out += fmt::format(
        "  {:<40} {:>12}  ({} with {:.0f}% headroom): {}\n", "device memory",
        format_bytes(device_memory), format_bytes(usable_bytes()), headroom * 100,
        *f ? "fits"
           : fmt::format("does NOT fit, {} short", format_bytes(peak_bytes - usable_bytes())));
  }
  out += fmt::format("  {:<40} {:>12}\n", "FLOPs per step", flops_text(flops));
  out += "bytes received per device per step\n";
  if (bytes_moved() == 0) out += "  (nothing)\n";
  for (const auto& [kind, bytes] : bytes_by_collective) {
    if (bytes == 0) continue;  // a kind the program uses without moving data (a local slice)
    out += fmt::format("  {:<40} {:>12}\n", kind, format_bytes(bytes));
  }
  if (bytes_by_collective.size() > 1) {
    out += fmt::format("  {:<40} {:>12}\n", "total", format_bytes(bytes_moved()));
  }
  out += fmt::format("FLOPs per step, all devices: {}; planned in {:.2f} s{}\n",
                     flops_text(total_flops), seconds_to_plan,
                     extrapolated ? fmt::format(", extrapolated from {}", traced) : "");
  return out;
}

namespace {

nlohmann::ordered_json to_json(const TrainPlan& p) {
  nlohmann::ordered_json j;
  if (!p.error.empty()) {
    j["mesh"] = p.mesh;
    j["rules"] = p.rules;
    j["error"] = p.error;
    j["fits"] = nullptr;
    return j;
  }
  j["model"] = p.model;
  j["mesh"] = p.mesh;
  j["devices"] = p.devices;
  j["rules"] = p.rules;
  if (!p.rules_note.empty()) j["rules_note"] = p.rules_note;
  j["not_modelled"] = p.not_modelled;
  j["parameter_count"] = p.parameter_count;
  j["batch"] = p.batch;
  j["seq"] = p.seq;
  if (p.target_seq > 0) j["target_seq"] = p.target_seq;
  j["batch_axes"] = p.batch_axes;
  j["grad_accum"] = p.grad_accum;
  j["recompute"] = p.recompute;
  j["optimizer"] = p.optimizer;
  j["param_dtype"] = std::string(name(p.param_dtype));
  j["grad_dtype"] = std::string(name(p.grad_dtype));
  j["optimizer_dtype"] = std::string(name(p.optimizer_dtype));
  j["per_device"] = {{"parameter_bytes", p.parameter_bytes},
                     {"gradient_bytes", p.gradient_bytes},
                     {"optimizer_bytes", p.optimizer_bytes},
                     {"batch_bytes", p.batch_bytes},
                     {"transient_bytes", p.transient_bytes},
                     {"peak_held_bytes", p.peak_held_bytes},
                     {"peak_gathered_bytes", p.peak_gathered_bytes},
                     {"peak_computed_bytes", p.peak_computed_bytes},
                     {"peak_bytes", p.peak_bytes},
                     {"flops", p.flops}};
  j["bytes_received_per_device"] = p.bytes_by_collective;
  j["bytes_moved_per_device"] = p.bytes_moved();
  j["total_flops"] = p.total_flops;
  if (const auto f = p.fits()) {
    j["device_memory"] = p.device_memory;
    j["headroom"] = p.headroom;
    j["usable_bytes"] = p.usable_bytes();
    j["fits"] = *f;
  } else {
    j["fits"] = nullptr;
  }
  j["seconds_to_plan"] = p.seconds_to_plan;
  j["extrapolated"] = p.extrapolated;
  j["traced"] = p.traced;
  return j;
}

/// Mesh axes and file names come from the user and need not be UTF-8: invalid bytes become
/// U+FFFD rather than an exception from the writer.
std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

void TrainPlan::write_json(std::ostream& os) const { os << dump(to_json(*this)); }

std::optional<std::size_t> cheapest_fitting(const std::vector<TrainPlan>& plans) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    if (!plans[i].error.empty() || plans[i].fits() == false) continue;
    if (!best) {
      best = i;
      continue;
    }
    const TrainPlan& a = plans[i];
    const TrainPlan& b = plans[*best];
    if (a.bytes_moved() < b.bytes_moved() ||
        (a.bytes_moved() == b.bytes_moved() && a.peak_bytes < b.peak_bytes)) {
      best = i;
    }
  }
  return best;
}

std::string compare_table(const std::vector<TrainPlan>& plans) {
  std::string out = fmt::format("{:<3} {:<34} {:<26} {:>12} {:>6} {:>14} {:>10}\n", "#", "mesh",
                                "rules", "peak/device", "fits", "moved/device", "FLOPs/dev");
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const TrainPlan& p = plans[i];
    if (!p.error.empty()) {
      out +=
          fmt::format("{:<3} {:<34} {:<26} cannot be planned: {}\n", i, detail::printable(p.mesh),
                      detail::printable(p.rules), detail::printable(p.error));
      continue;
    }
    const auto f = p.fits();
    out += fmt::format("{:<3} {:<34} {:<26} {:>12} {:>6} {:>14} {:>10}\n", i,
                       detail::printable(p.mesh), detail::printable(p.rules),
                       format_bytes(p.peak_bytes), f ? (*f ? "yes" : "NO") : "-",
                       format_bytes(p.bytes_moved()), flops_text(p.flops));
  }
  for (const TrainPlan& p : plans) {  // one model: said once
    if (!p.not_modelled.empty()) {
      out += fmt::format("not modelled: {}\n", fmt::join(p.not_modelled, "; "));
      break;
    }
  }
  if (const auto best = cheapest_fitting(plans)) {
    const TrainPlan& p = plans[*best];
    out += fmt::format(
        "cheapest that fits: #{} {} with rules {} ({} moved per device per step, peak {})\n", *best,
        detail::printable(p.mesh), detail::printable(p.rules), format_bytes(p.bytes_moved()),
        format_bytes(p.peak_bytes));
  } else {
    out +=
        "none of these fits: try more devices, --recompute, gradient accumulation or a "
        "smaller batch\n";
  }
  return out;
}

void write_compare_json(std::ostream& os, const std::vector<TrainPlan>& plans) {
  nlohmann::ordered_json j;
  j["plans"] = nlohmann::ordered_json::array();
  for (const TrainPlan& p : plans) j["plans"].push_back(to_json(p));
  const auto best = cheapest_fitting(plans);
  j["cheapest_fitting"] = best ? nlohmann::ordered_json(*best) : nlohmann::ordered_json(nullptr);
  os << dump(j);
}

}  // namespace shardplan
