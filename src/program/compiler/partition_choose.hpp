#pragma once
// Phase 1 of the partitioner (partition.hpp): every node's strategy, chosen as one minimum of one
// cost over the whole program. Private to partition*.cpp and the partitioner's tests.
//
// Each node has candidate strategies (partition_space.hpp), each made from declared properties
// (the propagated factors, Primitive::linearity, fixed layouts, pointwise): its reduce or pass
// factors taking the contested mesh axes, a pointwise node split like an operand, a pending sum
// carried through a linear op. A candidate says what layout it reads each operand in (or reads
// one as it is, pending sum kept) and what layout its result is in. The cost of a program is the
// cost of its reshards (PartitionCost, reshard_cost.hpp) plus the compute its strategies do.
// The choice:
//   1. forward, in graph order, the least cost of making each value in each layout it can be made
//      in (dynamic programming; a value read n times charges each read 1/n of making it: exact
//      on chains and on trees of single-use values);
//   2. backward, each value's layout the least cost given every sharding its chosen users want
//      it in (all at once: a pending sum wanted in several shardings is reduced once and the
//      others made from that copy where that is cheaper; ReadPlan);
//   3. forward again, every read as it is checked against the layout chosen for its operand; a
//      node where one is not met takes its cheapest candidate given its operands' layouts;
//   4. where values have several uses, moves that lower the whole program's cost: each node's
//      best move and each shared sharding's (its readers moving together) are evaluated, the
//      one lowering the cost most is applied, and the moves it touched are evaluated again,
//      until none lowers it; then 1-4 again with shared values priced at their marginal cost
//      given the last choice, keeping the cheapest round;
//   5. groups of nodes coupled by the values they share, each searched exactly over its nodes'
//      candidates with the rest held, the group lowering the cost most moved first; then 4
//      again (partition_moves.hpp, improve_groups).
// Ties go to less work per device, then fewer collectives, then the strategies' declared order
// (Strategy), then the candidate's place among its node's; of two moves that lower the cost
// alike, to a hash of what the node computes and how it is read (not its number). Nothing
// depends on the order of a value's uses.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "compile.hpp"
#include "propagate.hpp"
#include "reshard_cost.hpp"

namespace shardplan::detail {

/// The kinds of candidate, in their order for ties.
enum class Strategy : std::uint8_t {
  kSplitLike,     // a pointwise node split like a pending or split operand (1/n of the work)
  kPassFirst,     // the result's sharding first, then the reduce factors take what is left
  kReduceFirst,   // the reduce factors take the operands' axes first (all, or a subset)
  kCarry,         // a pending sum carried through a linear op
  kMadeForUser,   // a repetition made in the one sharding its one user wants
  kFixed,         // the layouts the op fixes (shard_map), an input, an alias
};
std::string_view to_string(Strategy s);

/// What the emitter does for a node.
struct Decision {
  enum class Kind {
    kInput,   // bound to an input slot
    kKernel,  // operands brought to `wants` (or taken as they are), then a kernel step
    kAlias,   // no step: the value is its one operand's, brought to wants[0] or as it is
  };
  Kind kind = Kind::kKernel;
  std::vector<PartitionSpec> wants;
  std::vector<char> as_is;
  Layout result;
  /// The chosen strategy and its cost, and the runner-up's (the reshards a decision inserts name
  /// it): "its reduce factors took x first: 96 B; runner-up pass factors first: 192 B".
  std::string decision;
};

/// How a value's reshards are made: for each sharding its users want it in, from the value as it
/// is (nullopt) or from its copy in another of those shardings.
using ReadPlan = std::vector<std::pair<PartitionSpec, std::optional<PartitionSpec>>>;

struct Choices {
  ValueMap<Decision> decisions;
  ValueMap<ReadPlan> reads;   // by value, the shardings its users (and outputs) want, non-empty
  ValueMap<char> constants;   // values that depend on no input
  double cost = 0;            // the chosen program's cost (PartitionCost's unit)
};

/// The strategies of the whole program (the steps of the comment above).
Choices choose(const Graph& g, const Propagator& prop, const ValueMap<PartitionSpec>& specs,
               const CompileSpec& spec);

/// For the partitioner's tests: every candidate of every node (given every layout its operands
/// can be in), and the cost of any consistent assignment, so a brute-force search over the same
/// candidates can be compared with choose().
struct CandidateSpace {
  struct Candidate {
    Strategy strategy;
    Decision decision;  // wants, as_is, result
    // Per operand: the operand's state index read as it is, -1 (read in decision.wants, made
    // from the operand's state as cost() says) or -2 (held in whatever state it is in).
    std::vector<int> as_is_state;
    Cost compute;  // the compute it does (PartitionCost's unit)
    // Per operand read in decision.wants: that sharding's index in the operand's `wanted`; -1.
    std::vector<int> wanted;
    // Possible only where the operands it reads in decision.wants are in a state with no sum
    // pending (cost() is infinite otherwise).
    bool fallback = false;
  };
  struct NodeSpace {
    std::vector<Layout> states;         // the layouts the value can be in
    std::vector<Candidate> candidates;  // each names its result state in `result_state`
    std::vector<int> result_state;
    std::string op;  // the node's primitive
    std::vector<ValueId> operands;
    // The pieces of cost()'s reads of the value: every sharding a candidate of one of its readers
    // reads it in, and the program's output its own (`output`: its index, or -1); the cost of
    // making wanted[w] from states[s] (from_state[w][s]) and, when a state has a sum pending,
    // from the copy reduced into wanted[r] (from_copy[w][r], infinite for r == w).
    std::vector<PartitionSpec> wanted;
    int output = -1;
    std::vector<std::vector<double>> from_state, from_copy;
  };
  ValueMap<NodeSpace> nodes;
  /// The cost of the program where node i runs candidate pick[i] (consistent: each read as it is
  /// meets the operand's chosen result), its reads made as choose() makes them (ReadPlan): the
  /// candidates' compute, plus per value in its chosen state s, with W the distinct shardings its
  /// chosen readers read it in (and the output's): the sum over W of from_state[w][s]; or, where
  /// s has a sum pending and W has two or more, the least of that and, over each r in W, the
  /// cost of making W[r] from s and each other w from s or from W[r], whichever costs less.
  std::function<double(const std::vector<int>& pick)> cost;
  /// choose()'s pick, as candidate indices.
  std::vector<int> chosen;
};
CandidateSpace candidate_space(const Graph& g, const Propagator& prop,
                               const ValueMap<PartitionSpec>& specs, const CompileSpec& spec);

/// candidate_space of `graph` prepared as compile() prepares it (compile.cpp).
CandidateSpace partition_candidates(const Graph& graph, const CompileSpec& spec);

}  // namespace shardplan::detail
