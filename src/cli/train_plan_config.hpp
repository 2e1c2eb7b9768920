#pragma once
// train-plan's --from-config and --emit-config (stack_config.hpp; docs/training.md "Stack
// configs"): a stack's own config file read into the command's options, and written for a plan.
#include <optional>

#include "../formats/output_file.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/train_plan.hpp"
#include "train_plan_cmd.hpp"

namespace shardplan::cli {

/// --from-config: reads the file as --stack's config (or the stack its extension names, set in
/// c.stack) and sets on `c` each option the file gives that the command line does not (an
/// option given overrides the keys that set the same thing: the dtypes together, the
/// checkpointing together), recording what applied in c.set_by_config and c.config_record.
/// Does nothing without --from-config. Throws UsageError (a missing file, an unknown stack, a
/// -1 degree without --devices) or the reader's IoError naming the file, line and key.
void apply_from_config(TrainPlanCommand& c);

/// The outputs the command writes (--html, --emit-config), checked against its inputs; none
/// when neither is given. UsageError for --emit-config with --compare or without a stack.
std::optional<detail::OutputFiles> open_outputs(const TrainPlanCommand& c);

/// Writes --emit-config's file into its place in `out` (the stack's config of the plan `p` of
/// the options `o` on `mesh`). UsageError naming what the stack's config cannot say.
void write_emitted_config(const TrainPlanCommand& c, detail::OutputFiles& out, const TrainPlan& p,
                          const TrainPlanOptions& o, const Mesh& mesh);

}  // namespace shardplan::cli
