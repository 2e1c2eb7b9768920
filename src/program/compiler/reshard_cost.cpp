// The partitioner's reshard costs, each distinct question planned once (reshard_cost.hpp).
#include "reshard_cost.hpp"

#include <fmt/format.h>

#include <functional>
#include <string>

#include "../ir/fields.hpp"
#include "shardplan/detail/checked.hpp"
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

std::int64_t ReshardCosts::bytes(const TensorType& type, const PartitionSpec& from,
                                 const Pending& pending, const PartitionSpec& to) {
  std::size_t h = hash_combine(hash_of(type.dtype), hash_of(type.shape));
  h = hash_combine(h, hash_of(from));
  h = hash_combine(h, hash_of(pending));
  h = hash_combine(h, hash_of(to));
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
