#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardplan/mesh.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/sharding_rule.hpp"

namespace shardplan {

/// What a mesh axis is for in a training step (docs/rule-files.md, "Axis roles"): the batch is
/// split over batch and expert axes, tensor parallelism runs over model axes, ring attention over
/// a context axis; pipeline axes are not planned.
enum class AxisRole { kBatch, kModel, kContext, kPipeline, kExpert };
/// "batch", "model", "context", "pipeline", "expert" (as a rule file writes them).
std::string_view name(AxisRole role);
/// The role an axis has when no rule file declares it, by its name: tp, model, mp and tensor are
/// model axes, cp and context context axes, every other a batch axis.
AxisRole default_axis_role(std::string_view axis);

/// A rule table read from YAML (format in docs/rule-files.md):
///
///   mesh: "fsdp:-1,tp:2"          # optional default mesh
///   strict: true                  # optional, default true
///   rules:                        # ordered; first match wins
///     - {match: "self_attn/(q|k|v)_proj/weight", spec: [tp, fsdp]}
///     - {match: "norm", spec: []}
///   fsdp_fallback: {axis: fsdp, min_size: 1048576}   # optional, for leaves no rule matched
///   logical_axes: {batch: data, mlp: tp, embed: null} # optional
///   activations:                  # optional: named activations in logical axes
///     residual: [activation_batch, activation_norm_length, activation_embed]
///   axis_roles: {ep: expert, shard: model}   # optional: what an axis is for (else by name)
struct RuleFile {
  struct Rule {
    std::string match;
    PartitionSpec spec;
    int line = 0;  // 1-based line in the file, for messages
  };
  /// A named activation (with_sharding_annotation's name) and the logical axis of each of its
  /// dimensions ("" for a dimension not sharded).
  struct Activation {
    std::string name;
    std::vector<std::string> logical_axes;
    int line = 0;  // 1-based line in the file, for messages
  };
  /// Logical axis -> mesh axes (nullopt: not sharded), in order; the first entry for a name wins.
  using LogicalMapping = std::vector<std::pair<std::string, std::optional<AxisNames>>>;
  struct FsdpFallback {
    std::string axis = "fsdp";
    std::int64_t min_size = std::int64_t{1} << 20;
  };

  std::string source;  // file name, or "<memory>"
  std::optional<std::string> mesh;
  bool strict = true;
  std::vector<Rule> rules;
  std::optional<FsdpFallback> fsdp_fallback;
  LogicalMapping logical_axes;
  /// Every logical axis they name is one of logical_axes (checked when parsed).
  std::vector<Activation> activations;
  /// Mesh axis -> its role, as declared (axis_roles:); the axes not named have their default.
  std::vector<std::pair<std::string, AxisRole>> axis_roles;

  /// The role of mesh axis `axis`: as declared, else default_axis_role.
  AxisRole axis_role(std::string_view axis) const;

  /// The rule the table describes: tensors with logical axes use the logical mapping (when
  /// given), others the regex rules in order, then the FSDP fallback, then (strict) a RuleError
  /// naming the path or (non-strict) replication. Throws RuleError for a bad regex, naming the
  /// file, its line and the position in the pattern.
  RulePtr make_rule() const;

  /// The shardings of `activations` for SjitOptions::annotation_shardings on `on_mesh`, by name:
  /// each dimension's logical axis mapped through `bind`, then logical_axes (the first entry
  /// for a name wins, as LogicalAxisRule). Applied to a value, a dimension whose size does not
  /// divide by its mesh axes' product is left unsharded. Throws RuleError naming the file, the
  /// line, the activation, the logical axis and the mesh axis when the mesh lacks that axis;
  /// the rule throws RuleError naming the activation and the shape when the ranks differ.
  std::map<std::string, RuleTree> activation_shardings(const Mesh& on_mesh,
                                                       const LogicalMapping& bind = {}) const;
  /// The mesh axes logical axis `name` maps to through `bind`, then logical_axes (empty: none).
  AxisNames logical_axis(std::string_view name, const LogicalMapping& bind = {}) const;
};

/// Parses a rule file. Throws IoError naming `source`, the line and what was expected.
RuleFile parse_rule_file(std::string_view yaml, std::string_view source = "<memory>");
/// Reads and parses a rule file. Throws IoError.
RuleFile load_rule_file(const std::filesystem::path& file);

/// Names of the presets compiled into the library ("llama_fsdp_tp.yaml", ...).
std::vector<std::string> preset_names();
/// The text of a compiled-in preset, by file name with or without ".yaml". Throws IoError
/// listing the known presets.
std::string_view preset_text(std::string_view name);
/// Parses a compiled-in preset.
RuleFile load_preset(std::string_view name);

}  // namespace shardplan
