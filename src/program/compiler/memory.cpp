#include "memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "../ir/primitives.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

std::int64_t add_live(std::int64_t live, std::int64_t bytes) {
  std::int64_t out = 0;
  if (!checked_add(live, bytes, &out)) {
    throw SpecError(
        fmt::format("[compile] the bytes live at once on a device overflow int64 ({} + {} bytes)",
                    live, bytes));
  }
  return out;
}

// The operand blocks read by the steps of a multi-result op so far (Primitive::shared_reads): a
// step of the same op reading the same blocks is another result of the same kernel.
using SharedReads = std::set<std::pair<const Primitive*, std::vector<SlotId>>>;

// The bytes a kernel step not on matrix units reads and writes (Liveness::memory_traffic).
void count_traffic(const Step& st, bool skip, const std::vector<std::int64_t>& slot_bytes,
                   SharedReads& shared, std::int64_t& traffic) {
  if (skip || st.kind != Step::Kind::kKernel || st.local.op->time_bound != TimeBound::kMemory) return;
  if (st.local.op->sharding_identity || st.local.op->barrier || st.local.op->check) return;
  const auto add = [&](SlotId slot) {
    if (!checked_add(traffic, slot_bytes[index(slot)], &traffic)) {
      throw SpecError("[compile] the bytes the kernels read and write on a device overflow int64");
    }
  };
  if (!st.fused && st.local.op->traffic != nullptr) {
    if (!checked_add(traffic, st.local.op->traffic(st.local, slot_bytes[index(st.out)]), &traffic)) {
      throw SpecError("[compile] the bytes the kernels read and write on a device overflow int64");
    }
    return;
  }
  add(st.out);
  if (!st.fused && st.local.op->shared_reads && !shared.emplace(st.local.op, st.in).second) return;
  for (const SlotId in : st.in) add(in);
}

// The phase of each step: that of the latest graph node any step up to it computes or feeds (a
// reshard feeding the backward pass reads a forward value, but runs where the backward does).
std::vector<PhaseStart> phase_starts(const Graph& g, const Partitioned& p) {
  std::vector<PhaseStart> out;
  if (g.phase_marks.empty()) return out;
  std::size_t latest = 0, mark = 0;
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    latest = std::max(latest, index(p.steps[s].node));
    while (mark + 1 < g.phase_marks.size() && g.phase_marks[mark + 1].first <= latest) ++mark;
    // Steps before the first mark (the arguments' constraints) count in the first phase.
    const StepPhase phase = g.phase_marks[mark].second;
    if (out.empty() || out.back().phase != phase) out.push_back(PhaseStart{phase, s});
  }
  return out;
}

std::optional<StepPhase> phase_of_step(const std::vector<PhaseStart>& phases, std::size_t step) {
  std::optional<StepPhase> out;
  for (const PhaseStart& ps : phases) {
    if (ps.step > step) break;
    out = ps.phase;
  }
  return out;
}

// How a value live at the peak is named: the argument, or the op with its names.
LiveValue describe_live(const Graph& g, const Partitioned& p, const CompileSpec& spec,
                        const std::vector<PhaseStart>& phases, SlotId slot, int made_by,
                        std::int64_t bytes) {
  LiveValue v;
  v.bytes = bytes;
  if (made_by < 0) {
    const auto k = static_cast<std::size_t>(
        std::find(p.input_slots.begin(), p.input_slots.end(), slot) - p.input_slots.begin());
    v.input = static_cast<int>(k);
    v.what = k < spec.inputs.size() && !spec.inputs[k].name.empty() ? spec.inputs[k].name
                                                                    : "input " + std::to_string(k);
    for (std::size_t i = 0; i < g.size(); ++i) {
      const Node& n = g.nodes[i];
      if (n.is(prim::input) && n.attr<InputAttrs>().index == static_cast<int>(k)) v.type = to_string(n.type);
    }
    return v;
  }
  const Step& st = p.steps[static_cast<std::size_t>(made_by)];
  const Node& n = g[st.node];
  v.type = to_string(st.type);
  v.phase = phase_of_step(phases, static_cast<std::size_t>(made_by));
  const std::optional<ValueId> arg = argument_read(g, st.node);
  const Node& src = arg ? g[*arg] : n;
  if (st.kind == Step::Kind::kReshard && src.is(prim::input)) {
    const auto k = static_cast<std::size_t>(src.attr<InputAttrs>().index);
    v.input = static_cast<int>(k);
    v.resharded = true;
    v.what = k < spec.inputs.size() && !spec.inputs[k].name.empty() ? spec.inputs[k].name
                                                                     : fmt::format("input {}", k);
    if (n.type.dtype != src.type.dtype) v.what += fmt::format(" as {}", name(n.type.dtype));
    return v;
  }
  v.what = st.kind == Step::Kind::kReshard ? fmt::format("{} resharded", n.op->name)
                                           : std::string(n.op->name);
  if (st.kind == Step::Kind::kKernel && st.fused) v.what = "fused " + v.what;
  if (n.is(prim::sharding_annotation)) v.what += fmt::format(" '{}'", n.attr<AnnotationAttrs>().name);
  // A name given to this value, or to the value it constrains or annotates.
  for (ValueId id = st.node;;) {
    if (const auto it = g.names.find(id); it != g.names.end()) {
      for (const std::string& nm : it->second) v.what += fmt::format(" '{}'", nm);
      break;
    }
    const Node& m = g[id];
    if (!m.op->sharding_identity || m.operands.empty()) break;
    id = m.operands[0];
  }
  return v;
}

}  // namespace

// What is live at the peak, by kind: replay the frees up to the peak step; each buffer once, of
// the kind of the slot that made it (its group's root: a view of an argument holds the
// argument's bytes), the largest with their names.
static void count_peak_by_kind(const Graph& g, const Partitioned& p, const CompileSpec& spec,
                               const std::vector<std::int64_t>& slot_bytes,
                               const std::vector<SlotId>& root, std::size_t peak_step,
                               Liveness& l) {
  const std::size_t num_slots = slot_bytes.size();
  enum Kind : std::uint8_t { kNone, kInput, kResharded, kComputed };
  std::vector<std::uint8_t> kind(num_slots, kNone), alive(num_slots, 0);
  std::vector<int> made_by(num_slots, -1);
  for (const SlotId in : p.input_slots) {
    if (index(in) < num_slots) {
      kind[index(in)] = kInput;
      alive[index(in)] = 1;
    }
  }
  if (peak_step < p.steps.size()) {
    for (const SlotId f : l.free_at_start) alive[index(f)] = 0;
    for (std::size_t s = 0; s <= peak_step; ++s) {
      const Step& st = p.steps[s];
      // An argument, or an argument cast or scaled (mixed precision gathers the weights in the
      // dtype they are used in, float8 in 8 bits): argument_read.
      const bool of_input = st.kind == Step::Kind::kReshard && argument_read(g, st.node).has_value();
      kind[index(st.out)] = of_input ? kResharded : kComputed;
      made_by[index(st.out)] = static_cast<int>(s);
      alive[index(st.out)] = 1;
      if (s < peak_step) {
        for (const SlotId f : l.free_after[s]) alive[index(f)] = 0;
      }
    }
  }
  std::int64_t* const part[] = {nullptr, &l.peak_by_kind.inputs, &l.peak_by_kind.resharded_inputs,
                                &l.peak_by_kind.computed};
  std::vector<std::size_t> live;  // the roots of the groups live, each once
  live.reserve(num_slots);
  std::vector<char> counted(num_slots, 0);
  for (std::size_t s = 0; s < num_slots; ++s) {
    const std::size_t r = index(root[s]);
    if (alive[s] == 0 || kind[r] == kNone || counted[r] != 0) continue;
    counted[r] = 1;
    *part[kind[r]] += slot_bytes[r];
    live.push_back(r);
  }
  // The largest first (ties: the earlier slot), named by the slot that made the buffer.
  const std::size_t shown = std::min(live.size(), MemoryTimeline::kMaxLiveAtPeak);
  std::partial_sort(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(shown), live.end(),
                    [&](std::size_t a, std::size_t b) {
                      return slot_bytes[a] != slot_bytes[b] ? slot_bytes[a] > slot_bytes[b] : a < b;
                    });
  l.timeline.live_at_peak.reserve(l.timeline.live_at_peak.size() + shown);
  for (std::size_t i = 0; i < shown; ++i) {
    const std::size_t s = live[i];
    l.timeline.live_at_peak.push_back(describe_live(g, p, spec, l.timeline.phases,
                                                    static_cast<SlotId>(s), made_by[s],
                                                    slot_bytes[s]));
  }
}

bool shares_operand_buffers(const Step& st) {
  if (st.kind == Step::Kind::kReshard) return st.cost.empty();
  if (st.fused) return false;
  return st.local.op->view || (st.local.op->collective != nullptr && st.cost.empty());
}

std::vector<SlotId> buffer_roots(const std::vector<Step>& steps, std::size_t num_slots) {
  std::vector<SlotId> root(num_slots);
  for (std::size_t s = 0; s < num_slots; ++s) root[s] = static_cast<SlotId>(s);
  // A step's operand comes before it: its root is final when the step is reached.
  for (const Step& st : steps) {
    if (!st.in.empty() && shares_operand_buffers(st)) root[index(st.out)] = root[index(st.in[0])];
  }
  return root;
}

namespace {

// The slots held past the run: outputs, undonated inputs, and the constants kept for the next run
// (Liveness::input_donated, constant_slots, cached_step filled on the way).
std::set<SlotId> kept_slots(const Partitioned& p, const CompileSpec& spec,
                            const std::vector<SlotId>& root, Liveness& l) {
  // Inputs stay alive (the caller holds them) unless donated: a donated input is freed after its
  // last use, so that its memory serves what the program computes next.
  l.input_donated.assign(p.input_slots.size(), 0);
  std::set<SlotId> keep(p.output_slots.begin(), p.output_slots.end());
  for (std::size_t k = 0; k < p.input_slots.size(); ++k) {
    if (k < spec.inputs.size() && spec.inputs[k].donated) {
      l.input_donated[k] = 1;
      l.any_donated = true;
    } else {
      keep.insert(p.input_slots[k]);
    }
  }
  l.cached_step.assign(p.steps.size(), 0);
  if (!spec.cache_constants) return keep;
  std::int64_t cached = 0;
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    const Step& st = p.steps[s];
    if (!st.constant || !st.sharding) continue;
    const std::int64_t bytes = byte_size(st.sharding->shard_shape(st.type.shape), st.type.dtype);
    // Made again each run (see memory.hpp).
    if (bytes > kMaxCachedConstantBytes || cached + bytes > spec.kept_constant_bytes) continue;
    // A view of a constant made again is not kept either: a later run would hold it beside the
    // operand made anew, two buffers where the first run (and the plan) has one. (A view has its
    // operand's bytes, so the bounds above skip it already; the run check relies on this.)
    const SlotId r = root[index(st.out)];
    if (r != st.out && !keep.count(r)) continue;
    cached += bytes;
    l.constant_slots.push_back(st.out);
    l.cached_step[s] = 1;
    keep.insert(st.out);  // cached for the next run
  }
  return keep;
}

// By device id: the peak, or, over processes, the bytes live at a step whose collective stages
// what it receives (held with its output until it returns) plus those staged, when more. As the
// timeline, the first run's: a constant step kept for the next run runs in it.
std::vector<std::int64_t> peak_with_staging(const Partitioned& p, const Liveness& l,
                                            const Mesh& mesh, std::int64_t peak) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(mesh.size()), peak);  // as ProgramCost
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    for (const CollectiveRecord& rec : p.steps[s].cost) {
      for (std::size_t d = 0; d < rec.staging_bytes.size() && d < out.size(); ++d) {
        if (rec.staging_bytes[d] == 0) continue;
        out[d] = std::max(out[d], add_live(l.timeline.live_bytes[s], rec.staging_bytes[d]));
      }
    }
  }
  return out;
}

}  // namespace

Liveness plan_memory(const Graph& g, const Partitioned& p, const CompileSpec& spec) {
  Liveness l;
  const auto num_slots = static_cast<std::size_t>(p.num_slots);
  const std::vector<SlotId> root = buffer_roots(p.steps, num_slots);
  // When each slot is last read.
  std::vector<int> last(num_slots, -1);
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    for (const SlotId in : p.steps[s].in) last[index(in)] = static_cast<int>(s);
  }
  const std::set<SlotId> keep = kept_slots(p, spec, root, l);
  l.free_after.resize(p.steps.size());
  for (std::size_t s = 0; s < num_slots; ++s) {
    if (last[s] >= 0 && !keep.count(static_cast<SlotId>(s))) {
      l.free_after[static_cast<std::size_t>(last[s])].push_back(static_cast<SlotId>(s));
    }
  }
  for (std::size_t k = 0; k < p.input_slots.size(); ++k) {
    const SlotId s = p.input_slots[k];
    if (l.input_donated[k] && index(s) < num_slots && last[index(s)] < 0 && !keep.count(s)) {
      l.free_at_start.push_back(s);
    }
  }
  // The peak: inputs first, then each step's result, minus what each step frees; a group's bytes
  // (its root's) while any of its slots is held: a view of a value still live adds nothing, and
  // a value whose view outlives it stays until the view dies.
  std::vector<std::int64_t> slot_bytes(num_slots, 0);
  std::vector<int> held(num_slots, 0);  // by root: its group's slots held
  std::int64_t live = 0;
  const auto hold = [&](SlotId s) {
    const std::size_t r = index(root[index(s)]);
    if (held[r]++ == 0) live = add_live(live, slot_bytes[r]);
  };
  const auto release = [&](SlotId s) {
    const std::size_t r = index(root[index(s)]);
    if (held[r] > 0 && --held[r] == 0) live -= slot_bytes[r];
  };
  for (const Node& n : g.nodes) {
    if (!n.is(prim::input)) continue;
    const auto k = static_cast<std::size_t>(n.attr<InputAttrs>().index);
    if (k >= p.input_slots.size() || index(p.input_slots[k]) >= num_slots) continue;
    const std::size_t s = index(p.input_slots[k]);
    slot_bytes[s] = byte_size(p.input_shardings[k].shard_shape(n.type.shape), n.type.dtype);
    hold(p.input_slots[k]);
  }
  std::int64_t peak = live;
  std::size_t peak_step = p.steps.size();  // steps.size(): the peak is the inputs alone
  l.timeline.start_bytes = live;
  SharedReads shared;
  l.timeline.live_bytes.reserve(p.steps.size());
  for (const SlotId f : l.free_at_start) release(f);
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    const Step& st = p.steps[s];
    slot_bytes[index(st.out)] = st.constant && !spec.count_constants
                                    ? 0
                                    : byte_size(st.sharding->shard_shape(st.type.shape), st.type.dtype);
    hold(st.out);
    l.timeline.live_bytes.push_back(live);
    count_traffic(st, shares_operand_buffers(st) || l.cached_step[s] != 0, slot_bytes, shared,
                  l.memory_traffic);
    if (live > peak) {
      peak = live;
      peak_step = s;
    }
    for (const SlotId f : l.free_after[s]) release(f);
  }
  l.peak_bytes = peak;
  l.peak_by_device = peak_with_staging(p, l, spec.mesh, peak);
  l.timeline.peak_step = peak_step;
  l.timeline.phases = phase_starts(g, p);
  count_peak_by_kind(g, p, spec, slot_bytes, root, peak_step, l);
  l.slot_bytes = std::move(slot_bytes);
  return l;
}

}  // namespace shardplan::detail
