// Pricing and planning a value's reads (partition_reads.hpp).
#include "partition_reads.hpp"

#include <algorithm>

#include "../ir/fields.hpp"
#include "shardplan/detail/hash.hpp"
#include "../ir/primitive.hpp"
#include "../ir/primitives.hpp"

namespace shardplan::detail {

bool cheaper(const Cost& a, const Cost& b) {
  if (!same_cost(a.value, b.value)) return a.value < b.value;
  return !same_cost(a.collectives, b.collectives) && a.collectives < b.collectives;
}

ReadPricer::ReadPricer(const Graph& g, const Propagator& prop, const Mesh& mesh,
                       const PartitionCost& model, const CompileSpec& spec)
    : g_(g), prop_(prop), costs_(mesh, model), pendings_{Pending{}} {
  mark_examples(spec);
  mark_kept(examples_);
  key_types();
}

StateKey ReadPricer::key(const Layout& state, SpecTable& table) {
  auto it = std::find(pendings_.begin(), pendings_.end(), state.pending);
  if (it == pendings_.end()) it = pendings_.insert(it, state.pending);
  return {table.intern(state.spec), static_cast<int>(it - pendings_.begin())};
}

// A reshard's cost; none possible (infinite) where it would move examples of a batch between
// devices of the batch axes (InputSpec::batch). Each question is answered once per choice: the
// answer depends on the value only through type_key_.
Cost ReadPricer::reshard(ValueId v, StateKey from, Spec to) {
  // (Equivalent specs cost nothing: plan_reshard moves nothing; the cache answers that.)
  if (from.spec == to && pendings_[static_cast<std::size_t>(from.pending)].empty()) return {};
  const Question key{type_key_[v], from.spec.id(), from.pending, to.id()};
  const auto it = known_.find(key);
  if (it != known_.end()) return it->second;
  const Cost c = uncached(v, from, to);
  known_.emplace(key, c);
  return c;
}

std::size_t ReadPricer::QuestionHash::operator()(const Question& q) const {
  std::size_t h = static_cast<std::size_t>(q.type);
  for (const int x : {q.from, q.pending, q.to}) h = hash_combine(h, static_cast<std::size_t>(x));
  return h;
}

Cost ReadPricer::uncached(ValueId v, StateKey from, Spec to) {
  const TensorType& t = g_[v].type;
  const Pending& pending = pendings_[static_cast<std::size_t>(from.pending)];
  if (examples_[v] == kAsItIs) return kInf;  // (from == to without a sum returned before)
  if (examples_[v] == 0) return costs_.cost(t, *from.spec, pending, *to);
  bool moves = false;
  const Cost c = costs_.cost(t, *from.spec, pending, *to, &batch_axes_, &moves);
  return moves ? kInf : c;
}

// Values alike for a reshard (the same type, the same examples_ mark) share one index.
void ReadPricer::key_types() {
  type_key_ = ValueMap<int>(g_.size(), 0);
  std::unordered_map<std::size_t, std::vector<ValueId>> first;  // by hash: one value per index
  int next = 0;
  for (std::size_t i = 0; i < g_.size(); ++i) {
    const ValueId v = value_id(i);
    const TensorType& t = g_[v].type;
    const std::size_t h = hash_combine(hash_combine(hash_of(t.dtype), hash_of(t.shape)),
                                       static_cast<std::size_t>(examples_[v]));
    std::vector<ValueId>& same = first[h];
    const auto it = std::find_if(same.begin(), same.end(), [&](ValueId u) {
      return g_[u].type == t && examples_[u] == examples_[v];
    });
    if (it != same.end()) {
      type_key_[v] = type_key_[*it];
      continue;
    }
    same.push_back(v);
    type_key_[v] = next++;
  }
}

// Values computed from a batch (InputSpec::batch) and not summed over its axes, whose
// propagated pending sum is not over a batch axis: their examples stay where they are.
// Values their readers read as they are (ConstraintAttrs::readers_keep): kAsItIs.
void ReadPricer::mark_kept(ValueMap<char>& marks) const {
  for (std::size_t i = 0; i < g_.size(); ++i) {
    const Node& n = g_.nodes[i];
    if (n.is(prim::sharding_constraint) && n.attr<ConstraintAttrs>().readers_keep) {
      marks[value_id(i)] = kAsItIs;
    }
  }
}

void ReadPricer::mark_examples(const CompileSpec& spec) {
  examples_ = ValueMap<char>(g_.size(), 0);
  for (std::size_t i = 0; i < g_.size(); ++i) {
    const Node& n = g_.nodes[i];
    if (!n.is(prim::input)) continue;
    const auto k = static_cast<std::size_t>(n.attr<InputAttrs>().index);
    if (k >= spec.inputs.size() || !spec.inputs[k].batch || !spec.inputs[k].spec) continue;
    // The axes of its first split dimension (the batch; a micro-batch index before it is not
    // split, a sequence split over a context axis after it is not the batch).
    for (const AxisNames& dim : spec.inputs[k].spec->dims()) {
      if (dim.empty()) continue;
      for (const std::string& a : dim) {
        if (std::find(batch_axes_.begin(), batch_axes_.end(), a) == batch_axes_.end()) {
          batch_axes_.push_back(a);
        }
      }
      examples_[value_id(i)] = 1;
      break;
    }
  }
  if (batch_axes_.empty()) return;
  for (std::size_t i = 0; i < g_.size(); ++i) {
    const Node& n = g_.nodes[i];
    if (n.is(prim::input)) continue;
    const bool from_batch = std::any_of(n.operands.begin(), n.operands.end(),
                                        [&](ValueId o) { return examples_[o] == 1; });
    const auto& pend = prop_.at(value_id(i)).pending.axes;
    const bool summed = std::any_of(pend.begin(), pend.end(), [&](const std::string& a) {
      return std::find(batch_axes_.begin(), batch_axes_.end(), a) != batch_axes_.end();
    });
    examples_[value_id(i)] = from_batch && !summed ? 1 : 0;
  }
}

// plan()'s cost alone (the least (cost, collectives) does not depend on the order of the
// wants, so they are not sorted; duplicates count once), without building the plan.
Cost ReadPricer::cost(ValueId v, StateKey at, const std::vector<Spec>& wants) {
  const std::size_t n = wants.size();
  const auto duplicate = [&](std::size_t i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (wants[j] == wants[i]) return true;
    }
    return false;
  };
  own_.clear();
  dup_.assign(n, 0);
  Cost direct;
  std::size_t unique = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool dup = duplicate(i);
    own_.push_back(dup ? Cost{} : reshard(v, at, wants[i]));
    dup_[i] = dup ? 1 : 0;
    if (dup) continue;
    direct += own_[i];
    ++unique;
  }
  if (pendings_[static_cast<std::size_t>(at.pending)].empty() || unique < 2) return direct;
  Cost best = direct;
  for (std::size_t r = 0; r < n; ++r) {
    if (dup_[r] != 0) continue;
    Cost total = own_[r];
    for (std::size_t j = 0; j < n; ++j) {
      if (j == r || dup_[j] != 0) continue;
      const Cost from_root = reshard(v, StateKey{wants[r], 0}, wants[j]);
      total += cheaper(from_root, own_[j]) ? from_root : own_[j];
    }
    if (cheaper(total, best)) best = total;
  }
  return best;
}

// The reads of value v in state `at` for the shardings `wants` (each made from v as it is or,
// for a pending sum, from the copy reduced into one of them), and their cost.
std::pair<Cost, ReadPlan> ReadPricer::plan(ValueId v, StateKey at, std::vector<Spec> wants) {
  std::sort(wants.begin(), wants.end(), [](Spec a, Spec b) { return a.dims() < b.dims(); });
  wants.erase(std::unique(wants.begin(), wants.end()), wants.end());
  ReadPlan plan;
  Cost direct;
  for (const Spec w : wants) {
    direct += reshard(v, at, w);
    plan.emplace_back(*w, std::nullopt);
  }
  if (pendings_[static_cast<std::size_t>(at.pending)].empty() || wants.size() < 2) {
    return {direct, std::move(plan)};
  }
  // One of them reduced first, the others each made from it or from the summands.
  Cost best = direct;
  for (std::size_t r = 0; r < wants.size(); ++r) {
    const StateKey root{wants[r], 0};
    Cost total = reshard(v, at, wants[r]);
    ReadPlan p;
    for (std::size_t j = 0; j < wants.size(); ++j) {
      if (j == r) {
        p.emplace_back(*wants[j], std::nullopt);
        continue;
      }
      const Cost own = reshard(v, at, wants[j]);
      const Cost from_root = reshard(v, root, wants[j]);
      const bool reuse = cheaper(from_root, own);
      total += reuse ? from_root : own;
      p.emplace_back(*wants[j], reuse ? std::optional(*wants[r]) : std::nullopt);
    }
    if (cheaper(total, best)) {
      best = total;
      plan = std::move(p);
    }
  }
  return {best, std::move(plan)};
}

}  // namespace shardplan::detail
