#pragma once
// A training step's time on some hardware, as train-plan's time model gives it
// (TrainPlan::time; docs/training.md "Step time"): the compute, each kind of collective on its
// link tier and role, what of it is exposed, async TP's pairs and the data-parallel overlap.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/program_cost.hpp"  // CollectiveOn

namespace shardplan {

/// The links a collective's groups run over: kNode (every device of a group in one node: the
/// fast links) or kNetwork.
enum class LinkTier { kNode, kNetwork };
/// "node", "network" (as the report and its JSON write them).
std::string_view name(LinkTier tier);
/// What a collective is for: kData (a weight's gather, whatever its axes, and anything over
/// batch axes only: FSDP's gathers and gradient reductions), kContext (ring attention's
/// transfers), kTensor (the rest over model axes: tensor parallelism's collectives).
enum class CommRole { kData, kContext, kTensor };
/// "data", "context", "tensor" (as the report and its JSON write them).
std::string_view name(CommRole role);

/// Async TP (TrainPlanOptions::async_tp): a kind of tensor-parallel collective run decomposed and
/// overlapped with products, as read from the planned program: an all-gather over model axes
/// whose result products read split along the gathered dimension (fused_all_gather_matmul), or
/// a reduce-scatter over model axes of a product's pending result (fused_matmul_reduce_scatter).
struct TpOverlapKind {
  CollectiveOn collective;  // all-gather or reduce-scatter, over model axes
  std::int64_t bytes = 0;   // the most a device receives, each
  std::int64_t flops = 0;   // the products' it runs with, per device (the busiest), each
  bool float8 = false;      // those products are float8 (scaled_dot)
  friend auto operator<=>(const TpOverlapKind&, const TpOverlapKind&) = default;
  friend bool operator==(const TpOverlapKind&, const TpOverlapKind&) = default;
};
/// How many of one kind a step runs (forward and backward passes).
struct TpOverlap {
  TpOverlapKind kind;
  std::int64_t count = 0;
  friend bool operator==(const TpOverlap&, const TpOverlap&) = default;
};

/// One kind of async TP's pairs in the time model (docs/training.md "Async TP"): the collective
/// over a group of n devices split in n chunks, one per rank, the products in n pieces; the local
/// chunk's piece first while the first remote chunk moves, then each chunk's transfer under the
/// piece before it (PyTorch's _pipelined_all_gather_and_consume; the reduce-scatter's mirror
/// _pipelined_produce_and_all2all). A pair lasts product/n + max(transfer, product (n-1)/n): its
/// exposed part is max(0, transfer - product (n-1)/n).
struct TpOverlapTime {
  TpOverlap pair;
  LinkTier tier = LinkTier::kNode;
  std::int64_t group = 1;       // n: the devices of the collective's group
  double comm_seconds = 0;      // one collective at the tier's bandwidth, as if exposed
  double matmul_seconds = 0;    // its products at the matrix units' rate
  double exposed_seconds = 0;   // one pair's exposed part
};

/// One line of a step's communication time: a kind of collective over some mesh axes.
struct CommTime {
  CollectiveOn collective;
  LinkTier tier = LinkTier::kNode;
  CommRole role = CommRole::kData;
  std::int64_t bytes = 0;  // the most a device receives per step
  /// Over the network: the NICs a node's part of the group sends through at once. For a ring
  /// (all-gather, reduce-scatter, all-reduce) the data enters and leaves each node once and the
  /// node's devices of the group each drive one ring over their own NIC (NCCL's rings), so it is
  /// the group's devices in a node; for the rest (all-to-all, permutes) each device sends its
  /// own data through its own NIC: 1. 0 on the node's links.
  std::int64_t nics = 0;
  double seconds = 0;  // at the tier's achievable bandwidth
  /// Under compute when there is enough of it: context's, and data's as DpOverlap says (all
  /// with kFsdp; the reductions, and with kBuckets ZeRO-1's gathers, with buckets; none off).
  bool overlapped = false;
};

/// A training step's time on some hardware (docs/training.md "Step time"): the busiest device's
/// matmul and attention FLOPs at their achievable rates and its other kernels' bytes at memory
/// bandwidth; communication per link tier, FSDP's and the ring's hidden under compute up to the
/// compute's length (the first layer's share never), tensor parallelism's exposed.
struct StepTime {
  std::string hardware;  // the entry's name
  double matmul_seconds = 0, attention_seconds = 0, memory_seconds = 0;
  double matmul_fp8_seconds = 0;  // float8 products at the fp8 rate (--float8)
  /// FSDP2's copy-out of each gathered weight from the all-gather's flat buffer into its
  /// parameter (foreach_all_gather_copy_out, on the compute stream before the layer runs): the
  /// unsharded bytes read and written at memory bandwidth.
  double copy_out_seconds = 0;
  std::vector<CommTime> comms;
  /// Exposed communication by tier (both tiers present) and in all; what of it is tensor
  /// parallelism's.
  std::map<LinkTier, double> exposed_by_tier;
  double exposed_seconds = 0, exposed_tensor_seconds = 0;
  double step_seconds = 0;
  double tokens_per_second_per_device = 0;
  /// 6 N + 12 L H Q T (PaLM's; N the active parameters without the input embedding)
  double model_flops_per_token = 0;
  /// model_flops_per_token x tokens/s per device / the bf16 peak, never clamped.
  double mfu = 0;

  /// Eager tensor parallelism (TrainPlan::eager with a model axis): the host dispatches each op
  /// the forward and backward passes launch (TrainPlan::launched_ops) as DTensor does, at
  /// dispatch_seconds_per_op each (its source in docs/training.md "Step time"), while the device
  /// runs what was dispatched before: the step lasts at least the host's dispatch_seconds, and
  /// dispatch_exposed_seconds is what that adds to the device's time. All 0 otherwise.
  std::int64_t launched_ops = 0;
  double dispatch_seconds_per_op = 0, dispatch_seconds = 0, dispatch_exposed_seconds = 0;
  /// Async TP (TrainPlan::tp_overlaps): each kind's figures; exposed_tensor_seconds counts
  /// their exposed parts in place of their collectives' seconds, which tp_overlap_hidden_seconds
  /// says how much of was hidden. Empty and 0 without.
  std::vector<TpOverlapTime> tp_overlaps;
  double tp_overlap_hidden_seconds = 0;
  /// How the data-parallel collectives were timed (DpOverlap's name, as the time model ran
  /// it). With buckets: the buckets' parameter elements per device in the order the backward
  /// pass reduces them (the last holds the model's first parameters), the size they close at,
  /// and the gradient reductions' and ZeRO-1 parameter gathers' seconds, whole and exposed.
  std::string dp_overlap = "fsdp";
  std::vector<std::int64_t> dp_bucket_elements;
  std::int64_t dp_bucket_size = 0;
  double dp_reduce_seconds = 0, dp_reduce_exposed_seconds = 0;
  double dp_gather_seconds = 0, dp_gather_exposed_seconds = 0;

  double compute_seconds() const {
    return matmul_seconds + matmul_fp8_seconds + attention_seconds + memory_seconds +
           copy_out_seconds;
  }
};

}  // namespace shardplan
