#pragma once
// A training stack's own config file as train-plan options (--from-config) and back
// (--emit-config): a torchtitan TOML, a file of Megatron-LM command-line arguments, a MaxText
// YAML. Each key the stack reads is either planned (as the train-plan option it sets), listed as
// ignored with the reason, or refused; a key the stack does not read is refused. docs/training.md
// "Stack configs".
//
//   const StackConfig f = read_stack_config("llama3_8b.toml",
//   find_training_stack("torchtitan-2025-08"));
//   // f.settings: {"--seq", "8192", "training.seq_len = 8192"}, ...; f.axes: {"fsdp", -1}, ...
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardplan/mesh.hpp"
#include "shardplan/train_plan.hpp"
#include "shardplan/training_stack.hpp"

namespace shardplan {

/// What a stack's config file says, in train-plan's terms.
struct StackConfig {
  /// One train-plan option a key sets: "--seq" "8192" (a flag: value ""; "--compile" for
  /// "--eager" off), and the key with its value as read ("training.seq_len = 8192"; a stack
  /// default for a key the file leaves out says so).
  struct Setting {
    std::string option, value, key;
  };
  std::string path;    // as given
  std::string stack;   // the stack it was read for
  std::string format;  // "torchtitan TOML", "Megatron-LM arguments", "MaxText YAML"
  std::vector<Setting> settings;
  /// The mesh its parallelism degrees make, in order ("fsdp" -1: the devices the others leave).
  std::vector<std::pair<std::string, std::int64_t>> axes;
  std::string mesh_keys;  // the keys that give the degrees, for the report
  /// The batch: per data-parallel rank and micro-batch (torchtitan, Megatron) or per device
  /// (MaxText: may be a fraction), the global batch, and the micro-batches per step.
  std::optional<double> local_batch;
  bool local_batch_per_device = false;
  std::optional<std::int64_t> global_batch, grad_accum;
  std::string batch_keys;  // the keys that give the batch, for messages
  /// "metrics.log_freq (logging, not part of a step)": keys read and not planned, with why.
  std::vector<std::string> ignored;

  /// "fsdp:8,tp:2" (-1 kept); empty when the file sets no degree.
  std::string mesh_text() const;
  /// The global batch and micro-batches per step on `mesh` with the batch split over
  /// `batch_axes` (the data-parallel ranks); nullopt where the file says nothing. Throws IoError
  /// naming the file and keys when the batch does not split as the keys say.
  std::pair<std::optional<std::int64_t>, std::optional<std::int64_t>> batch_on(
      const Mesh& mesh, const std::vector<std::string>& batch_axes) const;
};

/// Whether `stack` has a config format --from-config reads (torchtitan-*, megatron-core,
/// maxtext), and its name ("torchtitan TOML"); empty when not.
std::string stack_config_format(const TrainingStack& stack);

/// The stack a config file is read as when none is named, from its extension: .toml is the
/// newest torchtitan, .yml/.yaml maxtext, .args/.sh/.txt megatron-core. Throws SpecError naming
/// the file and the extensions known.
const TrainingStack& stack_for_config_file(const std::filesystem::path& file);

/// Reads `file` as `stack`'s config. Throws IoError naming the file (its line where the format
/// has one) for a file that cannot be read or parsed, an unknown key, a value of the wrong type
/// or one train-plan cannot plan; SpecError for a stack without a config format.
StackConfig read_stack_config(const std::filesystem::path& file, const TrainingStack& stack);
/// The same, of `text` named `source` (tests).
StackConfig parse_stack_config(std::string_view text, std::string_view source,
                               const TrainingStack& stack);

/// `stack`'s config for the step `o` plans on `mesh` (the batch split over `batch_axes`; the
/// plan's sequence parallelism `sequence_parallel`, TrainPlan::sequence_parallel, written where
/// the config says it): what the stack needs to run it, such that parse_stack_config of it under
/// the same stack sets the same options. Throws SpecError naming the option when the plan has a
/// setting the stack's config cannot say (a fused loss for torchtitan, a batch that does not split
/// into its ranks).
std::string emit_stack_config(const TrainingStack& stack, const TrainPlanOptions& o,
                              const Mesh& mesh, const std::vector<std::string>& batch_axes,
                              bool sequence_parallel);

}  // namespace shardplan
