#pragma once
// Steps 4 and 5 of the partitioner's choice (partition_choose.hpp): from the assignment steps
// 1-3 made, moves that lower the whole program's cost, the one lowering it most first; then
// groups of coupled nodes searched exactly. Private to partition_choose.cpp,
// partition_moves.cpp and partition_groups.cpp.

#include "partition_reads.hpp"
#include "partition_space.hpp"

namespace shardplan::detail {

/// The tie order of a node's candidates a and b (their places ia, ib among the node's): less
/// cost, then fewer bytes held, less work per device, fewer collectives, the strategies' order,
/// the place (partition_choose.cpp).
bool before(const Cost& cost_a, const Cand& a, int ia, const Cost& cost_b, const Cand& b, int ib);

/// Whether node v's candidate c can run given its operands' chosen states (`state`, by value):
/// each read as it is meets its operand's state, and a fallback reads no pending sum.
bool meets(const Graph& g, const ValueMap<Space>& space, const ValueMap<int>& state, ValueId v,
           const Cand& c);

/// Each node named by a hash of what it computes and how it is read, never by its number (the
/// order of moves and of a group's search): nodes with the same name compute the same.
ValueMap<std::size_t> numbering_free_names(const Graph& g, const GraphUses& uses);

/// Step 4, where values have several uses (`specs`: the outputs' shardings, interned): `pick` (by node, its candidate) and `state` (by
/// value, its candidate's state) moved while a move lowers the program's cost (the best first).
void improve(const Graph& g, const ValueMap<Spec>& specs, const GraphUses& uses,
             const ValueMap<Space>& space, ReadPricer& reads, ValueMap<int>& pick,
             ValueMap<int>& state);

/// After improve(): groups of nodes coupled by the values they share (a node, its operands'
/// makers, their other readers and its readers, grown by whole rings up to a bound), each
/// searched exactly over its nodes' candidates with the rest held; the group lowering the
/// program's cost most moved first, until none does (partition_groups.cpp). True when one moved.
bool improve_groups(const Graph& g, const ValueMap<Spec>& specs, const GraphUses& uses,
                    const ValueMap<Space>& space, ReadPricer& reads, ValueMap<int>& pick,
                    ValueMap<int>& state);

}  // namespace shardplan::detail
