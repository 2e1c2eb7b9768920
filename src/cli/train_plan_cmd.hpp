#pragma once
// `shardplan train-plan`: memory, FLOPs and communication of one training step of a Hugging Face
// model on a mesh, derived from the lowered program (docs/cli.md).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "shardplan/rule_file.hpp"
#include "shardplan/train_plan.hpp"

namespace shardplan::cli {

struct TrainPlanCommand {
  CLI::App* command = nullptr;
  std::string config;
  std::vector<std::string> meshes;
  std::vector<std::string> rules;
  std::int64_t devices = 0;
  std::int64_t batch = 8;
  std::int64_t seq = 2048;
  std::int64_t target_seq = 0;
  std::string optimizer = "adamw";
  std::string optimizer_kernel = "ops";
  std::string optimizer_sharding = "rules";
  std::string param_dtype = "bf16", grad_dtype = "", optimizer_dtype = "f32";
  std::string master_dtype, reduce_dtype, mixed_precision;  // empty: not given
  std::string hardware;                                      // empty: no time model
  int grad_accum = 1;
  bool recompute = false;
  bool no_reshard_after_forward = false;
  bool float8 = false;
  bool strict_shards = false;
  bool eager = false;
  bool async_tp = false;  // --async-tp
  bool fsdp_root = false;
  std::string remat;  // --remat; empty: not given
  std::string remat_blocks;  // --remat-blocks; empty: not given
  bool reshard_last_block = true;  // --[no-]reshard-last-block, when given
  std::string loss;       // "fused", "naive"; empty: not given (the family's)
  std::string loss_dtype;  // --loss-dtype "f32", "bf16"; empty: not given (f32)
  std::string attention;  // "fused", "naive"; empty: not given (the family's)
  std::string sequence_parallel;  // "on", "off"; empty: the rules decide
  std::string batch_axes;
  std::string device_memory;
  double headroom = 0.1;
  bool json = false;
  bool compare = false;
  std::string html;  // also write the plan as an HTML page to this file
  std::string tp_plan;   // --tp-plan; empty: not given (partitioner)
  std::string cp_rotate;  // --cp-rotate; empty: not given (permute)
  std::string cp_kernel;  // --cp-kernel; empty: not given (ring)
  std::string dp_overlap;           // --dp-overlap; empty: not given (fsdp)
  std::int64_t dp_bucket_size = 0;  // --dp-bucket-size; 0: not given (Megatron's default)
  std::string float8_recipe;      // --float8-recipe; empty: not given (tensorwise)
  std::string float8_all_gather;  // --float8-all-gather; empty: not given (the recipe's)
  std::string stack;     // --stack NAME; empty: none
  bool explain = false;  // --explain: list the stack's choices, plan nothing
  std::string from_config;  // --from-config FILE: a stack's own config (stack_config.hpp)
  std::string emit_config;  // --emit-config FILE: write the stack's config for the plan
  /// Filled by apply_from_config: the options the file set, each with "FILE: key" (what
  /// overrides a stack's choice), and the file's record for the report.
  std::map<std::string, std::string, std::less<>> set_by_config;
  StackUse config_record;
};

/// Registers `train-plan` under `app`; the returned options are filled by parsing.
TrainPlanCommand& add_train_plan_command(CLI::App& app, TrainPlanCommand& c,
                                         std::int64_t max_devices);

/// Runs it. `load_rules` reads --rules as `plan` does; `devices_for(mesh, devices)` gives the
/// device count (a UsageError from either is reported by the caller). Returns the exit code.
int run_train_plan(
    const TrainPlanCommand& c, const std::function<RuleFile(const std::string&)>& load_rules,
    const std::function<std::int64_t(const std::string&, std::int64_t)>& devices_for);

}  // namespace shardplan::cli
