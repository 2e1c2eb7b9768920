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
  /// Three or more lines: flops, bytes per collective kind, peak memory.
  std::string to_string() const;
};

}  // namespace shardplan
