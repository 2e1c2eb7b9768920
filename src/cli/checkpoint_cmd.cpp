#include "checkpoint_cmd.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "input_path_option.hpp"
#include "output_path_option.hpp"
#include "shardplan/checkpoint.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan::cli {
namespace {

/// A one-line progress bar on stderr for work that takes more than a second: nothing before
/// the first second, then at most five updates a second, then a final line. Only on a terminal
/// (or with SHARDPLAN_PROGRESS=1), so scripts and logs stay clean.
class Progress {
 public:
  explicit Progress(std::string what)
      : what_(std::move(what)),
        start_(std::chrono::steady_clock::now()),
        on_(::isatty(2) != 0 || std::getenv("SHARDPLAN_PROGRESS") != nullptr) {}
  ~Progress() {
    if (shown_) std::cerr << "\n";
  }
  void operator()(std::int64_t done, std::int64_t total) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - start_ < std::chrono::seconds(1)) return;
    if (shown_ && done < total && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    shown_ = true;
    const double f = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int width = 30, filled = static_cast<int>(f * width);
    std::cerr << fmt::format("\r{} [{}{}] {:3.0f}% {} of {}", what_, std::string(filled, '#'),
                             std::string(width - filled, ' '), f * 100, format_bytes(done),
                             format_bytes(total))
              << std::flush;
  }

 private:
  std::string what_;
  std::chrono::steady_clock::time_point start_, last_;
  bool on_;
  bool shown_ = false;
};

std::string shape_text(const Shape& s) { return s.to_string(); }

int run_inspect(const CheckpointCommand& c) {
  const CheckpointInfo info = read_checkpoint_info(c.src);
  if (c.json) {
    nlohmann::json out;
    out["path"] = c.src;
    out["format"] = info.shardplan ? "shardplan" : "huggingface";
    if (info.shardplan) out["mesh"] = info.mesh;
    out["total_bytes"] = info.total_bytes();
    out["files"] = nlohmann::json::array();
    for (const auto& f : info.files) {
      nlohmann::json j{{"name", f.name}};
      if (f.xxh3) j["xxh3"] = fmt::format("{:016x}", *f.xxh3);
      out["files"].push_back(j);
    }
    out["tensors"] = nlohmann::json::array();
    for (const auto& t : info.tensors) {
      out["tensors"].push_back({{"name", t.name},
                                {"dtype", std::string(safetensors_name(t.spec.dtype))},
                                {"shape", t.spec.shape.dims()},
                                {"bytes", t.spec.bytes()},
                                {"file", t.file},
                                {"offset", t.offset},
                                {"sharding", t.sharding}});
    }
    std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::size_t width = 6;
  for (const auto& t : info.tensors) width = std::max(width, detail::printable(t.name).size());
  width = std::min<std::size_t>(width, 60);
  std::cout << fmt::format("{:<{}}  {:<5}  {:<16}  {:>10}  {:<28}  {}\n", "tensor", width, "dtype",
                           "shape", "bytes", "file", info.shardplan ? "sharding" : "");
  for (const auto& t : info.tensors) {
    // Names come from the files: control characters are escaped before they reach a terminal.
    std::cout << fmt::format("{:<{}}  {:<5}  {:<16}  {:>10}  {:<28}  {}\n",
                             detail::printable(t.name), width, safetensors_name(t.spec.dtype),
                             shape_text(t.spec.shape), format_bytes(t.spec.bytes()),
                             detail::printable(t.file), detail::printable(t.sharding));
  }
  std::cout << fmt::format("\n{} tensors, {} in {} file{}; {}\n", info.tensors.size(),
                           format_bytes(info.total_bytes()), info.files.size(),
                           info.files.size() == 1 ? "" : "s",
                           info.shardplan ? fmt::format("shardplan checkpoint saved on mesh {}, "
                                                        "with a checksum per file",
                                                        info.mesh)
                                          : std::string("Hugging Face safetensors (no shardings "
                                                        "or checksums)"));
  return 0;
}

/// What both conversions take: the source, the destination, the largest file.
void add_conversion_options(CLI::App& cmd, CheckpointCommand& c) {
  cmd.add_option("src", c.src, "The checkpoint to read")->required();
  cmd.add_option("dst", c.dst, "The directory to write (must not exist)")
      ->required()
      ->check(non_empty_output_path());
  cmd.add_option("--max-file-mib", c.max_file_mib, "Largest file, in MiB")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30))
      ->capture_default_str();
}

}  // namespace

CheckpointCommand& add_checkpoint_commands(CLI::App& app, CheckpointCommand& c,
                                           std::int64_t max_devices) {
  c.command = app.add_subcommand(
      "checkpoint", "Inspect, reshard or consolidate checkpoints (shardplan's or Hugging Face's)");
  c.command->require_subcommand(1);
  c.inspect = c.command->add_subcommand(
      "inspect", "List a checkpoint's tensors: dtype, shape, bytes, file, sharding");
  c.inspect
      ->add_option("dir", c.src,
                   "A checkpoint directory (with model.safetensors.index.json or one "
                   ".safetensors file), or a .safetensors file")
      ->required();
  c.inspect->add_flag("--json", c.json, "Print JSON");

  c.reshard = c.command->add_subcommand(
      "reshard",
      "Rewrite a checkpoint as a shardplan checkpoint laid out for another mesh "
      "(streaming: memory bounded by a 4 MiB buffer)");
  add_conversion_options(*c.reshard, c);
  c.reshard->add_option("--mesh", c.mesh, "Mesh axes as name:size. Example: --mesh fsdp:4,tp:2")
      ->required();
  c.reshard
      ->add_option(
          "--devices,-n", c.devices,
          fmt::format("Number of devices, 1 to {} (default: the mesh's size)", max_devices))
      ->check(CLI::Range(std::int64_t{1}, max_devices));
  c.reshard->add_option("--rules,-r", c.rules,
                        "A YAML rule file, or preset:NAME. Default: preset:llama_fsdp_tp");

  c.consolidate = c.command->add_subcommand(
      "consolidate",
      "Rewrite a checkpoint as plain Hugging Face safetensors (+ index when more "
      "than one file), tensors byte for byte");
  add_conversion_options(*c.consolidate, c);
  return c;
}

int run_checkpoint(
    const CheckpointCommand& c, const std::function<RuleFile(const std::string&)>& load_rules,
    const std::function<std::int64_t(const std::string&, std::int64_t)>& devices_for) {
  require_input(c.inspect->parsed()       ? "checkpoint inspect DIR"
                : c.consolidate->parsed() ? "checkpoint consolidate SRC"
                                          : "checkpoint reshard SRC",
                c.src);
  if (c.inspect->parsed()) return run_inspect(c);
  ConvertOptions o;
  o.max_file_bytes = c.max_file_mib << 20;
  if (c.consolidate->parsed()) {
    Progress progress("consolidating");
    o.progress = [&](std::int64_t d, std::int64_t t) { progress(d, t); };
    consolidate_checkpoint(c.src, c.dst, o);
    std::cout << fmt::format("wrote {} (Hugging Face safetensors)\n", c.dst);
    return 0;
  }
  const RuleFile rules = load_rules(c.rules);
  const Mesh mesh = Mesh::parse(c.mesh, devices_for(c.mesh, c.devices));
  const MeshShardingHelper helper(mesh);
  Progress progress("resharding");
  o.progress = [&](std::int64_t d, std::int64_t t) { progress(d, t); };
  reshard_checkpoint(c.src, c.dst, helper, RuleTree(rules.make_rule()), o);
  std::cout << fmt::format("wrote {} (shardplan checkpoint for mesh {})\n", c.dst,
                           mesh.to_string());
  return 0;
}

}  // namespace shardplan::cli
