#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardplan {

/// What a compiled program costs, per device: floating-point operations of its kernels, the
/// most bytes a device receives per kind of collective, and the peak of the bytes it holds
/// (its inputs and every live intermediate).
struct ProgramCost {
  std::vector<double> flops;                          // by device id
  std::map<std::string, std::int64_t> bytes_by_kind;  // most bytes a device receives, per kind
  std::vector<std::int64_t> peak_bytes;               // by device id
  /// What is live at the (first) peak, by kind: "inputs" (the arguments still held),
  /// "resharded inputs" (arguments gathered or moved to another sharding: FSDP's gathered
  /// weights), "computed" (what the program made: activations, gradients, temporaries and
  /// their reshardings). Adds up to the peak.
  std::map<std::string, std::int64_t> peak_by_kind;
  /// Three or more lines: flops, bytes per collective kind, peak memory.
  std::string to_string() const;
};

}  // namespace shardplan
