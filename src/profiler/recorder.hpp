#pragma once
// The profiler's recording side (private): the on/off flag the runtime reads, the events, the
// per-thread buffers they go to, the named-scope stack. include/shardplan/profiler.hpp is the
// public side.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/profiler.hpp"

namespace shardplan::profiler::detail {

/// What an event is (the trace's "cat").
/// kMemory: a counter sample ("ph": "C"), `bytes` the bytes a device's program held then and
/// `planned` what the memory pass planned. kMemoryPeak: an instant event ("ph": "i") at a run's
/// peak on the peak's device, `run` the whole run (the memory report reads it back).
enum class Category : std::uint8_t {
  kKernel,
  kCollective,
  kReshard,
  kWait,
  kDispatch,
  kMemory,
  kMemoryPeak
};
/// "kernel", "collective", "reshard", "wait", "dispatch", "memory", "memory" (the peak).
const char* category_name(Category c);

/// The thread id the host's events (dispatch) are written under; devices use their ids.
inline constexpr int kHostTid = 1000000;

/// One complete event, on a device (or the host: kHostTid).
struct Event {
  Category cat = Category::kKernel;
  int device = 0;
  /// steady_clock ns from collect(); stamp()s where an Event is handed to record().
  std::int64_t start_ns = 0, end_ns = 0;
  /// The op ("dot_general"): text of static storage (a primitive's name), or, when `owned` is
  /// set, *owned ("fused(add, exp)").
  std::string_view name;
  std::shared_ptr<const std::string> owned;
  std::shared_ptr<const std::string> scope;  // its named scope, or null
  std::int64_t bytes = -1;                   // a collective's bytes received by this device
  int kind = -1;                             // a collective's CollectiveKind, or -1
  /// A collective's group: the devices it runs among, this one included (shared by the group's
  /// events; the trace's "peers" leave this device out).
  std::shared_ptr<const std::vector<int>> group;
  std::int64_t planned = -1;                     // kMemory: the planned bytes, or -1
  std::shared_ptr<const MemoryRun> run;          // kMemoryPeak: the run
  std::string_view op() const { return owned ? std::string_view(*owned) : name; }
};

/// False in a build configured with -DSHARDPLAN_PROFILER=OFF: on() is then a constant and every
/// recording branch is compiled out (the baseline docs/performance.md times the off path against).
#ifdef SHARDPLAN_NO_PROFILER
inline constexpr bool kCompiledIn = false;
#else
inline constexpr bool kCompiledIn = true;
#endif

extern std::atomic<bool> g_on;
/// The one branch a run pays when the profiler is off.
inline bool on() {
  if constexpr (!kCompiledIn) return false;
  return g_on.load(std::memory_order_relaxed);
}
extern std::atomic<bool> g_memory;
/// On, with ProfileOptions::memory: runs record their live bytes into the trace.
inline bool memory_on_trace() { return on() && g_memory.load(std::memory_order_relaxed); }
/// Test-only: added to every time this process's profiler reads (events, session starts, the
/// clock alignment's round trips), as a clock that is off by that much would be. 0 normally.
extern std::atomic<std::int64_t> g_test_clock_skew_ns;
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
             .count() +
         g_test_clock_skew_ns.load(std::memory_order_relaxed);
}
/// Sets the test-only skew of now_ns() on this process.
void set_test_clock_skew(std::int64_t ns);

/// True while this session's stamps are the CPU's time-stamp counter (set by start()).
extern std::atomic<bool> g_stamp_tsc;
/// The time of an event as it is recorded: as cheap a clock read as this machine allows. On
/// x86-64, where the kernel's own clock runs on the time-stamp counter (invariant, synchronized
/// over cores: the kernel checked), the counter itself (~9 ns here, against ~20 ns for
/// steady_clock through the vDSO); elsewhere now_ns(). collect() turns stamps into now_ns()'s
/// nanoseconds along the line through two (stamp, ns) pairs read at the session's start and at
/// the collect, so an Event's times are steady_clock nanoseconds either way.
inline std::int64_t stamp() {
#if defined(__x86_64__)
  if (g_stamp_tsc.load(std::memory_order_relaxed)) {
    return static_cast<std::int64_t>(__builtin_ia32_rdtsc());
  }
#endif
  return now_ns();
}
/// Whether sessions may stamp with the time-stamp counter (as detected: x86-64, the kernel's
/// clocksource "tsc", the CPU's constant_tsc and nonstop_tsc). Tests turn it off to run the
/// steady_clock path; takes effect at the next start().
bool tsc_usable();
void set_test_tsc_allowed(bool allowed);

/// The groups of a collective over some mesh axes: each group's devices, and each device's
/// group (by device id; -1 for a device not in the mesh). Made once per mesh and axes
/// (program_profile.cpp) and shared by every event that names one of its groups.
struct GroupTable {
  std::vector<std::vector<int>> groups;
  std::vector<int> group_of_device;
};

/// What the events of one step share, stored once per step in the buffer: its op and scope, the
/// category of its events, a collective's kind, groups and bytes, and the step's span. Its events
/// themselves are Slices (a device and a span each). collect() joins the two into Events.
/// Recording a step is then one Proto (a few reference counts) and 16 bytes per device, under one
/// lock (docs/performance.md, "Tracing a small step").
struct Proto {
  Category cat = Category::kKernel;  // of its slices
  std::string_view name;             // as Event::name
  std::shared_ptr<const std::string> owned, scope;
  int kind = -1;
  std::shared_ptr<const GroupTable> groups;  // a collective's groups, or null
  /// A collective's bytes received, by device id (Event::bytes); or null and `bytes` for all.
  std::shared_ptr<const std::vector<std::int64_t>> bytes_in;
  std::int64_t bytes = -1;
  std::shared_ptr<const MemoryRun> run;  // kMemoryPeak
  std::int64_t planned = -1;             // kMemory
  /// The step's own span (stamps): its slices lie inside it. collect() derives from it the
  /// events no step writes: with `waits`, each kernel slice's device waited from `step_start` to
  /// its start and from its end to `step_end` (kWait events, those of 1 us or more); with
  /// `with_reshard`, each slice is its device's first collective of a reshard that ran from
  /// `step_start` to `step_end` (a kReshard event before it, named as this proto, no kind).
  std::int64_t step_start = 0, step_end = 0;
  bool waits = false;
  bool with_reshard = false;
  /// Set by record(): a slice's times are kept as 32-bit offsets from `step_start` in units of
  /// 2^shift stamps (0 unless the step spans 2^32 stamps or more: over a second).
  int shift = 0;
};
/// One event as a step hands it to record(): its proto (an index into the protos recorded with
/// it), its device, its span (stamp()s, inside the proto's step span).
struct Slice {
  std::int64_t start_ns = 0, end_ns = 0;
  std::uint32_t proto = 0;
  int device = 0;
};

/// Appends one step's events to this thread's buffer under one lock (dropped when the session
/// they began in has ended): `protos` what they share, `slices` the events, each naming its
/// proto by index. Clears both.
void record(std::vector<Proto>& protos, std::vector<Slice>& slices);
/// Appends `e` to this thread's buffer.
void record(Event e);
/// Appends every event of `events` there under one lock, and clears `events`.
void record(std::vector<Event>& events);
/// Every event of the current session, by start time; the session's start (steady_clock ns).
std::vector<Event> collect(std::int64_t* session_start_ns);

/// The named scope open on this thread (the scopes joined by '/'), or null.
const std::shared_ptr<const std::string>& current_scope();

/// Makes `scope` the current scope for its lifetime (value_and_grad gives a forward node's scope
/// to the backward ops it records).
class ScopeOverride {
 public:
  explicit ScopeOverride(std::shared_ptr<const std::string> scope);
  ~ScopeOverride();
  ScopeOverride(const ScopeOverride&) = delete;
  ScopeOverride& operator=(const ScopeOverride&) = delete;
};

}  // namespace shardplan::profiler::detail
