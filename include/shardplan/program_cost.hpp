#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
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

/// The part of a training step a program step belongs to, as recorded while tracing
/// (begin_phase in sjit.hpp; value_and_grad records its forward and backward passes).
enum class StepPhase : std::uint8_t { kForward, kBackward, kUpdate };
/// "forward", "backward", "update".
std::string_view name(StepPhase phase);

/// One value live at a program's peak, per device.
struct LiveValue {
  std::int64_t bytes = 0;
  /// An argument ("argument 0 'layers/0/w'"), an argument resharded, or the op that made the
  /// value with the names checkpoint_name gave it and an annotation's name ("dot_general
  /// 'mlpwo'").
  std::string what;
  std::string type;  // the global type: "bf16[8,2048,4096]"
  int input = -1;    // the argument's input index (also when resharded); -1: computed
  bool resharded = false;
  /// The phase of the step that made it; none for an argument held as passed, or when the
  /// trace recorded no phases.
  std::optional<StepPhase> phase;
  friend bool operator==(const LiveValue&, const LiveValue&) = default;
};

/// Where a phase begins: the index of its first program step.
struct PhaseStart {
  StepPhase phase = StepPhase::kForward;
  std::size_t step = 0;
  friend bool operator==(const PhaseStart&, const PhaseStart&) = default;
};

/// The bytes a device holds over the program's steps (the memory pass's own count: each buffer
/// once, a view and the value it views one buffer; what a run measures, MemoryDebugMode).
struct MemoryTimeline {
  std::int64_t start_bytes = 0;  // the arguments, before the first step
  /// Per step: the bytes live once its result is allocated (before it frees what it read last).
  std::vector<std::int64_t> live_bytes;
  /// The step of the (first) peak; live_bytes.size() when the peak is the arguments alone.
  std::size_t peak_step = 0;
  /// The largest values live at the peak, largest first, at most kMaxLiveAtPeak of them.
  std::vector<LiveValue> live_at_peak;
  static constexpr std::size_t kMaxLiveAtPeak = 20;
  /// Where each recorded phase begins, in step order, the first at step 0 (a phase may begin
  /// again: forward and backward per micro-batch); empty when the trace recorded none.
  std::vector<PhaseStart> phases;
  friend bool operator==(const MemoryTimeline&, const MemoryTimeline&) = default;
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
  /// By device, what a time model counts at the matrix units' rates: the FLOPs of products
  /// (dot_general), of fused attention and of float8 products (scaled_dot) (each part of
  /// `flops`).
  std::vector<double> matmul_flops;
  std::vector<double> attention_flops;
  std::vector<double> matmul_fp8_flops;
  /// Per device (every device holds blocks of one size, so one figure), what a time model counts
  /// at memory bandwidth: the bytes every kernel not on the matrix units reads and writes (a
  /// fused group: its operands and its result; views, collectives that move nothing and kept
  /// constants: none).
  std::int64_t memory_traffic = 0;
  /// By device id. Over processes (a program compiled for an executor whose devices span them)
  /// a device's peak also counts what a collective stages there to receive from other
  /// processes, at its step (CollectiveRecord::staging_bytes; docs/distributed.md): the first
  /// device of each process may then peak above the others and above `timeline`.
  std::vector<std::int64_t> peak_bytes;
  /// What is live at the (first) peak, by kind.
  PeakByKind peak_by_kind;
  /// The bytes live after each step, what is live at the peak, where each phase begins.
  MemoryTimeline timeline;
  /// Three or more lines: flops, bytes per collective kind, peak memory.
  std::string to_string() const;
};

}  // namespace shardplan
