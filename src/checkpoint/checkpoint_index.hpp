#pragma once
// Reading a checkpoint's index (model.safetensors.index.json): Hugging Face's weight map and
// shardplan's own record in its metadata. Text in, plain values out (no files, no runtime), so
// that read_checkpoint_info and the fuzzers (tests/fuzz/fuzz_checkpoint_*.cpp) share them.
// Both go through the project's JSON reader (json_impl.hpp): bounded nesting, checked UTF-8,
// linear time, and messages that quote at most a short piece of a value.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace shardplan::detail {

/// The version of shardplan's record that save_checkpoint writes and this reader accepts.
inline constexpr int kCheckpointFormatVersion = 1;

/// Shardplan's record: index.metadata.shardplan.
struct CheckpointRecord {
  std::string mesh;           // "" when absent
  char name_separator = '/';  // "names": "tree paths" ('/', the default) or "dotted" ('.')
  std::string structure;      // the tree's structure as JSON text, "" when absent
  std::unordered_map<std::string, std::uint64_t> checksums;  // file name -> XXH3-64
  std::unordered_map<std::string, std::string> shardings;    // tensor name -> sharding text
};

/// What an index says.
struct CheckpointIndex {
  /// Tensor name -> file name (relative, inside the directory), in the index's order; every
  /// name once.
  std::vector<std::pair<std::string, std::string>> weight_map;
  std::optional<CheckpointRecord> record;  // when metadata.shardplan is there
};

/// Parses an index's text. Throws IoError "[checkpoint] SOURCE: ..." for text that is not JSON,
/// a missing or malformed weight_map (a tensor twice, a file name that is not a plain relative
/// name inside the directory) or a malformed record.
CheckpointIndex parse_checkpoint_index(std::string_view text, std::string_view source);

/// Parses a record alone (its JSON object's text); messages name `source` as the index does.
CheckpointRecord parse_checkpoint_record(std::string_view text, std::string_view source);

}  // namespace shardplan::detail
