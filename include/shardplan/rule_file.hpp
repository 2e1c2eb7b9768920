#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardplan/partition_spec.hpp"
#include "shardplan/sharding_rule.hpp"

namespace shardplan {

/// A rule table read from YAML (format in docs/rule-files.md):
///
///   mesh: "fsdp:-1,tp:2"          # optional default mesh
///   strict: true                  # optional, default true
///   rules:                        # ordered; first match wins
///     - {match: "self_attn/(q|k|v)_proj/weight", spec: [tp, fsdp]}
///     - {match: "norm", spec: []}
///   fsdp_fallback: {axis: fsdp, min_size: 1048576}   # optional, for leaves no rule matched
///   logical_axes: {batch: data, mlp: tp, embed: null} # optional
struct RuleFile {
  struct Rule {
    std::string match;
    PartitionSpec spec;
    int line = 0;  // 1-based line in the file, for messages
  };
  struct FsdpFallback {
    std::string axis = "fsdp";
    std::int64_t min_size = std::int64_t{1} << 20;
  };

  std::string source;  // file name, or "<memory>"
  std::optional<std::string> mesh;
  bool strict = true;
  std::vector<Rule> rules;
  std::optional<FsdpFallback> fsdp_fallback;
  std::vector<std::pair<std::string, std::optional<AxisNames>>> logical_axes;

  /// The rule the table describes: tensors with logical axes use the logical mapping (when
  /// given), others the regex rules in order, then the FSDP fallback, then (strict) a RuleError
  /// naming the path or (non-strict) replication. Throws RuleError for a bad regex, naming the
  /// file, its line and the position in the pattern.
  RulePtr make_rule() const;
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
