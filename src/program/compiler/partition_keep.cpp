// The partitioner's phase 3 (partition.cpp has the first two): keep what is read, count it.
#include <fmt/format.h>

#include <algorithm>

#include "partition.hpp"
#include "../ir/primitives.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {

namespace {

// A floating-point argument as read (argument_read): what FSDP gathers (a weight), not what the
// step computed.
bool of_argument(const Graph& g, ValueId v) {
  const std::optional<ValueId> arg = argument_read(g, v);
  return arg && is_floating(g[*arg].type.dtype);
}

}  // namespace

// Drops the steps whose results nothing reads (no later step, no output), then counts the
// FLOPs and the bytes per collective kind of the steps kept.
void keep_read(const Graph& g, Partitioned& p, int devices) {
  std::vector<char> read(static_cast<std::size_t>(p.num_slots), 0);
  for (const SlotId s : p.output_slots) read[index(s)] = 1;
  std::vector<char> keep(p.steps.size(), 0);
  for (std::size_t i = p.steps.size(); i-- > 0;) {
    const Step& st = p.steps[i];
    if (read[index(st.out)] == 0) continue;
    keep[i] = 1;
    for (const SlotId in : st.in) read[index(in)] = 1;
  }
  if (std::find(keep.begin(), keep.end(), 0) != keep.end()) {  // (otherwise all are kept as they are)
    std::vector<Step> kept;
    kept.reserve(p.steps.size());
    for (std::size_t i = 0; i < p.steps.size(); ++i) {
      if (keep[i] != 0) kept.push_back(std::move(p.steps[i]));
    }
    p.steps = std::move(kept);
  }
  p.flops.assign(static_cast<std::size_t>(devices), 0);
  p.matmul_flops.assign(static_cast<std::size_t>(devices), 0);
  p.attention_flops.assign(static_cast<std::size_t>(devices), 0);
  p.matmul_fp8_flops.assign(static_cast<std::size_t>(devices), 0);
  const auto flops_of = [&p](TimeBound bound) -> std::vector<double>* {
    switch (bound) {
      case TimeBound::kMatmul:
        return &p.matmul_flops;
      case TimeBound::kAttention:
        return &p.attention_flops;
      case TimeBound::kMatmulFp8:
        return &p.matmul_fp8_flops;
      case TimeBound::kMemory:
        break;
    }
    return nullptr;
  };
  for (const Step& st : p.steps) {
    if (st.kind == Step::Kind::kKernel) {
      for (double& fl : p.flops) fl += st.flops;
      if (std::vector<double>* part = flops_of(st.local.op->time_bound)) {
        for (double& fl : *part) fl += st.flops;
      }
    }
    for (const auto& rec : st.cost) {
      std::int64_t& b = p.bytes_by_kind[rec.kind];
      const bool argument = st.kind == Step::Kind::kReshard && of_argument(g, st.node);
      std::int64_t& on = p.bytes_by_axes[CollectiveOn{rec.kind, rec.axes, argument}];
      if (!checked_add(b, rec.max_bytes_in(), &b) || !checked_add(on, rec.max_bytes_in(), &on)) {
        throw SpecError("[compile] the bytes received per step overflow int64");
      }
    }
  }
}

std::vector<CollectiveRecord> collective_cost(const CollectivePlan& plan, DType dtype,
                                              const Mesh& mesh, int devices_per_process) {
  if (plan.permute_axis.empty()) {
    return plan_reshard(plan.view, dtype, NamedSharding(mesh, plan.from), plan.pending,
                        NamedSharding(mesh, plan.to), devices_per_process);
  }
  // A permute: every device a pair sends to from another coordinate receives one block, into
  // its output (permute stages nothing).
  const int ax = mesh.axis_index(plan.permute_axis);
  const auto num =
      static_cast<std::size_t>(*std::max_element(mesh.devices().begin(), mesh.devices().end()) + 1);
  CollectiveRecord rec{CollectiveKind::kPermute, {plan.permute_axis},
                       std::vector<std::int64_t>(num, 0), std::vector<std::int64_t>(num, 0)};
  const std::int64_t block = byte_size(NamedSharding(mesh, plan.from).shard_shape(plan.view), dtype);
  for (const int d : mesh.devices()) {
    const std::int64_t at = mesh.coords_of_position(mesh.position_of_device(d))[static_cast<std::size_t>(ax)];
    for (const auto& [from, to] : plan.pairs) {
      if (to == at && from != to) rec.bytes_in[static_cast<std::size_t>(d)] = block;
    }
  }
  return {std::move(rec)};
}

}  // namespace shardplan::detail
