#pragma once
// The profiler (as jax.profiler, torch.profiler): while on, every program run records what each
// device did (kernel steps, collectives, reshards, waits) and each sjit call's host dispatch, with
// the op and the named scope it came from; write_trace() writes them as Chrome/Perfetto trace
// event JSON (docs/profiling.md). Off, a run pays one relaxed atomic load per step.
//
//   shardplan::profiler::ProfileSession session;  // on until it ends
//   {
//     auto scope = shardplan::named_scope("mlp");
//     step(params, batch);  // an sjit function: its ops traced inside carry "mlp"
//   }
//   shardplan::profiler::write_trace("step.trace.json");
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/collective_kind.hpp"

namespace shardplan {

namespace profiler {

/// What a session records beyond the steps, collectives, waits and dispatches.
struct ProfileOptions {
  /// Each program run's live bytes per device after each step, beside the memory pass's plan
  /// (counter events), and what is live at its peak (a "memory peak" instant event: the source
  /// of `shardplan trace memory`). Off by default, as torch.profiler's profile_memory: it keeps
  /// each value's buffers per run, a few points of a step of many small kernels
  /// (docs/performance.md, "Tracing overhead").
  bool memory = false;
};

/// Starts recording, dropping the events of an earlier session. Thread-safe.
void start(const ProfileOptions& options = {});
/// Stops recording; what was recorded stays until the next start(). Thread-safe.
void stop();
/// Whether recording is on. Thread-safe.
bool is_on();
/// The number of events recorded since the last start() (host and devices).
std::size_t event_count();

/// The recorded events as Chrome/Perfetto trace event JSON ("traceEvents": complete events per
/// device of this process, metadata naming processes and threads). Thread-safe; call after stop()
/// for a complete picture.
std::string trace_json();
/// Writes the trace to `path` (replaced whole, never left half-written). Throws IoError naming
/// the path when it cannot be written.
///
/// Under mpirun (more than one process) it is collective and writes one file for the job: every
/// process's events, moved onto process 0's clock (estimate_clock_offsets), gathered to process 0,
/// which alone writes `path` (its "pid" is each event's process index); the other processes'
/// `path` is not used. A failure on any process (process 0's path cannot be written, ...) makes
/// every process throw a DistributedError naming the failed process and its message (the IoError
/// nested in it on process 0), instead of leaving the others waiting.
void write_trace(const std::filesystem::path& path);

/// How a process's clock (the one the profiler reads, std::chrono::steady_clock) stands against
/// process 0's, estimated over the interconnect as Cristian's algorithm does: process 0 notes
/// t0, sends a message, the process replies with its clock's reading t, process 0 notes t1;
/// offset = t - (t0 + (t1 - t0) / 2), from the round trip with the least t1 - t0 of `rounds`
/// (more while the bound is over 10 us: up to 16 times `rounds`, or 100 ms a process).
struct ClockOffset {
  int process = 0;
  /// Its clock less process 0's: a time T on its clock is T - offset_ns on process 0's.
  std::int64_t offset_ns = 0;
  /// The estimate is within this of the true offset (half the least round trip; its reply was
  /// read between t0 and t1), whatever the delays each way. 0 for process 0.
  std::int64_t error_bound_ns = 0;
  std::int64_t round_trip_ns = 0;  // the least round trip
};

/// Collective: every process's ClockOffset, in process order, on every process (one entry, all
/// zero, without mpirun). `rounds` round trips per process (at least 1; a SpecError otherwise).
std::vector<ClockOffset> estimate_clock_offsets(int rounds = 64);

/// Recording on for its lifetime: start() when made, stop() when it ends.
class ProfileSession {
 public:
  explicit ProfileSession(const ProfileOptions& options = {}) { start(options); }
  ~ProfileSession() { stop(); }
  ProfileSession(const ProfileSession&) = delete;
  ProfileSession& operator=(const ProfileSession&) = delete;
};

/// The collectives of one kind a set of program runs ran (CommDebugMode).
struct CollectiveCount {
  std::int64_t count = 0;  // collectives run (one per collective of a step, whatever the devices)
  /// Per collective, the most bytes a device received, summed over the collectives: the measure
  /// of `lower(...).cost().bytes_by_kind` (a program run once gives exactly its cost's figure).
  std::int64_t bytes = 0;
  std::int64_t total_bytes = 0;  // the bytes every device received, summed over devices too
  friend bool operator==(const CollectiveCount&, const CollectiveCount&) = default;
};

/// What CommDebugMode counted: per collective kind over all runs, and per named scope (the scope
/// of the op whose value a collective moves, as the trace names it; "" for none).
struct CommCounts {
  std::map<CollectiveKind, CollectiveCount> by_kind;
  std::map<std::string, std::map<CollectiveKind, CollectiveCount>> by_scope;
  /// The collectives counted, of every kind.
  std::int64_t total_count() const;
  /// A table: per scope ("(all)" first) each kind with its count, bytes and total bytes.
  std::string to_string() const;
  friend bool operator==(const CommCounts&, const CommCounts&) = default;
};

/// Counts the collectives of every compiled program run (sjit calls, eager ops' programs) on any
/// thread while it lives, as PyTorch's CommDebugMode; no trace is needed. Over processes each
/// counts its own devices' bytes. Collectives called directly on arrays are not counted. Off (no
/// mode alive) a run pays one relaxed atomic load. Thread-safe.
class CommDebugMode {
 public:
  CommDebugMode();
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;
  /// What was counted so far.
  CommCounts counts() const;
  /// Forgets what was counted.
  void reset();
  struct State;

 private:
  std::shared_ptr<State> state_;
};

/// A value a device held at a run's peak, measured (MemoryDebugMode).
struct LiveBuffer {
  /// "input 2", or the op that made it ("dot_general", "fused(mul, add)", "dot_general
  /// resharded").
  std::string what;
  std::string scope;        // the op's named scope, or ""
  std::int64_t bytes = 0;   // its buffers' bytes on the peak's device
  friend bool operator==(const LiveBuffer&, const LiveBuffer&) = default;
};

/// What a program step is, for people (MemoryRun::steps).
struct MemoryStep {
  /// The op: "dot_general", "fused(mul, add)", "dot_general resharded" (a reshard step moving
  /// that op's value).
  std::string op;
  std::string value;  // the names checkpoint_name gave its value, joined by ", ", or ""
  std::string scope;  // its named scope, or ""
  friend bool operator==(const MemoryStep&, const MemoryStep&) = default;
};

/// The bytes a program run held per device, measured from the buffers its slots hold (each
/// buffer once, however many values share it: views), after binding the arguments and after each
/// step (before the step frees what it read last): what ProgramCost::timeline plans (tests check
/// every run; one array passed as two arguments is one buffer here, two in the plan).
struct MemoryRun {
  std::vector<int> devices;               // the local devices of the program's mesh
  std::vector<MemoryStep> steps;          // per program step: what it computes or moves
  std::vector<std::int64_t> start_bytes;  // per device (by position in `devices`)
  std::vector<std::vector<std::int64_t>> live_bytes;  // per step, per device
  /// The same with each value's buffers counted for it (a view of a live operand, or one array
  /// passed as two arguments, twice): more than the devices hold wherever values share buffers.
  std::vector<std::int64_t> value_start_bytes;
  std::vector<std::vector<std::int64_t>> value_bytes;
  /// The step of the (first) peak; live_bytes.size() when the peak is the arguments alone.
  std::size_t peak_step = 0;
  std::int64_t peak_bytes = 0;  // the most any device held
  int peak_device = -1;
  /// What that device held at the peak, largest first (each buffer named once).
  std::vector<LiveBuffer> live_at_peak;
  /// What the memory pass planned for every device (ProgramCost::timeline): before the first
  /// step, and per step. A run that took kept constants holds them from the start, above it.
  std::int64_t planned_start_bytes = 0;
  std::vector<std::int64_t> planned_bytes;
  /// Kept constants were taken from the cache of an earlier run (held from the start, their
  /// steps not run).
  bool took_constants = false;
  friend bool operator==(const MemoryRun&, const MemoryRun&) = default;
};

/// The runs as JSON (docs/profiling.md, "The memory report"): per run its devices, steps, bytes
/// measured per step and device, the planned bytes, the peak and what is live at it. Names that
/// are not UTF-8 are written with U+FFFD. Thread-safe.
std::string memory_json(const std::vector<MemoryRun>& runs);
/// The runs as one self-contained HTML page (the style of plan --html): per run, the measured
/// bytes of each device and the planned bytes over the steps, the peak marked, what is live at
/// it. `title` names the page (escaped). Thread-safe.
std::string memory_html(const std::vector<MemoryRun>& runs, std::string_view title);
/// Writes memory_json (a path ending in ".json") or memory_html (".html") to `path`, replaced
/// whole, never left half-written. Throws SpecError naming the path for another extension,
/// IoError naming it when it cannot be written.
void write_memory_report(const std::filesystem::path& path, const std::vector<MemoryRun>& runs,
                         std::string_view title = "shardplan memory");

/// Measures the memory of every compiled program run on any thread while it lives. Off, a run
/// pays one relaxed atomic load. Thread-safe.
class MemoryDebugMode {
 public:
  MemoryDebugMode();
  ~MemoryDebugMode();
  MemoryDebugMode(const MemoryDebugMode&) = delete;
  MemoryDebugMode& operator=(const MemoryDebugMode&) = delete;
  /// The runs measured so far, in the order they ended.
  std::vector<MemoryRun> runs() const;
  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace profiler

/// A scope, as jax.named_scope: ops traced (under sjit) while it lives carry its name, nested
/// scopes joined by '/' ("layer0/attn"); a trace names each kernel with the scope of its op, and
/// eager ops with the scope open when they run. Per thread. Throws SpecError naming the scope
/// (escaped) when `name` is empty or not valid UTF-8.
class NamedScope {
 public:
  explicit NamedScope(std::string_view name);
  ~NamedScope();
  NamedScope(const NamedScope&) = delete;
  NamedScope& operator=(const NamedScope&) = delete;
};

/// `NamedScope(name)`: `auto s = shardplan::named_scope("attn");`. Throws as NamedScope.
[[nodiscard]] inline NamedScope named_scope(std::string_view name) { return NamedScope(name); }

/// The scopes open on this thread joined by '/', or "" when none.
std::string current_named_scope();

}  // namespace shardplan
