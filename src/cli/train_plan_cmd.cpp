#include "train_plan_cmd.hpp"

#include <fmt/format.h>

#include <iostream>

#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/train_plan.hpp"
#include "usage_error.hpp"

namespace shardplan::cli {
namespace {

/// The preset written for the family's layout, used when no --rules is given.
const char* default_preset(ModelFamily family) {
  switch (family) {
    case ModelFamily::kGpt2:
      return "gpt2";
    case ModelFamily::kMixtral:
      return "mixtral_ep";
    case ModelFamily::kT5:
      return "t5";
    case ModelFamily::kLlama:
      break;
  }
  return "llama_fsdp_tp";
}

DType dtype_option(const char* option, const std::string& text) {
  try {
    return parse_dtype(text);
  } catch (const Error& e) {
    throw UsageError(fmt::format("{}: {}", option, e.what()));
  }
}

}  // namespace

TrainPlanCommand& add_train_plan_command(CLI::App& app, TrainPlanCommand& c,
                                         std::int64_t max_devices) {
  c.command = app.add_subcommand(
      "train-plan",
      "Size one training step (forward, loss, backward, optimizer) of a Hugging Face model on a "
      "mesh: memory per device, FLOPs, bytes moved, whether it fits");
  CLI::App* t = c.command;
  t->add_option(
       "--config,-c", c.config,
       "A Hugging Face config.json, or a checkpoint directory holding one (model types "
       "llama, mistral, qwen2, mixtral, gpt2, t5). Example: --config Meta-Llama-3-70B/config.json")
      ->required();
  t->add_option("--mesh", c.meshes,
                "Mesh axes as name:size (one size may be -1). Repeat it with --compare. Default: "
                "the rule file's mesh. Example: --mesh fsdp:64,tp:8");
  t->add_option("--devices,-n", c.devices,
                fmt::format("Number of devices, 1 to {}. Default: the mesh's size when every "
                            "axis size is given",
                            max_devices))
      ->check(CLI::Range(std::int64_t{1}, max_devices));
  t->add_option("--rules,-r", c.rules,
                "A YAML rule file or preset:NAME. Repeat it with --compare. Default: the "
                "family's preset (llama_fsdp_tp, mixtral_ep, gpt2, t5)");
  t->add_option("--batch,-b", c.batch, "Sequences per step (the global batch)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  t->add_option("--seq,-s", c.seq, "Tokens per sequence")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30))
      ->capture_default_str();
  t->add_option("--target-seq", c.target_seq,
                "T5: the decoder's tokens per sequence (--seq is the encoder's). Default: --seq")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  t->add_option("--optimizer", c.optimizer, "sgd, adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  t->add_option("--param-dtype", c.param_dtype, "The weights' dtype (the forward computes in it)")
      ->capture_default_str();
  t->add_option("--grad-dtype", c.grad_dtype, "The gradients' dtype. Default: --param-dtype");
  t->add_option("--optimizer-dtype", c.optimizer_dtype,
                "The optimizer state's dtype (the update runs in it)")
      ->capture_default_str();
  t->add_option("--grad-accum", c.grad_accum,
                "Micro-batches per step (the batch splits evenly; activations of one at a time)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  t->add_flag("--recompute", c.recompute,
              "Recompute each layer's activations in the backward pass (keep only layer inputs)");
  t->add_option("--batch-axes", c.batch_axes,
                "Mesh axes the batch is split over, comma-separated. Default: every axis except "
                "tp, model, mp, tensor");
  t->add_option("--device-memory", c.device_memory,
                "Memory of one device, to say whether the step fits. Example: 80GiB");
  t->add_option("--headroom", c.headroom,
                "Fraction of --device-memory kept free (runtime, fragmentation)")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  t->add_flag("--json", c.json, "Print JSON (schema in docs/cli.md)");
  t->add_flag("--compare", c.compare,
              "Plan every --mesh with every --rules, one row each, and name the cheapest that "
              "fits (fewest bytes moved per step)");
  return c;
}

int run_train_plan(
    const TrainPlanCommand& c, const std::function<RuleFile(const std::string&)>& load_rules,
    const std::function<std::int64_t(const std::string&, std::int64_t)>& devices_for) {
  const ModelConfig config = [&] {
    if (!std::filesystem::exists(c.config)) {
      throw UsageError(fmt::format("--config: no such file or directory '{}'", c.config));
    }
    return ModelConfig::load(c.config);
  }();
  if (!c.compare && (c.meshes.size() > 1 || c.rules.size() > 1)) {
    throw UsageError("--mesh and --rules are given once each, unless --compare is on");
  }
  TrainPlanOptions o;
  o.batch = c.batch;
  o.seq = c.seq;
  o.target_seq = c.target_seq;
  o.optimizer = parse_optimizer(c.optimizer);
  o.param_dtype = dtype_option("--param-dtype", c.param_dtype);
  o.grad_dtype = c.grad_dtype.empty() ? o.param_dtype : dtype_option("--grad-dtype", c.grad_dtype);
  o.optimizer_dtype = dtype_option("--optimizer-dtype", c.optimizer_dtype);
  for (const auto& [option, dtype] : {std::pair{"--param-dtype", o.param_dtype},
                                      {"--grad-dtype", o.grad_dtype},
                                      {"--optimizer-dtype", o.optimizer_dtype}}) {
    if (!is_floating(dtype) || size_of(dtype) < 2) {
      throw UsageError(
          fmt::format("{}: {} is not a training dtype (bf16, f16, f32, f64)", option, name(dtype)));
    }
  }
  o.grad_accum = c.grad_accum;
  o.recompute = c.recompute;
  if (!c.batch_axes.empty()) {
    std::size_t from = 0;
    while (from <= c.batch_axes.size()) {
      const std::size_t end = std::min(c.batch_axes.find(',', from), c.batch_axes.size());
      o.batch_axes.push_back(c.batch_axes.substr(from, end - from));
      from = end + 1;
    }
  }
  if (!c.device_memory.empty()) {
    try {
      o.device_memory = parse_bytes(c.device_memory);
    } catch (const Error& e) {
      throw UsageError(fmt::format("--device-memory: {}", e.what()));
    }
  }
  o.headroom = c.headroom;

  const std::vector<std::string> rule_names =
      c.rules.empty()
          ? std::vector<std::string>{std::string("preset:") + default_preset(config.family)}
          : c.rules;
  std::vector<TrainPlan> plans;
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
    const std::string rules_label = rules_name.rfind("preset:", 0) == 0 ? rules_name : file.source;
    for (const std::string& mesh_text : meshes) {
      const Mesh mesh = Mesh::parse(mesh_text, devices_for(mesh_text, c.devices));
      TrainPlan p;
      try {
        p = plan_training(config, mesh, rule, o);
      } catch (const Error& e) {
        if (!c.compare) throw;
        // One configuration that cannot be planned is a row of the comparison, not its end.
        p.mesh = mesh.to_string();
        p.devices = mesh.size();
        p.error = e.what();
      }
      p.rules = rules_label;
      plans.push_back(std::move(p));
    }
  }
  if (c.compare) {
    if (c.json) {
      write_compare_json(std::cout, plans);
      std::cout << "\n";
    } else {
      std::cout << compare_table(plans);
    }
    return 0;
  }
  if (c.json) {
    plans.front().write_json(std::cout);
    std::cout << "\n";
  } else {
    std::cout << plans.front().table();
  }
  return 0;
}

}  // namespace shardplan::cli
