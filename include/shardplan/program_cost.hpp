#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shardplan/collective_kind.hpp"

namespace shardplan {

/// What is live at a program's (first) peak, per device, by what it is. Adds up to the peak.
struct PeakByKind {
  std::int64_t inputs = 0;  // the arguments still held
  /// Arguments gathered or moved to another sharding (FSDP's gathered weights).
  std::int64_t resharded_inputs = 0;
  /// What the program made: activations, gradients, temporaries and their reshardings.
  std::int64_t computed = 0;
  friend bool operator==(const PeakByKind&, const PeakByKind&) = default;
};

/// A kind of collective over the mesh axes it runs in (as the collective names them), and whether
/// what it moves is an argument (a weight) as passed or cast (FSDP's gathers: a runtime can
/// prefetch them, whatever the axes).
struct CollectiveOn {
  CollectiveKind kind = CollectiveKind::kGeneral;
  std::vector<std::string> axes;
  bool of_argument = false;
  friend auto operator<=>(const CollectiveOn&, const CollectiveOn&) = default;
  friend bool operator==(const CollectiveOn&, const CollectiveOn&) = default;
};

/// What a compiled program costs, per device: floating-point operations of its kernels, the
/// most bytes a device receives per kind of collective, and the peak of the bytes it holds
/// (its inputs and every live intermediate).
struct ProgramCost {
  std::vector<double> flops;  // by device id
  /// The most bytes a device receives, per kind of collective the program runs (a kind it runs
  /// without moving data, a local slice, is there with 0).
  std::map<CollectiveKind, std::int64_t> bytes_by_kind;
  /// The same split by the mesh axes each collective runs in (a time model's link tiers).
  std::map<CollectiveOn, std::int64_t> bytes_by_axes;
  /// By device, what a time model counts at the matrix units' rates and at memory bandwidth:
  /// the FLOPs of products (dot_general) and of fused attention (part of `flops`), and the bytes
  /// every other kernel reads and writes (a fused group: its operands and its result; views and
  /// kept constants: none).
  std::vector<double> matmul_flops;
  std::vector<double> attention_flops;
  std::vector<std::int64_t> memory_traffic;
  std::vector<std::int64_t> peak_bytes;  // by device id
  /// What is live at the (first) peak, by kind.
  PeakByKind peak_by_kind;
  /// Three or more lines: flops, bytes per collective kind, peak memory.
  std::string to_string() const;
};

}  // namespace shardplan
