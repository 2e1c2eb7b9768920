#pragma once
// `shardplan checkpoint inspect|reshard|consolidate` (docs/cli.md, docs/checkpoint.md).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "shardplan/rule_file.hpp"

namespace shardplan::cli {

struct CheckpointCommand {
  CLI::App* command = nullptr;
  CLI::App* inspect = nullptr;
  CLI::App* reshard = nullptr;
  CLI::App* consolidate = nullptr;
  std::string src, dst, mesh, rules;
  std::int64_t devices = 0;
  std::int64_t max_file_mib = 4096;
  bool json = false;
};

/// Registers the subcommands under `app`; the returned options are filled by parsing.
CheckpointCommand& add_checkpoint_commands(CLI::App& app, CheckpointCommand& c,
                                           std::int64_t max_devices);

/// Runs the parsed subcommand. `load_rules` reads --rules as `plan` does; `devices_for` gives
/// the device count of --mesh and --devices as `plan` does (a UsageError for a count past the
/// limit or a -1 without --devices). Returns the exit code.
int run_checkpoint(
    const CheckpointCommand& c, const std::function<RuleFile(const std::string&)>& load_rules,
    const std::function<std::int64_t(const std::string&, std::int64_t)>& devices_for);

}  // namespace shardplan::cli
