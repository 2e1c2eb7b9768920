#pragma once
// How the partitioner prices and makes a value's reads (partition_choose.hpp, steps 1-2): the
// cost of one reshard, where none is possible (it would move a batch's examples between
// devices of the batch axes: InputSpec::batch), and the cost and plan of every sharding a
// value's users want it in (a pending sum reduced once, the others made from that copy where
// that is cheaper). Private to partition_choose.cpp.

#include <string>
#include <utility>
#include <vector>

#include "partition_space.hpp"

namespace shardplan::detail {

/// a < b: less cost, then (among the same cost) fewer collectives.
bool cheaper(const Cost& a, const Cost& b);

class ReadPricer {
 public:
  /// `model` must outlive it.
  ReadPricer(const Graph& g, const Propagator& prop, const Mesh& mesh, const PartitionCost& model,
             const CompileSpec& spec);
  /// One reshard of v from `from` to `to`; infinite where it would move a batch's examples.
  Cost reshard(ValueId v, const Layout& from, const PartitionSpec& to);
  /// plan()'s cost alone.
  Cost cost(ValueId v, const Layout& at, const std::vector<PartitionSpec>& wants);
  Cost cost(ValueId v, const Layout& at, const std::vector<const PartitionSpec*>& wants);
  /// The reads of v in layout `at` for the shardings `wants`, and their cost.
  std::pair<Cost, ReadPlan> plan(ValueId v, const Layout& at, std::vector<PartitionSpec> wants);

 private:
  Cost reshard(ValueId v, const PartitionSpec& from, const Pending& pending, const PartitionSpec& to);
  void mark_examples(const CompileSpec& spec);

  const Graph& g_;
  const Propagator& prop_;
  ReshardCosts costs_;
  ValueMap<char> examples_;              // values whose examples stay on their devices
  std::vector<std::string> batch_axes_;  // the axes batch inputs are split over
  std::vector<const PartitionSpec*> ptrs_;  // cost()'s scratch
  std::vector<Cost> own_;
  std::vector<char> dup_;
};

}  // namespace shardplan::detail
