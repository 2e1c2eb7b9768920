#include "shardplan/collective_kind.hpp"

namespace shardplan {

std::string_view to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kGeneral:
      return "general";
    case CollectiveKind::kPermute:
      return "permute";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kSlice:
      break;
  }
  return "slice";
}

std::ostream& operator<<(std::ostream& os, CollectiveKind kind) { return os << to_string(kind); }

}  // namespace shardplan
