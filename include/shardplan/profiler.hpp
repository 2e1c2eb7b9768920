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
#include <filesystem>
#include <string>
#include <string_view>

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
/// Writes trace_json() to `path` (replaced whole, never left half-written). Throws IoError naming
/// the path when it cannot be written.
void write_trace(const std::filesystem::path& path);

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
