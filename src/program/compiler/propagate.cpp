#include "propagate.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "../ir/primitive.hpp"
#include "../ir/primitives.hpp"
#include "shardplan/named_sharding.hpp"

namespace shardplan::detail {

bool Sharding::uses(const std::string& axis) const {
  return std::any_of(dims.begin(), dims.end(), [&](const AxisNames& d) {
    return std::find(d.begin(), d.end(), axis) != d.end();
  });
}

std::vector<AxisNames> padded(const PartitionSpec& spec, int rank) {
  std::vector<AxisNames> dims(spec.dims().begin(), spec.dims().end());
  dims.resize(static_cast<std::size_t>(std::max(rank, static_cast<int>(dims.size()))));
  return dims;
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
  factors_.reserve(g.size());
  for (const Node& n : g.nodes) {
    factors_.push_back(n.op->factors(n, operand_shapes(g, n)));
  }
  for (std::size_t i = 0; i < g.size(); ++i) {
    sh_[value_id(i)].dims.resize(static_cast<std::size_t>(g.nodes[i].type.shape.rank()));
  }
}

void Propagator::fix(ValueId id, const PartitionSpec& spec, std::string origin) {
  const Node& n = g_[id];
  const int rank = n.type.shape.rank();
  spec.validate(mesh_, rank, value_name(id));
  NamedSharding(mesh_, spec).shard_shape(n.type.shape, value_name(id));
  Sharding& s = sh_[id];
  s.dims = padded(spec, rank);
  s.dims.resize(static_cast<std::size_t>(rank));
  s.known = s.fixed = true;
  s.origin = std::move(origin);
}

void Propagator::run() {
  bool changed = true;
  while (changed) {
    changed = false;
    // Pointwise ops first, to a fixed point; then every op once; again until nothing moves.
    bool inner = true;
    while (inner) {
      inner = sweep(true);
      changed |= inner;
    }
    changed |= sweep(false);
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

bool Propagator::sweep(bool pointwise_only) {
  bool changed = false;
  const std::size_t n = g_.size();
  for (std::size_t i = 0; i < n; ++i) changed |= through(value_id(i), pointwise_only);
  for (std::size_t i = n; i-- > 0;) changed |= through(value_id(i), pointwise_only);
  return changed;
}

// Each factor of the node takes the best proposal among the tensors it touches (fixed shardings
// first, then the larger tensor) and gives it to the others where their dimension is free.
bool Propagator::through(ValueId id, bool pointwise_only) {
  const Node& node = g_[id];
  if (pointwise_only && !node.op->pointwise) return false;
  const OpFactors& f = factors_[id];
  // The tensors an op touches: its operands, then itself (the result).
  struct Touched {
    ValueId value;
    const std::vector<int>* dims;
  };
  std::vector<Touched> touched;
  for (std::size_t k = 0; k < node.operands.size(); ++k) {
    touched.push_back({node.operands[k], &f.operands[k]});
  }
  touched.push_back({id, &f.result});
  bool changed = false;
  for (int fac = 0; fac < f.count(); ++fac) {
    if (f.kind(fac) == FactorKind::kReplicate) continue;
    const AxisNames* best = nullptr;
    ValueId best_value{-1};
    std::pair<int, std::int64_t> best_rank{-1, -1};
    for (const Touched& t : touched) {
      const Sharding& sh = sh_[t.value];
      if (!sh.known) continue;
      for (std::size_t d = 0; d < t.dims->size(); ++d) {
        if ((*t.dims)[d] != fac || sh.dims[d].empty()) continue;
        const std::pair<int, std::int64_t> r{sh.fixed ? 1 : 0, g_[t.value].type.shape.numel()};
        if (r > best_rank) {
          best_rank = r;
          best = &sh.dims[d];
          best_value = t.value;
        }
      }
    }
    if (best == nullptr) continue;
    const AxisNames axes = *best;  // a copy: the shardings below may change
    const std::int64_t p = product(mesh_, axes);
    if (f.size(fac) % p != 0) continue;
    for (const Touched& t : touched) {
      Sharding& sh = sh_[t.value];
      if (sh.fixed || t.value == best_value) continue;
      const Shape& shape = g_[t.value].type.shape;
      for (std::size_t d = 0; d < t.dims->size(); ++d) {
        if ((*t.dims)[d] != fac || !sh.dims[d].empty()) continue;
        if (shape[static_cast<int>(d)] % p != 0) continue;
        if (std::any_of(axes.begin(), axes.end(), [&](const auto& a) { return sh.uses(a); })) {
          continue;
        }
        sh.dims[d] = axes;
        const std::string note =
            fmt::format("from {} through {}", value_name(best_value),
                        t.value == id ? std::string(node.op->name)
                                      : fmt::format("{} (backward)", node.op->name));
        if (!sh.known || sh.origin.empty()) {
          sh.origin = note;
        } else if (sh.origin.find(note) == std::string::npos) {
          sh.origin += fmt::format("; dim {} {}", d, note);
        }
        sh.known = true;
        changed = true;
      }
    }
  }
  return changed;
}

}  // namespace shardplan::detail
