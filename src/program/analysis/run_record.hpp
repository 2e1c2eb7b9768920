#pragma once
// What one Program::run did, recorded only when a debug mode (profiler.hpp CommDebugMode,
// MemoryDebugMode) is alive or a test observer is set: the collectives each step ran, as reshard
// and permute reported them, and the bytes the run's slots held per local device at the start
// and after each step, counted from the buffers they hold (each buffer once: what the memory
// pass plans, memory.hpp).
#include <climits>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "../../profiler/recorder.hpp"
#include "../compiler/compile.hpp"

namespace shardplan::detail {

struct RanCollective {
  std::size_t step = 0;
  CollectiveRecord rec;
};

class RunRecord {
 public:
  static constexpr int kStart = -1;       // bound before the first step / freed at the start
  static constexpr int kNever = INT_MAX;  // never freed

  /// `names_buffers`: keep each slot's buffers, to name what is live at the peak.
  RunRecord(const Executor& executor, const Mesh& mesh, std::size_t num_slots,
            std::size_t num_steps, bool names_buffers);
  /// `slot` now holds `a`, from the sample after step `step` on (kStart: from the start).
  void bind(SlotId slot, const Array& a, int step);
  /// `slot` lets go of `a` after step `step`'s sample.
  void drop(SlotId slot, const Array& a, int step);
  void sample_start() {
    start_bytes = live_;
    value_start_bytes = values_;
    if (planned_ != nullptr) sample_ns[live_bytes.size()] = profiler::detail::stamp();
  }
  void sample(std::size_t step) {
    live_bytes[step] = live_;
    value_bytes[step] = values_;
    if (planned_ != nullptr) sample_ns[step] = profiler::detail::stamp();
  }
  /// The samples as the trace's counter events, a pair per device (measured, planned), recorded
  /// in one batch: called once the run is complete, before its figures are moved out.
  void write_counter_events() const;
  /// With the profiler on: each sample also goes to the trace as a counter per device, with
  /// what `planned` (the program's timeline, outliving the run) plans then.
  void write_counters(const MemoryTimeline& planned) {
    planned_ = &planned;
    sample_ns.assign(live_bytes.size() + 1, 0);
  }
  bool writes_counters() const { return planned_ != nullptr; }

  std::vector<int> devices;  // the mesh's local devices
  std::vector<RanCollective> collectives;        // per step that communicated
  std::vector<CollectiveRecord> input_reshards;  // arguments resharded at call time
  std::vector<std::int64_t> start_bytes;               // per device (position in `devices`)
  std::vector<std::vector<std::int64_t>> live_bytes;   // per step, per device
  /// The same, each value's buffers counted for it (a view and its operand, or one array passed
  /// as two arguments, count twice): more than the devices hold wherever values share buffers.
  std::vector<std::int64_t> value_start_bytes;
  std::vector<std::vector<std::int64_t>> value_bytes;
  std::vector<int> bound_at, freed_at;                 // per slot
  /// Per slot, per device (names_buffers): its buffer (an identity only: it may be gone), bytes,
  /// and the slot that held that buffer first (itself, or the operand of a view of it); slot s,
  /// device position i at s * devices.size() + i (one allocation per run).
  struct Held {
    const Buffer* id = nullptr;
    std::int64_t bytes = 0;
    std::size_t origin = 0;
  };
  std::vector<Held> slot_buffers;
  /// A buffer that two or more arguments hold (one array passed as two arguments: `x * x`
  /// eagerly), on one device: a fact of the run the compiler cannot know, so the memory pass
  /// counts it for each argument; the run holds it once.
  struct SharedArgument {
    const Buffer* id = nullptr;
    std::size_t device = 0;  // position in `devices`
    std::int64_t bytes = 0;
    std::vector<SlotId> slots;  // the argument slots holding it, in binding order
  };
  std::vector<SharedArgument> shared_arguments;
  bool took_constants = false;
  bool complete = false;
  /// With counters: when each sample was taken (per step; the start last).
  std::vector<std::int64_t> sample_ns;

 private:
  struct Ref {
    int count = 0;
    std::size_t origin = 0;  // the slot that bound the buffer first
  };
  std::unordered_map<const Buffer*, Ref> refs_;
  std::vector<int> position_;  // by device id: its position in `devices`, or -1
  std::vector<std::int64_t> live_, values_;
  bool names_buffers_;
  const MemoryTimeline* planned_ = nullptr;
  void note_shared_argument(SlotId slot, const Buffer* id, std::size_t at, std::size_t origin);
};

/// Called after every run that completed when set, with what it recorded (tests check each run
/// against its program's cost). Not for library code.
using RunObserver = void (*)(const Program& program, const RunRecord& record);
void set_run_observer(RunObserver observer);
RunObserver run_observer();

/// Gives the debug modes alive what `record` counted (`comm`: the collectives; `memory`: the
/// measured timeline and what is live at its peak); with counters written, the run also goes
/// to the trace at its peak (an instant event the memory report reads back). Moves the bytes
/// out of `record` (the last use of it).
void report_run(const Program& program, RunRecord& record, bool comm, bool memory);

}  // namespace shardplan::detail
