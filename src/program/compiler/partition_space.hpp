#pragma once
// The candidates of every node (partition_choose.hpp), each made from the declared properties
// of its op and the layouts its operands can be in. Private to partition_candidates.cpp and
// partition_choose.cpp.

#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "partition_choose.hpp"

namespace shardplan::detail {

inline constexpr double kInfinite = std::numeric_limits<double>::infinity();
inline constexpr Cost kInf{kInfinite, 0};
inline constexpr int kRead = -1;      // Cand::as_is: read in the wanted sharding (a reshard when needed)
inline constexpr int kAnyState = -2;  // Cand::as_is: held as it is, in whatever layout (keep_alive)

bool equivalent(const Mesh& mesh, const PartitionSpec& a, const PartitionSpec& b, int rank);

/// A PartitionSpec interned for one choice (SpecTable): equal specs are one handle, so the
/// choice's hot paths copy, compare and key by a small integer, never by the axes' names.
class Spec {
 public:
  Spec() = default;  // no spec (only to be assigned)
  const PartitionSpec& operator*() const { return entry_->spec; }
  const PartitionSpec* operator->() const { return &entry_->spec; }
  const std::vector<AxisNames>& dims() const { return entry_->spec.dims(); }
  /// Its index in its table: 0, 1, 2, ... in the order specs were first interned.
  int id() const { return entry_->id; }
  friend bool operator==(Spec a, Spec b) { return a.entry_ == b.entry_; }

 private:
  friend class SpecTable;
  struct Entry {
    PartitionSpec spec;
    int id;
  };
  explicit Spec(const Entry* e) : entry_(e) {}
  const Entry* entry_ = nullptr;
};

/// The specs of one choice, each distinct spec once. Handles stay valid while it lives.
class SpecTable {
 public:
  SpecTable() = default;
  SpecTable(const SpecTable&) = delete;
  SpecTable& operator=(const SpecTable&) = delete;
  Spec intern(const PartitionSpec& spec);
  /// intern(spec_of_dims(dims)) without building the spec when it is known.
  Spec intern_dims(const std::vector<AxisNames>& dims);

 private:
  Spec intern(const AxisNames* dims, std::size_t n);

  std::deque<Spec::Entry> entries_;
  std::unordered_multimap<std::size_t, const Spec::Entry*> by_hash_;
};

// Mesh axes per factor of a node.
class FactorAxes {
 public:
  explicit FactorAxes(int factors = 0) : axes_(static_cast<std::size_t>(factors)) {}
  AxisNames& operator[](int factor) { return axes_[static_cast<std::size_t>(factor)]; }
  const AxisNames& operator[](int factor) const { return axes_[static_cast<std::size_t>(factor)]; }
  friend bool operator==(const FactorAxes&, const FactorAxes&) = default;

 private:
  std::vector<AxisNames> axes_;
};

// One way to run a node (a candidate): what it reads each operand in, what it makes.
struct Cand {
  Strategy strategy = Strategy::kPassFirst;
  std::string why;  // the result's Layout::why ("" for the propagation's own choice)
  Decision::Kind kind = Decision::Kind::kKernel;
  std::vector<Spec> wants;
  std::vector<int> as_is;  // per operand: the operand state read as it is, kRead or kAnyState
  Layout result;
  int state = -1;       // index of `result` among the node's states
  Cost compute;         // the compute it does per device (PartitionCost)
  double work = 1;      // the fraction of the node's work each device does
  std::int64_t held = 0;  // the bytes of its result a device holds
  // Not a candidate while a carry is possible (Linearity::carry: the sum is carried whatever it
  // costs): taken only where its operand is not pending after all, reading it reduced.
  bool fallback = false;
  Cost total = kInf;  // forward: compute + its reads at their least cost
};

/// A state interned (ReadPricer::key): its spec's handle and its pending sum's index (0: none).
struct StateKey {
  Spec spec;
  int pending = 0;
};

struct Space {
  std::vector<Layout> states;
  std::vector<StateKey> keys;  // by state: its key (the choice sets them)
  std::vector<Cand> cands;
  std::vector<Cost> best;  // by state: the least total of a candidate making it
  std::vector<int> arg;      // by state: that candidate
};

/// What the candidates and the choice both read of the graph: each value's readers.
struct GraphUses {
  explicit GraphUses(const Graph& g);
  ValueMap<std::vector<std::pair<ValueId, int>>> users;  // (node, operand position), by value
  ValueMap<int> reads_of;        // the operand slots and outputs that read it
  ValueMap<char> is_output;
  ValueMap<char> pointwise_only;  // read by pointwise nodes only
  ValueMap<char> constant;        // depends on no input (cacheable sources and what they make)
};

/// Every node's candidates and the states they make, in graph order (a candidate may depend on
/// the layouts its operands can be in), then a repetition's candidates in the shardings its one
/// user reads it in.
/// The candidates' wants are interned in `table`.
ValueMap<Space> build_candidates(const Graph& g, const Propagator& prop,
                                 const ValueMap<PartitionSpec>& specs, const Mesh& mesh,
                                 const PartitionCost& model, const GraphUses& uses,
                                 SpecTable& table);

/// CandidateSpace's pieces of the reads' cost (partition_choose.hpp): each value's wanted
/// shardings (outputs' and every reader's candidates'), each candidate's index into its operands',
/// and what each costs made from each state and from each other's reduced copy, by `reshard`
/// (the choice's own: read_plan's terms).
void read_pieces(const Graph& g, const ValueMap<PartitionSpec>& specs, const ValueMap<Space>& space,
                 CandidateSpace& out,
                 const std::function<Cost(ValueId, const Layout&, const PartitionSpec&)>& reshard);

}  // namespace shardplan::detail
