#include "train_plan_cmd.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <optional>

#include "../core/error_context.hpp"
#include "../formats/output_file.hpp"
#include "../train/model_family.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"
#include "input_path_option.hpp"
#include "output_path_option.hpp"
#include "shardplan/train_plan.hpp"
#include "shardplan/train_plan_html.hpp"
#include "shardplan/training_stack.hpp"
#include "train_plan_config.hpp"
#include "usage_error.hpp"

namespace shardplan::cli {
namespace {

/// The preset written for the family's layout, used when no --rules is given.
std::string default_preset(const train::FamilyDef* family) {
  return std::string(family->default_preset);
}

/// The dtypes a training step can be planned in (f16 is not: the step cannot be differentiated
/// in it).
constexpr const char* kTrainingDtypes = "bf16, f32 or f64";

DType dtype_option(const char* option, const std::string& text) {
  DType d{};
  try {
    d = parse_dtype(text);
  } catch (const Error& e) {
    throw UsageError(fmt::format("{}: {}", option, e.what()));
  }
  if (d != DType::kBF16 && d != DType::kF32 && d != DType::kF64) {
    throw UsageError(fmt::format("{}: {} is not a dtype train-plan can plan a step in (choose {})",
                                 option, name(d), kTrainingDtypes));
  }
  return d;
}

bool has_axis(const std::vector<std::string>& axes, std::string_view a) {
  return std::find(axes.begin(), axes.end(), a) != axes.end();
}

/// The axes a rule file shards over (its specs and its FSDP fallback).
std::vector<std::string> axes_of(const RuleFile& file) {
  std::vector<std::string> out;
  const auto add = [&](const std::string& a) {
    if (!has_axis(out, a)) out.push_back(a);
  };
  for (const RuleFile::Rule& r : file.rules) {
    for (const AxisNames& dim : r.spec.dims()) {
      for (const std::string& a : dim) add(a);
    }
  }
  if (file.fsdp_fallback) add(file.fsdp_fallback->axis);
  for (const auto& [logical, axes] : file.logical_axes) {
    for (const std::string& a : axes.value_or(AxisNames{})) add(a);
  }
  return out;
}

/// `file` with each mesh axis it names replaced by `to(axis)`, or taken out where that is
/// empty (in its specs, its FSDP fallback and its logical axes).
RuleFile map_axes(RuleFile file, const std::function<std::string(const std::string&)>& to) {
  const auto mapped = [&](const AxisNames& axes) {
    AxisNames out;
    for (const std::string& a : axes) {
      if (std::string b = to(a); !b.empty()) out.push_back(std::move(b));
    }
    return out;
  };
  for (RuleFile::Rule& r : file.rules) {
    std::vector<AxisNames> dims;
    for (const AxisNames& dim : r.spec.dims()) dims.push_back(mapped(dim));
    r.spec = PartitionSpec(std::move(dims));
  }
  if (file.fsdp_fallback) {
    file.fsdp_fallback->axis = to(file.fsdp_fallback->axis);
    if (file.fsdp_fallback->axis.empty()) file.fsdp_fallback.reset();
  }
  for (auto& [logical, axes] : file.logical_axes) {
    if (axes) axes = mapped(*axes);
  }
  return file;
}

/// `file` with the axes `mesh` lacks taken out of its specs: such an axis counts as size 1 (as
/// a logical-axis rule's mesh axis that is absent does in MaxText).
RuleFile without_axes(RuleFile file, const std::vector<std::string>& mesh) {
  return map_axes(std::move(file),
                  [&](const std::string& a) { return has_axis(mesh, a) ? a : std::string(); });
}

/// `file` for a mesh with a context axis: every weight spec entry that names `fsdp` names
/// `context` after it (the devices along the context axis hold different tokens of the same
/// sequences, so they shard the weights too, as the batch's devices do: torchtitan's dp_shard_cp
/// mesh), and the activations' sequence (logical axes activation_length, activation_norm_length)
/// is split over `context` first (MaxText's context parallelism), then over what it named.
RuleFile with_context_sharding(RuleFile file, const std::string& context) {
  for (RuleFile::Rule& r : file.rules) {
    std::vector<AxisNames> dims(r.spec.dims().begin(), r.spec.dims().end());
    for (AxisNames& dim : dims) {
      if (std::find(dim.begin(), dim.end(), "fsdp") != dim.end() &&
          std::find(dim.begin(), dim.end(), context) == dim.end()) {
        dim.push_back(context);
      }
    }
    r.spec = PartitionSpec(std::move(dims));
  }
  for (auto& [logical, axes] : file.logical_axes) {
    if (logical != "activation_length" && logical != "activation_norm_length") continue;
    AxisNames split{context};
    for (const std::string& a : axes.value_or(AxisNames{})) {
      if (a != context) split.push_back(a);
    }
    axes = std::move(split);
  }
  return file;
}

/// The rules used without --rules on `mesh`: the family's preset, or the one of its layout
/// that fits the mesh's axes (LLaMA on a mesh without a model axis: llama_fsdp), or the family's
/// preset with the axes the mesh lacks left out. A preset names its model axis `tp`; a mesh whose
/// one model axis has another default name (model, mp, tensor: default_axis_role) has it take
/// tp's place. `note` says which and why.
struct DefaultRules {
  std::string name;  // "preset:llama_fsdp"
  RuleFile file;
  std::string note;
};
DefaultRules default_rules(const train::FamilyDef* family, const std::string& family_name,
                           const std::vector<std::string>& mesh,
                           const std::function<RuleFile(const std::string&)>& load_rules) {
  std::string preset = default_preset(family);
  const train::FamilyDef& def = *family;
  std::vector<std::string> model_axes;
  for (const std::string& a : mesh) {
    if (default_axis_role(a) == AxisRole::kModel) model_axes.push_back(a);
  }
  if (!def.preset_without_tp.empty() && model_axes.empty()) {
    preset = std::string(def.preset_without_tp);
  }
  DefaultRules d{"preset:" + preset, load_rules("preset:" + preset), ""};
  if (preset == def.preset_without_tp && preset != default_preset(family)) {
    d.note = fmt::format("the default for {} on a mesh without a model axis", family_name);
  } else {
    d.note = fmt::format("the default for {}", family_name);
  }
  if (!has_axis(mesh, "tp") && model_axes.size() == 1 && has_axis(axes_of(d.file), "tp")) {
    const std::string& model = model_axes.front();
    d.file = map_axes(std::move(d.file),
                      [&](const std::string& a) { return a == "tp" ? model : a; });
    d.note += fmt::format("; its tp is the mesh's model axis {}", model);
  }
  std::vector<std::string> missing;
  for (const std::string& a : axes_of(d.file)) {
    if (!has_axis(mesh, a)) missing.push_back(a);
  }
  if (!missing.empty()) {
    d.file = without_axes(std::move(d.file), mesh);
    d.note += fmt::format("; the mesh has no {} axis{}: left out of the preset's specs, as size 1",
                          fmt::join(missing, ", "), missing.size() == 1 ? "" : "es");
  }
  for (const std::string& context : mesh) {
    if (default_axis_role(context) != AxisRole::kContext) continue;  // a preset declares no roles
    d.file = with_context_sharding(std::move(d.file), context);
    d.note += has_axis(mesh, "fsdp")
                  ? fmt::format("; the weights sharded over fsdp and {} together, the "
                                "activations' sequence over {}",
                                context, context)
                  : fmt::format("; the activations' sequence over {}", context);
  }
  return d;
}

/// --batch-axes: comma-separated names, each once.
std::vector<std::string> batch_axes_option(const std::string& text) {
  std::vector<std::string> out;
  std::size_t from = 0;
  while (from <= text.size()) {
    const std::size_t end = std::min(text.find(',', from), text.size());
    std::string axis = text.substr(from, end - from);
    if (axis.empty()) {
      throw UsageError(
          fmt::format("--batch-axes '{}': an empty axis name (write names separated "
                      "by commas, e.g. --batch-axes dp,fsdp)",
                      detail::printable(text)));
    }
    if (has_axis(out, axis)) {
      throw UsageError(fmt::format("--batch-axes '{}': axis '{}' is named twice",
                                   detail::printable(text), detail::printable(axis)));
    }
    out.push_back(std::move(axis));
    from = end + 1;
  }
  return out;
}

}  // namespace


namespace {

using DevicesFor = std::function<std::int64_t(const std::string&, std::int64_t)>;

/// The --config file's model. Only "it is not there" is bad usage; anything else (a link loop,
/// a permission) is the reader's error naming the file.
ModelConfig config_option(const std::string& path) {
  require_input("--config", path);
  return ModelConfig::load(path);
}

bool given_option(const TrainPlanCommand& c, const char* option) {
  return c.command != nullptr && c.command->count(option) > 0;
}

/// --attention / --loss: fused or naive, or nullopt when not given (the family's).
std::optional<bool> fused_option(const char* option, const std::string& text) {
  if (text.empty()) return std::nullopt;
  if (text != "fused" && text != "naive") {
    throw UsageError(fmt::format("{}: unknown '{}' (known: fused, naive)", option,
                                 detail::printable(text)));
  }
  return text == "fused";
}

/// The step's dtypes: --param-dtype, --grad-dtype, --optimizer-dtype, --mixed-precision,
/// --master-dtype and --reduce-dtype, checked, into `o`.
void dtype_options(const TrainPlanCommand& c, TrainPlanOptions& o) {
  o.param_dtype = dtype_option("--param-dtype", c.param_dtype);
  o.grad_dtype = c.grad_dtype.empty() ? o.param_dtype : dtype_option("--grad-dtype", c.grad_dtype);
  o.optimizer_dtype = dtype_option("--optimizer-dtype", c.optimizer_dtype);
  if (!c.mixed_precision.empty()) {
    if (c.mixed_precision != "fsdp2") {
      throw UsageError(fmt::format("--mixed-precision: unknown '{}' (known: fsdp2)",
                                   detail::printable(c.mixed_precision)));
    }
    if (!c.master_dtype.empty() || !c.reduce_dtype.empty() || !c.grad_dtype.empty()) {
      throw UsageError(
          "--mixed-precision fsdp2 sets the dtypes itself: give it or --master-dtype, "
          "--reduce-dtype, --grad-dtype, not both");
    }
    // FSDP2's mixed precision holds the optimizer state like the f32 weights it updates
    // (torch.optim's state is zeros_like(param); torchtitan has no other dtype with it): a
    // bf16 state there is not a run torchtitan makes, and was once silently f32.
    if (given_option(c, "--optimizer-dtype")) {
      throw UsageError(fmt::format(
          "--optimizer-dtype {} is refused with --mixed-precision fsdp2: it holds the optimizer "
          "state in f32, like the weights it updates (torch.optim's state is zeros_like the "
          "f32 parameter); leave --optimizer-dtype out, or give the dtypes one by one",
          detail::printable(c.optimizer_dtype)));
    }
    o.master_dtype = o.reduce_dtype = DType::kF32;
    o.grad_dtype = o.optimizer_dtype = DType::kF32;
  }
  if (!c.master_dtype.empty()) o.master_dtype = dtype_option("--master-dtype", c.master_dtype);
  if (!c.reduce_dtype.empty()) o.reduce_dtype = dtype_option("--reduce-dtype", c.reduce_dtype);
}

/// The device's memory: --device-memory and --headroom, checked, into `o`.
void memory_options(const TrainPlanCommand& c, TrainPlanOptions& o) {
  if (!c.device_memory.empty() || given_option(c, "--device-memory")) {
    try {
      o.device_memory = parse_bytes(c.device_memory);
    } catch (const Error& e) {
      throw UsageError(fmt::format("--device-memory: {}", e.what()));
    }
  }
  // CLI11's range check lets NaN through (every comparison with it is false).
  if (!(c.headroom >= 0 && c.headroom <= 0.99)) {
    throw UsageError(
        fmt::format("--headroom {}: not a fraction in [0, 0.99] (the part of --device-memory "
                    "kept free)",
                    c.headroom));
  }
  if (given_option(c, "--headroom") && !given_option(c, "--device-memory") &&
      c.hardware.empty()) {
    throw UsageError(fmt::format(
        "--headroom {} is refused without --device-memory or --hardware: there is no memory to "
        "keep it in (nothing would use it)",
        c.headroom));
  }
  o.headroom = c.headroom;
}

/// `option` as the command line gave it (its negation's name for --eager and --fsdp-root given
/// as --compile, --no-fsdp-root); empty when not given.
std::string as_given(const TrainPlanCommand& c, std::string_view option) {
  const std::string name(option);
  if (!given_option(c, name.c_str())) {
    const auto by_file = c.set_by_config.find(option);  // --from-config's key
    return by_file == c.set_by_config.end() ? std::string() : by_file->second;
  }
  if (name == "--eager" && !c.eager) return "--compile";
  if (name == "--fsdp-root" && !c.fsdp_root) return "--no-fsdp-root";
  return name;
}

/// --stack's stack, or none.
const TrainingStack* stack_option(const TrainPlanCommand& c) {
  if (c.stack.empty() && !given_option(c, "--stack")) return nullptr;
  try {
    return &find_training_stack(c.stack);
  } catch (const SpecError& e) {
    throw UsageError(fmt::format("--stack: {}", e.what()));
  }
}

/// The options of the step (everything but the meshes and rules), checked.
/// `option`'s value parsed into `out` when given (an empty value too: "" names nothing); a
/// SpecError becomes a UsageError naming the option.
template <class T, class Parse>
void parse_given(const TrainPlanCommand& c, const char* option, const std::string& value, T& out,
                 Parse parse) {
  if (value.empty() && (c.command == nullptr || c.command->count(option) == 0)) return;
  try {
    out = parse(value);
  } catch (const SpecError& e) {
    throw UsageError(fmt::format("{}: {}", option, e.what()));
  }
}

TrainPlanOptions plan_options(const TrainPlanCommand& c) {
  TrainPlanOptions o;
  o.reserved_whole = !c.compare;  // one plan: its reserved bytes on the whole step
  o.batch = c.batch;
  o.seq = c.seq;
  o.target_seq = c.target_seq;
  o.optimizer = parse_optimizer(c.optimizer);
  o.optimizer_kernel = parse_optimizer_kernel(c.optimizer_kernel);
  o.optimizer_sharding = parse_optimizer_sharding(c.optimizer_sharding);
  dtype_options(c, o);
  if (!c.hardware.empty()) {  // an empty --hardware is refused when parsed
    if (c.hardware.ends_with(".yaml") || c.hardware.ends_with(".yml")) {
      require_input("--hardware", c.hardware);
    }
    try {
      o.hardware = find_hardware(c.hardware);
    } catch (const SpecError& e) {
      throw UsageError(fmt::format("--hardware: {}", e.what()));
    }
  }
  o.grad_accum = c.grad_accum;
  o.recompute = c.recompute;
  o.reshard_after_forward = !c.no_reshard_after_forward;
  o.float8 = c.float8;
  o.uneven = c.strict_shards ? Uneven::kRefuse : Uneven::kPad;
  o.eager = c.eager;
  o.async_tp = c.async_tp;
  o.fsdp_root = c.fsdp_root;
  if (c.sequence_parallel == "on" || c.sequence_parallel == "off") {
    o.sequence_parallel = c.sequence_parallel == "on";
  } else if (!c.sequence_parallel.empty() ||
             (c.command != nullptr && c.command->count("--sequence-parallel") > 0)) {
    throw UsageError(fmt::format("--sequence-parallel '{}': expected on or off",
                                 detail::printable(c.sequence_parallel)));
  }
  // An option given is parsed even when empty ("" is neither a size nor an axis).
  const auto given = [&](const char* option) {
    return c.command != nullptr && c.command->count(option) > 0;
  };
  if (!c.remat.empty() || given("--remat")) {
    try {
      o.remat = parse_remat(c.remat);
    } catch (const SpecError& e) {
      throw UsageError(fmt::format("--remat: {}", e.what()));
    }
    if (c.recompute && !o.remat) {
      throw UsageError("--recompute and --remat none contradict each other: give one");
    }
  }
  parse_given(c, "--tp-plan", c.tp_plan, o.tp_plan, parse_tp_plan);
  parse_given(c, "--cp-rotate", c.cp_rotate, o.cp_rotate, parse_ring_rotate);
  parse_given(c, "--cp-kernel", c.cp_kernel, o.cp_kernel, parse_context_kernel);
  parse_given(c, "--dp-overlap", c.dp_overlap, o.dp_overlap, parse_dp_overlap);
  o.dp_bucket_size = c.dp_bucket_size;
  parse_given(c, "--float8-recipe", c.float8_recipe, o.float8_recipe, parse_float8_recipe);
  parse_given(c, "--float8-all-gather", c.float8_all_gather, o.float8_all_gather,
              parse_float8_gather);
  if (!c.remat_blocks.empty() || given("--remat-blocks")) {
    try {
      o.remat_blocks = parse_remat_blocks(c.remat_blocks);
    } catch (const SpecError& e) {
      throw UsageError(e.what());
    }
  }
  if (given("--reshard-last-block")) o.reshard_last_block = c.reshard_last_block;
  o.fused_loss = fused_option("--loss", c.loss);
  parse_given(c, "--loss-dtype", c.loss_dtype, o.loss_dtype,
              [](const std::string& v) { return std::optional<DType>(parse_dtype(v)); });
  o.fused_attention = fused_option("--attention", c.attention);
  if (!c.batch_axes.empty() || given("--batch-axes")) {
    o.batch_axes = batch_axes_option(c.batch_axes);
  }
  memory_options(c, o);
  // The stack's choices, where no option given sets the same thing.
  if (const TrainingStack* stack = stack_option(c)) {
    apply_stack(*stack, o, [&](std::string_view option) { return as_given(c, option); });
    o.stack->config = c.config_record.config;
    o.stack->config_applied = c.config_record.config_applied;
    o.stack->config_overridden = c.config_record.config_overridden;
    o.stack->config_ignored = c.config_record.config_ignored;
  }
  return o;
}

/// The rules of one configuration: the rule, its label and a note for the table.
struct Rules {
  RulePtr rule;
  std::string label, note;
  std::optional<RuleFile> file;  // its activations shard the layers' norm and residual regions
};

/// Runs `f`: a failure is the command's error, or with --compare `row`'s error.
template <class F>
void or_error_row(const TrainPlanCommand& c, TrainPlan& row, const F& f) {
  try {
    f();
  } catch (const UsageError& e) {
    if (!c.compare) throw;
    row.error = e.what();
  } catch (const Error& e) {
    if (!c.compare) throw;
    row.error = e.what();
  }
}

/// One configuration before it is planned: its row so far (the mesh and rules named, or why it
/// cannot be planned) and, when it can, what plan_training is called with.
struct Configuration {
  TrainPlan row;
  std::optional<Mesh> mesh;
  RulePtr rule;
  TrainPlanOptions options;
};

/// The mesh parsed and the rules loaded (on the command's thread: yaml-cpp's reader is not
/// thread-safe). `rules_for` gives the rules for the parsed mesh (their label until then:
/// `rules_label`).
Configuration prepare_one(const TrainPlanCommand& c, const TrainPlanOptions& o,
                          const DevicesFor& devices_for, const std::string& mesh_text,
                          const std::string& rules_label,
                          const std::function<Rules(const Mesh&)>& rules_for) {
  Configuration k;
  k.row.mesh = mesh_text;
  k.row.rules = rules_label;
  or_error_row(c, k.row, [&] {
    const Mesh mesh = [&] {
      const std::int64_t n = devices_for(mesh_text, c.devices);
      try {
        return Mesh::parse(mesh_text, n);
      } catch (const Error& e) {  // the mesh text is usage
        throw UsageError(fmt::format("--mesh '{}': {}", detail::printable(mesh_text), e.what()));
      }
    }();
    k.row.mesh = mesh.to_string();
    k.row.devices = mesh.size();
    const Rules r = rules_for(mesh);
    k.row.rules = r.label;
    k.row.rules_note = r.note;
    k.rule = r.rule;
    k.options = o;
    k.options.activations = r.file;
    k.mesh = mesh;
  });
  return k;
}

/// One configuration planned (on any thread: plan_concurrently).
TrainPlan plan_one(const TrainPlanCommand& c, const ModelConfig& config, const Configuration& k) {
  TrainPlan p = k.row;
  if (!k.mesh) return p;  // its error says why
  or_error_row(c, p, [&] {
    TrainPlan planned = plan_training(config, *k.mesh, k.rule, k.options);
    planned.rules = k.row.rules;
    planned.rules_note = k.row.rules_note;
    p = std::move(planned);
  });
  return p;
}

/// `plan()`, an error naming the stack the options came from and what it set (a choice the
/// model cannot take fails as the option it sets would, then says so).
std::vector<TrainPlan> plan_with_stack_named(const TrainPlanOptions& o,
                                             const std::function<std::vector<TrainPlan>()>& plan) {
  if (!o.stack) return plan();
  std::vector<std::string> sets;  // the choices that set an option
  for (const std::string& a : o.stack->applied) {
    if (a.find(": --") != std::string::npos) sets.push_back(a);
  }
  const std::string note = fmt::format("train-plan --stack {} (which sets {}; an option given "
                                       "overrides the choice it sets)",
                                       o.stack->name, fmt::join(sets, "; "));
  try {
    return plan();
  } catch (const OptionError& e) {
    throw OptionError(e.refusal_index(), fmt::format("{}: {}", note, e.what()));
  } catch (const Error&) {
    detail::rethrow_with_context(note);
  }
}

/// Prints the plans: the comparison of all, or the one plan.
void print_plans(const TrainPlanCommand& c, const std::vector<TrainPlan>& plans) {
  if (c.compare) {
    if (c.json) {
      write_compare_json(std::cout, plans);
      std::cout << "\n";
    } else {
      std::cout << compare_table(plans);
    }
    return;
  }
  if (c.json) {
    plans.front().write_json(std::cout);
    std::cout << "\n";
  } else {
    std::cout << plans.front().table();
  }
}

}  // namespace

int run_train_plan(
    const TrainPlanCommand& given, const std::function<RuleFile(const std::string&)>& load_rules,
    const std::function<std::int64_t(const std::string&, std::int64_t)>& devices_for) {
  TrainPlanCommand c = given;
  if (c.explain && !c.emit_config.empty()) {
    throw UsageError("--explain plans nothing: --emit-config cannot be given with it");
  }
  apply_from_config(c);  // its options where none given sets them
  if (c.explain) {
    const TrainingStack* stack = stack_option(c);
    if (stack == nullptr) throw UsageError("--explain lists a stack's choices: give --stack NAME");
    std::cout << explain_stack(*stack,
                               [&](std::string_view option) { return as_given(c, option); });
    return 0;
  }
  if (c.config.empty()) {
    throw UsageError("--config is required (a Hugging Face config.json, or a directory holding one)");
  }
  const ModelConfig config = config_option(c.config);
  if (!c.compare && (c.meshes.size() > 1 || c.rules.size() > 1)) {
    throw UsageError("--mesh and --rules are given once each, unless --compare is on");
  }
  if (c.compare && !c.html.empty()) {
    throw UsageError("--html draws one plan: it cannot be given with --compare");
  }
  const TrainPlanOptions o = plan_options(c);

  // Each configuration is prepared here, then all are planned on every core (plan_concurrently).
  std::vector<Configuration> configurations;
  const auto add_plan = [&](const std::string& mesh_text, const std::string& rules_label,
                            const std::function<Rules(const Mesh&)>& rules_for) {
    configurations.push_back(prepare_one(c, o, devices_for, mesh_text, rules_label, rules_for));
  };
  if (c.rules.empty() && !c.meshes.empty()) {
    // The family's rules chosen for each mesh's axes.
    for (const std::string& mesh_text : c.meshes) {
      add_plan(
          mesh_text, "preset:" + std::string(default_preset(config.family)), [&](const Mesh& mesh) {
            const DefaultRules d =
                default_rules(config.family, config.family_name(), mesh.axis_names(), load_rules);
            return Rules{d.file.make_rule(), d.name, d.note, d.file};
          });
    }
  } else {
    const bool chosen = c.rules.empty();
    const std::vector<std::string> rule_names =
        chosen ? std::vector<std::string>{std::string("preset:") + default_preset(config.family)}
               : c.rules;
    for (const std::string& rules_name : rule_names) {
      const RuleFile file = load_rules(rules_name);
      const RulePtr rule = file.make_rule();
      std::vector<std::string> meshes = c.meshes;
      if (meshes.empty()) {
        if (!file.mesh) {
          throw UsageError(
              fmt::format("--mesh: the rule file {} names no mesh; give --mesh", file.source));
        }
        meshes.push_back(*file.mesh);
      }
      const std::string label = rules_name.rfind("preset:", 0) == 0 ? rules_name : file.source;
      const std::string note =
          chosen ? fmt::format("the default for {}, on its own mesh", config.family_name()) : "";
      for (const std::string& mesh_text : meshes) {
        add_plan(mesh_text, label, [&](const Mesh&) { return Rules{rule, label, note, file}; });
      }
    }
  }
  // The inputs (config, rules, hardware file) are read: the page's path is checked against
  // them before the planning (docs/cli.md "Outputs").
  std::optional<detail::OutputFiles> out = open_outputs(c);
  const std::vector<TrainPlan> plans = plan_with_stack_named(o, [&] {
    return plan_concurrently(configurations.size(),
                             [&](std::size_t i) { return plan_one(c, config, configurations[i]); });
  });
  // Before the text, as plan --html: a page that cannot be written fails the command.
  if (out) {
    if (!c.html.empty()) (*out)[0].write(train_plan_html(plans.front()));
    if (configurations.front().mesh) {
      write_emitted_config(c, *out, plans.front(), o, *configurations.front().mesh);
    }
    out->commit();
  }
  print_plans(c, plans);
  return 0;
}

}  // namespace shardplan::cli
