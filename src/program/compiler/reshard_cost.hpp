#pragma once
// What the partitioner's choices cost: the bytes of reshards (plan_reshard's steps, the most any
// device receives in each, summed), remembered per (type, layout, target) for one mesh, since a
// step of many alike layers asks the same question at every layer. Private to the library.

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../ir/graph.hpp"
#include "shardplan/collectives.hpp"

namespace shardplan::detail {

/// a + b, or SpecError naming what overflowed (a plan of absurd sizes, never a wrapped number).
std::int64_t add_bytes(std::int64_t a, std::int64_t b, std::string_view what);

/// The steps' bytes: each step's most bytes any device receives, summed.
std::int64_t bytes_received(const std::vector<CollectiveRecord>& records);

/// bytes_received(plan_reshard(...)) on one mesh, each distinct question answered once (the
/// answer is a function of the question: the same shape, dtype, sharding, pending state and
/// target always cost the same). Throws as plan_reshard, and then remembers nothing.
class ReshardCosts {
 public:
  explicit ReshardCosts(const Mesh& mesh) : mesh_(mesh) {}
  std::int64_t bytes(const TensorType& type, const PartitionSpec& from, const Pending& pending,
                     const PartitionSpec& to);

 private:
  struct Entry {
    TensorType type;
    PartitionSpec from;
    Pending pending;
    PartitionSpec to;
    std::int64_t bytes = 0;
  };
  const Mesh& mesh_;
  // By a hash of the question; the entries of one hash compared in full.
  std::unordered_map<std::size_t, std::vector<Entry>> known_;
};

}  // namespace shardplan::detail
