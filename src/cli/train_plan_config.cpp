// train-plan's --from-config and --emit-config: train_plan_config.hpp.
#include "train_plan_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "input_path_option.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/stack_config.hpp"
#include "shardplan/training_stack.hpp"
#include "usage_error.hpp"

namespace shardplan::cli {
namespace {

bool given(const TrainPlanCommand& c, std::string_view option) {
  return c.command != nullptr && c.command->count(std::string(option)) > 0;
}

// Options that set one thing together: one of them given overrides the file's keys for all (as
// one dtype option replaces a stack's whole precision choice).
constexpr std::array<std::string_view, 6> kDtypes = {"--mixed-precision", "--param-dtype",
                                                     "--master-dtype",    "--grad-dtype",
                                                     "--reduce-dtype",    "--optimizer-dtype"};
constexpr std::array<std::string_view, 3> kRemat = {"--remat", "--recompute", "--remat-blocks"};

/// The option given on the command line that overrides a file's `option`; empty: none.
std::string overridden_by(const TrainPlanCommand& c, std::string_view option) {
  const auto first_given = [&](const auto& group) -> std::string {
    for (std::string_view o : group) {
      if (given(c, o)) return std::string(o);
    }
    return {};
  };
  if (std::find(kDtypes.begin(), kDtypes.end(), option) != kDtypes.end()) {
    return first_given(kDtypes);
  }
  if (std::find(kRemat.begin(), kRemat.end(), option) != kRemat.end()) return first_given(kRemat);
  if (option == "--compile" || option == "--eager") {
    return given(c, "--eager") ? (c.eager ? "--eager" : "--compile") : "";
  }
  return given(c, option) ? std::string(option) : std::string();
}

/// Sets the command's field for `option` as parsing it would have.
void set_option(TrainPlanCommand& c, const std::string& option, const std::string& value) {
  std::string* text = option == "--mixed-precision"     ? &c.mixed_precision
                      : option == "--param-dtype"       ? &c.param_dtype
                      : option == "--master-dtype"      ? &c.master_dtype
                      : option == "--grad-dtype"        ? &c.grad_dtype
                      : option == "--reduce-dtype"      ? &c.reduce_dtype
                      : option == "--optimizer-dtype"   ? &c.optimizer_dtype
                      : option == "--optimizer"         ? &c.optimizer
                      : option == "--optimizer-sharding" ? &c.optimizer_sharding
                      : option == "--remat"             ? &c.remat
                      : option == "--remat-blocks"      ? &c.remat_blocks
                      : option == "--attention"         ? &c.attention
                      : option == "--sequence-parallel" ? &c.sequence_parallel
                      : option == "--cp-kernel"         ? &c.cp_kernel
                      : option == "--dp-overlap"        ? &c.dp_overlap
                      : option == "--float8-recipe"     ? &c.float8_recipe
                      : option == "--float8-all-gather" ? &c.float8_all_gather
                                                        : nullptr;
  if (text != nullptr) {
    *text = value;
  } else if (option == "--seq") {
    c.seq = std::stoll(value);
  } else if (option == "--dp-bucket-size") {
    c.dp_bucket_size = std::stoll(value);
  } else if (option == "--eager" || option == "--compile") {
    c.eager = option == "--eager";
  } else if (option == "--float8") {
    c.float8 = true;
  } else if (option == "--async-tp") {
    c.async_tp = true;
  } else if (option == "--no-reshard-after-forward") {
    c.no_reshard_after_forward = true;
  } else {
    throw std::logic_error("stack config: no command field for " + option);
  }
}

/// The stack the file is read as: --stack's, or the one its extension names (said in the
/// record).
const TrainingStack& config_stack(TrainPlanCommand& c) {
  try {
    if (!c.stack.empty() || given(c, "--stack")) return find_training_stack(c.stack);
    const TrainingStack& s = stack_for_config_file(c.from_config);
    c.stack = std::string(s.name);
    c.config_record.config_applied.push_back(
        fmt::format("stack {} (from the extension; --stack names another)", s.name));
    return s;
  } catch (const SpecError& e) {
    throw UsageError(fmt::format("--from-config: {}", e.what()));
  }
}

/// The mesh and batch the file gives, where no option given sets them.
void apply_mesh_and_batch(TrainPlanCommand& c, const StackConfig& f) {
  StackUse& rec = c.config_record;
  const std::string mesh = f.mesh_text();
  if (!c.meshes.empty()) {
    rec.config_overridden.push_back(fmt::format("{} (by --mesh)", f.mesh_keys));
  } else {
    if (mesh.find("-1") != std::string::npos && c.devices == 0) {
      throw UsageError(fmt::format(
          "--from-config {}: its mesh {} has a degree of -1 (the devices the others leave): "
          "give --devices",
          detail::printable(f.path), mesh));
    }
    c.meshes = {mesh};
    rec.config_applied.push_back(fmt::format("{}: --mesh {}", f.mesh_keys, mesh));
  }
  if (c.meshes.size() != 1 || f.batch_keys.empty()) return;
  // The devices: --devices, else the product of the sizes; a mesh that is not read so (a -1
  // without --devices, a bad size) is refused when it is planned.
  const std::string& text = c.meshes.front();
  std::int64_t devices = c.devices;
  if (devices == 0) {
    devices = 1;
    for (std::size_t from = 0; from < text.size();) {
      const std::size_t end = std::min(text.find(',', from), text.size());
      const std::size_t colon = text.find(':', from);
      std::int64_t size = 0;
      try {
        size = colon < end ? std::stoll(text.substr(colon + 1, end - colon - 1)) : 0;
      } catch (const std::exception&) {
        return;
      }
      if (size < 1 || size > Mesh::kMaxDevices) return;
      devices *= size;
      if (devices > Mesh::kMaxDevices) return;
      from = end + 1;
    }
  }
  std::optional<Mesh> m;
  try {
    m = Mesh::parse(text, devices);
  } catch (const Error&) {
    return;  // refused, with its message, when planned
  }
  std::vector<std::string> batch_axes;
  for (std::size_t from = 0; !c.batch_axes.empty() && from <= c.batch_axes.size();) {
    const std::size_t end = std::min(c.batch_axes.find(',', from), c.batch_axes.size());
    batch_axes.push_back(c.batch_axes.substr(from, end - from));
    from = end + 1;
  }
  const auto [batch, accum] = f.batch_on(*m, batch_axes);
  if (batch && given(c, "--batch")) {
    rec.config_overridden.push_back(fmt::format("{} (by --batch)", f.batch_keys));
  } else if (batch) {
    c.batch = *batch;
    rec.config_applied.push_back(fmt::format("{}: --batch {}", f.batch_keys, *batch));
  }
  if (accum && given(c, "--grad-accum")) {
    rec.config_overridden.push_back(fmt::format("{} (by --grad-accum)", f.batch_keys));
  } else if (accum) {
    c.grad_accum = static_cast<int>(*accum);
    rec.config_applied.push_back(fmt::format("{}: --grad-accum {}", f.batch_keys, *accum));
  }
}

}  // namespace

void apply_from_config(TrainPlanCommand& c) {
  if (c.from_config.empty() && !given(c, "--from-config")) return;
  require_input("--from-config", c.from_config);
  const TrainingStack& stack = config_stack(c);
  if (stack_config_format(stack).empty()) {
    throw UsageError(
        fmt::format("--from-config: the stack {} has no config format train-plan "
                    "reads (torchtitan-*, megatron-core and maxtext have)",
                    stack.name));
  }
  const StackConfig f = read_stack_config(c.from_config, stack);
  StackUse& rec = c.config_record;
  rec.config = f.path;
  for (const StackConfig::Setting& s : f.settings) {
    const std::string shown = s.option.empty()  ? "train-plan's default"
                              : s.value.empty() ? s.option
                                                : s.option + " " + s.value;
    if (s.option.empty()) {
      rec.config_applied.push_back(fmt::format("{}: {}", s.key, shown));
    } else if (const std::string by = overridden_by(c, s.option); !by.empty()) {
      rec.config_overridden.push_back(fmt::format("{} (by {})", s.key, by));
    } else {
      set_option(c, s.option, s.value);
      c.set_by_config[s.option == "--compile" ? "--eager" : s.option] =
          fmt::format("{}: {}", f.path, s.key);
      rec.config_applied.push_back(fmt::format("{}: {}", s.key, shown));
    }
  }
  if (!c.explain) apply_mesh_and_batch(c, f);  // --explain plans nothing
  rec.config_ignored = f.ignored;
}

std::optional<detail::OutputFiles> open_outputs(const TrainPlanCommand& c) {
  std::vector<detail::NamedOutput> outputs;
  if (!c.html.empty()) outputs.push_back({"--html", c.html});
  if (!c.emit_config.empty()) {
    if (c.compare) throw UsageError("--emit-config writes one plan's config: not with --compare");
    if (c.stack.empty()) {
      throw UsageError("--emit-config writes a stack's config: give --stack NAME or --from-config");
    }
    if (stack_config_format(find_training_stack(c.stack)).empty()) {
      throw UsageError(
          fmt::format("--emit-config: the stack {} has no config format train-plan "
                      "writes (torchtitan-*, megatron-core and maxtext have)",
                      c.stack));
    }
    outputs.push_back({"--emit-config", c.emit_config});
  }
  if (outputs.empty()) return std::nullopt;
  return std::optional<detail::OutputFiles>(std::in_place, outputs);
}

void write_emitted_config(const TrainPlanCommand& c, detail::OutputFiles& out, const TrainPlan& p,
                          const TrainPlanOptions& o, const Mesh& mesh) {
  if (c.emit_config.empty()) return;
  std::string text;
  try {
    text =
        emit_stack_config(find_training_stack(c.stack), o, mesh, o.batch_axes, p.sequence_parallel);
  } catch (const SpecError& e) {
    throw UsageError(e.what());
  }
  out[out.size() - 1].write(text);
}

}  // namespace shardplan::cli
