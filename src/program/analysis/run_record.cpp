// A run's record (run_record.hpp): the buffers its slots hold, counted per device as they come
// and go; what the debug modes are given when the run ends.
#include "run_record.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <numeric>
#include <set>

#include "../../profiler/debug_modes.hpp"
#include "../../profiler/recorder.hpp"
#include "../ir/array_access.hpp"
#include "../ir/primitive.hpp"
#include "program_profile.hpp"

namespace shardplan::detail {
namespace {
std::atomic<RunObserver> g_run_observer{nullptr};
}  // namespace

void set_run_observer(RunObserver observer) { g_run_observer.store(observer); }
RunObserver run_observer() { return g_run_observer.load(std::memory_order_relaxed); }

RunRecord::RunRecord(const Executor& executor, const Mesh& mesh, std::size_t num_slots,
                     std::size_t num_steps, bool names_buffers)
    : names_buffers_(names_buffers) {
  position_.assign(static_cast<std::size_t>(executor.num_devices()), -1);
  for (const int d : mesh.devices()) {
    if (!executor.is_local(d)) continue;
    position_[static_cast<std::size_t>(d)] = static_cast<int>(devices.size());
    devices.push_back(d);
  }
  live_.assign(devices.size(), 0);
  values_ = live_;
  start_bytes = value_start_bytes = live_;
  live_bytes.assign(num_steps, live_);
  value_bytes = live_bytes;
  bound_at.assign(num_slots, kNever);
  freed_at.assign(num_slots, kNever);
  if (names_buffers_) slot_buffers.resize(num_slots * devices.size());
  // Buffers live at once are at most the slots' (and a few arguments'): no rehash while running.
  refs_.reserve(num_slots * devices.size() / 4 + 64);
}

void RunRecord::bind(SlotId slot, const Array& a, int step) {
  if (!a.valid()) return;
  bound_at[index(slot)] = step;
  freed_at[index(slot)] = kNever;
  Held* named = nullptr;
  if (names_buffers_) {
    named = slot_buffers.data() + index(slot) * devices.size();
    std::fill(named, named + devices.size(), Held{});
  }
  for (const std::shared_ptr<Buffer>& b : ArrayAccess::buffers(a)) {
    if (!b || b->device() < 0 || static_cast<std::size_t>(b->device()) >= position_.size()) continue;
    const int at = position_[static_cast<std::size_t>(b->device())];
    if (at < 0) continue;
    Ref& ref = refs_[b.get()];
    if (ref.count++ == 0) {
      ref.origin = index(slot);
      live_[static_cast<std::size_t>(at)] += b->size();
    } else if (step == kStart) {
      note_shared_argument(slot, b.get(), static_cast<std::size_t>(at), ref.origin);
    }
    if (named != nullptr) named[at] = Held{b.get(), b->size(), ref.origin};
    values_[static_cast<std::size_t>(at)] += b->size();
  }
}

void RunRecord::note_shared_argument(SlotId slot, const Buffer* id, std::size_t at,
                                     std::size_t origin) {
  for (SharedArgument& s : shared_arguments) {
    if (s.id == id) {
      s.slots.push_back(slot);
      return;
    }
  }
  shared_arguments.push_back(SharedArgument{
      id, at, id->size(), {static_cast<SlotId>(origin), slot}});
}

void RunRecord::drop(SlotId slot, const Array& a, int step) {
  if (!a.valid()) return;
  freed_at[index(slot)] = step;
  for (const std::shared_ptr<Buffer>& b : ArrayAccess::buffers(a)) {
    const auto it = b ? refs_.find(b.get()) : refs_.end();
    if (it == refs_.end()) continue;
    const auto at = static_cast<std::size_t>(position_[static_cast<std::size_t>(b->device())]);
    values_[at] -= b->size();
    if (--it->second.count == 0) {
      live_[at] -= b->size();
      refs_.erase(it);
    }
  }
}

void RunRecord::write_counter_events() const {
  if (planned_ == nullptr) return;
  const std::size_t steps = live_bytes.size();
  std::vector<profiler::detail::Event> events;
  events.reserve((steps + 1) * devices.size());
  const auto add = [&](std::int64_t t, const std::vector<std::int64_t>& bytes, std::int64_t planned) {
    for (std::size_t i = 0; i < devices.size() && i < bytes.size(); ++i) {
      events.push_back(profiler::detail::Event{.cat = profiler::detail::Category::kMemory,
                                               .device = devices[i],
                                               .start_ns = t,
                                               .end_ns = t,
                                               .bytes = bytes[i],
                                               .planned = planned});
    }
  };
  add(sample_ns[steps], start_bytes, planned_->start_bytes);
  for (std::size_t s = 0; s < steps; ++s) {
    if (sample_ns[s] == 0) continue;  // a step the run did not reach (it threw): no sample
    add(sample_ns[s], live_bytes[s], s < planned_->live_bytes.size() ? planned_->live_bytes[s] : -1);
  }
  profiler::detail::record(events);
}

namespace {

profiler::CollectiveCount count_of(const CollectiveRecord& rec) {
  profiler::CollectiveCount c;
  c.count = 1;
  c.bytes = rec.max_bytes_in();
  c.total_bytes = rec.total_bytes_in();
  return c;
}

void add(profiler::CollectiveCount& to, const profiler::CollectiveCount& c) {
  to.count += c.count;
  to.bytes += c.bytes;
  to.total_bytes += c.total_bytes;
}

void report_comm(const Program& program, const RunRecord& record) {
  profiler::detail::ScopeCounts counts;
  for (const RanCollective& ran : record.collectives) {
    const auto scope = scope_of(program.graph(), program.steps()[ran.step]);
    add(counts[scope ? *scope : std::string()][ran.rec.kind], count_of(ran.rec));
  }
  const std::string outer = current_named_scope();
  for (const CollectiveRecord& rec : record.input_reshards) add(counts[outer][rec.kind], count_of(rec));
  profiler::detail::add_comm(counts);
}

// What a step computes or moves, for people: "dot_general", "fused(mul, add)", "dot_general
// resharded"; the names checkpoint_name gave its value; its scope.
profiler::MemoryStep step_label(const Program& program, const Step& st) {
  profiler::MemoryStep l;
  if (st.fused) {
    std::vector<std::string_view> names;
    for (const FusedOp& op : *st.fused) names.push_back(op.local.op->name);
    l.op = fmt::format("fused({})", fmt::join(names, ", "));
  } else {
    l.op = std::string(program.graph()[st.node].op->name);
  }
  if (st.kind == Step::Kind::kReshard) l.op += " resharded";
  if (const auto it = program.graph().names.find(st.node); it != program.graph().names.end()) {
    l.value = fmt::format("{}", fmt::join(it->second, ", "));
  }
  // The node's scope, relative to the traced function (the caller's is joined per run).
  const Graph& g = program.graph();
  if (index(st.node) < g.size() && g[st.node].scope) l.scope = *g[st.node].scope;
  return l;
}

// The steps' labels with their scopes relative to the traced function: made once per program.
const std::vector<profiler::MemoryStep>& static_labels(const Program& program) {
  Program::ReportMemo& memo = program.report_memo();
  std::call_once(memo.once, [&] {
    auto labels = std::make_shared<std::vector<profiler::MemoryStep>>();
    labels->reserve(program.steps().size());
    for (const Step& st : program.steps()) labels->push_back(step_label(program, st));
    memo.value = std::move(labels);
  });
  return *static_cast<const std::vector<profiler::MemoryStep>*>(memo.value.get());
}

// The steps' labels for this run: the caller's named scope joined in front (as scope_of does).
std::vector<profiler::MemoryStep> step_labels(const Program& program) {
  std::vector<profiler::MemoryStep> labels = static_labels(program);
  const std::shared_ptr<const std::string>& caller = profiler::detail::current_scope();
  if (!caller) return labels;
  for (profiler::MemoryStep& l : labels) l.scope = l.scope.empty() ? *caller : *caller + "/" + l.scope;
  return labels;
}

// What the slot's value is, for people: "input 2", "dot_general", "fused(mul, add)"; `labels`
// the program's steps' (MemoryRun::steps). The step that bound it, or for a kept constant (bound
// at the first step), the step that makes it.
profiler::LiveBuffer describe(const Program& program, const std::vector<profiler::MemoryStep>& labels,
                              std::size_t slot, int bound_at) {
  profiler::LiveBuffer v;
  const std::vector<Step>& steps = program.steps();
  std::size_t made = steps.size();
  if (bound_at >= 0) {
    const auto b = static_cast<std::size_t>(bound_at);
    made = b < steps.size() && index(steps[b].out) == slot ? b : steps.size();
    for (std::size_t s = 0; s < steps.size() && made == steps.size(); ++s) {
      if (index(steps[s].out) == slot) made = s;
    }
  }
  if (made < labels.size()) {
    v.what = labels[made].op;
    v.scope = labels[made].scope;
    return v;
  }
  const std::vector<SlotId>& inputs = program.input_slots();
  const auto k = std::find(inputs.begin(), inputs.end(), static_cast<SlotId>(slot)) - inputs.begin();
  v.what = fmt::format("input {}", k);
  return v;
}

}  // namespace

namespace {

// The peak (first, over devices and samples) and what its device held then, each buffer once.
void find_peak(const Program& program, const RunRecord& record, profiler::MemoryRun& run) {
  const std::size_t steps = record.live_bytes.size();
  run.peak_step = steps;
  run.peak_bytes = -1;
  const auto consider = [&](const std::vector<std::int64_t>& live, std::size_t step) {
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (live[i] > run.peak_bytes) {
        run.peak_bytes = live[i];
        run.peak_step = step;
        run.peak_device = record.devices[i];
      }
    }
  };
  consider(record.start_bytes, steps);
  for (std::size_t s = 0; s < steps; ++s) consider(record.live_bytes[s], s);
  if (run.peak_device < 0) return;
  const auto at = static_cast<std::size_t>(
      std::find(record.devices.begin(), record.devices.end(), run.peak_device) -
      record.devices.begin());
  const int p = run.peak_step == steps ? RunRecord::kStart : static_cast<int>(run.peak_step);
  // Each buffer once, named by the slot that held it first (the value a view was made of).
  std::set<const Buffer*> seen;
  const std::size_t per_slot = record.devices.size();
  for (std::size_t slot = 0; slot < record.bound_at.size(); ++slot) {
    const bool live = record.bound_at[slot] != RunRecord::kNever && record.bound_at[slot] <= p &&
                      record.freed_at[slot] >= p;
    if (!live || (slot + 1) * per_slot > record.slot_buffers.size()) continue;
    const RunRecord::Held& b = record.slot_buffers[slot * per_slot + at];
    if (b.id == nullptr || !seen.insert(b.id).second) continue;
    profiler::LiveBuffer v = describe(program, run.steps, b.origin, record.bound_at[b.origin]);
    v.bytes = b.bytes;
    run.live_at_peak.push_back(std::move(v));
  }
  std::stable_sort(run.live_at_peak.begin(), run.live_at_peak.end(),
                   [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
}

// The run at its peak, as an instant event on the peak's device (the memory report's source).
void record_peak(const RunRecord& record, std::shared_ptr<const profiler::MemoryRun> run) {
  if (run->peak_device < 0 || record.sample_ns.empty()) return;
  const std::size_t at = std::min(run->peak_step, record.sample_ns.size() - 1);
  const std::int64_t t = record.sample_ns[at];
  profiler::detail::record(profiler::detail::Event{.cat = profiler::detail::Category::kMemoryPeak,
                                                   .device = run->peak_device,
                                                   .start_ns = t,
                                                   .end_ns = t,
                                                   .run = std::move(run)});
}

}  // namespace

void report_run(const Program& program, RunRecord& record, bool comm, bool memory) {
  if (comm) report_comm(program, record);
  const bool to_trace = record.writes_counters();
  if (!memory && !to_trace) return;
  // The counters go to the trace at the run's end, in one batch (a sample per step is only a
  // clock read while the steps run).
  record.write_counter_events();
  auto run = std::make_shared<profiler::MemoryRun>();
  run->devices = record.devices;
  run->steps = step_labels(program);
  find_peak(program, record, *run);
  // The record's figures are not needed after this: moved, not copied.
  run->start_bytes = std::move(record.start_bytes);
  run->live_bytes = std::move(record.live_bytes);
  run->value_start_bytes = std::move(record.value_start_bytes);
  run->value_bytes = std::move(record.value_bytes);
  run->planned_start_bytes = program.cost().timeline.start_bytes;
  run->planned_bytes = program.cost().timeline.live_bytes;
  run->took_constants = record.took_constants;
  if (memory) profiler::detail::add_memory(*run);
  if (to_trace) record_peak(record, std::move(run));
}

}  // namespace shardplan::detail
