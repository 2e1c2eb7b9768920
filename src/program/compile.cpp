#include "compile.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "array_access.hpp"
#include "factors.hpp"
#include "kernels.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan {

std::string ProgramCost::to_string() const {
  const double most_flops = flops.empty() ? 0 : *std::max_element(flops.begin(), flops.end());
  const std::int64_t most_peak =
      peak_bytes.empty() ? 0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
  std::string s = fmt::format("flops per device: {:.4g}\n", most_flops);
  if (bytes_by_kind.empty()) {
    s += "communication: none\n";
  } else {
    for (const auto& [kind, bytes] : bytes_by_kind) {
      s += fmt::format("{}: {} per device\n", kind, format_bytes(bytes));
    }
  }
  s += fmt::format("peak memory per device: {}\n", format_bytes(most_peak));
  return s;
}

namespace detail {
namespace {

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

// A value's sharding while propagating.
struct Sharding {
  std::vector<AxisNames> dims;
  bool known = false;
  bool fixed = false;
  std::string origin;

  bool uses(const std::string& axis) const {
    for (const auto& d : dims) {
      if (std::find(d.begin(), d.end(), axis) != d.end()) return true;
    }
    return false;
  }
};

std::string value_name(int id) { return fmt::format("%{}", id); }

class Propagator {
 public:
  Propagator(const Graph& g, const Mesh& mesh) : g_(g), mesh_(mesh) {
    sh_.resize(g.nodes.size());
    factors_.reserve(g.nodes.size());
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      sh_[i].dims.resize(static_cast<std::size_t>(g.nodes[i].type.shape.rank()));
      factors_.push_back(factors_of(g, g.nodes[i]));
    }
  }

  void fix(int id, const PartitionSpec& spec, std::string origin) {
    const Node& n = g_.nodes[static_cast<std::size_t>(id)];
    const int rank = n.type.shape.rank();
    spec.validate(mesh_, rank, value_name(id));
    NamedSharding(mesh_, spec).shard_shape(n.type.shape, value_name(id));
    Sharding& s = sh_[static_cast<std::size_t>(id)];
    s.dims = padded(spec, rank);
    s.dims.resize(static_cast<std::size_t>(rank));
    s.known = s.fixed = true;
    s.origin = std::move(origin);
  }

  void run() {
    bool changed = true;
    while (changed) {
      changed = false;
      // Elementwise ops first, to a fixed point; then every op once; again until nothing moves.
      bool inner = true;
      while (inner) {
        inner = sweep(true);
        changed |= inner;
      }
      changed |= sweep(false);
    }
    for (std::size_t i = 0; i < sh_.size(); ++i) {
      if (!sh_[i].known) {
        sh_[i].known = true;
        sh_[i].origin = "no sharding reached it: replicated";
      }
    }
  }

  const Sharding& at(int id) const { return sh_[static_cast<std::size_t>(id)]; }
  const OpFactors& factors(int id) const { return factors_[static_cast<std::size_t>(id)]; }

 private:
  bool sweep(bool elementwise_only) {
    bool changed = false;
    const int n = static_cast<int>(g_.nodes.size());
    for (int i = 0; i < n; ++i) changed |= through(i, elementwise_only);
    for (int i = n - 1; i >= 0; --i) changed |= through(i, elementwise_only);
    return changed;
  }

  // The tensors an op touches: its operands, then itself (the result).
  struct Slot {
    int value;
    const std::vector<int>* dims;
  };

  bool through(int id, bool elementwise_only) {
    const Node& node = g_.nodes[static_cast<std::size_t>(id)];
    const bool identity = node.op == Op::kConstraint || node.op == Op::kAnnotation;
    if (elementwise_only && !is_elementwise(node.op) && !identity && node.op != Op::kConvert &&
        node.op != Op::kSelect) {
      return false;
    }
    const OpFactors& f = factors_[static_cast<std::size_t>(id)];
    std::vector<Slot> slots;
    for (std::size_t k = 0; k < node.operands.size(); ++k) {
      slots.push_back({node.operands[k], &f.operands[k]});
    }
    slots.push_back({id, &f.result});
    bool changed = false;
    for (int fac = 0; fac < static_cast<int>(f.sizes.size()); ++fac) {
      if (f.kinds[static_cast<std::size_t>(fac)] == FactorKind::kReplicate) continue;
      // The best proposal for this factor: fixed shardings first, then the larger tensor.
      const AxisNames* best = nullptr;
      int best_value = -1;
      std::pair<int, std::int64_t> best_rank{-1, -1};
      for (const Slot& s : slots) {
        const Sharding& sh = sh_[static_cast<std::size_t>(s.value)];
        if (!sh.known) continue;
        for (std::size_t d = 0; d < s.dims->size(); ++d) {
          if ((*s.dims)[d] != fac || sh.dims[d].empty()) continue;
          const std::pair<int, std::int64_t> r{
              sh.fixed ? 1 : 0, g_.nodes[static_cast<std::size_t>(s.value)].type.shape.numel()};
          if (r > best_rank) {
            best_rank = r;
            best = &sh.dims[d];
            best_value = s.value;
          }
        }
      }
      if (best == nullptr) continue;
      const AxisNames axes = *best;  // a copy: the slots below may change
      const std::int64_t p = product(mesh_, axes);
      if (f.sizes[static_cast<std::size_t>(fac)] % p != 0) continue;
      for (const Slot& s : slots) {
        Sharding& sh = sh_[static_cast<std::size_t>(s.value)];
        if (sh.fixed || s.value == best_value) continue;
        const Shape& shape = g_.nodes[static_cast<std::size_t>(s.value)].type.shape;
        for (std::size_t d = 0; d < s.dims->size(); ++d) {
          if ((*s.dims)[d] != fac || !sh.dims[d].empty()) continue;
          if (shape[static_cast<int>(d)] % p != 0) continue;
          bool free = true;
          for (const auto& a : axes) free = free && !sh.uses(a);
          if (!free) continue;
          sh.dims[d] = axes;
          const std::string note =
              fmt::format("from {} through {}", value_name(best_value),
                          s.value == id ? std::string(name(node.op))
                                        : fmt::format("{} (backward)", name(node.op)));
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

  const Graph& g_;
  const Mesh& mesh_;
  std::vector<Sharding> sh_;
  std::vector<OpFactors> factors_;
};

ReduceOp pending_op(Op op) {
  switch (op) {
    case Op::kReduceMax:
      return ReduceOp::kMax;
    case Op::kReduceMin:
      return ReduceOp::kMin;
    default:
      return ReduceOp::kSum;
  }
}

// The local (per-device) version of a node, given the shape of its result block.
Node localize(const Node& n, const Shape& local, const std::vector<Shape>& in_local,
              const Graph& g) {
  Node l = n;
  l.type.shape = local;
  if (n.op == Op::kRandom) l.limits = n.type.shape.dims();  // the global shape
  if (n.op == Op::kSlice) {
    const Shape& in = g.nodes[static_cast<std::size_t>(n.operands[0])].type.shape;
    for (int d = 0; d < in.rank(); ++d) {
      const auto i = static_cast<std::size_t>(d);
      if (n.starts[i] == 0 && n.limits[i] == in[d])
        l.limits[i] = in_local[0][d];  // whole, maybe sharded
    }
  }
  return l;
}

}  // namespace

Program compile(const Graph& input_graph, const CompileSpec& spec) {
  Program prog(spec.mesh);
  const Mesh& mesh = spec.mesh;
  // Outputs with a sharding get a constraint node, so that the output's own computation and
  // its other users are free to differ.
  Graph g = input_graph;
  for (std::size_t k = 0; k < g.outputs.size(); ++k) {
    if (k < spec.outputs.size() && spec.outputs[k]) {
      Node c;
      c.op = Op::kConstraint;
      c.operands = {g.outputs[k]};
      c.type = g.nodes[static_cast<std::size_t>(g.outputs[k])].type;
      c.spec = spec.outputs[k];
      c.name = fmt::format("output {} (out_shardings)", k);
      g.outputs[k] = g.add(std::move(c));
    }
  }
  Propagator prop(g, mesh);
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const Node& n = g.nodes[static_cast<std::size_t>(i)];
    if (n.op == Op::kInput) {
      const auto& in = spec.inputs.at(static_cast<std::size_t>(n.index));
      if (in.spec) prop.fix(i, *in.spec, in.origin);
    } else if (n.op == Op::kConstraint && !n.spec) {
      const int src = n.like;
      if (src >= 0 && prop.at(src).fixed) {
        prop.fix(i, spec_of_dims(prop.at(src).dims),
                 fmt::format("sharded like {} (the gradient of a parameter)", value_name(src)));
      }
    } else if (n.op == Op::kConstraint) {
      prop.fix(i, *n.spec, n.name.empty() ? std::string("with_sharding_constraint") : n.name);
    } else if (n.op == Op::kAnnotation && n.spec) {
      prop.fix(i, *n.spec, fmt::format("annotation '{}'", n.name));
    }
  }
  prop.run();

  const int num = static_cast<int>(g.nodes.size());
  prog.specs_.resize(static_cast<std::size_t>(num));
  prog.origins_.resize(static_cast<std::size_t>(num));
  for (int i = 0; i < num; ++i) {
    prog.specs_[static_cast<std::size_t>(i)] = spec_of_dims(prop.at(i).dims);
    prog.origins_[static_cast<std::size_t>(i)] = prop.at(i).origin;
  }

  // Partitioning: every value lives in a slot with its current sharding and pending state.
  struct State {
    int slot = -1;
    PartitionSpec spec;
    Pending pending;
  };
  std::vector<State> state(static_cast<std::size_t>(num));
  // Values that depend on no input (constants, iotas and what is computed from them only).
  std::vector<bool> is_constant(static_cast<std::size_t>(num), false);
  for (int i = 0; i < num; ++i) {
    const Node& n = g.nodes[static_cast<std::size_t>(i)];
    bool c = n.op == Op::kConstant || n.op == Op::kIota;
    if (n.op != Op::kInput && !n.operands.empty()) {
      c = true;
      for (const int o : n.operands) c = c && is_constant[static_cast<std::size_t>(o)];
    }
    is_constant[static_cast<std::size_t>(i)] = c;
  }
  std::map<std::pair<int, std::string>, int> resharded;  // (value, spec) -> slot
  const auto num_devices = static_cast<std::size_t>(mesh.size());
  prog.cost_.flops.assign(num_devices, 0);
  int next_slot = 0;

  auto require = [&](int value, const PartitionSpec& want) -> int {
    State& st = state[static_cast<std::size_t>(value)];
    const TensorType& t = g.nodes[static_cast<std::size_t>(value)].type;
    const NamedSharding cur(mesh, st.spec);
    const NamedSharding target(mesh, want);
    if (st.pending.empty() && cur.is_equivalent_to(target, t.shape.rank())) return st.slot;
    const auto key = std::make_pair(value, want.to_string());
    if (auto it = resharded.find(key); it != resharded.end()) return it->second;
    Step step;
    step.kind = Step::Kind::kReshard;
    step.node = value;
    step.in = {st.slot};
    step.out = next_slot++;
    step.type = t;
    step.sharding = target;
    step.cost = plan_reshard(t.shape, t.dtype, cur, st.pending, target);
    step.constant = is_constant[static_cast<std::size_t>(value)];
    for (const auto& rec : step.cost) {
      auto& b = prog.cost_.bytes_by_kind[rec.kind];
      b += rec.max_bytes_in();
    }
    prog.steps_.push_back(std::move(step));
    resharded[key] = prog.steps_.back().out;
    return prog.steps_.back().out;
  };

  for (int i = 0; i < num; ++i) {
    const Node& n = g.nodes[static_cast<std::size_t>(i)];
    State& st = state[static_cast<std::size_t>(i)];
    if (n.op == Op::kInput) {
      const auto& in = spec.inputs.at(static_cast<std::size_t>(n.index));
      st.slot = next_slot++;
      st.spec = prog.specs_[static_cast<std::size_t>(i)];
      st.pending = in.spec ? in.pending : Pending{};
      if (static_cast<int>(prog.input_slots_.size()) <= n.index) {
        prog.input_slots_.resize(static_cast<std::size_t>(n.index) + 1, -1);
        prog.input_shardings_.resize(static_cast<std::size_t>(n.index) + 1,
                                     NamedSharding(mesh, PartitionSpec()));
        prog.input_pending_.resize(static_cast<std::size_t>(n.index) + 1);
      }
      prog.input_slots_[static_cast<std::size_t>(n.index)] = st.slot;
      prog.input_shardings_[static_cast<std::size_t>(n.index)] = NamedSharding(mesh, st.spec);
      prog.input_pending_[static_cast<std::size_t>(n.index)] = st.pending;
      continue;
    }
    const OpFactors& f = prop.factors(i);
    // Axes per factor. Pass factors take the result's sharding and reduce factors the operands'
    // (first sharded dimension), an axis going to one factor only; which of the two claims an
    // axis they both want is decided by cost (the bytes of the reshards each choice needs).
    const auto& rdims = prop.at(i).dims;
    auto assign = [&](bool reduce_first) {
      std::vector<AxisNames> axes(f.sizes.size());
      std::set<std::string> used;
      auto take_pass = [&] {
        for (std::size_t d = 0; d < f.result.size(); ++d) {
          const int fac = f.result[d];
          if (fac < 0 || f.kinds[static_cast<std::size_t>(fac)] != FactorKind::kPass) continue;
          if (!axes[static_cast<std::size_t>(fac)].empty()) continue;
          AxisNames kept;
          for (const auto& a : rdims[d]) {
            if (used.count(a)) break;  // a major-to-minor prefix only
            kept.push_back(a);
          }
          axes[static_cast<std::size_t>(fac)] = kept;
          used.insert(kept.begin(), kept.end());
        }
      };
      auto take_reduce = [&] {
        for (std::size_t k = 0; k < n.operands.size(); ++k) {
          const auto& odims = prop.at(n.operands[k]).dims;
          for (std::size_t d = 0; d < f.operands[k].size(); ++d) {
            const int fac = f.operands[k][d];
            if (fac < 0 || f.kinds[static_cast<std::size_t>(fac)] != FactorKind::kReduce) continue;
            if (!axes[static_cast<std::size_t>(fac)].empty() || odims[d].empty()) continue;
            bool free = true;
            for (const auto& a : odims[d]) free = free && !used.count(a);
            if (!free || f.sizes[static_cast<std::size_t>(fac)] % product(mesh, odims[d]) != 0) {
              continue;
            }
            axes[static_cast<std::size_t>(fac)] = odims[d];
            used.insert(odims[d].begin(), odims[d].end());
          }
        }
      };
      if (reduce_first) {
        take_reduce();
        take_pass();
      } else {
        take_pass();
        take_reduce();
      }
      return axes;
    };
    struct Choice {
      std::vector<AxisNames> axes;
      std::vector<PartitionSpec> wants;  // per operand
      std::vector<AxisNames> out_dims;
      Pending pend;
      std::int64_t cost = 0;
    };
    auto evaluate = [&](std::vector<AxisNames> axes) {
      Choice c;
      c.axes = std::move(axes);
      auto fits = [&](std::int64_t size, int fac) {
        return fac >= 0 && size % std::max<std::int64_t>(
                                      1, product(mesh, c.axes[static_cast<std::size_t>(fac)])) ==
                               0;
      };
      for (std::size_t k = 0; k < n.operands.size(); ++k) {
        const int o = n.operands[k];
        const TensorType& ot = g.nodes[static_cast<std::size_t>(o)].type;
        std::vector<AxisNames> want(static_cast<std::size_t>(ot.shape.rank()));
        for (std::size_t d = 0; d < want.size(); ++d) {
          const int fac = f.operands[k][d];
          if (fits(ot.shape[static_cast<int>(d)], fac))
            want[d] = c.axes[static_cast<std::size_t>(fac)];
        }
        c.wants.push_back(spec_of_dims(want));
        const State& os = state[static_cast<std::size_t>(o)];
        for (const auto& rec : plan_reshard(ot.shape, ot.dtype, NamedSharding(mesh, os.spec),
                                            os.pending, NamedSharding(mesh, c.wants.back()))) {
          c.cost += rec.max_bytes_in();
        }
      }
      c.out_dims.assign(static_cast<std::size_t>(n.type.shape.rank()), {});
      for (std::size_t d = 0; d < c.out_dims.size(); ++d) {
        const int fac = f.result[d];
        if (fits(n.type.shape[static_cast<int>(d)], fac))
          c.out_dims[d] = c.axes[static_cast<std::size_t>(fac)];
      }
      c.pend = Pending{pending_op(n.op), {}};
      for (std::size_t fac = 0; fac < f.sizes.size(); ++fac) {
        if (f.kinds[fac] == FactorKind::kReduce) {
          c.pend.axes.insert(c.pend.axes.end(), c.axes[fac].begin(), c.axes[fac].end());
        }
      }
      // What the result then costs to reach its chosen sharding.
      for (const auto& rec :
           plan_reshard(n.type.shape, n.type.dtype, NamedSharding(mesh, spec_of_dims(c.out_dims)),
                        c.pend, NamedSharding(mesh, spec_of_dims(rdims)))) {
        c.cost += rec.max_bytes_in();
      }
      return c;
    };
    Choice choice = evaluate(assign(false));
    if (std::any_of(f.kinds.begin(), f.kinds.end(),
                    [](FactorKind k) { return k == FactorKind::kReduce; })) {
      Choice other = evaluate(assign(true));
      if (other.cost < choice.cost) choice = std::move(other);
    }
    // Operands brought to the sharding the factors ask for.
    std::vector<int> in_slots;
    std::vector<Shape> in_local;
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      const int o = n.operands[k];
      const Shape& os = g.nodes[static_cast<std::size_t>(o)].type.shape;
      in_slots.push_back(require(o, choice.wants[k]));
      in_local.push_back(NamedSharding(mesh, choice.wants[k]).shard_shape(os));
    }
    const std::vector<AxisNames>& out_dims = choice.out_dims;
    const Pending& pend = choice.pend;
    st.spec = spec_of_dims(out_dims);
    st.pending = pend;
    if (n.op == Op::kConstraint || n.op == Op::kAnnotation) {  // identities: no kernel
      st.slot = in_slots[0];
      st.pending = Pending{};
      continue;
    }
    const NamedSharding out_sharding(mesh, st.spec);
    const Shape local = out_sharding.shard_shape(n.type.shape);
    Step step;
    step.kind = Step::Kind::kKernel;
    step.node = i;
    step.local = localize(n, local, in_local, g);
    step.in = in_slots;
    step.out = next_slot++;
    step.type = n.type;
    step.sharding = out_sharding;
    step.pending = pend;
    step.blocks =
        std::make_shared<const std::vector<Block>>(out_sharding.device_blocks(n.type.shape));
    for (const Block& b : *step.blocks) {
      std::vector<std::int64_t> o;
      for (const auto& dim : b) o.push_back(dim.start);
      step.offsets.push_back(std::move(o));
    }
    step.flops = kernel_flops(step.local, in_local, local);
    step.constant = is_constant[static_cast<std::size_t>(i)];
    for (auto& fl : prog.cost_.flops) fl += step.flops;
    st.slot = step.out;
    prog.steps_.push_back(std::move(step));
  }
  // Outputs in their chosen shardings, nothing pending.
  for (const int o : g.outputs) {
    const PartitionSpec& want = prog.specs_[static_cast<std::size_t>(o)];
    prog.output_slots_.push_back(require(o, want));
    prog.output_shardings_.emplace_back(mesh, want);
  }
  prog.num_slots_ = next_slot;
  // When each slot is last needed, and the peak of what lives at once.
  std::vector<int> last(static_cast<std::size_t>(next_slot), -1);
  for (std::size_t s = 0; s < prog.steps_.size(); ++s) {
    for (const int in : prog.steps_[s].in) last[static_cast<std::size_t>(in)] = static_cast<int>(s);
  }
  // Inputs stay alive (the caller holds them) unless donated: a donated input is freed after its
  // last use, so that its memory serves what the program computes next.
  prog.input_donated_.assign(prog.input_slots_.size(), 0);
  std::set<int> keep(prog.output_slots_.begin(), prog.output_slots_.end());
  for (std::size_t k = 0; k < prog.input_slots_.size(); ++k) {
    if (k < spec.inputs.size() && spec.inputs[k].donated) {
      prog.input_donated_[k] = 1;
      prog.any_donated_ = true;
    } else {
      keep.insert(prog.input_slots_[k]);
    }
  }
  for (const Step& st : prog.steps_) {
    if (st.constant) {
      prog.constant_slots_.push_back(st.out);
      keep.insert(st.out);  // cached for the next run
    }
  }
  prog.free_after_.resize(prog.steps_.size());
  for (int s = 0; s < next_slot; ++s) {
    if (last[static_cast<std::size_t>(s)] >= 0 && !keep.count(s)) {
      prog.free_after_[static_cast<std::size_t>(last[static_cast<std::size_t>(s)])].push_back(s);
    }
  }
  for (std::size_t k = 0; k < prog.input_slots_.size(); ++k) {
    const int s = prog.input_slots_[k];
    if (prog.input_donated_[k] && s >= 0 && last[static_cast<std::size_t>(s)] < 0 &&
        !keep.count(s)) {
      prog.free_at_start_.push_back(s);
    }
  }
  std::vector<std::int64_t> slot_bytes(static_cast<std::size_t>(next_slot), 0);
  std::int64_t live = 0;
  for (std::size_t k = 0; k < prog.input_slots_.size(); ++k) {
    const int s = prog.input_slots_[k];
    if (s < 0) continue;
    const Node* in = nullptr;
    for (const auto& n : g.nodes) {
      if (n.op == Op::kInput && n.index == static_cast<int>(k)) in = &n;
    }
    if (in == nullptr) continue;
    slot_bytes[static_cast<std::size_t>(s)] =
        byte_size(prog.input_shardings_[k].shard_shape(in->type.shape), in->type.dtype);
    live += slot_bytes[static_cast<std::size_t>(s)];
  }
  std::int64_t peak = live;
  for (const int f : prog.free_at_start_) live -= slot_bytes[static_cast<std::size_t>(f)];
  for (std::size_t s = 0; s < prog.steps_.size(); ++s) {
    const Step& st = prog.steps_[s];
    const std::int64_t b = byte_size(st.sharding->shard_shape(st.type.shape), st.type.dtype);
    slot_bytes[static_cast<std::size_t>(st.out)] = b;
    live += b;
    peak = std::max(peak, live);
    for (const int f : prog.free_after_[s]) live -= slot_bytes[static_cast<std::size_t>(f)];
  }
  prog.cost_.peak_bytes.assign(num_devices, peak);
  prog.graph_ = std::move(g);
  return prog;
}

std::vector<Array> Program::run(const Executor& executor, std::vector<Array>& inputs) const {
  std::vector<Array> slots(static_cast<std::size_t>(num_slots_));
  // Donated inputs moved into their slots as they are: a failed run gives back those still there.
  std::vector<char> moved_in;
  if (any_donated_) moved_in.assign(input_slots_.size(), 0);
  try {
    return run_steps(executor, inputs, slots, moved_in);
  } catch (...) {
    for (std::size_t k = 0; k < moved_in.size(); ++k) {
      if (!moved_in[k]) continue;
      Array& held = slots[static_cast<std::size_t>(input_slots_[k])];
      if (held.valid()) inputs[k] = std::move(held);
    }
    throw;
  }
}

std::vector<Array> Program::run_steps(const Executor& executor, std::vector<Array>& inputs,
                                      std::vector<Array>& slots,
                                      std::vector<char>& moved_in) const {
  for (std::size_t k = 0; k < input_slots_.size(); ++k) {
    if (input_slots_[k] < 0) continue;
    Array& a = inputs.at(k);
    const NamedSharding& want = input_shardings_[k];
    const bool same =
        a.pending() == input_pending_[k] && a.sharding().is_equivalent_to(want, a.shape().rank());
    Array& slot = slots[static_cast<std::size_t>(input_slots_[k])];
    if (same && input_donated_[k]) {
      slot = std::move(a);
      moved_in[k] = 1;
    } else if (same) {
      slot = a;
    } else {
      slot = reshard(a, want).array;
      if (input_donated_[k]) a = Array();  // its resharded copy is what the program uses
    }
  }
  for (const int f : free_at_start_) slots[static_cast<std::size_t>(f)] = Array();
  // Constant steps ran on this executor before: take their results.
  bool have_constants = false;
  if (!constant_slots_.empty()) {
    std::lock_guard<std::mutex> lock(constants_->mu);
    auto it = constants_->by_executor.find(executor.identity());
    if (it != constants_->by_executor.end()) {
      for (const auto& [slot, a] : it->second) slots[static_cast<std::size_t>(slot)] = a;
      have_constants = true;
    }
  }
  // Over processes, a step that fails on one process must not leave the others waiting in the
  // next reshard: the failing process skips to the next communicating step (or the end), where
  // every process learns who failed (distributed::all_succeed) and throws.
  const bool spans = !executor.holds_all(mesh_.devices());
  std::exception_ptr failed;
  auto agree = [&] {
    if (spans) {
      distributed::all_succeed([&] {
        if (failed) std::rethrow_exception(failed);
      });
    } else if (failed) {
      std::rethrow_exception(failed);
    }
  };
  for (std::size_t s = 0; s < steps_.size(); ++s) {
    const Step& st = steps_[s];
    if (st.constant && have_constants) continue;
    if (failed && st.kind != Step::Kind::kReshard) continue;
    if (st.kind == Step::Kind::kReshard) {
      agree();
      slots[static_cast<std::size_t>(st.out)] =
          reshard(slots[static_cast<std::size_t>(st.in[0])], *st.sharding).array;
    } else {
      try {
        const Shape& local = st.local.type.shape;
        const std::int64_t bytes = byte_size(local, st.type.dtype);
        std::vector<std::shared_ptr<Buffer>> out(static_cast<std::size_t>(executor.num_devices()));
        for (const int d : mesh_.devices()) {
          if (!executor.is_local(d)) continue;  // another process runs it
          out[static_cast<std::size_t>(d)] = std::make_shared<Buffer>(executor.allocate(d, bytes));
        }
        std::vector<const Array*> ins;
        for (const int in : st.in) ins.push_back(&slots[static_cast<std::size_t>(in)]);
        // Steps of a few KiB run inline: waking the pool would cost more than the work.
        const bool parallel =
            bytes * static_cast<std::int64_t>(mesh_.devices().size()) > (64 << 10);
        executor.run(
            mesh_.devices(),
            [&](int d) {
              std::vector<ConstBlock> in_blocks;
              in_blocks.reserve(ins.size());
              for (const Array* a : ins) {
                in_blocks.push_back(ConstBlock{a->shard(d).data(), a->shard_shape(), a->dtype()});
              }
              run_kernel(st.local, in_blocks,
                         MutBlock{out[static_cast<std::size_t>(d)]->data(), local, st.type.dtype},
                         st.offsets[static_cast<std::size_t>(d)]);
            },
            parallel);
        slots[static_cast<std::size_t>(st.out)] =
            Array::from_buffers(executor, st.type.shape, st.type.dtype, *st.sharding, st.blocks,
                                std::move(out), st.pending);
      } catch (...) {
        if (!spans) throw;
        failed = std::current_exception();
      }
    }
    // After a failure nothing more is freed: donated inputs still held go back to the caller,
    // as when the run stops at the failure in one process.
    if (!failed) {
      for (const int f : free_after_[s]) slots[static_cast<std::size_t>(f)] = Array();
    }
  }
  agree();
  if (!constant_slots_.empty() && !have_constants) {
    std::vector<std::pair<int, Array>> made;
    for (const int slot : constant_slots_)
      made.emplace_back(slot, slots[static_cast<std::size_t>(slot)]);
    std::lock_guard<std::mutex> lock(constants_->mu);
    if (constants_->by_executor.size() > 16) constants_->by_executor.clear();
    constants_->by_executor.emplace(executor.identity(), std::move(made));
  }
  std::vector<Array> outs;
  for (const int s : output_slots_) outs.push_back(slots[static_cast<std::size_t>(s)]);
  return outs;
}

std::string Program::text() const {
  std::string s = fmt::format("program on {} ({} steps)\n", mesh_.to_string(), steps_.size());
  for (std::size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    std::string operands;
    for (const int o : n.operands) operands += (operands.empty() ? "" : ", ") + value_name(o);
    std::string head = n.op == Op::kInput ? fmt::format("input {}", n.index)
                                          : fmt::format("{}({})", name(n.op), operands);
    if (n.op == Op::kAnnotation) head += fmt::format(" '{}'", n.name);
    s += fmt::format("  {:>4} = {:<32} {:<16} {:<24} <- {}\n", value_name(static_cast<int>(i)),
                     head, to_string(n.type), specs_[i].to_string(), origins_[i]);
  }
  s += "steps:\n";
  for (const Step& st : steps_) {
    if (st.kind == Step::Kind::kKernel) {
      s += fmt::format("  kernel  {} = {} on blocks {}{}\n", value_name(st.node), name(st.local.op),
                       st.local.type.shape.to_string(),
                       st.pending.empty() ? ""
                                          : fmt::format(" (pending {} over {})",
                                                        shardplan::to_string(st.pending.op),
                                                        fmt::join(st.pending.axes, ", ")));
    } else {
      for (const auto& rec : st.cost) {
        s += fmt::format("  reshard {} -> {}: {}\n", value_name(st.node),
                         st.sharding->spec().to_string(), rec.to_string());
      }
    }
  }
  s += cost_.to_string();
  return s;
}

}  // namespace detail
}  // namespace shardplan
