// The partitioner (partition.hpp) in its three phases: Chooser decides every node, Emitter emits
// the decided steps once, and `keep_read` drops what nothing reads and counts what is left.
#include "partition.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "../ir/fields.hpp"
#include "../ir/primitive.hpp"
#include "../ir/primitives.hpp"
#include "partition_choose.hpp"
#include "reshard_cost.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

// ---- Phase 2: emit ---------------------------------------------------------------------------

class Emitter {
 public:
  Emitter(const Graph& g, const Choices& choices, const ValueMap<PartitionSpec>& specs,
          const CompileSpec& spec)
      : g_(g),
        dec_(choices.decisions),
        reads_(choices.reads),
        constant_(choices.constants),
        specs_(specs),
        mesh_(spec.mesh),
        devices_per_process_(spec.devices_per_process),
        slot_(g.size(), SlotId{-1}),
        resharded_(g.size()) {}

  Partitioned run() {
    for (std::size_t i = 0; i < g_.size(); ++i) {
      const ValueId id = value_id(i);
      const Decision& d = dec_[id];
      reader_ = id;
      reason_.reset();
      switch (d.kind) {
        case Decision::Kind::kInput:
          bind_input(id);
          break;
        case Decision::Kind::kAlias:
          slot_[id] = read(g_[id].operands[0], d, 0);
          break;
        case Decision::Kind::kKernel:
          emit_kernel(id);
          break;
      }
    }
    // Outputs in their propagated shardings, nothing pending.
    for (const ValueId o : g_.outputs) {
      // The reason is named only where require() may reshard (it returns at once otherwise).
      const Layout& at = dec_[o].result;
      out_.output_slots.push_back(require(
          o, specs_[o],
          at.pending.empty() && at.spec == specs_[o]
              ? nullptr
              : std::make_shared<const std::string>(
                    fmt::format("for output {}: its sharding", out_.output_slots.size()))));
      out_.output_shardings.push_back(sharding(specs_[o], g_[o].type.shape));
    }
    out_.num_slots = next_slot_;
    out_.layouts = ValueMap<Layout>(g_.size());
    for (std::size_t i = 0; i < g_.size(); ++i)
      out_.layouts[value_id(i)] = dec_[value_id(i)].result;
    return std::move(out_);
  }

 private:
  SlotId new_slot() { return static_cast<SlotId>(next_slot_++); }

  // The NamedSharding of a value of `shape` split as `spec` (value_sharding: padded where the
  // axes do not divide), made once: the steps, inputs and outputs in one sharding share it (a
  // program holds, and later frees, one copy).
  const NamedSharding& sharding(const PartitionSpec& spec, const Shape& shape) {
    bool pads = false;
    for (int d = 0; d < spec.size() && d < shape.rank(); ++d) {
      pads = pads || shape[d] % product(mesh_, spec[d]) != 0;
    }
    auto& made = pads ? padded_shardings_ : shardings_;
    auto it = made.find(spec);
    if (it == made.end()) {
      it = made.emplace(spec, value_sharding(mesh_, spec, shape)).first;
    }
    return it->second;
  }

  void bind_input(ValueId id) {
    const auto k = static_cast<std::size_t>(g_[id].attr<InputAttrs>().index);
    slot_[id] = new_slot();
    const NamedSharding& made = sharding(dec_[id].result.spec, g_[id].type.shape);
    if (out_.input_slots.size() == k) {  // (inputs come in order of their index, mostly)
      if (k == 0) {
        const auto inputs = static_cast<std::size_t>(std::max(g_.num_inputs, 1));
        out_.input_slots.reserve(inputs);
        out_.input_shardings.reserve(inputs);
        out_.input_pending.reserve(inputs);
      }
      out_.input_slots.push_back(slot_[id]);
      out_.input_shardings.push_back(made);
      out_.input_pending.push_back(dec_[id].result.pending);
      return;
    }
    if (out_.input_slots.size() < k) {
      out_.input_slots.resize(k + 1, SlotId{-1});
      out_.input_shardings.resize(k + 1, sharding(PartitionSpec(), Shape{}));
      out_.input_pending.resize(k + 1);
    }
    out_.input_slots[k] = slot_[id];
    out_.input_shardings[k] = made;
    out_.input_pending[k] = dec_[id].result.pending;
  }

  // Operand k of a decided node: as it is, or brought to the sharding the decision wants.
  SlotId read(ValueId operand, const Decision& d, std::size_t k) {
    if (d.as_is[k] != 0) return slot_[operand];
    if (!reason_) reason_ = std::make_shared<const std::string>(
                      fmt::format("for {}: {}", value_name(reader_), d.decision));
    return require(operand, d.wants[k], reason_);
  }

  // The slot holding `value` in sharding `want` (nothing pending), adding a reshard step when it
  // is not there yet (once per value and sharding).
  SlotId require(ValueId value, const PartitionSpec& want,
                 const std::shared_ptr<const std::string>& reason) {
    const Layout& at = dec_[value].result;
    if (at.pending.empty() && at.spec == want) return slot_[value];  // (the common case, cheaply)
    const TensorType& t = g_[value].type;
    const NamedSharding& cur = sharding(at.spec, t.shape);
    const NamedSharding& target = sharding(want, t.shape);
    if (at.pending.empty() && cur.is_equivalent_to(target, t.shape.rank())) return slot_[value];
    for (const auto& [done, slot] : resharded_[value]) {
      if (done == want) return slot;
    }
    // From the value as it is, or, for a pending sum, from the reduced copy plan_reduced_sources
    // chose (made first when it is not yet).
    SlotId from = slot_[value];
    std::vector<CollectiveRecord> cost;
    const PartitionSpec* source = nullptr;
    for (const auto& [spec, src] : reads_[value]) {
      if (spec == want && src.has_value()) source = &*src;
    }
    if (source != nullptr) {
      from = require(value, *source, reason);
      cost = plan_reshard(t.shape, t.dtype, sharding(*source, t.shape), {}, target,
                          devices_per_process_);
    } else {
      cost = plan_reshard(t.shape, t.dtype, cur, at.pending, target, devices_per_process_);
    }
    Step step{.kind = Step::Kind::kReshard,
              .node = value,
              .in = {from},
              .out = new_slot(),
              .type = t,
              .sharding = target,
              .cost = std::move(cost),
              .constant = constant_[value] != 0,
              .reason = cur.uneven() == Uneven::kPad ? gathers_padded(value, cur, reason) : reason};
    resharded_[value].emplace_back(want, step.out);
    out_.steps.push_back(std::move(step));
    return out_.steps.back().out;
  }

  // The reason of a reshard from a padded value: `reason`, then each padded dimension (no op
  // takes one: each reads it gathered, value_sharding).
  std::shared_ptr<const std::string> gathers_padded(
      ValueId value, const NamedSharding& padded, const std::shared_ptr<const std::string>& reason) {
    const Shape& shape = g_[value].type.shape;
    std::string text = reason ? *reason : std::string();
    for (int d = 0; d < padded.spec().size() && d < shape.rank(); ++d) {
      const std::int64_t k = padded.num_shards(d);
      if (shape[d] % k == 0) continue;
      text += fmt::format("; dim {} of {} is padded ({} rows in {} blocks of {} over {}): read "
                          "gathered, as every op reads a padded dimension",
                          d, value_name(value), shape[d], k, split_block(shape[d], k, 0).size,
                          padded.spec()[d].size() == 1
                              ? fmt::format("'{}'", padded.spec()[d][0])
                              : fmt::format("'{}'", fmt::join(padded.spec()[d], "', '")));
    }
    return std::make_shared<const std::string>(std::move(text));
  }

  void emit_kernel(ValueId id) {
    const Node& n = g_[id];
    const Decision& d = dec_[id];
    std::vector<SlotId> in_slots;
    std::vector<Shape> in_local;
    in_slots.reserve(n.operands.size());
    in_local.reserve(n.operands.size());
    for (std::size_t k = 0; k < n.operands.size(); ++k) {
      const ValueId o = n.operands[k];
      in_slots.push_back(read(o, d, k));
      in_local.push_back(sharding(d.wants[k], g_[o].type.shape).shard_shape(g_[o].type.shape));
    }
    const NamedSharding& out_sharding = sharding(d.result.spec, n.type.shape);
    Node local = n;
    local.type.shape = out_sharding.shard_shape(n.type.shape);
    if (n.op->localize != nullptr) n.op->localize(local, operand_shapes(g_, n), in_local);
    Step step{.kind = Step::Kind::kKernel,
              .node = id,
              .local = std::move(local),
              .in = std::move(in_slots),
              .out = new_slot(),
              .type = n.type,
              .sharding = out_sharding,
              .pending = d.result.pending,
              .constant = constant_[id] != 0};
    std::tie(step.blocks, step.offsets) = blocks_of(d.result.spec, n.type.shape);
    step.flops = n.op->flops(step.local, in_local, step.local.type.shape);
    if (n.op->collective != nullptr) {
      step.cost =
          collective_cost(n.op->collective(step.local, {in_local[0], g_[n.operands[0]].type.dtype}),
                          g_[n.operands[0]].type.dtype, mesh_, devices_per_process_);
    }
    slot_[id] = step.out;
    out_.steps.push_back(std::move(step));
  }

  // Each device's block of a result, and the blocks' starts, made once per (spec, shape): the
  // key compares both (the hash only picks the bucket).
  struct BlocksKey {
    PartitionSpec spec;
    Shape shape;
    friend bool operator==(const BlocksKey&, const BlocksKey&) = default;
  };
  struct BlocksKeyHash {
    std::size_t operator()(const BlocksKey& k) const {
      return hash_combine(hash_of(k.spec), hash_of(k.shape));
    }
  };
  using Offsets = std::vector<std::vector<std::int64_t>>;
  using SharedBlocks =
      std::pair<std::shared_ptr<const std::vector<Block>>, std::shared_ptr<const Offsets>>;

  SharedBlocks blocks_of(const PartitionSpec& spec, const Shape& shape) {
    BlocksKey key{spec, shape};
    if (const auto it = blocks_.find(key); it != blocks_.end()) return it->second;
    auto blocks =
        std::make_shared<const std::vector<Block>>(sharding(spec, shape).device_blocks(shape));
    auto offsets = std::make_shared<Offsets>();
    offsets->reserve(blocks->size());
    for (const Block& b : *blocks) {
      std::vector<std::int64_t> starts;
      starts.reserve(b.size());
      for (const auto& dim : b) starts.push_back(dim.start);
      offsets->push_back(std::move(starts));
    }
    SharedBlocks made{std::move(blocks), std::move(offsets)};
    blocks_.emplace(std::move(key), made);
    return made;
  }

  const Graph& g_;
  const ValueMap<Decision>& dec_;
  const ValueMap<ReadPlan>& reads_;  // Choices::reads
  const ValueMap<char>& constant_;
  const ValueMap<PartitionSpec>& specs_;
  const Mesh& mesh_;
  const int devices_per_process_;  // CompileSpec::devices_per_process
  ValueMap<SlotId> slot_;
  ValueMap<std::vector<std::pair<PartitionSpec, SlotId>>> resharded_;  // reshards made, by value
  std::unordered_map<BlocksKey, SharedBlocks, BlocksKeyHash> blocks_;
  struct SpecHash {
    std::size_t operator()(const PartitionSpec& s) const { return hash_of(s); }
  };
  std::unordered_map<PartitionSpec, NamedSharding, SpecHash> shardings_;  // sharding()'s
  std::unordered_map<PartitionSpec, NamedSharding, SpecHash> padded_shardings_;  // and padded
  int next_slot_ = 0;
  Partitioned out_;
  ValueId reader_{};                              // the node whose operands are read now
  std::shared_ptr<const std::string> reason_;     // its decision, made once when it reshards
};

}  // namespace

Partitioned partition(const Graph& g, const Propagator& prop, const ValueMap<PartitionSpec>& specs,
                      const CompileSpec& spec) {
  const Choices choices = choose(g, prop, specs, spec);  // phase 1 (partition_choose.cpp)
  Partitioned out = Emitter(g, choices, specs, spec).run();
  keep_read(g, out, spec.mesh.size());  // phase 3 (partition_keep.cpp)
  return out;
}

}  // namespace shardplan::detail
