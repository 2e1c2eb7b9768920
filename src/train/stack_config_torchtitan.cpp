// torchtitan's TOML job config (stack_config.hpp), by version. The keys are those of its
// JobConfig at each stack's commit: torchtitan/config_manager.py (argparse "--table.key") at
// 40f79d7 (torchtitan-2024-07) and 3f20451 (-2024-12), its dataclasses at 6b11290 (-2025-06) and
// torchtitan/config/job_config.py at 07c00d9 (-2025-08); the defaults are theirs. The TOML is
// parsed by toml++ (Debian's libtomlplusplus-dev, header-only here).
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

// toml++ 3.3 asserts (and, under NDEBUG, assumes) things some malformed texts break ("[#" as a
// table name): its assertions are made exceptions here, caught below as a parse error, with
// NDEBUG off while it is included so that none is an assumption.
namespace shardplan::train::stack_config {
struct TomlAssertion : std::logic_error {
  using std::logic_error::logic_error;
};
// In a noexcept function of toml++'s (none of the parser's), this ends the program as assert
// would.
[[noreturn]] inline void toml_assertion(const char* expr) { throw TomlAssertion(expr); }
}  // namespace shardplan::train::stack_config
// clang-format off
#define TOML_ASSERT(expr) \
  (static_cast<bool>(expr) ? static_cast<void>(0) \
                           : ::shardplan::train::stack_config::toml_assertion(#expr))
#define TOML_HEADER_ONLY 1
#pragma push_macro("NDEBUG")
#undef NDEBUG
#include <toml++/toml.h>
#pragma pop_macro("NDEBUG")
// clang-format on

#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "resolve_options.hpp"
#include "stack_config_impl.hpp"

namespace shardplan::train::stack_config {
namespace {

// Key::versions bits: the stacks' dates.
constexpr unsigned k2407 = 1, k2412 = 2, k2506 = 4, k2508 = 8;
constexpr unsigned k2024 = k2407 | k2412, k2025 = k2506 | k2508;

unsigned version_of(std::string_view stack) {
  if (stack == "torchtitan-2024-07") return k2407;
  if (stack == "torchtitan-2024-12") return k2412;
  if (stack == "torchtitan-2025-06") return k2506;
  return k2508;
}

Entry entry_of(const std::string& key, const toml::node& n) {
  Entry e{.key = key, .line = static_cast<int>(n.source().begin.line)};
  if (const auto* b = n.as_boolean()) {
    e.kind = Entry::Kind::kBool, e.b = b->get(), e.text = e.b ? "true" : "false";
  } else if (const auto* i = n.as_integer()) {
    e.kind = Entry::Kind::kInt, e.i = i->get(), e.text = std::to_string(e.i);
  } else if (const auto* d = n.as_floating_point()) {
    e.kind = Entry::Kind::kNumber, e.d = d->get(), e.text = fmt::format("{}", e.d);
  } else if (const auto* s = n.as_string()) {
    e.kind = Entry::Kind::kText, e.text = s->get();
  } else if (const auto* a = n.as_array();
             a != nullptr &&
             std::all_of(a->begin(), a->end(), [](const toml::node& x) { return x.is_string(); })) {
    e.kind = Entry::Kind::kList;
    for (const toml::node& x : *a) e.list.push_back(x.as_string()->get());
  } else {
    e.kind = Entry::Kind::kOther, e.text = n.is_table() ? "(a table)" : "(an array)";
  }
  return e;
}

std::vector<Entry> parse(std::string_view text, std::string_view source) {
  // TOML allows no control character but tab, LF and CR, anywhere; toml++ 3.3 asserts on some
  // (a table name "[\x11"), so they are refused before it sees them. Non-ASCII bytes too:
  // toml++ 3.3's test for non-ASCII whitespace reaches __builtin_unreachable for characters from
  // U+00A1 to U+0499 (and others) wherever it looks for whitespace (found by fuzz_stack_config
  // under UBSan), and torchtitan's configs are ASCII.
  int line = 1;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u == '\n') ++line;
    if ((u < 0x20 && u != '\t' && u != '\n' && u != '\r') || u == 0x7f) {
      throw IoError(fmt::format("[stack-config] {}:{}: not valid TOML: control character 0x{:02x}",
                                detail::printable(source), line, u));
    }
    if (u >= 0x80) {
      throw IoError(fmt::format("[stack-config] {}:{}: a non-ASCII byte 0x{:02x}: torchtitan's "
                                "configs are ASCII, and the TOML parser (toml++ 3.3) is not safe "
                                "on some non-ASCII characters, so none is read",
                                detail::printable(source), line, u));
    }
  }
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw IoError(fmt::format("[stack-config] {}:{}: not valid TOML: {}", detail::printable(source),
                              e.source().begin.line, e.description()));
  } catch (const TomlAssertion& e) {
    throw IoError(fmt::format("[stack-config] {}: not valid TOML (the parser's check '{}')",
                              detail::printable(source), e.what()));
  }
  std::vector<Entry> out;
  for (const auto& [name, node] : root) {
    const std::string table(name.str());
    if (const toml::table* t = node.as_table()) {
      for (const auto& [key, value] : *t)
        out.push_back(entry_of(table + "." + std::string(key.str()), value));
    } else {
      out.push_back(entry_of(table, node));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Entry& a, const Entry& b) { return a.line < b.line; });
  return out;
}

void local_batch(const Entry& e, Reading& r) {
  const std::int64_t b = r.integer(e);
  if (b < 1) r.fail(e, "expected a batch of at least 1 per data-parallel rank");
  r.out().local_batch = static_cast<double>(b);
  r.out().batch_keys += (r.out().batch_keys.empty() ? "" : ", ") + Reading::said(e);
}

void global_batch(const Entry& e, Reading& r) {
  const std::int64_t b = r.integer(e);
  if (b == -1) return;  // local_batch_size x the data-parallel degree
  if (b < 1) r.fail(e, "expected -1 or a batch of at least 1");
  r.out().global_batch = b;
  r.out().batch_keys += (r.out().batch_keys.empty() ? "" : ", ") + Reading::said(e);
}

void seq(const Entry& e, Reading& r) {
  if (r.integer(e) < 1) r.fail(e, "expected at least 1 token");
  r.set(e, "--seq", std::to_string(r.integer(e)));
}

void fsdp(const Entry& e, Reading& r) { r.axis(e, "fsdp"); }
void dp(const Entry& e, Reading& r) { r.axis(e, "dp"); }
void tp(const Entry& e, Reading& r) { r.axis(e, "tp"); }
void cp(const Entry& e, Reading& r) { r.axis(e, "cp"); }
void hold(const Entry& e, Reading& r) { r.hold(e); }

void precision(const Entry& e, Reading& r) {
  const std::string& v = r.text(e);
  if (v == "bfloat16") return r.set(e, "--mixed-precision", "fsdp2");
  if (v != "float32") r.fail(e, "expected bfloat16 or float32");
  r.set(e, "--param-dtype", "f32");  // FSDP2 over float32: everything float32
  r.set(e, "--grad-dtype", "f32");
  r.set(e, "--optimizer-dtype", "f32");
}

// Async TP (--async-tp): PyTorch's micro-pipeline TP pass on the tensor-parallel group.
void async_tp(const Entry& e, Reading& r) { r.set(e, r.boolean(e) ? "--async-tp" : ""); }

void compile(const Entry& e, Reading& r) { r.set(e, r.boolean(e) ? "--compile" : "--eager"); }

void float8_linear(const Entry& e, Reading& r) {
  if (r.boolean(e)) r.set(e, "--float8");
}

void converters(const Entry& e, Reading& r) {
  for (const std::string& c : r.strings(e)) {
    if (c != "float8") {
      r.fail(e, fmt::format("the converter '{}' is not planned (float8 is: --float8)",
                            detail::printable(c)));
    }
    r.set(e, "--float8");
  }
}

void optimizer(const Entry& e, Reading& r) {
  const std::string& v = r.text(e);
  if (v != "AdamW" && v != "Adam") r.fail(e, "expected AdamW or Adam (build_optimizers' names)");
  r.set(e, "--optimizer", v == "AdamW" ? "adamw" : "adam");
}

void reshard(const Entry& e, Reading& r) {
  const std::string& v = r.text(e);
  if (v == "never") return r.set(e, "--no-reshard-after-forward");
  if (v != "default" && v != "always") r.fail(e, "expected default, always or never");
  r.set(e, "");  // resharded after forward: train-plan's default
}

// Custom code may change anything: only its empty default is planned.
void no_custom_code(const Entry& e, Reading& r) {
  if (!r.text(e).empty()) r.fail(e, "custom code is not planned");
  r.out().ignored.push_back(Reading::said(e) + " (no custom code)");
}

constexpr std::string_view kModel = "the model is --config's";
constexpr std::string_view kNotStep = "not part of a training step's memory or time";
constexpr std::string_view kValue = "a value of the update, not its size or time";
constexpr std::string_view kPipeline = "pipeline parallelism is not planned";
constexpr std::string_view kPipelineSetting = "a pipeline setting: no pipeline is planned";

// The tables of things outside a step, the model's and the update's values.
std::vector<Key> other_keys() {
  return {
      {"job.*", nullptr, kNotStep},
      {"profiling.*", nullptr, kNotStep},
      {"metrics.*", nullptr, kNotStep},
      {"checkpoint.*", nullptr, "checkpoints are saved between steps"},
      {"comm.*", nullptr, "timeouts and traces of the collectives"},
      {"lr_scheduler.*", nullptr, kValue},
      {"memory_estimation.*", nullptr, kNotStep},
      {"fault_tolerance.*", nullptr, "fault tolerance between steps"},
      {"validation.*", nullptr, "evaluation, outside the training step"},
      {"mx.*", nullptr, "MX formats apply with model.converters 'mx', refused"},
      {"model.name", nullptr, kModel},
      {"model.flavor", nullptr, kModel},
      {"model.norm_type", nullptr, kModel, {}, k2024},
      {"model.tokenizer_path", nullptr, kModel},
      {"model.hf_assets_path", nullptr, kModel, {}, k2508},
      {"model.converters", converters, {}, {}, k2025},
      {"model.print_after_conversion", nullptr, kNotStep, {}, k2025},
      {"optimizer.name", optimizer},
      {"optimizer.lr", nullptr, kValue},
      {"optimizer.eps", nullptr, kValue, {}, k2025},
      {"optimizer.beta1", nullptr, kValue, {}, k2025},
      {"optimizer.beta2", nullptr, kValue, {}, k2025},
      {"optimizer.weight_decay", nullptr, kValue, {}, k2025},
      {"optimizer.fused", nullptr, "the optimizer's kernel is not modelled", {}, k2024},
      {"optimizer.implementation", nullptr, "the optimizer's kernel is not modelled", {}, k2025},
      {"optimizer.early_step_in_backward", nullptr, "the update after the backward pass", "false",
       k2412 | k2025},
  };
}

// [training], [compile] and the data-parallel degrees of 2024.
std::vector<Key> training_keys() {
  return {
      {"training.batch_size", local_batch, {}, {}, k2024},
      {"training.local_batch_size", local_batch, {}, {}, k2025},
      {"training.global_batch_size", global_batch, {}, {}, k2025},
      {"training.seq_len", seq},
      {"training.max_norm", nullptr, "gradient clipping: a norm of the gradients, a scalar"},
      {"training.steps", nullptr, kNotStep},
      {"training.warmup_steps", nullptr, kValue, {}, k2024},
      {"training.dataset", nullptr, kNotStep},
      {"training.dataset_path", nullptr, kNotStep},
      {"training.gc_freq", nullptr, kNotStep},
      {"training.gc_debug", nullptr, kNotStep, {}, k2025},
      {"training.seed", nullptr, kNotStep, {}, k2412 | k2025},
      {"training.deterministic", nullptr, kNotStep, {}, k2412 | k2025},
      {"training.enable_cpu_offload", nullptr, "CPU offload is not planned", "false",
       k2412 | k2025},
      {"training.mixed_precision_param", precision},
      {"training.mixed_precision_reduce", nullptr,
       "FSDP2 reduces in float32, as --mixed-precision fsdp2", "float32"},
      {"training.compile", compile, {}, {}, k2407 | k2412 | k2506},
      {"compile.enable", compile, {}, {}, k2508},
      {"compile.components",
       nullptr,
       "train-plan compiles the whole step or none of it",
       {},
       k2508},
      {"training.data_parallel_degree", fsdp, {}, {}, k2407},
      {"training.data_parallel_type", nullptr, "train-plan plans FSDP", "fsdp", k2407},
      {"training.data_parallel_shard_degree", fsdp, {}, {}, k2412},
      {"training.data_parallel_replicate_degree", dp, {}, {}, k2412},
      {"training.tensor_parallel_degree", tp, {}, {}, k2024},
      {"training.enable_loss_parallel", nullptr, "loss parallelism is not modelled", {}, k2407},
      {"training.disable_loss_parallel", nullptr, "loss parallelism is not modelled", {}, k2412},
  };
}

// [parallelism] (and 2024's [experimental]), [activation_checkpoint], [float8].
std::vector<Key> parallelism_keys() {
  return {
      {"parallelism.data_parallel_shard_degree", fsdp, {}, {}, k2025},
      {"parallelism.data_parallel_replicate_degree", dp, {}, {}, k2025},
      {"parallelism.tensor_parallel_degree", tp, {}, {}, k2025},
      {"parallelism.context_parallel_degree", cp, {}, {}, k2025},
      {"experimental.context_parallel_degree", cp, {}, {}, k2412},
      {"parallelism.disable_loss_parallel", nullptr, "loss parallelism is not modelled", {}, k2025},
      {"parallelism.fsdp_reshard_after_forward", reshard, {}, {}, k2025},
      {"parallelism.enable_async_tensor_parallel", async_tp, {}, {}, k2025},
      {"experimental.enable_async_tensor_parallel", async_tp, {}, {}, k2024},
      {"parallelism.enable_compiled_autograd", nullptr, "compiled autograd is not modelled",
       "false", k2025},
      {"experimental.enable_compiled_autograd", nullptr, "compiled autograd is not modelled",
       "false", k2024},
      {"parallelism.context_parallel_rotate_method",
       nullptr,
       "context parallelism is planned as train-plan's ring attention",
       {},
       k2025},
      {"experimental.context_parallel_rotate_method",
       nullptr,
       "context parallelism is planned as train-plan's ring attention",
       {},
       k2412},
      {"parallelism.pipeline_parallel_degree", nullptr, kPipeline, "1", k2025},
      {"parallelism.pipeline_parallel_split_points", nullptr, kPipelineSetting, {}, k2025},
      {"parallelism.pipeline_parallel_schedule", nullptr, kPipelineSetting, {}, k2025},
      {"parallelism.pipeline_parallel_schedule_csv", nullptr, kPipelineSetting, {}, k2025},
      {"parallelism.pipeline_parallel_microbatch_size", nullptr, kPipelineSetting, {}, k2025},
      {"parallelism.pipeline_parallel_layers_per_stage", nullptr, kPipelineSetting, {}, k2025},
      {"parallelism.pipeline_parallel_first_stage_less_layers",
       nullptr,
       kPipelineSetting,
       {},
       k2508},
      {"parallelism.pipeline_parallel_last_stage_less_layers",
       nullptr,
       kPipelineSetting,
       {},
       k2508},
      {"parallelism.module_fqns_per_model_part", nullptr, kPipelineSetting, {}, k2508},
      {"experimental.pipeline_parallel_split_points", nullptr, kPipelineSetting, {}, k2024},
      {"experimental.pipeline_parallel_schedule", nullptr, kPipelineSetting, {}, k2024},
      {"experimental.pipeline_parallel_schedule_csv", nullptr, kPipelineSetting, {}, k2412},
      {"experimental.pipeline_parallel_microbatches", nullptr, kPipelineSetting, {}, k2024},
      {"experimental.pipeline_parallel_split_mode", nullptr, kPipelineSetting, {}, k2407},
      {"experimental.pipeline_parallel_degree", nullptr, kPipeline, "1", k2024},
      {"parallelism.expert_parallel_degree", nullptr, "expert parallelism is not planned", "1",
       k2508},
      {"parallelism.expert_tensor_parallel_degree", nullptr, "expert parallelism is not planned",
       "1", k2508},
      {"experimental.custom_import", no_custom_code, {}, {}, k2025},
      {"experimental.custom_args_module", no_custom_code, {}, {}, k2025},
      {"activation_checkpoint.mode", hold},
      {"activation_checkpoint.selective_ac_option", hold},
      {"activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
       nullptr,
       "the op policy's saved list is train-plan's torchtitan:op",
       {},
       k2508},
      {"activation_checkpoint.early_stop", nullptr, "early stop is not modelled", "false", k2508},
      {"float8.enable_float8_linear", float8_linear, {}, {}, k2024},
      {"float8.enable_fsdp_float8_all_gather", hold},
      {"float8.precompute_float8_dynamic_scale_for_fsdp", nullptr, "a scale, a scalar per weight"},
      {"float8.scaling_type_input", nullptr, "--float8 plans dynamic scaling", "dynamic", k2024},
      {"float8.scaling_type_weight", nullptr, "--float8 plans dynamic scaling", "dynamic", k2024},
      {"float8.scaling_type_grad_output", nullptr, "--float8 plans dynamic scaling", "dynamic",
       k2024},
      {"float8.recipe_name", hold, {}, {}, k2025},
      {"float8.filter_fqns",
       nullptr,
       "--float8 converts the blocks' linear layers; the head stays as computed",
       {},
       k2025},
      {"float8.emulate", nullptr, "emulation is not planned", "false", k2025},
      {"float8.moe_fqns_prototype", nullptr, "MoE float8 is not planned", {}, k2025},
  };
}

const std::vector<Key>& keys() {
  static const std::vector<Key> k = [] {
    std::vector<Key> all = other_keys();
    for (const auto& part : {training_keys(), parallelism_keys()}) {
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }();
  return k;
}

std::vector<Entry> defaults(std::string_view stack) {
  const unsigned v = version_of(stack);
  return {
      text_entry("activation_checkpoint.mode", "selective"),
      text_entry("activation_checkpoint.selective_ac_option", "2"),
      bool_entry("float8.enable_fsdp_float8_all_gather", false),
      int_entry((v & k2024) != 0 ? "training.batch_size" : "training.local_batch_size", 8),
      int_entry("training.seq_len", 2048),
      int_entry(v == k2407   ? "training.data_parallel_degree"
                : v == k2412 ? "training.data_parallel_shard_degree"
                             : "parallelism.data_parallel_shard_degree",
                -1),
  };
}

// With float8 on: float8.recipe_name (2025; unset: tensorwise) and
// enable_fsdp_float8_all_gather (Float8Converter / Float8Handler).
void finish_float8(Reading& r) {
  const auto& settings = r.out().settings;
  const bool float8 = std::any_of(settings.begin(), settings.end(),
                                  [](const StackConfig::Setting& s) { return s.option == "--float8"; });
  const Entry& gather = *r.held("float8.enable_fsdp_float8_all_gather");
  const Entry* recipe = r.held("float8.recipe_name");
  if (!float8) {
    for (const Entry* e : {&gather, recipe}) {
      if (e != nullptr && e->line > 0) r.out().ignored.push_back(Reading::said(*e) + " (no float8)");
    }
    return;
  }
  if (recipe != nullptr) {
    if (r.boolean(gather)) {
      r.fail(gather, "torchtitan's Float8Converter asserts that enable_fsdp_float8_all_gather is "
                     "not used together with recipe_name (torchao gathers a rowwise-scaled "
                     "weight in high precision)");
    }
    try {
      r.set(*recipe, "--float8-recipe", std::string(name(parse_float8_recipe(r.text(*recipe)))));
    } catch (const SpecError& e) {
      r.fail(*recipe, e.what());
    }
  }
  r.set(gather, "--float8-all-gather", r.boolean(gather) ? "float8" : "bf16");
}

// activation_checkpoint.mode with selective_ac_option: torchtitan's apply_ac.
void finish(Reading& r, std::string_view) {
  finish_float8(r);
  const Entry& mode = *r.held("activation_checkpoint.mode");
  const Entry& option = *r.held("activation_checkpoint.selective_ac_option");
  const std::string& m = r.text(mode);
  const std::string keys = Reading::said(mode) + ", " + Reading::said(option);
  if (m == "none") return r.set_from(Reading::said(mode), "--remat", "none");
  if (m == "full") return r.set_from(Reading::said(mode), "--remat", "torchtitan:full");
  if (m != "selective") r.fail(mode, "expected none, selective or full");
  const std::string& o = r.text(option);
  if (o == "op") return r.set_from(keys, "--remat", "torchtitan:op");
  const std::int64_t every = r.integer(option);  // every k-th block, whole
  if (every < 1) r.fail(option, "expected op or a positive number of blocks");
  r.set_from(keys, "--remat", "torchtitan:full");
  if (every > 1) r.set_from(keys, "--remat-blocks", fmt::format("every:{}", every));
}

// Whether the dtypes are FSDP2's mixed precision (mixed_precision_param "bfloat16"); false:
// float32 throughout; SpecError for others.
bool fsdp2_precision(std::string_view stack, const TrainPlanOptions& o) {
  const bool f32 = o.param_dtype == DType::kF32 && o.grad_dtype == DType::kF32 &&
                   o.optimizer_dtype == DType::kF32 &&
                   o.master_dtype.value_or(DType::kF32) == DType::kF32 &&
                   o.reduce_dtype.value_or(DType::kF32) == DType::kF32;
  const bool fsdp2 = o.param_dtype == DType::kBF16 && o.master_dtype == DType::kF32 &&
                     o.reduce_dtype == DType::kF32 && o.grad_dtype == DType::kF32 &&
                     o.optimizer_dtype == DType::kF32;
  if (!f32 && !fsdp2) {
    throw SpecError(fmt::format(
        "[stack-config] --emit-config for {}: the dtypes (param {}, grad {}, optimizer {}) are "
        "not FSDP2's mixed precision (--mixed-precision fsdp2) or float32",
        stack, name(o.param_dtype), name(o.grad_dtype), name(o.optimizer_dtype)));
  }
  return fsdp2;
}

// [activation_checkpoint]'s keys for the plan's remat (apply_ac's modes).
std::string ac_table(std::string_view stack, const TrainPlanOptions& o) {
  std::string ac;
  const std::string remat = remat_name(o.remat);
  const std::string blocks = remat_blocks_name(o.remat_blocks);
  if (!o.remat && !o.recompute) {
    ac = "mode = \"none\"";
  } else if (remat == "torchtitan:op" && blocks == "all") {
    ac = "mode = \"selective\"\nselective_ac_option = \"op\"";
  } else if ((remat == "torchtitan:full" || remat == "full" || o.recompute) &&
             (blocks == "all" || o.remat_blocks.kind == RematBlocks::Kind::kEvery)) {
    ac = blocks == "all"
             ? "mode = \"full\""
             : fmt::format("mode = \"selective\"\nselective_ac_option = \"{}\"", blocks.substr(6));
  } else {
    throw SpecError(
        fmt::format("[stack-config] --emit-config for {}: --remat {} --remat-blocks {} "
                    "is not one of its checkpointing modes (none, full, selective op "
                    "or every k blocks)",
                    stack, remat, blocks));
  }
  return ac;
}

// [float8]'s recipe and all-gather keys for a float8 plan (what finish_float8 reads back).
std::string float8_table(std::string_view stack, const TrainPlanOptions& o) {
  const Float8Scaling recipe = o.float8_recipe.value_or(Float8Scaling::kTensorwise);
  const bool in_float8 = effective_float8_gather(o) == Float8Gather::kFloat8;
  const bool k2024_stack = (version_of(stack) & k2024) != 0;
  if (recipe != Float8Scaling::kTensorwise && k2024_stack) {
    throw SpecError(fmt::format("[stack-config] --emit-config for {}: --float8-recipe {} has no "
                                "key in its config (float8.recipe_name came in 2025-02, "
                                "pytorch/torchtitan#808)",
                                stack, name(recipe)));
  }
  std::string out = k2024_stack ? "" : "\n[float8]\n";
  out += fmt::format("enable_fsdp_float8_all_gather = {}\n", in_float8 ? "true" : "false");
  if (recipe != Float8Scaling::kTensorwise) {
    out += fmt::format("recipe_name = \"{}\"\n", name(recipe));
  }
  return out;
}

std::string emit(std::string_view stack, const TrainPlanOptions& o, const Mesh& mesh,
                 std::int64_t data_parallel, bool) {
  const unsigned v = version_of(stack);
  require_stack_defaults(stack, o,
                         kSaysEager | kSaysFloat8 | kSaysAsyncTp |
                             ((v & k2025) != 0 ? kSaysReshard : 0u));
  auto deg = mesh_degrees(stack, mesh,
                          v == k2407 ? std::vector<std::string_view>{"fsdp", "tp"}
                                     : std::vector<std::string_view>{"dp", "fsdp", "tp", "cp"});
  if ((v & k2024) != 0 && o.grad_accum != 1) {
    throw SpecError(
        fmt::format("[stack-config] --emit-config for {}: --grad-accum {} has no key "
                    "in its config (gradient accumulation came in 2025)",
                    stack, o.grad_accum));
  }
  const std::int64_t local = per_rank_batch(stack, o, data_parallel, "data-parallel ranks");
  const bool fsdp2 = fsdp2_precision(stack, o);
  const std::string ac = ac_table(stack, o);
  if (o.optimizer == OptimizerKind::kSgd) {
    throw SpecError(fmt::format(
        "[stack-config] --emit-config for {}: --optimizer sgd is not one of its optimizers "
        "(AdamW, Adam)",
        stack));
  }
  const auto degree = [&](const char* a) { return deg.count(a) ? deg[a] : 1; };
  std::string out = fmt::format(
      "# torchtitan job config for {} written by shardplan train-plan --emit-config\n"
      "# [model] name and flavor: the model planned (train-plan --config)\n\n",
      stack);
  const std::string table = (v & k2024) != 0 ? "training" : "parallelism";
  out += "[training]\n";
  out += fmt::format("{} = {}\n", (v & k2024) != 0 ? "batch_size" : "local_batch_size", local);
  if ((v & k2025) != 0) out += fmt::format("global_batch_size = {}\n", o.batch);
  out += fmt::format("seq_len = {}\n", o.seq);
  out += fmt::format("mixed_precision_param = \"{}\"\n", fsdp2 ? "bfloat16" : "float32");
  if (v != k2508) out += fmt::format("compile = {}\n", o.eager ? "false" : "true");
  if (v == k2407) {
    out += fmt::format("data_parallel_degree = {}\ntensor_parallel_degree = {}\n", degree("fsdp"),
                       degree("tp"));
  } else {
    if (table == "parallelism") out += "\n[parallelism]\n";
    out += fmt::format(
        "data_parallel_replicate_degree = {}\ndata_parallel_shard_degree = {}\n"
        "tensor_parallel_degree = {}\n",
        degree("dp"), degree("fsdp"), degree("tp"));
    if (v == k2412) out += fmt::format("\n[experimental]\n");
    out += fmt::format("context_parallel_degree = {}\n", degree("cp"));
    if ((v & k2025) != 0) {
      out += fmt::format("fsdp_reshard_after_forward = \"{}\"\n",
                         o.reshard_after_forward ? "default" : "never");
    }
    if (o.async_tp) out += "enable_async_tensor_parallel = true\n";
  }
  if (v == k2407 && o.async_tp) out += "\n[experimental]\nenable_async_tensor_parallel = true\n";
  if (v == k2508) out += fmt::format("\n[compile]\nenable = {}\n", o.eager ? "false" : "true");
  out += fmt::format("\n[activation_checkpoint]\n{}\n", ac);
  if ((v & k2024) != 0) {
    out += fmt::format("\n[float8]\nenable_float8_linear = {}\n", o.float8 ? "true" : "false");
  } else {
    out += fmt::format("\n[model]\nconverters = [{}]\n", o.float8 ? "\"float8\"" : "");
  }
  if (o.float8) out += float8_table(stack, o);
  out += fmt::format("\n[optimizer]\nname = \"{}\"\n",
                     o.optimizer == OptimizerKind::kAdamw ? "AdamW" : "Adam");
  return out;
}

}  // namespace

const Dialect& torchtitan_dialect() {
  static const Dialect d{
      .format = "torchtitan TOML",
      .serves = [](std::string_view s) { return s.starts_with("torchtitan-"); },
      .extensions = {".toml"},
      .inferred_stack = "torchtitan-2025-08",
      .parse = parse,
      .keys = keys,
      .version = version_of,
      .defaults = defaults,
      .finish = finish,
      .emit = emit,
  };
  return d;
}

}  // namespace shardplan::train::stack_config
