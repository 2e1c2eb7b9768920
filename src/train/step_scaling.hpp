#pragma once
// Planning a step of many identical layers or micro-batches from a few small ones: the traced
// figures of a step (peak bytes and its split, FLOPs, bytes per collective) are affine in the
// layer count and in the micro-batch count, bilinear in both, once past small counts. Private to
// the library.
#include <cstdint>
#include <map>
#include <optional>
#include <variant>
#include <vector>

#include "shardplan/collective_kind.hpp"
#include "shardplan/program_cost.hpp"
#include "shardplan/train_plan.hpp"

namespace shardplan::train {

/// The byte figures of a traced step besides the bytes each collective kind receives: the
/// batch a device holds, the peak, the peak's split (ProgramCost::peak_by_kind), and the bytes
/// the kernels not on matrix units read and write (ProgramCost::memory_traffic, per device).
/// kReserved, kReservedExpandable: detail::reserved_bytes (allocation_events.hpp: the
/// caching allocator model). kLaunchedOps is a count, not bytes, kept here because it is an
/// exact integer affine in the layers as they are: the operations the forward and backward
/// passes launch (launched_ops in step_trace.cpp).
enum class ByteFigure {
  kBatch, kPeak, kPeakHeld, kPeakGathered, kPeakComputed, kMemoryTraffic, kReserved,
  kReservedExpandable, kLaunchedOps
};
/// A byte figure's key: one of those, a collective kind (the most bytes a device receives), a
/// collective kind over the mesh axes it runs in (ProgramCost::bytes_by_axes), or a kind of async
/// TP's pairs (its figure a count: tp_overlap_pairs).
using ByteKey = std::variant<ByteFigure, CollectiveKind, CollectiveOn, TpOverlapKind>;
/// The FLOPs of a traced step: the busiest device's, all devices' together, and the busiest
/// device's in products, in fused attention and in float8 products (ProgramCost::matmul_flops,
/// attention_flops, matmul_fp8_flops).
enum class FlopFigure { kBusiest, kTotal, kMatmul, kAttention, kMatmulFp8 };

/// The figures of one traced training step that grow with its layer and micro-batch counts.
struct StepFigures {
  std::map<ByteKey, std::int64_t> bytes;
  std::map<FlopFigure, double> flops;
  friend bool operator==(const StepFigures&, const StepFigures&) = default;
};

/// The figures of a step traced with `layers` layers and `micro_batches` micro-batches.
struct StepSample {
  std::int64_t layers = 0, micro_batches = 0;
  StepFigures figures;
};

/// The figures at (layers, micro_batches) on the function a + b l + c k + d l k fitted to the
/// samples at the two smallest layer counts l0, l0 + 1 and micro-batch counts k0, k0 + 1 (one
/// count alone: that term is left out), when every sample lies on it: bytes exactly (the memory
/// traffic, a time-model figure, to a relative 1e-3), FLOPs to a relative 1e-12 (sums of
/// doubles). When a sample lies off it, fitted again past the smallest count of each dimension
/// that varies (a step of the fewest layers or micro-batches may peak elsewhere), the samples
/// there checked the same way, when a third count to check remains. nullopt when a sample lies
/// off both, the samples' keys differ or the fitting samples are missing. Throws SpecError when a
/// byte count overflows int64.
std::optional<StepFigures> extrapolate(const std::vector<StepSample>& samples, std::int64_t layers,
                                       std::int64_t micro_batches);

}  // namespace shardplan::train
