// The time model (docs/training.md "Step time"): compute from the busiest device's FLOPs and
// memory traffic, communication per link tier, FSDP's and the ring's overlapped with compute.
#include "step_time.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "shardplan/detail/printable.hpp"
#include "model_family.hpp"
#include "resolve_options.hpp"
#include "shardplan/error.hpp"

namespace shardplan::train {

namespace {

// The distance in device ids between neighbours along `axis` (row-major, the last axis
// innermost).
std::int64_t axis_stride(const Mesh& mesh, const std::string& axis) {
  const std::vector<std::string>& names = mesh.axis_names();
  std::int64_t stride = 1;
  for (auto k = static_cast<std::size_t>(mesh.axis_index(axis)) + 1; k < names.size(); ++k) {
    stride *= mesh.axis_size(names[k]);
  }
  return stride;
}

/// How the groups of a collective over `axes` lie against nodes of `node_size` consecutive
/// device ids: every group, from each of its bases (a device whose coordinate on each of `axes`
/// is 0), its members base + the offsets. A node size that does not divide the mesh or the group
/// layout (6 on fsdp:2,tp:4) makes groups that differ: each is looked at, none assumed a
/// translate of device 0's.
struct Placement {
  bool inside_nodes = true;       // every group lies in one node
  std::int64_t fewest_in_a_node;  // the fewest members a group has in any node it touches
};
Placement place_groups(const Mesh& mesh, const std::vector<std::string>& axes,
                       std::int64_t node_size) {
  std::vector<std::int64_t> offsets{0};  // ascending
  std::vector<std::pair<std::int64_t, std::int64_t>> strides;  // (stride, size) per axis
  for (const std::string& a : axes) {
    const std::int64_t stride = axis_stride(mesh, a), size = mesh.axis_size(a);
    strides.emplace_back(stride, size);
    std::vector<std::int64_t> next;
    for (std::int64_t c = 0; c < size; ++c) {
      for (const std::int64_t o : offsets) next.push_back(o + c * stride);
    }
    offsets = std::move(next);
  }
  std::sort(offsets.begin(), offsets.end());
  Placement p{true, static_cast<std::int64_t>(offsets.size())};
  for (std::int64_t base = 0; base < mesh.size(); ++base) {
    const bool is_base = std::all_of(strides.begin(), strides.end(), [&](const auto& s) {
      return (base / s.first) % s.second == 0;
    });
    if (!is_base) continue;
    if (base / node_size != (base + offsets.back()) / node_size) p.inside_nodes = false;
    std::int64_t run = 0, node = base / node_size;
    for (const std::int64_t o : offsets) {
      if ((base + o) / node_size != node) {
        p.fewest_in_a_node = std::min(p.fewest_in_a_node, run);
        node = (base + o) / node_size;
        run = 0;
      }
      ++run;
    }
    p.fewest_in_a_node = std::min(p.fewest_in_a_node, run);
  }
  return p;
}

}  // namespace

}  // namespace shardplan::train

namespace shardplan {

std::string_view name(LinkTier tier) { return tier == LinkTier::kNode ? "node" : "network"; }

std::string_view name(CommRole role) {
  switch (role) {
    case CommRole::kData:
      return "data";
    case CommRole::kContext:
      return "context";
    case CommRole::kTensor:
      return "tensor";
  }
  return "data";
}

}  // namespace shardplan

namespace shardplan::train {

LinkTier tier_of(const Mesh& mesh, const std::vector<std::string>& axes, std::int64_t node_size) {
  return place_groups(mesh, axes, node_size).inside_nodes ? LinkTier::kNode : LinkTier::kNetwork;
}

Bandwidth bandwidth(const Mesh& mesh, const std::vector<std::string>& axes, const Hardware& hw,
                    bool ring) {
  // Over the network a ring is bound by the node's NICs it runs through, and never faster than
  // the node's links it also crosses (each device forwards every byte it receives).
  const double intra = hw.intra_node_bandwidth * hw.intra_node_efficiency;
  if (tier_of(mesh, axes, hw.node_size) == LinkTier::kNode) return {intra, 0};
  const std::int64_t nics = ring ? group_devices_per_node(mesh, axes, hw.node_size) : 1;
  return {std::min(intra,
                   static_cast<double>(nics) * hw.inter_node_bandwidth * hw.inter_node_efficiency),
          nics};
}

std::string link_text(const CommTime& c) {
  if (c.tier == LinkTier::kNode) return "node's links";
  return fmt::format("network ({} NIC{} a node)", c.nics, c.nics == 1 ? "" : "s");
}

std::int64_t group_devices_per_node(const Mesh& mesh, const std::vector<std::string>& axes,
                                    std::int64_t node_size) {
  return std::max<std::int64_t>(1, place_groups(mesh, axes, node_size).fewest_in_a_node);
}

double model_flops_per_token(const ModelConfig& c, std::int64_t parameters, std::int64_t seq) {
  double n = static_cast<double>(parameters);
  if (!c.tie_embeddings) n -= static_cast<double>(c.vocab) * static_cast<double>(c.hidden);
  const double layers = static_cast<double>(c.family->encoder_decoder ? c.layers + c.decoder_layers
                                                                         : c.layers);
  return 6 * n + 12 * layers * static_cast<double>(c.heads) * static_cast<double>(c.head_dim) *
                     static_cast<double>(seq);
}

namespace {

// A weight's gather is FSDP's (prefetched under compute) whatever axes it runs over; anything
// else by its axes.
CommRole role_of(const CollectiveOn& on, const TimeInputs& in) {
  if (on.of_argument) return CommRole::kData;
  const std::vector<std::string>& axes = on.axes;
  const auto any_in = [&](const AxisNames& set) {
    return std::any_of(axes.begin(), axes.end(), [&](const std::string& a) {
      return std::find(set.begin(), set.end(), a) != set.end();
    });
  };
  if (any_in(in.model_axes)) return CommRole::kTensor;
  if (any_in(in.context_axes)) return CommRole::kContext;
  return CommRole::kData;
}

// Async TP: each pair's collective over n devices runs as n chunks under the product's n pieces
// (TpOverlapTime): its exposed part replaces the collective's seconds in the tensor-parallel
// exposed time. A transfer at the ring's bandwidth (the collective's own figure; PyTorch copies
// each remote chunk over the same links); the pieces at the product's rate (the hardware has one
// GEMM efficiency, not one per product size: the smaller pieces' is not modelled).
void overlap_tensor_pairs(const TrainPlan& plan, const Mesh& mesh, const Hardware& hw,
                          StepTime& t) {
  for (const TpOverlap& p : plan.tp_overlaps) {
    const CollectiveOn& on = p.kind.collective;
    TpOverlapTime o;
    o.pair = p;
    o.tier = tier_of(mesh, on.axes, hw.node_size);
    for (const std::string& a : on.axes) o.group *= mesh.axis_size(a);
    o.comm_seconds =
        static_cast<double>(p.kind.bytes) / bandwidth(mesh, on.axes, hw, true).bytes_per_second;
    const double rate = p.kind.float8 ? hw.fp8_flops * hw.fp8_matmul_efficiency
                                      : hw.bf16_flops * hw.matmul_efficiency;
    o.matmul_seconds = static_cast<double>(p.kind.flops) / rate;
    const auto n = static_cast<double>(o.group);
    o.exposed_seconds = std::max(0.0, o.comm_seconds - o.matmul_seconds * (n - 1) / n);
    const double hidden =
        static_cast<double>(p.count) * (o.comm_seconds - o.exposed_seconds);
    t.exposed_by_tier[o.tier] -= hidden;
    t.exposed_tensor_seconds -= hidden;
    t.tp_overlap_hidden_seconds += hidden;
    t.tp_overlaps.push_back(o);
  }
}

// How one collective is timed: in FSDP's layer pipeline, per bucket (Megatron's DDP), or
// exposed.
enum class DpTiming { kPipelined, kReduceBuckets, kGatherBuckets, kExposed };

// Whether a collective runs over a batch axis (one neither a model nor a context axis): the
// gradients' reduction over batch and context axes together is data parallelism's, though its
// role (role_of) is the context's.
bool spans_batch_axis(const CollectiveOn& on, const TimeInputs& in) {
  return std::any_of(on.axes.begin(), on.axes.end(), [&](const std::string& a) {
    return std::find(in.model_axes.begin(), in.model_axes.end(), a) == in.model_axes.end() &&
           std::find(in.context_axes.begin(), in.context_axes.end(), a) == in.context_axes.end();
  });
}

DpTiming dp_timing(const CommTime& c, const TimeInputs& in) {
  if (c.role == CommRole::kTensor) return DpTiming::kExposed;
  const bool data = c.role == CommRole::kData || spans_batch_axis(c.collective, in);
  if (!data || in.dp_overlap == DpOverlap::kFsdp) return DpTiming::kPipelined;
  if (in.dp_overlap == DpOverlap::kOff) return DpTiming::kExposed;
  // Buckets: the gradient reductions (all-reduce; reduce-scatter with ZeRO-1) and ZeRO-1's
  // all-gather of the updated parameters (a result's gather, not an argument's); anything
  // else over the data axes is exposed.
  const CollectiveOn& on = c.collective;
  if (on.of_argument) return DpTiming::kExposed;
  if (on.kind == CollectiveKind::kAllReduce || on.kind == CollectiveKind::kReduceScatter) {
    return DpTiming::kReduceBuckets;
  }
  if (on.kind == CollectiveKind::kAllGather && in.zero1) return DpTiming::kGatherBuckets;
  return DpTiming::kExposed;
}

// The collectives one kind of bucketed transfer is made of, by tier.
struct BucketedTransfers {
  double seconds = 0;
  std::map<LinkTier, double> by_tier;
  void add(const CommTime& c) {
    seconds += c.seconds;
    by_tier[c.tier] += c.seconds;
  }
  // Adds `exposed` of it to the tiers in proportion.
  void expose(double exposed, StepTime& t) const {
    for (const auto& [tier, s] : by_tier) t.exposed_by_tier[tier] += exposed * s / seconds;
  }
};

// A transfer split over the buckets in proportion to their elements, run one bucket after the
// other beside `compute`: the `waits` bucket's share cannot start before (the gather of the
// first layers' bucket) or end before (the reduction of theirs) the compute it overlaps, and
// the rest shows what exceeds that compute.
double bucketed_exposed(double seconds, double waits_share, double compute) {
  const double waits = seconds * waits_share;
  return waits + std::max(0.0, seconds - waits - compute);
}

// Megatron's DDP with --overlap-grad-reduce (docs/training.md "Step time"): a bucket's
// reduction starts when the backward pass has produced its last gradient, so the last bucket's
// (the model's first parameters) follows the backward compute; with --overlap-param-gather the
// forward pass waits for the first layers' bucket's gather and runs under the next ones'. Over
// micro-batches, under the last one's backward pass and the first one's forward pass.
void time_buckets(const TimeInputs& in, double compute, const BucketedTransfers& reduce,
                  const BucketedTransfers& gather, StepTime& t) {
  std::int64_t total = 0;
  for (const std::int64_t e : in.dp_bucket_elements) total += e;
  const double last_share =
      total > 0 ? static_cast<double>(in.dp_bucket_elements.back()) / static_cast<double>(total)
                : 1.0;
  // The backward pass's products are twice the forward's (dx and dw): 2/3 and 1/3 of the
  // compute, one micro-batch's.
  const double micro = static_cast<double>(std::max<std::int64_t>(in.micro_batches, 1));
  const double backward = compute * 2 / 3 / micro, forward = compute / 3 / micro;
  t.dp_bucket_elements = in.dp_bucket_elements;
  t.dp_bucket_size = in.dp_bucket_size;
  t.dp_reduce_seconds = reduce.seconds;
  t.dp_reduce_exposed_seconds = bucketed_exposed(reduce.seconds, last_share, backward);
  t.dp_gather_seconds = gather.seconds;
  t.dp_gather_exposed_seconds = in.dp_overlap == DpOverlap::kBuckets
                                    ? bucketed_exposed(gather.seconds, last_share, forward)
                                    : gather.seconds;
  if (reduce.seconds > 0) reduce.expose(t.dp_reduce_exposed_seconds, t);
  if (gather.seconds > 0) gather.expose(t.dp_gather_exposed_seconds, t);
}

// Where each collective's seconds go: FSDP's pipeline, a bucketed transfer, or exposed.
struct Pools {
  double overlapped = 0, exposed_data = 0;
  std::map<LinkTier, double> overlapped_by_tier;
  BucketedTransfers reduce, gather;
};

void place(CommTime& c, const TimeInputs& in, Pools& pools, StepTime& t) {
  switch (dp_timing(c, in)) {
    case DpTiming::kPipelined:
      c.overlapped = true;
      pools.overlapped += c.seconds;
      pools.overlapped_by_tier[c.tier] += c.seconds;
      break;
    case DpTiming::kReduceBuckets:
      c.overlapped = true;
      pools.reduce.add(c);
      break;
    case DpTiming::kGatherBuckets:
      c.overlapped = in.dp_overlap == DpOverlap::kBuckets;
      pools.gather.add(c);
      break;
    case DpTiming::kExposed:
      c.overlapped = false;
      t.exposed_by_tier[c.tier] += c.seconds;
      if (c.role == CommRole::kTensor) {
        t.exposed_tensor_seconds += c.seconds;
      } else {
        pools.exposed_data += c.seconds;
      }
      break;
  }
}

}  // namespace

StepTime step_time(const TrainPlan& plan, const Mesh& mesh, const Hardware& hw,
                   const TimeInputs& in) {
  StepTime t;
  t.hardware = hw.name;
  t.matmul_seconds = plan.matmul_flops / (hw.bf16_flops * hw.matmul_efficiency);
  t.attention_seconds = plan.attention_flops / (hw.bf16_flops * hw.attention_efficiency);
  if (plan.matmul_fp8_flops > 0) {
    if (hw.fp8_flops <= 0) {
      refuse(Refusal::kFloat8Hardware,
             fmt::format("the step has float8 products (--float8) but the hardware '{}' has no "
                         "float8 matrix units (fp8_flops 0)",
                         detail::printable(hw.name)));
    }
    t.matmul_fp8_seconds = plan.matmul_fp8_flops / (hw.fp8_flops * hw.fp8_matmul_efficiency);
  }
  const double memory_rate = hw.memory_bandwidth * hw.memory_efficiency;
  t.memory_seconds = static_cast<double>(plan.memory_traffic) / memory_rate;
  Pools pools;
  t.exposed_by_tier = {{LinkTier::kNode, 0.0}, {LinkTier::kNetwork, 0.0}};
  for (const auto& [on, bytes] : plan.bytes_by_axes) {
    if (bytes == 0) continue;
    CommTime c;
    c.collective = on;
    c.tier = tier_of(mesh, on.axes, hw.node_size);
    c.role = role_of(on, in);
    c.bytes = bytes;
    const bool ring = on.kind == CollectiveKind::kAllGather ||
                      on.kind == CollectiveKind::kReduceScatter ||
                      on.kind == CollectiveKind::kAllReduce;
    const Bandwidth b = bandwidth(mesh, on.axes, hw, ring);
    c.nics = b.nics;
    c.seconds = static_cast<double>(bytes) / b.bytes_per_second;
    if (on.of_argument && on.kind == CollectiveKind::kAllGather) {
      // The gathered weight's unsharded bytes: a device receives (n - 1) / n of them.
      std::int64_t n = 1;
      for (const std::string& a : on.axes) n *= mesh.axis_size(a);
      if (n > 1) {
        const double unsharded =
            static_cast<double>(bytes) * static_cast<double>(n) / static_cast<double>(n - 1);
        t.copy_out_seconds += 2 * unsharded / memory_rate;
      }
    }
    place(c, in, pools, t);
    t.comms.push_back(std::move(c));
  }
  overlap_tensor_pairs(plan, mesh, hw, t);
  // FSDP's pipeline over n layer steps: the first layer's gather waits, then each layer's
  // transfers run under the previous layer's compute, showing only what exceeds it.
  const auto n = static_cast<double>(std::max<std::int64_t>(in.layer_steps, 1));
  const double compute = t.compute_seconds();
  const double overlapped = pools.overlapped;
  const double exposed_overlapped =
      overlapped > 0 ? overlapped / n + (n - 1) / n * std::max(0.0, overlapped - compute) : 0;
  for (const auto& [tier, s] : pools.overlapped_by_tier) {
    t.exposed_by_tier[tier] += exposed_overlapped * s / overlapped;
  }
  t.dp_overlap = std::string(name(in.dp_overlap));
  if (in.dp_overlap == DpOverlap::kBuckets || in.dp_overlap == DpOverlap::kGradBuckets) {
    time_buckets(in, compute, pools.reduce, pools.gather, t);
  }
  t.exposed_seconds = t.exposed_tensor_seconds + exposed_overlapped + pools.exposed_data +
                      t.dp_reduce_exposed_seconds + t.dp_gather_exposed_seconds;
  // Eager dispatch: the host issues the ops in order while the device runs those issued before
  // it (an unbounded queue), so the step takes the longer of the two.
  t.launched_ops = in.dispatch_seconds_per_op > 0 ? plan.launched_ops : 0;
  t.dispatch_seconds_per_op = in.dispatch_seconds_per_op;
  t.dispatch_seconds = static_cast<double>(t.launched_ops) * in.dispatch_seconds_per_op;
  t.dispatch_exposed_seconds = std::max(0.0, t.dispatch_seconds - (compute + t.exposed_seconds));
  t.step_seconds = compute + t.exposed_seconds + t.dispatch_exposed_seconds;
  t.model_flops_per_token = in.model_flops_per_token;
  if (t.step_seconds > 0 && plan.devices > 0) {
    t.tokens_per_second_per_device = static_cast<double>(in.tokens_per_step) / t.step_seconds /
                                     static_cast<double>(plan.devices);
    t.mfu = t.model_flops_per_token * t.tokens_per_second_per_device / hw.bf16_flops;
  }
  return t;
}

}  // namespace shardplan::train

namespace shardplan {

LinkFigures link_figures(const Hardware& hw, const Mesh& mesh) {
  LinkFigures links;
  for (const std::string& axis : mesh.axis_names()) {
    links.axes[axis] =
        AxisLink{.bytes_per_second = train::bandwidth(mesh, {axis}, hw, true).bytes_per_second};
  }
  links.flops_per_second = hw.bf16_flops * hw.matmul_efficiency;
  return links;
}

}  // namespace shardplan
