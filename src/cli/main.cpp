// The `shardplan` command: plans checkpoints against rule files, draws shardings, lists presets.
// Exit codes: 0 success, 1 the plan (or its input) failed, 2 bad usage.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <future>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "../formats/input_file.hpp"
#include "../formats/output_file.hpp"
#include "checkpoint_cmd.hpp"
#include "example_cmd.hpp"
#include "example_model.hpp"
#include "input_path_option.hpp"
#include "output_path_option.hpp"
#include "trace_cmd.hpp"
#include "train_plan_cmd.hpp"
#include "usage_error.hpp"
#include "shardplan/checkpoint.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/plan_html.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/train_plan.hpp"
#include "shardplan/tensor_spec.hpp"

namespace {

using namespace shardplan;

constexpr int kOk = 0;
constexpr int kFailed = 1;
constexpr int kUsage = 2;
constexpr const char* kDefaultPreset = "llama_fsdp_tp";
constexpr const char* kDefaultMesh = "fsdp:-1,tp:2";
constexpr std::int64_t kMaxDevices = Mesh::kMaxDevices;

using cli::UsageError;

struct PlanOptions {
  std::string model;
  std::string mesh;
  std::int64_t devices = 0;  // 0: the mesh's size when every axis size is given, else 8
  std::string rules;
  bool json = false;
  bool summary = false;
  std::string explain;
  int largest = 5;
  std::string html;  // also write the report as an HTML page to this file
};

RuleFile load_rules(const std::string& rules) {
  if (rules.empty()) return load_preset(kDefaultPreset);
  if (rules.rfind("preset:", 0) == 0) {
    const std::string name = rules.substr(7);
    try {
      preset_text(name);
    } catch (const IoError& e) {
      throw UsageError(e.what());
    }
    return load_preset(name);
  }
  cli::require_input("--rules", rules,
                     " (use preset:NAME for a built-in preset; `shardplan presets` lists them)");
  return load_rule_file(rules);
}

Tree<TensorSpec> load_data(const std::string& model) {
  if (model.empty()) return tree_from_names(cli::llama2_7b_tensors());
  cli::require_input("--model", model);
  std::error_code ec;
  if (std::filesystem::is_directory(model, ec)) {
    // A checkpoint that shardplan saved names its tensors as its record says (tree paths, or
    // dotted names): read them as `checkpoint reshard` and restore do, not as dotted names.
    if (std::filesystem::is_regular_file(
            std::filesystem::path(model) / "model.safetensors.index.json", ec)) {
      const CheckpointInfo info = read_checkpoint_info(model);
      if (info.shardplan) {
        std::vector<std::pair<std::string, TensorSpec>> named;
        for (const CheckpointTensor& t : info.tensors) named.emplace_back(t.name, t.spec);
        return tree_from_names(named, info.name_separator);
      }
    }
    // A Hugging Face checkpoint directory: the index of a sharded checkpoint, else the one file
    // (or one stat cannot tell, a link loop: the reader names it).
    for (const char* name : {"model.safetensors.index.json", "model.safetensors"}) {
      const std::filesystem::path file = std::filesystem::path(model) / name;
      const auto st = std::filesystem::status(file, ec);
      if (std::filesystem::is_regular_file(st) ||
          (ec && st.type() != std::filesystem::file_type::not_found)) {
        return load_model(file.string());
      }
    }
    throw UsageError(
        fmt::format("--model: the directory '{}' holds neither "
                    "model.safetensors.index.json nor model.safetensors",
                    model));
  }
  return load_model(model);
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const auto stop = text.find(sep, start);
    out.push_back(text.substr(start, stop == std::string::npos ? std::string::npos : stop - start));
    if (stop == std::string::npos) return out;
    start = stop + 1;
  }
}

/// The device count for `mesh`: `devices` when given (> 0), else the product of the mesh's axis
/// sizes ("x:4,y:2": 8). When an axis has no size (-1, or not a number): `fallback` when > 0,
/// else a UsageError asking for every size or --devices. A product over the device limit is a
/// UsageError naming the limit.
std::int64_t devices_for(const std::string& mesh, std::int64_t devices, std::int64_t fallback) {
  if (devices > 0) return devices;
  std::int64_t product = 1;
  for (const std::string& entry : split(mesh, ',')) {
    const auto colon = entry.find(':');
    const std::string size = colon == std::string::npos ? entry : entry.substr(colon + 1);
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), v);
    const bool whole = end == size.data() + size.size();
    if (whole && (ec == std::errc::result_out_of_range || (ec == std::errc() && v > kMaxDevices))) {
      throw UsageError(fmt::format("--mesh '{}': axis size {} is more than the limit of {} devices",
                                   mesh, size, kMaxDevices));
    }
    if (!whole || ec != std::errc() || v <= 0) {
      if (fallback > 0) return fallback;
      throw UsageError(
          fmt::format("--mesh '{}': give every axis size, or --devices to infer a -1", mesh));
    }
    // Both factors are at most 2^20: the product fits before it is checked.
    product *= v;
    if (product > kMaxDevices) {
      // The sizes so far (each at most 2^20, so exact); later ones may be -1 or not numbers.
      throw UsageError(fmt::format(
          "--mesh '{}': the mesh has at least {} devices (the product of its axis sizes), more "
          "than the limit of {} devices",
          mesh, product, kMaxDevices));
    }
  }
  return product;
}

/// A rule file, and its rule built (or why it could not be).
struct LoadedRules {
  RuleFile file;
  RulePtr rule;
  std::exception_ptr rule_error;
};

int plan_with(const PlanOptions& o);

// Without --rules the LLaMA preset is used; a model it does not fit (no rule matches a tensor)
// is usually another family, so the error says so and names the other presets.
int run_plan(const PlanOptions& o) {
  try {
    return plan_with(o);
  } catch (const RuleError& e) {
    if (!o.rules.empty()) throw;
    std::vector<std::string> others;
    for (const std::string& name : preset_names()) {
      const std::string stem = name.substr(0, name.rfind(".yaml"));
      if (stem != kDefaultPreset) others.push_back(stem);
    }
    throw RuleError(fmt::format(
        "{}\n(no --rules was given, and the default preset {} is for LLaMA checkpoints; for "
        "another model pass --rules preset:NAME, one of: {}; `shardplan presets` lists them)",
        e.what(), kDefaultPreset, fmt::join(others, ", ")));
  }
}

// plan --explain NAME: every rule entry tried on one tensor, and what it got.
int print_explain(const PlanOptions& o, MeshShardingHelper& helper, const RuleTree& rules,
                  const Tree<TensorSpec>& data) {
  const auto steps = helper.explain(rules, data, o.explain);
  const PlanReport report = helper.plan(rules, data);
  // The leaf by its tree path, or by the checkpoint's name (explain() accepts both).
  const LeafPlan* leaf = report.find(o.explain);
  if (leaf == nullptr) leaf = report.find(tree_path_of_name(o.explain));
  if (o.json) {
    nlohmann::ordered_json j;
    j["name"] = o.explain;
    j["mesh"] = helper.mesh().to_string();
    j["steps"] = nlohmann::ordered_json::array();
    for (const ExplainStep& s : steps) {
      j["steps"].push_back({{"rule_index", s.rule_index},
                            {"rule", s.rule},
                            {"entry", s.step.entry},
                            {"decided", s.step.decided},
                            {"description", s.step.description}});
    }
    if (leaf != nullptr) {
      j["path"] = leaf->path;
      j["spec"] = leaf->spec ? nlohmann::ordered_json(leaf->spec->to_string())
                             : nlohmann::ordered_json(nullptr);
      j["shard_shape"] = leaf->shard_shape.dims();
      j["bytes_per_device"] = leaf->bytes_per_device;
    }
    // (A rule file's path or a mesh axis may not be UTF-8: shown with U+FFFD, as inspect does.)
    std::cout << j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return kOk;
  }
  std::cout << fmt::format("{} on mesh {}:\n", detail::printable(o.explain),
                           detail::printable(helper.mesh().to_string()));
  for (const ExplainStep& s : steps) {
    std::ostringstream step;
    step << s;
    std::cout << "  " << detail::printable(step.str()) << "\n";
  }
  if (leaf != nullptr) {
    std::cout << fmt::format("  spec {} shard {} ({} per device)\n",
                             leaf->spec ? leaf->spec->to_string() : std::string("unspecified"),
                             leaf->shard_shape.to_string(), format_bytes(leaf->bytes_per_device));
  }
  return kOk;
}

int plan_with(const PlanOptions& o) {
  // The rule file is read and its patterns compiled on a second thread while the model loads.
  // Errors are reported in the order of the serial steps: rule file, model, mesh, rule.
  auto rules_job = std::async(std::launch::async, [&o] {
    LoadedRules r{load_rules(o.rules), nullptr, nullptr};
    try {
      r.rule = r.file.make_rule();
    } catch (...) {
      r.rule_error = std::current_exception();
    }
    return r;
  });
  std::optional<Tree<TensorSpec>> loaded;
  std::exception_ptr data_error;
  try {
    loaded.emplace(load_data(o.model));
  } catch (...) {
    data_error = std::current_exception();
  }
  const LoadedRules job = rules_job.get();  // throws the rule file's error
  if (data_error) std::rethrow_exception(data_error);
  const Tree<TensorSpec>& data = *loaded;
  const RuleFile& file = job.file;
  const std::string mesh_text = !o.mesh.empty() ? o.mesh : file.mesh.value_or(kDefaultMesh);
  MeshShardingHelper helper(Mesh::parse(mesh_text, devices_for(mesh_text, o.devices, 8)));
  if (job.rule_error) std::rethrow_exception(job.rule_error);
  const RuleTree rules(job.rule);
  if (!o.explain.empty()) return print_explain(o, helper, rules, data);
  // The inputs are read: the page's path is checked against them (docs/cli.md "Outputs").
  std::optional<detail::OutputFiles> out;
  if (!o.html.empty()) out.emplace(std::vector<detail::NamedOutput>{{"--html", o.html}});
  const PlanReport report = helper.plan(rules, data);
  const std::string model_name = o.model.empty() ? "LLaMA-2-7B (embedded example)" : o.model;
  if (out) {
    // Before the text: a page that cannot be written fails the command before its long output.
    (*out)[0].write(
        plan_html(report, fmt::format("shardplan: {} on {}", model_name, helper.mesh().to_string()),
                  std::max<std::size_t>(8, static_cast<std::size_t>(o.largest))));
    out->commit();
  }
  if (o.json) {
    report.write_json(std::cout);
    std::cout << "\n";
  } else {
    std::cout << fmt::format("model {}, rules {}, mesh {}\n\n", detail::printable(model_name),
                             detail::printable(file.source),
                             detail::printable(helper.mesh().to_string()));
    const auto largest = static_cast<std::size_t>(o.largest);
    std::cout << (o.summary ? report.summary(largest) : report.table(largest));
  }
  return kOk;
}

struct VisualizeOptions {
  std::string shape;
  std::string mesh;
  std::int64_t devices = 0;
  std::string spec;
  std::string dtype = "f32";
};

int run_visualize(const VisualizeOptions& o) {
  std::vector<std::int64_t> dims;
  for (const std::string& d : split(o.shape, ',')) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(d, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != d.size() || v < 0) {
      throw UsageError(
          fmt::format("--shape: '{}' is not a list of non-negative integers like "
                      "8192,8192",
                      o.shape));
    }
    dims.push_back(v);
  }
  const std::int64_t devices = devices_for(o.mesh, o.devices, 0);
  const Mesh mesh = Mesh::parse(o.mesh, devices);
  std::vector<AxisNames> spec_dims;
  if (!o.spec.empty()) {
    for (const std::string& entry : split(o.spec, ',')) {
      if (entry == "none" || entry == "-" || entry.empty()) {
        spec_dims.emplace_back();
      } else {
        spec_dims.push_back(split(entry, '+'));
      }
    }
  }
  const Shape shape(dims);
  const NamedSharding sharding(mesh, PartitionSpec(spec_dims));
  DType dtype{};
  try {
    dtype = parse_dtype(o.dtype);
  } catch (const Error& e) {
    throw UsageError(fmt::format("--dtype: {}", e.what()));
  }
  // Validates: the spec fits the rank and every dimension divides.
  const Shape shard = sharding.shard_shape(shape);
  std::cout << sharding.visualize(shape);
  std::cout << fmt::format("each device holds a {} block of {}: {} ({} in all)\n",
                           shard.to_string(), name(dtype), format_bytes(byte_size(shard, dtype)),
                           format_bytes(byte_size(shape, dtype)));
  return kOk;
}

int run_presets() {
  for (const std::string& name : preset_names()) {
    const RuleFile f = load_preset(name);
    std::cout << fmt::format("{:<20} mesh {:<14} {} rules{}\n", name, f.mesh.value_or("-"),
                             f.rules.size(), f.fsdp_fallback ? " + fsdp_fallback" : "");
  }
  return kOk;
}

/// The `plan` subcommand, its options read into `plan`.
CLI::App* add_plan_command(CLI::App& app, PlanOptions& plan) {
  CLI::App* plan_cmd = app.add_subcommand("plan", "Plan a model against a rule file and report it");
  plan_cmd->add_option("--model,-m", plan.model,
                       "A .safetensors file (only its header is read), a *.safetensors.index.json "
                       "of a sharded checkpoint, a checkpoint directory holding either, or a JSON "
                       "model description "
                       "{\"name\": {\"shape\": [..], \"dtype\": \"BF16\"}}. "
                       "Default: an embedded LLaMA-2-7B. Example: --model model.safetensors");
  plan_cmd->add_option(
      "--mesh", plan.mesh,
      "Mesh axes as name:size, one size may be -1 (inferred from --devices). "
      "Default: the rule file's mesh, else fsdp:-1,tp:2. Example: --mesh fsdp:4,tp:2");
  plan_cmd
      ->add_option("--devices,-n", plan.devices,
                   fmt::format("Number of devices, 1 to {}. Default: the mesh's size when every "
                               "axis size is given, else 8. Example: --devices 8",
                               kMaxDevices))
      ->check(CLI::Range(std::int64_t{1}, kMaxDevices));
  plan_cmd->add_option(
      "--rules,-r", plan.rules,
      "A YAML rule file, or preset:NAME for a built-in preset (see `shardplan "
      "presets`). Default: preset:llama_fsdp_tp. Example: --rules preset:llama_fsdp");
  plan_cmd->add_flag("--json", plan.json, "Print the plan as JSON (schema in docs/cli.md)");
  plan_cmd->add_flag("--summary", plan.summary,
                     "Print only the summary (bytes per device, largest tensors, unmatched rules), "
                     "not a row per tensor");
  plan_cmd->add_option("--explain", plan.explain,
                       "Show every rule tried on one tensor (its tree path or the checkpoint's own "
                       "name) and which one decided; with --json as JSON. Example: "
                       "--explain model/layers/0/mlp/down_proj/weight");
  plan_cmd->add_option("--largest", plan.largest, "How many of the largest tensors to list")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  plan_cmd
      ->add_option("--html", plan.html,
                   "Also write the report as a self-contained HTML page (bytes per device as "
                   "bars, the largest tensors' blocks over the mesh). Example: --html plan.html")
      ->excludes("--explain")
      ->check(cli::non_empty_output_path());
  return plan_cmd;
}

/// The `visualize` subcommand, its options read into `vis`.
CLI::App* add_visualize_command(CLI::App& app, VisualizeOptions& vis) {
  CLI::App* vis_cmd =
      app.add_subcommand("visualize", "Draw which device holds which block of a 1-D or 2-D array");
  vis_cmd->add_option("--shape", vis.shape, "Global shape. Example: --shape 8192,8192")->required();
  vis_cmd->add_option("--mesh", vis.mesh, "Mesh. Example: --mesh x:4,y:2")->required();
  vis_cmd
      ->add_option("--devices,-n", vis.devices,
                   fmt::format("Number of devices, 1 to {} (needed only when the mesh has a -1)",
                               kMaxDevices))
      ->check(CLI::Range(std::int64_t{1}, kMaxDevices));
  vis_cmd->add_option("--spec", vis.spec,
                      "One entry per dimension: an axis, none (or -) for not sharded, x+y for "
                      "both axes. Example: --spec x,y  or  --spec x+y,none");
  vis_cmd
      ->add_option("--dtype", vis.dtype,
                   "Element type, for the bytes per device. Example: --dtype bf16")
      ->capture_default_str();
  return vis_cmd;
}

}  // namespace

// The command's --help text.
constexpr const char* kDescription =
      "shardplan: plans how every tensor of a model is split over a device mesh.\n"
      "Examples:\n"
      "  shardplan plan                                   # LLaMA-2-7B, preset llama_fsdp_tp, 8 "
      "devices\n"
      "  shardplan plan --model model.safetensors.index.json --rules "
      "rules/presets/llama_fsdp_tp.yaml "
      "--mesh fsdp:4,tp:2\n"
      "  shardplan visualize --shape 8192,8192 --mesh x:4,y:2 --spec x,y\n"
      "  shardplan train-plan --config config.json --mesh fsdp:64,tp:8 --batch 256 --seq 4096 "
      "--device-memory 80GiB\n"
      "  shardplan presets\n"
      "  shardplan checkpoint inspect runs/llama/step_00000100\n"
      "  shardplan trace summarize step.trace.json\n"
      "  shardplan trace memory step.trace.json --html memory.html\n"
      "  shardplan example trace step.trace.json   # a trace to try the trace commands on\n"
      "  shardplan example checkpoint ckpt         # a small checkpoint to try the others on";

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // A plan of a large model allocates and frees tens of megabytes in a few big steps (file text,
  // parsed JSON, tree, report). Keep freed memory for the next step instead of returning it to
  // the kernel and faulting it in again: a third fewer page faults on a 90k-tensor model.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
  // Under a file size limit (ulimit -f) a write past it raises SIGXFSZ, whose default action
  // kills the process without a word and leaves the hidden temporary output behind. Ignored, the
  // write fails with EFBIG instead: an error naming the file, and the temporary is removed.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{kDescription, "shardplan"};
  app.require_subcommand(1);

  PlanOptions plan;
  CLI::App* plan_cmd = add_plan_command(app, plan);
  VisualizeOptions vis;
  CLI::App* vis_cmd = add_visualize_command(app, vis);
  app.add_subcommand("presets", "List the built-in rule presets");

  cli::CheckpointCommand ckpt;
  cli::add_checkpoint_commands(app, ckpt, kMaxDevices);

  cli::TrainPlanCommand train;
  cli::add_train_plan_command(app, train, kMaxDevices);

  cli::TraceCommand trace;
  cli::add_trace_commands(app, trace);

  cli::ExampleCommand example;
  cli::add_example_commands(app, example);

  // Every file the command reads is noted, so that no output overwrites one (OutputFiles).
  const detail::InputRecord inputs;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kOk : kUsage;
  }
  // The subcommands' device count for a --mesh: given in it, never inferred.
  const auto devices_of_mesh = [](const std::string& mesh, std::int64_t n) {
    return devices_for(mesh, n, 0);
  };
  try {
    if (plan_cmd->parsed()) return run_plan(plan);
    if (vis_cmd->parsed()) return run_visualize(vis);
    if (ckpt.command->parsed()) {
      return cli::run_checkpoint(ckpt, load_rules, devices_of_mesh);
    }
    if (train.command->parsed()) return cli::run_train_plan(train, load_rules, devices_of_mesh);
    if (trace.command->parsed()) return cli::run_trace(trace);
    if (example.command->parsed()) return cli::run_example(example);
    return run_presets();
  } catch (const UsageError& e) {
    // Messages quote names from files and options: escaped, as the text outputs are.
    std::cerr << "shardplan: " << detail::printable_lines(e.what()) << "\n";
    return kUsage;
  } catch (const shardplan::OptionError& e) {
    // An option the plan cannot apply (train_plan_refusals()): bad usage, named.
    std::cerr << "shardplan: " << detail::printable_lines(e.what()) << "\n";
    return kUsage;
  } catch (const detail::OutputPathError& e) {  // an output path against the outputs contract
    std::cerr << "shardplan: " << detail::printable_lines(e.what()) << "\n";
    return kUsage;
  } catch (const shardplan::Error& e) {
    std::cerr << "shardplan: " << detail::printable_lines(e.what()) << "\n";
    return kFailed;
  } catch (const std::exception& e) {
    std::cerr << "shardplan: internal error: " << detail::printable_lines(e.what()) << "\n";
    return kFailed;
  }
}
