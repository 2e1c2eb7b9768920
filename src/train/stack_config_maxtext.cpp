// MaxText's YAML config as a stack config (stack_config.hpp): the keys and defaults of
// AI-Hypercomputer/maxtext@e591f30 src/maxtext/configs/base.yml; the global batch is
// int(devices x per_device_batch_size) x gradient_accumulation_steps
// (src/maxtext/configs/types.py: calculate_global_batch_sizes). Read with yaml-cpp.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>

#include "../formats/yaml_input.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "stack_config_impl.hpp"

namespace shardplan::train::stack_config {
namespace {

std::vector<Entry> parse(std::string_view text, std::string_view source) {
  detail::check_yaml_depth(text, "stack-config", source);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::ParserException& e) {
    throw IoError(fmt::format("[stack-config] {}:{}: not valid YAML: {}", detail::printable(source),
                              e.mark.line + 1, e.msg));
  } catch (const YAML::Exception& e) {
    throw IoError(
        fmt::format("[stack-config] {}: not valid YAML: {}", detail::printable(source), e.what()));
  }
  if (root.IsNull()) return {};
  if (!root.IsMap()) {
    throw IoError(fmt::format("[stack-config] {}:{}: expected a mapping of keys to values",
                              detail::printable(source), root.Mark().line + 1));
  }
  std::vector<Entry> out;
  for (const auto& kv : root) {
    Entry e{.key = kv.first.Scalar(), .line = kv.first.Mark().line + 1};
    const YAML::Node& v = kv.second;
    if (v.IsScalar()) {
      e.kind = Entry::Kind::kText, e.text = v.Scalar();
    } else if (v.IsSequence() &&
               std::all_of(v.begin(), v.end(), [](const YAML::Node& x) { return x.IsScalar(); })) {
      e.kind = Entry::Kind::kList;
      for (const YAML::Node& x : v) e.list.push_back(x.Scalar());
    } else {
      e.kind = Entry::Kind::kOther, e.text = v.IsMap() ? "(a mapping)" : "(a list)";
    }
    out.push_back(std::move(e));
  }
  return out;
}

void per_device(const Entry& e, Reading& r) {
  const double b = r.number(e);
  if (!(b > 0)) r.fail(e, "expected a positive number of sequences per device");
  r.out().local_batch = b;
  r.out().local_batch_per_device = true;
  r.out().batch_keys += (r.out().batch_keys.empty() ? "" : ", ") + Reading::said(e);
}
void accumulation(const Entry& e, Reading& r) {
  const std::int64_t n = r.integer(e);
  if (n < 1) r.fail(e, "expected at least 1 micro-batch");
  r.out().grad_accum = n;
  r.out().batch_keys += (r.out().batch_keys.empty() ? "" : ", ") + Reading::said(e);
}
void seq(const Entry& e, Reading& r) {
  if (r.integer(e) < 1) r.fail(e, "expected at least 1 token");
  r.set(e, "--seq", std::to_string(r.integer(e)));
}
void dp(const Entry& e, Reading& r) { r.axis(e, "dp"); }
void fsdp(const Entry& e, Reading& r) { r.axis(e, "fsdp"); }
void tp(const Entry& e, Reading& r) { r.axis(e, "tp"); }
void cp(const Entry& e, Reading& r) { r.axis(e, "cp"); }
void hold(const Entry& e, Reading& r) { r.hold(e); }
// One slice: a DCN (between slices) degree of 1, or -1 (the slices: one).
void one_slice(const Entry& e, Reading& r) {
  const std::int64_t n = r.integer(e);
  if (n != 1 && n != -1) r.fail(e, "more than one slice is not planned (1 or -1)");
  r.out().ignored.push_back(Reading::said(e) + " (one slice)");
}
void remat(const Entry& e, Reading& r) {
  const std::string name = "maxtext:" + r.text(e);
  try {
    (void)parse_remat(name);
  } catch (const SpecError& x) {
    r.fail(e, x.what());
  }
  r.set(e, "--remat", name);
}
void optimizer(const Entry& e, Reading& r) {
  const std::string& v = r.text(e);
  if (v != "adamw" && v != "sgd") r.fail(e, "expected adamw or sgd (adam_pax, muon: not planned)");
  r.set(e, "--optimizer", v);
}
void attention(const Entry& e, Reading& r) {
  const std::string& v = r.text(e);
  if (v == "dot_product") return r.set(e, "--attention", "naive");
  if (v != "autoselected" && v != "flash" && v != "cudnn_flash_te" && v != "cudnn_flash_jax") {
    r.fail(e, "expected autoselected, dot_product, flash, cudnn_flash_te or cudnn_flash_jax");
  }
  r.set(e, "--attention", "fused");
}

constexpr std::string_view kModel = "the model is --config's";
constexpr std::string_view kNotStep = "not part of a training step's memory or time";
constexpr std::string_view kValue = "a value of the update, not its size or time";
constexpr std::string_view kAxis = "only this axis's degree 1 is planned";

const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      {"per_device_batch_size", per_device},
      {"gradient_accumulation_steps", accumulation},
      {"max_target_length", seq},
      {"ici_data_parallelism", dp},
      {"ici_fsdp_parallelism", fsdp},
      {"ici_tensor_parallelism", tp},
      {"ici_context_parallelism", cp},
      {"ici_diloco_parallelism", nullptr, kAxis, "1"},
      {"ici_fsdp_transpose_parallelism", nullptr, kAxis, "1"},
      {"ici_sequence_parallelism", nullptr, kAxis, "1"},
      {"ici_context_usp_ulysses_parallelism", nullptr, kAxis, "1"},
      {"ici_context_autoregressive_parallelism", nullptr, kAxis, "1"},
      {"ici_tensor_sequence_parallelism", nullptr, kAxis, "1"},
      {"ici_autoregressive_parallelism", nullptr, kAxis, "1"},
      {"ici_pipeline_parallelism", nullptr, kAxis, "1"},
      {"ici_expert_parallelism", nullptr, kAxis, "1"},
      {"dcn_data_parallelism", one_slice},
      {"num_slices", one_slice},
      {"dcn_diloco_parallelism", nullptr, kAxis, "1"},
      {"dcn_fsdp_parallelism", nullptr, kAxis, "1"},
      {"dcn_fsdp_transpose_parallelism", nullptr, kAxis, "1"},
      {"dcn_sequence_parallelism", nullptr, kAxis, "1"},
      {"dcn_context_parallelism", nullptr, kAxis, "1"},
      {"dcn_tensor_parallelism", nullptr, kAxis, "1"},
      {"dcn_pipeline_parallelism", nullptr, kAxis, "1"},
      {"dcn_expert_parallelism", nullptr, kAxis, "1"},
      {"dcn_autoregressive_parallelism", nullptr, kAxis, "1"},
      {"dtype", hold},
      {"weight_dtype", hold},
      {"grad_dtype", hold},
      {"mu_dtype", hold},
      {"remat_policy", remat},
      {"opt_type", optimizer},
      {"attention", attention},
      {"quantization", nullptr, "quantized training is not planned", ""},
      {"cast_logits_to_fp32", nullptr, "the loss on float32 logits, as the stack's loss choice",
       "true"},
      {"num_vocab_tiling", nullptr, "the logits whole, as the stack's loss choice", "1"},
      {"scan_layers", nullptr, "a compilation choice: the layers are planned one by one"},
      {"base_config", nullptr, "the keys given here are read; the rest are base.yml's"},
      {"run_name", nullptr, kNotStep},
      {"base_output_directory", nullptr, kNotStep},
      {"model_name", nullptr, kModel},
      {"hardware", nullptr, "the hardware is train-plan's --hardware"},
      {"steps", nullptr, kNotStep},
      {"log_period", nullptr, kNotStep},
      {"enable_checkpointing", nullptr, kNotStep},
      {"async_checkpointing", nullptr, kNotStep},
      {"checkpoint_period", nullptr, kNotStep},
      {"load_parameters_path", nullptr, kNotStep},
      {"dataset_type", nullptr, kNotStep},
      {"dataset_path", nullptr, kNotStep},
      {"tokenizer_path", nullptr, kNotStep},
      {"profiler", nullptr, kNotStep},
      {"enable_dropout", nullptr, kValue},
      {"learning_rate", nullptr, kValue},
      {"adam_b1", nullptr, kValue},
      {"adam_b2", nullptr, kValue},
      {"adam_eps", nullptr, kValue},
      {"adam_weight_decay", nullptr, kValue},
      {"gradient_clipping_threshold", nullptr, "gradient clipping: a norm, a scalar"},
      {"base_emb_dim", nullptr, kModel},
      {"base_num_query_heads", nullptr, kModel},
      {"base_num_kv_heads", nullptr, kModel},
      {"base_mlp_dim", nullptr, kModel},
      {"base_num_decoder_layers", nullptr, kModel},
      {"head_dim", nullptr, kModel},
      {"vocab_size", nullptr, kModel},
      {"decoder_block", nullptr, kModel},
      {"mlp_activations", nullptr, kModel},
      {"logits_via_embedding", nullptr, kModel},
      {"normalization_layer_epsilon", nullptr, kModel},
      {"rope_max_timescale", nullptr, kModel},
  };
  return k;
}

std::vector<Entry> defaults(std::string_view) {
  return {text_entry("ici_fsdp_parallelism", "-1"),
          text_entry("dtype", "bfloat16"),
          text_entry("weight_dtype", "float32"),
          text_entry("grad_dtype", "float32"),
          text_entry("mu_dtype", ""),
          text_entry("remat_policy", "full"),
          text_entry("per_device_batch_size", "12.0"),
          text_entry("max_target_length", "2048")};
}

// The dtypes: dtype computes, weight_dtype holds and updates (cast for use when they differ),
// grad_dtype, mu_dtype (empty: weight_dtype's) the optimizer state.
void finish(Reading& r, std::string_view) {
  const Entry& dtype = *r.held("dtype");
  const Entry& weight = *r.held("weight_dtype");
  const Entry& grad = *r.held("grad_dtype");
  const Entry& mu = *r.held("mu_dtype");
  const auto dt = [&](const Entry& e) {
    std::string d = short_dtype(r.text(e));
    if (d.empty()) r.fail(e, "expected bfloat16 or float32");
    return d;
  };
  const std::string keys =
      fmt::format("{}, {}, {}, {}", Reading::said(dtype), Reading::said(weight),
                  Reading::said(grad), Reading::said(mu));
  const std::string compute = dt(dtype), held = dt(weight);
  r.set_from(keys, "--param-dtype", compute);
  if (held != compute) r.set_from(keys, "--master-dtype", held);
  r.set_from(keys, "--grad-dtype", dt(grad));
  r.set_from(keys, "--optimizer-dtype", r.text(mu).empty() ? held : dt(mu));
}

std::string emit(std::string_view stack, const TrainPlanOptions& o, const Mesh& mesh, std::int64_t,
                 bool) {
  require_stack_defaults(stack, o, 0);
  auto deg = mesh_degrees(stack, mesh, {"dp", "fsdp", "tp", "cp"});
  if (o.batch % o.grad_accum != 0) {
    throw SpecError(
        fmt::format("[stack-config] --emit-config for {}: the batch of {} does not "
                    "split into {} micro-batches",
                    stack, o.batch, o.grad_accum));
  }
  const std::int64_t micro = o.batch / o.grad_accum;
  const double per_device = static_cast<double>(micro) / static_cast<double>(mesh.size());
  const std::string per_text = fmt::format("{}", per_device);  // shortest that reads back
  if (per_device * static_cast<double>(mesh.size()) != static_cast<double>(micro)) {
    throw SpecError(
        fmt::format("[stack-config] --emit-config for {}: a micro-batch of {} over {} "
                    "devices is no per_device_batch_size",
                    stack, micro, mesh.size()));
  }
  // maxtext:full is the policy "full" (nothing saved but the layer's input).
  const std::string remat = o.recompute && !o.remat ? "full" : remat_name(o.remat);
  const std::string policy =
      remat == "full" ? remat : remat.substr(std::min<std::size_t>(8, remat.size()));
  if ((remat != "full" && !remat.starts_with("maxtext:")) ||
      o.remat_blocks.kind != RematBlocks::Kind::kAll) {
    throw SpecError(
        fmt::format("[stack-config] --emit-config for {}: --remat {} --remat-blocks "
                    "{} is not one of its remat_policy names (--remat maxtext:NAME "
                    "on every layer)",
                    stack, remat, remat_blocks_name(o.remat_blocks)));
  }
  if (o.optimizer == OptimizerKind::kAdam) {
    throw SpecError(fmt::format(
        "[stack-config] --emit-config for {}: --optimizer adam is not one of its opt_type names",
        stack));
  }
  const DType held = o.master_dtype.value_or(o.param_dtype);
  if ((o.reduce_dtype && *o.reduce_dtype != o.grad_dtype) ||
      (o.param_dtype != DType::kBF16 && o.param_dtype != DType::kF32) ||
      (held != DType::kBF16 && held != DType::kF32) ||
      (o.grad_dtype != DType::kBF16 && o.grad_dtype != DType::kF32) ||
      (o.optimizer_dtype != DType::kBF16 && o.optimizer_dtype != DType::kF32)) {
    throw SpecError(
        fmt::format("[stack-config] --emit-config for {}: the dtypes are not "
                    "MaxText's (bfloat16 or float32 each, gradients reduced as held)",
                    stack));
  }
  const auto degree = [&](const char* a) { return deg.count(a) ? deg[a] : 1; };
  std::string out = fmt::format(
      "# MaxText config for {} written by shardplan train-plan --emit-config (base_config:\n"
      "# base.yml's other keys; the model is train-plan's --config)\n",
      stack);
  out += fmt::format(
      "per_device_batch_size: {}\ngradient_accumulation_steps: {}\n"
      "max_target_length: {}\n",
      per_text, o.grad_accum, o.seq);
  out += fmt::format(
      "ici_data_parallelism: {}\nici_fsdp_parallelism: {}\n"
      "ici_context_parallelism: {}\nici_tensor_parallelism: {}\n",
      degree("dp"), degree("fsdp"), degree("cp"), degree("tp"));
  out += fmt::format("dtype: \"{}\"\nweight_dtype: \"{}\"\ngrad_dtype: \"{}\"\nmu_dtype: \"{}\"\n",
                     long_dtype(o.param_dtype), long_dtype(held), long_dtype(o.grad_dtype),
                     long_dtype(o.optimizer_dtype));
  out += fmt::format("remat_policy: \"{}\"\nopt_type: \"{}\"\n", policy, name(o.optimizer));
  return out;
}

}  // namespace

const Dialect& maxtext_dialect() {
  static const Dialect d{
      .format = "MaxText YAML",
      .serves = [](std::string_view s) { return s == "maxtext"; },
      .extensions = {".yml", ".yaml"},
      .inferred_stack = "maxtext",
      .parse = parse,
      .keys = keys,
      .version = [](std::string_view) { return 1u; },
      .defaults = defaults,
      .finish = finish,
      .emit = emit,
  };
  return d;
}

}  // namespace shardplan::train::stack_config
