#include "propagate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "../ir/primitive.hpp"
#include "../ir/primitives.hpp"
#include "shardplan/named_sharding.hpp"

namespace shardplan::detail {

bool Sharding::uses(const std::string& axis) const {
  return std::any_of(dims.begin(), dims.end(), [&](const AxisNames& d) {
    return std::find(d.begin(), d.end(), axis) != d.end();
  });
}

PartitionSpec spec_of_dims(std::vector<AxisNames> dims) {
  while (!dims.empty() && dims.back().empty()) dims.pop_back();
  return PartitionSpec(std::move(dims));
}

std::int64_t product(const Mesh& mesh, const AxisNames& axes) {
  std::int64_t p = 1;
  for (const auto& a : axes) p *= mesh.axis_size(a);
  return p;
}

NamedSharding value_sharding(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape) {
  NamedSharding s(mesh, spec);
  return s.is_padded(shape) ? s.with_uneven(Uneven::kPad) : s;
}

bool takes_padded(const Graph& g, const Node& n) {
  if (!n.op->pointwise && !n.op->per_element) return false;
  return std::all_of(n.operands.begin(), n.operands.end(), [&](ValueId o) {
    const Shape& s = g[o].type.shape;
    return s == n.type.shape || (n.op->per_element && s.rank() == 0);
  });
}

std::vector<TensorType> operand_types(const Graph& g, const Node& n) {
  std::vector<TensorType> types;
  types.reserve(n.operands.size());
  for (const ValueId o : n.operands) types.push_back(g[o].type);
  return types;
}

Linearity linearity_of(const Graph& g, const Node& n) {
  if (n.op->linearity == nullptr) return {};
  return n.op->linearity(n, operand_types(g, n));
}

std::vector<Shape> operand_shapes(const Graph& g, const Node& n) {
  std::vector<Shape> shapes;
  shapes.reserve(n.operands.size());
  for (const ValueId o : n.operands) shapes.push_back(g[o].type.shape);
  return shapes;
}

Propagator::Propagator(const Graph& g, const Mesh& mesh) : g_(g), mesh_(mesh) {
  sh_ = ValueMap<Sharding>(g.size());
  changed_at_ = ValueMap<std::uint64_t>(g.size());
  proposed_at_ = ValueMap<std::uint64_t>(g.size());
  factors_.reserve(g.size());
  for (const Node& n : g.nodes) {
    factors_.push_back(n.op->factors(n, operand_shapes(g, n)));
  }
  // Each node's depth: the longest path to it from a node without operands (the levels sized
  // first: each list is made once).
  std::vector<std::size_t> depth(g.size(), 0);
  std::size_t deepest = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    for (const ValueId o : g.nodes[i].operands) depth[i] = std::max(depth[i], depth[index(o)] + 1);
    deepest = std::max(deepest, depth[i]);
  }
  std::vector<std::size_t> at_depth(g.size() == 0 ? 0 : deepest + 1, 0);
  for (const std::size_t d : depth) ++at_depth[d];
  levels_.resize(at_depth.size());
  for (std::size_t d = 0; d < at_depth.size(); ++d) levels_[d].reserve(at_depth[d]);
  for (std::size_t i = 0; i < g.size(); ++i) levels_[depth[i]].push_back(value_id(i));
  for (std::size_t i = 0; i < g.size(); ++i) {
    sh_[value_id(i)].dims.resize(static_cast<std::size_t>(g.nodes[i].type.shape.rank()));
  }
}

void Propagator::fix(ValueId id, const PartitionSpec& spec, std::string origin,
                     Uneven uneven) {
  const Node& n = g_[id];
  const int rank = n.type.shape.rank();
  const std::string name = value_name(id);
  spec.validate(mesh_, rank, name);
  // NamedSharding::is_padded, without making the sharding unless it is to throw (every input of
  // every program is fixed here).
  bool divides = true;
  for (int d = 0; d < spec.size(); ++d) {
    divides = divides && n.type.shape[d] % product(mesh_, spec[d]) == 0;
  }
  if (!divides && uneven == Uneven::kRefuse) {
    NamedSharding(mesh_, spec, uneven).shard_shape(n.type.shape, name);  // throws, naming it
  }
  Sharding& s = sh_[id];
  s.dims.resize(static_cast<std::size_t>(rank));
  for (int d = 0; d < rank; ++d) s.dims[static_cast<std::size_t>(d)] = spec[d];
  s.known = s.fixed = true;
  s.padded = uneven == Uneven::kPad && !divides;
  s.origin = std::move(origin);
  mark_changed(id);
}

void Propagator::run() {
  // Pointwise ops first, to a fixed point; then every op once; again until nothing moves. A
  // sweep reads nothing but the shardings: when the full sweep changes nothing, the state is
  // a fixed point of both sweeps (the pointwise one just stopped there), and another round
  // would change nothing either.
  bool changed = true;
  while (changed) {
    while (sweep(true)) {
    }
    changed = sweep(false);
  }
  for (std::size_t i = 0; i < sh_.size(); ++i) {
    Sharding& s = sh_[value_id(i)];
    if (!s.known) {
      s.known = true;
      s.origin = "no sharding reached it: replicated";
    }
  }
}

void Propagator::carry_pending(std::span<const Pending> inputs) {
  for (std::size_t i = 0; i < g_.size(); ++i) {
    const ValueId id = value_id(i);
    const Node& n = g_[id];
    Sharding& s = sh_[id];
    if (n.is(prim::input)) {
      const auto k = static_cast<std::size_t>(n.attr<InputAttrs>().index);
      s.pending = k < inputs.size() ? inputs[k] : Pending{};
      continue;
    }
    std::vector<Pending> in;
    in.reserve(n.operands.size());
    for (const ValueId o : n.operands) in.push_back(sh_[o].pending);
    if (n.op->sharding_identity) {
      // A constraint or annotation reduces what it fixes; a gradient's constraint keeps it.
      s.pending = is_gradient_constraint(n) ? in[0] : Pending{};
      continue;
    }
    if (n.op->barrier) {
      s.pending = in[0];
      continue;
    }
    if (n.op->fixed_layout != nullptr) {  // reads and gives whole values
      s.pending = Pending{};
      continue;
    }
    Pending p = carried_pending(linearity_of(g_, n), in).value_or(Pending{n.op->partial, {}});
    // Its own reduce factors, split as its operands are (where the result does not use the axes).
    const OpFactors& f = factors_[id];
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      const Sharding& os = sh_[n.operands[k]];
      for (std::size_t d = 0; d < f.operands[k].size() && d < os.dims.size(); ++d) {
        const int fac = f.operands[k][d];
        if (fac < 0 || f.kind(fac) != FactorKind::kReduce) continue;
        for (const auto& a : os.dims[d]) {
          if (!s.uses(a) && std::find(p.axes.begin(), p.axes.end(), a) == p.axes.end()) {
            p.axes.push_back(a);
          }
        }
      }
    }
    s.pending = p.axes.empty() ? Pending{} : std::move(p);
  }
}

// Forward by depth, then backward. The nodes of one depth propose together, from the shardings
// before them: nodes the same distance from the inputs (such as two uses of one value) are not
// ordered by the graph, so neither is what they decide.
bool Propagator::sweep(bool pointwise_only) {
  bool changed = false;
  for (const auto& level : levels_) changed |= through(level, pointwise_only);
  for (auto l = levels_.rbegin(); l != levels_.rend(); ++l) changed |= through(*l, pointwise_only);
  return changed;
}

bool Propagator::may_propose(ValueId id) const {
  const std::uint64_t at = proposed_at_[id];
  if (at == 0 || changed_at_[id] > at) return true;
  return std::any_of(g_[id].operands.begin(), g_[id].operands.end(),
                     [&](ValueId o) { return changed_at_[o] > at; });
}

bool Propagator::through(std::span<const ValueId> nodes, bool pointwise_only) {
  std::vector<Proposal>& proposals = proposals_;
  proposals.clear();
  for (const ValueId id : nodes) {
    if (pointwise_only && !g_[id].op->pointwise) continue;
    if (!may_propose(id)) continue;
    proposed_at_[id] = ++clock_;
    propose(id, proposals);
  }
  // Each value takes its proposals best first, in an order of the proposals as data: the
  // declared priority (a fixed sharding, then the larger tensor), then the axes in mesh order,
  // then the more major dimension. The source's number only picks which of equal proposals
  // the origin names.
  const auto key = [](const Proposal& p) {
    return std::tie(p.target, p.rank, p.axis_order, p.dim, p.source, p.through);
  };
  std::sort(proposals.begin(), proposals.end(),
            [&](const Proposal& a, const Proposal& b) { return key(a) < key(b); });
  bool changed = false;
  for (const Proposal& p : proposals) {
    Sharding& sh = sh_[p.target];
    const auto d = static_cast<std::size_t>(p.dim);
    if (!sh.dims[d].empty()) continue;
    if (std::any_of(p.axes.begin(), p.axes.end(), [&](const auto& a) { return sh.uses(a); })) {
      continue;
    }
    sh.dims[d] = p.axes;
    const Node& node = g_[p.through];
    const std::string note =
        fmt::format("from {} through {}", value_name(p.source),
                    p.target == p.through ? std::string(node.op->name)
                                          : fmt::format("{} (backward)", node.op->name));
    if (!sh.known || sh.origin.empty()) {
      sh.origin = note;
    } else if (sh.origin.find(note) == std::string::npos) {
      sh.origin += fmt::format("; dim {} {}", d, note);
    }
    sh.known = true;
    mark_changed(p.target);
    changed = true;
  }
  return changed;
}

// Each factor of the node takes the best sharding among the tensors it touches (fixed shardings
// first, then the larger tensor; between operands, the first) and proposes it to the others where
// their dimension is free and no earlier factor of the node proposed the dimension or the axes.
void Propagator::propose(ValueId id, std::vector<Proposal>& out) const {
  const Node& node = g_[id];
  const OpFactors& f = factors_[id];
  // The tensors an op touches: its operands, then itself (the result), by index (nothing
  // allocated: every node is asked on every sweep, most propose nothing).
  const std::size_t num_touched = node.operands.size() + 1;
  const auto touched_value = [&](std::size_t t) {
    return t < node.operands.size() ? node.operands[t] : id;
  };
  const auto touched_dims = [&](std::size_t t) -> const std::vector<int>& {
    return t < node.operands.size() ? f.operands[t] : f.result;
  };
  // Within the node, an earlier factor wins, as its primitive declares them.
  const std::size_t first = out.size();
  const bool pads = takes_padded(g_, node);  // an axis that does not divide passes through
  const auto conflicts_earlier = [&](ValueId target, int dim, const AxisNames& axes) {
    return std::any_of(
        out.begin() + static_cast<std::ptrdiff_t>(first), out.end(), [&](const Proposal& e) {
          return e.target == target &&
                 (e.dim == dim || std::any_of(axes.begin(), axes.end(), [&](const std::string& a) {
                    return std::find(e.axes.begin(), e.axes.end(), a) != e.axes.end();
                  }));
        });
  };
  for (int fac = 0; fac < f.count(); ++fac) {
    if (f.kind(fac) == FactorKind::kReplicate) continue;
    const AxisNames* best = nullptr;
    ValueId best_value{-1};
    std::pair<int, std::int64_t> best_rank{-1, -1};
    for (std::size_t t = 0; t < num_touched; ++t) {
      const ValueId value = touched_value(t);
      const std::vector<int>& dims = touched_dims(t);
      const Sharding& sh = sh_[value];
      if (!sh.known) continue;
      for (std::size_t d = 0; d < dims.size(); ++d) {
        if (dims[d] != fac || sh.dims[d].empty()) continue;
        const std::pair<int, std::int64_t> r{sh.fixed ? 1 : 0, g_[value].type.shape.numel()};
        if (r > best_rank) {
          best_rank = r;
          best = &sh.dims[d];
          best_value = value;
        }
      }
    }
    if (best == nullptr) continue;
    const std::int64_t p = product(mesh_, *best);
    if (f.size(fac) % p != 0 && !pads) continue;
    std::vector<int> axis_order;  // made at the factor's first proposal
    const std::pair<int, std::int64_t> rank{-best_rank.first, -best_rank.second};
    for (std::size_t t = 0; t < num_touched; ++t) {
      const ValueId value = touched_value(t);
      const std::vector<int>& dims = touched_dims(t);
      const Sharding& sh = sh_[value];
      if (sh.fixed || value == best_value) continue;
      const Shape& shape = g_[value].type.shape;
      for (std::size_t d = 0; d < dims.size(); ++d) {
        if (dims[d] != fac || !sh.dims[d].empty()) continue;
        if (shape[static_cast<int>(d)] % p != 0 && !pads) continue;
        if (std::any_of(best->begin(), best->end(), [&](const auto& a) { return sh.uses(a); })) {
          continue;
        }
        if (conflicts_earlier(value, static_cast<int>(d), *best)) continue;
        if (axis_order.empty()) {
          for (const auto& a : *best) axis_order.push_back(mesh_.axis_index(a));
        }
        out.push_back({value, rank, axis_order, static_cast<int>(d), *best, best_value, id});
      }
    }
  }
}

}  // namespace shardplan::detail
