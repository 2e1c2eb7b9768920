// The partitioner's reshard costs, each distinct question planned once (reshard_cost.hpp).
#include "reshard_cost.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "../ir/fields.hpp"
#include "propagate.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
std::int64_t add_bytes(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t out = 0;
  if (!checked_add(a, b, &out)) {
    throw SpecError(fmt::format("[compile] {} overflows int64 ({} + {} bytes)", what, a, b));
  }
  return out;
}

std::int64_t bytes_received(const std::vector<CollectiveRecord>& records) {
  std::int64_t total = 0;
  for (const auto& rec : records) total = add_bytes(total, rec.max_bytes_in(), "a reshard's bytes");
  return total;
}

bool same_cost(double a, double b) {
  if (a == b) return true;
  if (std::isinf(a) || std::isinf(b)) return false;
  return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
}

void check_links(const LinkFigures& links, const Mesh& mesh, std::string_view who) {
  for (const std::string& axis : mesh.axis_names()) {
    const auto it = links.axes.find(axis);
    if (it == links.axes.end()) {
      throw SpecError(fmt::format("[{}] links: mesh axis '{}' has no figure (mesh {})", who,
                                  printable(axis), mesh.to_string()));
    }
    const AxisLink& link = it->second;
    if (!(link.bytes_per_second > 0) || !std::isfinite(link.bytes_per_second) ||
        !(link.latency_seconds >= 0) || !std::isfinite(link.latency_seconds)) {
      throw SpecError(fmt::format(
          "[{}] links: mesh axis '{}' has bandwidth {} B/s and latency {} s; want a finite "
          "bandwidth > 0 and a finite latency >= 0",
          who, printable(axis), link.bytes_per_second, link.latency_seconds));
    }
  }
  if (!(links.flops_per_second >= 0) || !std::isfinite(links.flops_per_second)) {
    throw SpecError(fmt::format(
        "[{}] links: flops_per_second is {}; want a finite rate >= 0 (0: compute not counted)",
        who, links.flops_per_second));
  }
}

PartitionCost::PartitionCost(const Mesh& mesh, const std::optional<LinkFigures>& links)
    : timed_(links.has_value()) {
  if (!links) return;
  check_links(*links, mesh, "compile");
  links_ = *links;
}

Cost PartitionCost::of(const std::vector<CollectiveRecord>& records) const {
  Cost total;
  for (const CollectiveRecord& rec : records) {
    const auto bytes = static_cast<double>(rec.max_bytes_in());
    if (rec.kind == CollectiveKind::kSlice) continue;  // local: no link crossed
    ++total.collectives;
    if (!timed_) {
      total.value += bytes;
      continue;
    }
    double bandwidth = 0;
    double latency = 0;
    for (const std::string& axis : rec.axes) {
      const AxisLink& l = links_.axes.at(axis);
      bandwidth = bandwidth == 0 ? l.bytes_per_second : std::min(bandwidth, l.bytes_per_second);
      latency = std::max(latency, l.latency_seconds);
    }
    if (bandwidth > 0) total.value += latency + bytes / bandwidth;
  }
  return total;
}

Cost PartitionCost::compute(double flops) const {
  return {timed_ && links_.flops_per_second > 0 ? flops / links_.flops_per_second : 0, 0};
}

std::string PartitionCost::format(double cost) const {
  if (std::isinf(cost)) return "not possible (it would move a batch's examples)";
  if (!timed_) return fmt::format("{} B", static_cast<std::int64_t>(cost));
  if (cost >= 1e-3) return fmt::format("{:.3g} ms", cost * 1e3);
  return fmt::format("{:.3g} us", cost * 1e6);
}

Cost ReshardCosts::cost(const TensorType& type, const PartitionSpec& from,
                        const Pending& pending, const PartitionSpec& to,
                        const std::vector<std::string>* axes, bool* moves) {
  const auto answer = [&](const Entry& e) {
    if (moves != nullptr) {
      *moves = axes != nullptr && std::any_of(e.moved.begin(), e.moved.end(), [&](const auto& a) {
        return std::find(axes->begin(), axes->end(), a) != axes->end();
      });
    }
    return e.cost;
  };
  std::size_t h = hash_combine(hash_of(type.dtype), hash_of(type.shape));
  h = hash_combine(h, hash_of(from));
  h = hash_combine(h, hash_of(pending));
  h = hash_combine(h, hash_of(to));
  std::vector<Entry>& same_hash = known_[h];
  for (const Entry& e : same_hash) {
    if (e.type == type && e.from == from && e.pending == pending && e.to == to) return answer(e);
  }
  const std::vector<CollectiveRecord> plan = plan_reshard(
      type.shape, type.dtype, value_sharding(mesh_, from, type.shape), pending,
      value_sharding(mesh_, to, type.shape));
  Entry e{type, from, pending, to, model_.of(plan), {}};
  for (const CollectiveRecord& rec : plan) {
    if (rec.kind == CollectiveKind::kReduceScatter || rec.kind == CollectiveKind::kAllReduce ||
        rec.kind == CollectiveKind::kSlice) {
      continue;
    }
    e.moved.insert(e.moved.end(), rec.axes.begin(), rec.axes.end());
  }
  same_hash.push_back(std::move(e));
  return answer(same_hash.back());
}

}  // namespace shardplan::detail
