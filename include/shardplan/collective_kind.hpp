#pragma once

#include <ostream>
#include <string_view>

namespace shardplan {

/// What a collective (or one step of a reshard) is. Declared in the order of their names, so a
/// map keyed by kind lists them as a map keyed by name would (the costs print in that order).
enum class CollectiveKind {
  kAllGather,      // all_gather
  kAllReduce,      // all_reduce (reduce-scatter, then all-gather)
  kAllToAll,       // all_to_all
  kGeneral,        // general: each device fetches the parts of its new block it does not hold
  kPermute,        // permute
  kReduceScatter,  // reduce_scatter
  kSlice,          // slice: a local slice, no data moves
};

/// Every kind, in declaration order.
inline constexpr CollectiveKind kCollectiveKinds[] = {
    CollectiveKind::kAllGather, CollectiveKind::kAllReduce, CollectiveKind::kAllToAll,
    CollectiveKind::kGeneral,   CollectiveKind::kPermute,   CollectiveKind::kReduceScatter,
    CollectiveKind::kSlice};

/// "all_gather", "all_reduce", "all_to_all", "general", "permute", "reduce_scatter", "slice": the
/// name program texts, costs and plans print. Thread-safe.
std::string_view to_string(CollectiveKind kind);
std::ostream& operator<<(std::ostream& os, CollectiveKind kind);

}  // namespace shardplan
