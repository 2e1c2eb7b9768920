#pragma once
// A training step's time from its planned figures on some hardware (docs/training.md "Step
// time"). Private to the library.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/hardware.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/train_plan.hpp"

namespace shardplan::train {

/// A host-side figure of the time model with its source.
struct SourcedSeconds {
  double seconds = 0;
  std::string_view source;
};
/// What PyTorch's DTensor takes on the host to dispatch one op on sharded tensors, its sharding
/// propagation found in its cache (the common case in a training loop), the local kernel's
/// launch included: PyTorch's own dispatch-overhead test expects 90 us. Charged per launched op
/// of an eager step with tensor parallelism (StepTime::dispatch_seconds_per_op).
inline constexpr SourcedSeconds kDTensorDispatch{
    90e-6,
    "pytorch/pytorch test/distributed/tensor/test_dtensor_dispatch_overhead.py "
    "(pytorch/pytorch#159699, August 2025): expected_dispatch_time = 90 (us), the median "
    "dispatch of aten.add on a Shard(0) DTensor [512, 512] over 4 CUDA devices with the "
    "sharding propagation cached"};

/// What the time model needs besides the plan's figures.
struct TimeInputs {
  AxisNames model_axes;    // tensor-parallel axes: their collectives are exposed
  AxisNames context_axes;  // ring attention's: overlapped as FSDP's are
  /// The layers the step runs, times its micro-batches: FSDP gathers layer by layer, so the
  /// first layer's share of the overlapped communication is never hidden.
  std::int64_t layer_steps = 1;
  double model_flops_per_token = 0;
  std::int64_t tokens_per_step = 0;  // the global batch's tokens
  /// How the data-parallel collectives overlap compute (TrainPlanOptions::dp_overlap); with
  /// buckets, the buckets' elements (dp_buckets: the backward pass's order) and their size.
  DpOverlap dp_overlap = DpOverlap::kFsdp;
  std::vector<std::int64_t> dp_bucket_elements;
  std::int64_t dp_bucket_size = 0;
  /// Micro-batches: Megatron reduces the gradients under the last one's backward pass and
  /// gathers the parameters under the first one's forward pass.
  std::int64_t micro_batches = 1;
  bool zero1 = false;  // ZeRO-1 (--optimizer-sharding zero1): its all-gathers over data axes
  /// Host time to dispatch each launched op (TrainPlan::launched_ops); 0: not charged (a
  /// compiled step, or no tensor parallelism).
  double dispatch_seconds_per_op = 0;
};

/// "node" when every group of devices a collective over `axes` runs in lies in one node of
/// `node_size` consecutive device ids (each group checked: none is assumed like device 0's), the mesh's devices numbered row-major (the last axis innermost, as
/// torch's init_device_mesh and JAX's create_device_mesh lay them out); else "network".
LinkTier tier_of(const Mesh& mesh, const std::vector<std::string>& axes, std::int64_t node_size);

/// What a collective over `axes` runs at: bytes per second a device receives, and over the
/// network the NICs a node lends its group (0 inside a node). A ring (all-gather,
/// reduce-scatter, all-reduce) over the network is bound by the fewest of its group's devices in
/// a node (group_devices_per_node) times a NIC's rate, and never faster than the node's links
/// it also crosses; anything else by one NIC.
struct Bandwidth {
  double bytes_per_second = 0;
  std::int64_t nics = 0;
};
Bandwidth bandwidth(const Mesh& mesh, const std::vector<std::string>& axes, const Hardware& hw,
                    bool ring);

/// "node's links", or "network (8 NICs a node)": where a collective runs, for the report and
/// the page.
std::string link_text(const CommTime& c);

/// The fewest devices of one group of a collective over `axes` in one node, over every group and
/// every node it touches (the ring's narrowest crossing: its NICs), the devices numbered as
/// tier_of says; at least 1. Every group is looked at: with a node size that does not divide
/// the group layout (6 on fsdp:2,tp:4) they lie differently.
std::int64_t group_devices_per_node(const Mesh& mesh, const std::vector<std::string>& axes,
                                    std::int64_t node_size);

/// PaLM's model FLOPs per token: 6 N + 12 L H Q T, N the parameters (the active ones:
/// ModelConfig::active_parameter_count) less the input embedding
/// (when it is not tied to the head), L layers, H heads, Q their width, T the sequence.
double model_flops_per_token(const ModelConfig& config, std::int64_t parameters, std::int64_t seq);

/// The step's time (StepTime's comment says how).
StepTime step_time(const TrainPlan& plan, const Mesh& mesh, const Hardware& hw,
                   const TimeInputs& in);

}  // namespace shardplan::train
