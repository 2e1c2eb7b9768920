#pragma once
// How the partitioner prices and makes a value's reads (partition_choose.hpp, steps 1-2): the
// cost of one reshard, where none is possible (it would move a batch's examples between
// devices of the batch axes: InputSpec::batch), and the cost and plan of every sharding a
// value's users want it in (a pending sum reduced once, the others made from that copy where
// that is cheaper). Private to partition_choose.cpp.

#include <cstdint>
#include <string>
#include <unordered_map>
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
  /// A state's key: its spec interned in `table` and its pending sum's index here.
  StateKey key(const Layout& state, SpecTable& table);
  /// One reshard of v from `from` to `to`; infinite where it would move a batch's examples.
  Cost reshard(ValueId v, StateKey from, Spec to);
  /// plan()'s cost alone.
  Cost cost(ValueId v, StateKey at, const std::vector<Spec>& wants);
  /// The reads of v in state `at` for the shardings `wants`, and their cost.
  std::pair<Cost, ReadPlan> plan(ValueId v, StateKey at, std::vector<Spec> wants);

 private:
  Cost uncached(ValueId v, StateKey from, Spec to);
  void mark_examples(const CompileSpec& spec);
  void mark_kept(ValueMap<char>& marks) const;
  void key_types();

  const Graph& g_;
  const Propagator& prop_;
  ReshardCosts costs_;
  // 1: values whose examples stay on their devices; kAsItIs: values read as they are.
  static constexpr char kAsItIs = 2;
  ValueMap<char> examples_;
  std::vector<std::string> batch_axes_;  // the axes batch inputs are split over
  std::vector<Pending> pendings_;        // by StateKey::pending (0: none)
  // Each value's type and whether its examples stay (what a reshard's cost depends on besides
  // the specs), as an index: values alike share their answers.
  ValueMap<int> type_key_;
  // A question reshard() answered: the value's type key, from's spec and pending indices, to's.
  struct Question {
    int type, from, pending, to;
    friend bool operator==(const Question&, const Question&) = default;
  };
  struct QuestionHash {
    std::size_t operator()(const Question& q) const;
  };
  std::unordered_map<Question, Cost, QuestionHash> known_;
  std::vector<Cost> own_;  // cost()'s scratch
  std::vector<char> dup_;
};

}  // namespace shardplan::detail
