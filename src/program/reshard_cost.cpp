// The partitioner's reshard costs, each distinct question planned once (reshard_cost.hpp).
#include "reshard_cost.hpp"

#include <fmt/format.h>

#include <functional>
#include <string>

#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

void hash_mix(std::size_t& h, std::size_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
}

void hash_axes(std::size_t& h, const std::vector<std::string>& axes) {
  hash_mix(h, axes.size());
  for (const std::string& a : axes) hash_mix(h, std::hash<std::string_view>()(a));
}

void hash_spec(std::size_t& h, const PartitionSpec& spec) {
  hash_mix(h, static_cast<std::size_t>(spec.size()));
  for (const AxisNames& dim : spec.dims()) hash_axes(h, dim);
}

}  // namespace

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

std::int64_t ReshardCosts::bytes(const TensorType& type, const PartitionSpec& from,
                                 const Pending& pending, const PartitionSpec& to) {
  std::size_t h = static_cast<std::size_t>(type.dtype);
  hash_mix(h, static_cast<std::size_t>(type.shape.rank()));
  for (int d = 0; d < type.shape.rank(); ++d) hash_mix(h, static_cast<std::size_t>(type.shape[d]));
  hash_spec(h, from);
  hash_mix(h, static_cast<std::size_t>(pending.op));
  hash_axes(h, pending.axes);
  hash_spec(h, to);
  std::vector<Entry>& same_hash = known_[h];
  for (const Entry& e : same_hash) {
    if (e.type == type && e.from == from && e.pending == pending && e.to == to) return e.bytes;
  }
  const std::int64_t b = bytes_received(plan_reshard(
      type.shape, type.dtype, NamedSharding(mesh_, from), pending, NamedSharding(mesh_, to)));
  same_hash.push_back(Entry{type, from, pending, to, b});
  return b;
}

}  // namespace shardplan::detail
