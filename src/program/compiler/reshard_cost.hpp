#pragma once
// What the partitioner's choices cost (partition_choose.hpp): the reshards' collectives priced by
// one formula (PartitionCost), each distinct question planned once per mesh, since a step of many
// alike layers asks the same question at every layer. Private to the library.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../ir/graph.hpp"
#include "compile.hpp"
#include "shardplan/collectives.hpp"

namespace shardplan::detail {

/// a + b, or SpecError naming what overflowed (a plan of absurd sizes, never a wrapped number).
std::int64_t add_bytes(std::int64_t a, std::int64_t b, std::string_view what);

/// The steps' bytes: each step's most bytes any device receives, summed.
std::int64_t bytes_received(const std::vector<CollectiveRecord>& records);

/// A cost in PartitionCost's unit, and the number of collectives in it (a key of the tie
/// order). Both are shared alike: a value read n times charges each read 1/n of its making, of
/// its cost and of its collectives (so a total over a graph with shared values counts each once,
/// not once per path: an integer count summed along paths grew past 2^31 on the LLaMA step).
struct Cost {
  double value = 0;
  double collectives = 0;
  Cost& operator+=(const Cost& o) {
    value += o.value;
    collectives += o.collectives;
    return *this;
  }
  friend Cost operator+(Cost a, const Cost& b) { return a += b; }
};
/// Whether two costs are the same up to rounding (sums of the same terms in another order).
bool same_cost(double a, double b);

/// Refuses link figures (SjitOptions::links, CompileSpec::links) that would rank nothing: a mesh
/// axis without a figure, a bandwidth not finite and above 0, a latency or compute rate not
/// finite and at least 0. SpecError "[who] links: ...". (Figures for other axes are not read.)
void check_links(const LinkFigures& links, const Mesh& mesh, std::string_view who);

/// The partitioner's one cost formula. With link figures (CompileSpec::links): per collective,
/// the latency of its slowest axis plus the most bytes a device receives over that axis's
/// bandwidth, in seconds; the compute a strategy repeats, its flops over the device's rate. Without
/// them: the bytes a device receives, and compute counts nothing.
class PartitionCost {
 public:
  /// Throws as check_links.
  PartitionCost(const Mesh& mesh, const std::optional<LinkFigures>& links);
  Cost of(const std::vector<CollectiveRecord>& records) const;
  Cost compute(double flops) const;
  bool timed() const { return timed_; }
  /// "96 B" or "1.25 us".
  std::string format(double cost) const;

 private:
  bool timed_ = false;
  LinkFigures links_;
};

/// PartitionCost::of(plan_reshard(...)) on one mesh, each distinct question answered once (the
/// answer is a function of the question: the same shape, dtype, sharding, pending state and
/// target always cost the same). Throws as plan_reshard, and then remembers nothing.
class ReshardCosts {
 public:
  ReshardCosts(const Mesh& mesh, const PartitionCost& model) : mesh_(mesh), model_(model) {}
  /// `moves`, when given, is set to whether the reshard moves data (a collective other than a
  /// reduction or a local slice) over one of `axes`.
  Cost cost(const TensorType& type, const PartitionSpec& from, const Pending& pending,
            const PartitionSpec& to, const std::vector<std::string>* axes = nullptr,
            bool* moves = nullptr);

 private:
  struct Entry {
    TensorType type;
    PartitionSpec from;
    Pending pending;
    PartitionSpec to;
    Cost cost;
    std::vector<std::string> moved;  // the axes of its collectives that move data
  };
  const Mesh& mesh_;
  const PartitionCost& model_;
  // By a hash of the question; the entries of one hash compared in full.
  std::unordered_map<std::size_t, std::vector<Entry>> known_;
};

}  // namespace shardplan::detail
