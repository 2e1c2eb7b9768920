#pragma once
// Pass 1, sharding propagation. Input: a graph, a mesh, and the shardings fixed by the user
// (in/out shardings, constraints, annotations). Output: a sharding for every value (dimension by
// dimension, as mesh axes) with its origin ("from %3 through dot_general"), and each node's
// factors (its primitive's sharding rule), which the partitioner reuses. The result does not
// depend on the order of a value's uses: the nodes are visited by depth, those of one depth
// propose together, and a value takes its proposals in an order of their data (Propagator::run).

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../ir/factors.hpp"
#include "../ir/graph.hpp"
#include "shardplan/array.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/partition_spec.hpp"

namespace shardplan::detail {

/// A value's sharding while propagating.
struct Sharding {
  std::vector<AxisNames> dims;
  bool known = false;
  bool fixed = false;
  /// Fixed padded (Uneven::kPad over a dimension its axes do not divide): a padded input, or
  /// what is fixed like one (a gradient sharded like its parameter).
  bool padded = false;
  std::string origin;
  /// The sum the value would be pending over if every node ran in its propagated sharding: a
  /// node's own reduce factors' axes, and the pending sums of its operands carried through it
  /// where it is linear in them (Primitive::linearity). An estimate (carry_pending): the
  /// partitioner decides the actual layout, and reads this for values it has not decided yet.
  Pending pending;

  bool uses(const std::string& axis) const;
};

/// The spec of `dims`, without trailing unsharded dimensions.
PartitionSpec spec_of_dims(std::vector<AxisNames> dims);
/// The number of devices along `axes`.
std::int64_t product(const Mesh& mesh, const AxisNames& axes);
/// The sharding a program gives a value of `shape` split as `spec`: padded (Uneven::kPad) where
/// the axes do not divide a dimension, which only a padded input's spec does (no candidate of an
/// op splits a dimension its axes do not divide: each reads a padded one gathered), else the
/// refusing one a user's own sharding is.
NamedSharding value_sharding(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape);
/// Whether `n` takes a padded split of its operands and gives one (value_sharding): a pointwise
/// primitive (Primitive::pointwise: element i from the operands' elements i) whose operands have
/// its shape, or a per-element one (Primitive::per_element) whose other operands are scalars, so
/// each block of each is ceil(n/k) rows at the same places; its pad rows are computed and never
/// read. Every other op reads a padded dimension gathered.
bool takes_padded(const Graph& g, const Node& n);

class Propagator {
 public:
  Propagator(const Graph& g, const Mesh& mesh);
  /// Fixes value `id` to `spec`. Throws SpecError for an unknown axis or, unless `uneven` is
  /// Uneven::kPad (a padded input), a shape that does not divide, naming the value.
  void fix(ValueId id, const PartitionSpec& spec, std::string origin,
           Uneven uneven = Uneven::kRefuse);
  /// Propagates to a fixed point, forward and backward over the nodes by depth (pointwise ones
  /// first); values nothing reached are replicated. Where proposals of one depth for a value
  /// conflict, a fixed sharding wins, then the larger tensor's, then the axes first in mesh
  /// order, then the more major dimension (within one node, the earlier factor): never the
  /// order of the uses.
  void run();

  /// Estimates every value's pending sum (Sharding::pending), after run(); `inputs`: the sums
  /// the inputs arrive pending over, by input index.
  void carry_pending(std::span<const Pending> inputs);

  const Sharding& at(ValueId id) const { return sh_[id]; }
  const OpFactors& factors(ValueId id) const { return factors_[id]; }

 private:
  /// A sharding one node proposes for one dimension of a value it touches.
  struct Proposal {
    ValueId target;
    std::pair<int, std::int64_t> rank;  // -(fixed, elements) of the source: lower first
    std::vector<int> axis_order;        // the axes' indices in the mesh
    int dim;
    AxisNames axes;
    ValueId source;
    ValueId through;  // the node
  };
  // Over every depth, forward then backward (only the pointwise nodes when `pointwise_only`).
  bool sweep(bool pointwise_only);
  // Every proposal of `nodes` is made from the shardings before them, then taken best first.
  bool through(std::span<const ValueId> nodes, bool pointwise_only);
  void propose(ValueId id, std::vector<Proposal>& out) const;
  // Whether a value node `id` touches (an operand or its result) changed since it last proposed.
  // A proposal is made only for a free dimension and axes its target does not use, so each one
  // is either taken (its target changes) or refused because another proposal changed the target
  // first: a node none of whose values changed since it proposed would propose nothing.
  bool may_propose(ValueId id) const;
  void mark_changed(ValueId id) { changed_at_[id] = ++clock_; }

  const Graph& g_;
  const Mesh& mesh_;
  ValueMap<Sharding> sh_;
  ValueMap<OpFactors> factors_;
  std::vector<std::vector<ValueId>> levels_;  // the nodes by depth from the inputs
  // may_propose's clock: when each value last changed, when each node last proposed (0: never).
  std::uint64_t clock_ = 0;
  ValueMap<std::uint64_t> changed_at_;
  ValueMap<std::uint64_t> proposed_at_;
  std::vector<Proposal> proposals_;  // through()'s, kept to reuse their memory
};

/// The operand shapes of `n` in `g`.
std::vector<Shape> operand_shapes(const Graph& g, const Node& n);
/// The operand types of `n` in `g`.
std::vector<TensorType> operand_types(const Graph& g, const Node& n);
/// How a pending sum flows through `n` (its primitive's declared linearity; none when it declares
/// none).
struct Linearity;
Linearity linearity_of(const Graph& g, const Node& n);

}  // namespace shardplan::detail
