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
#include <string>
#include <string_view>
#include <vector>

namespace shardplan {

namespace profiler {

/// Starts recording, dropping the events of an earlier session. Thread-safe.
void start();
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
/// offset = t - (t0 + (t1 - t0) / 2), from the round trip with the least t1 - t0 of `rounds`.
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
  ProfileSession() { start(); }
  ~ProfileSession() { stop(); }
  ProfileSession(const ProfileSession&) = delete;
  ProfileSession& operator=(const ProfileSession&) = delete;
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
