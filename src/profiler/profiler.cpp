// The profiler's recording: the flag, a buffer per thread that records (pool threads append
// without contending: each buffer's mutex is taken by its own thread, and by collect() only),
// the sessions, and the named-scope stack.
#include "shardplan/profiler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>

#include "recorder.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/detail/utf8.hpp"
#include "shardplan/error.hpp"

namespace shardplan::profiler::detail {

std::atomic<bool> g_on{false};
std::atomic<bool> g_memory{false};
std::atomic<std::int64_t> g_test_clock_skew_ns{0};
std::atomic<bool> g_stamp_tsc{false};

void set_test_clock_skew(std::int64_t ns) { g_test_clock_skew_ns.store(ns); }

const char* category_name(Category c) {
  switch (c) {
    case Category::kKernel:
      return "kernel";
    case Category::kCollective:
      return "collective";
    case Category::kReshard:
      return "reshard";
    case Category::kWait:
      return "wait";
    case Category::kMemory:
    case Category::kMemoryPeak:
      return "memory";
    case Category::kDispatch:
      break;
  }
  return "dispatch";
}

namespace {

// Waits shorter than this are not written (a step's devices rarely end within a microsecond of
// each other; a trace of every few-nanosecond gap would only be bigger).
constexpr std::int64_t kMinWaitNs = 1000;

// A stamp() and now_ns() read together: of three tries, the one whose two stamps around the ns
// read are closest (the stamp is their middle).
struct ClockPair {
  std::int64_t stamp = 0, ns = 0;
};
ClockPair read_pair() {
  ClockPair best;
  std::int64_t best_gap = -1;
  for (int i = 0; i < 3; ++i) {
    const std::int64_t a = stamp();
    const std::int64_t ns = now_ns();
    const std::int64_t b = stamp();
    if (best_gap < 0 || b - a < best_gap) {
      best_gap = b - a;
      best = ClockPair{a + (b - a) / 2, ns};
    }
  }
  return best;
}

// Stamps to ns: through the session's pairs (one read at its start, one at each collect), a
// stamp between two pairs on the line through them, one past the last on the last segment's
// line. A stamp's ns never change once a later pair is read, so each collect of a session gives
// every event it has already given the same times. Identity while stamps are ns.
class StampToNs {
 public:
  StampToNs(bool tsc, const std::vector<ClockPair>& pairs) : tsc_(tsc), pairs_(pairs) {}
  std::int64_t operator()(std::int64_t s) const {
    if (!tsc_ || pairs_.empty()) return s;
    if (pairs_.size() == 1) return pairs_[0].ns;
    // The segment: the first pair after s, and the one before it (the first or last segment
    // for stamps outside).
    const auto after = std::upper_bound(pairs_.begin() + 1, pairs_.end() - 1, s,
                                        [](std::int64_t v, const ClockPair& p) { return v < p.stamp; });
    const ClockPair& to = *after;
    const ClockPair& from = *(after - 1);
    if (to.stamp == from.stamp) return from.ns;
    const long double slope = static_cast<long double>(to.ns - from.ns) /
                              static_cast<long double>(to.stamp - from.stamp);
    return from.ns + static_cast<std::int64_t>(
                         std::llround(slope * static_cast<long double>(s - from.stamp)));
  }

 private:
  bool tsc_;
  const std::vector<ClockPair>& pairs_;
};

// A Slice as the buffer keeps it: its span as offsets from its proto's step_start (Proto::shift).
struct Packed {
  std::uint32_t start, end;
  std::uint32_t proto;  // its index in the buffer's protos
  int device;
};

struct ThreadBuffer {
  std::mutex mu;
  std::uint64_t session = 0;
  std::vector<Proto> protos;
  std::vector<Packed> slices;
  void clear() {
    protos.clear();
    slices.clear();
  }
};

// Buffers are owned here, never freed: a thread that ends leaves its buffer to the next collect
// (the pools' threads live as long as the process anyway).
struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;
  std::atomic<std::uint64_t> session{0};
  std::atomic<std::int64_t> start_ns{0};
  // The session's clock pairs (its start's, then one per collect), stamps rising (under mu).
  std::vector<ClockPair> pairs;
  bool tsc = false;  // the session stamps with the time-stamp counter (under mu)
  bool tsc_allowed = true;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: threads may record during exit
  return *r;
}

thread_local ThreadBuffer* t_buffer = nullptr;

ThreadBuffer& my_buffer() {
  if (t_buffer == nullptr) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.buffers.push_back(std::make_unique<ThreadBuffer>());
    t_buffer = r.buffers.back().get();
  }
  return *t_buffer;
}

}  // namespace

namespace {
// This thread's buffer, locked, emptied first when a new session has begun since it last
// recorded.
std::unique_lock<std::mutex> open_buffer(ThreadBuffer*& out) {
  ThreadBuffer& b = my_buffer();
  const std::uint64_t session = registry().session.load(std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(b.mu);
  if (b.session != session) {
    b.clear();
    b.session = session;
  }
  out = &b;
  return lock;
}

// The proto and slice of one whole event.
Proto proto_of(Event& e) {
  Proto p{.cat = e.cat,
          .name = e.name,
          .owned = std::move(e.owned),
          .scope = std::move(e.scope),
          .kind = e.kind,
          .groups = nullptr,
          .bytes_in = nullptr,
          .bytes = e.bytes,
          .run = std::move(e.run),
          .planned = e.planned,
          .step_start = e.start_ns,
          .step_end = std::max(e.start_ns, e.end_ns)};
  if (e.group && e.device >= 0) {
    auto table = std::make_shared<GroupTable>();
    table->groups.push_back(*e.group);
    table->group_of_device.assign(static_cast<std::size_t>(e.device) + 1, -1);
    table->group_of_device.back() = 0;
    p.groups = std::move(table);
  }
  return p;
}

// The shift that makes the proto's span fit 32 bits (Proto::shift).
int shift_for(const Proto& p) {
  const std::uint64_t span = static_cast<std::uint64_t>(std::max<std::int64_t>(0, p.step_end - p.step_start));
  int shift = 0;
  while ((span >> shift) > 0xffffffffULL) ++shift;
  return shift;
}
// A time inside the proto's span as an offset, and back.
std::uint32_t offset_of(const Proto& p, std::int64_t t) {
  const std::int64_t d = std::clamp(t - p.step_start, std::int64_t{0}, p.step_end - p.step_start);
  return static_cast<std::uint32_t>(static_cast<std::uint64_t>(d) >> p.shift);
}
std::int64_t time_of(const Proto& p, std::uint32_t offset) {
  return p.step_start + static_cast<std::int64_t>(static_cast<std::uint64_t>(offset) << p.shift);
}

// The event `s` stands for, its shared fields from `p`, its times in ns.
Event event_of(const Proto& p, const Packed& s, const StampToNs& to_ns) {
  Event e{.cat = p.cat,
          .device = s.device,
          .start_ns = to_ns(time_of(p, s.start)),
          .end_ns = to_ns(time_of(p, s.end)),
          .name = p.name,
          .owned = p.owned,
          .scope = p.scope,
          .bytes = p.bytes,
          .kind = p.kind,
          .planned = p.planned,
          .run = p.run};
  const auto at = static_cast<std::size_t>(s.device);
  if (p.bytes_in) e.bytes = s.device >= 0 && at < p.bytes_in->size() ? (*p.bytes_in)[at] : 0;
  if (p.groups && s.device >= 0 && at < p.groups->group_of_device.size()) {
    const int g = p.groups->group_of_device[at];
    if (g >= 0) {
      // Shares the table's ownership: every event of one group holds the same list.
      e.group = std::shared_ptr<const std::vector<int>>(
          p.groups, &p.groups->groups[static_cast<std::size_t>(g)]);
    }
  }
  return e;
}

// Appends the events `s` stands for to `out`: its own, and those derived from its proto (the
// waits around a kernel, the reshard a collective ran in: Proto), in the order they happened.
void expand(const Proto& p, const Packed& s, const StampToNs& to_ns, std::vector<Event>& out) {
  const auto derived = [&](Category cat, std::int64_t from, std::int64_t to) {
    Event e{.cat = cat,
            .device = s.device,
            .start_ns = to_ns(from),
            .end_ns = to_ns(to),
            .name = p.name,
            .owned = p.owned,
            .scope = p.scope};
    if (cat == Category::kWait && e.end_ns - e.start_ns < kMinWaitNs) return;
    out.push_back(std::move(e));
  };
  if (p.with_reshard) derived(Category::kReshard, p.step_start, p.step_end);
  if (p.waits) derived(Category::kWait, p.step_start, time_of(p, s.start));
  out.push_back(event_of(p, s, to_ns));
  if (p.waits) derived(Category::kWait, time_of(p, s.end), p.step_end);
}
}  // namespace

void record(std::vector<Proto>& protos, std::vector<Slice>& slices) {
  if (!slices.empty()) {
    for (Proto& p : protos) p.shift = shift_for(p);
    ThreadBuffer* b = nullptr;
    const std::unique_lock<std::mutex> lock = open_buffer(b);
    const auto base = static_cast<std::uint32_t>(b->protos.size());
    for (const Slice& s : slices) {
      const Proto& p = protos[s.proto];
      b->slices.push_back(
          Packed{offset_of(p, s.start_ns), offset_of(p, s.end_ns), base + s.proto, s.device});
    }
    for (Proto& p : protos) b->protos.push_back(std::move(p));
  }
  protos.clear();
  slices.clear();
}

void record(Event e) {
  std::vector<Event> one;
  one.push_back(std::move(e));
  record(one);
}

void record(std::vector<Event>& events) {
  std::vector<Proto> protos;
  std::vector<Slice> slices;
  protos.reserve(events.size());
  slices.reserve(events.size());
  for (Event& e : events) {
    slices.push_back(Slice{.start_ns = e.start_ns,
                           .end_ns = e.end_ns,
                           .proto = static_cast<std::uint32_t>(protos.size()),
                           .device = e.device});
    protos.push_back(proto_of(e));
  }
  record(protos, slices);
  events.clear();
}

bool tsc_usable() {
#if defined(__x86_64__)
  static const bool usable = [] {
    // The kernel runs its clock on the counter only when it found it invariant and in step
    // over every core; the CPU's flags say it ticks at one rate through frequency changes and
    // sleep states.
    std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    std::string name;
    if (!(source >> name) || name != "tsc") return false;
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
      if (line.rfind("flags", 0) != 0) continue;
      const auto has = [&](const char* flag) {
        return (" " + line + " ").find(std::string(" ") + flag + " ") != std::string::npos;
      };
      return has("constant_tsc") && has("nonstop_tsc");
    }
    return false;
  }();
  return usable;
#else
  return false;
#endif
}

void set_test_tsc_allowed(bool allowed) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mu);
  r.tsc_allowed = allowed;
}

std::vector<Event> collect(std::int64_t* session_start_ns) {
  Registry& r = registry();
  std::vector<Event> all;
  std::lock_guard<std::mutex> lock(r.mu);
  const std::uint64_t session = r.session.load();
  if (r.tsc) {
    const ClockPair now = read_pair();
    if (r.pairs.empty() || now.stamp > r.pairs.back().stamp) r.pairs.push_back(now);
  }
  const StampToNs to_ns(r.tsc, r.pairs);
  for (const auto& b : r.buffers) {
    std::lock_guard<std::mutex> block(b->mu);
    if (b->session != session) continue;
    all.reserve(all.size() + b->slices.size());
    for (const Packed& s : b->slices) expand(b->protos[s.proto], s, to_ns, all);
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Event& a, const Event& b) { return a.start_ns < b.start_ns; });
  if (session_start_ns != nullptr) *session_start_ns = r.start_ns.load();
  return all;
}

namespace {
// Each entry: the whole path of the scope it opened ("a/b"); an override pushes its own.
thread_local std::vector<std::shared_ptr<const std::string>> t_scopes;
const std::shared_ptr<const std::string> kNoScope;
}  // namespace

const std::shared_ptr<const std::string>& current_scope() {
  return t_scopes.empty() ? kNoScope : t_scopes.back();
}

ScopeOverride::ScopeOverride(std::shared_ptr<const std::string> scope) {
  t_scopes.push_back(std::move(scope));
}
ScopeOverride::~ScopeOverride() { t_scopes.pop_back(); }

}  // namespace shardplan::profiler::detail

namespace shardplan {

namespace profiler {

void start(const ProfileOptions& options) {
  if constexpr (!detail::kCompiledIn) {
    throw Error(
        "profiler::start: this build has no profiler (configured with -DSHARDPLAN_PROFILER=OFF)");
  }
  detail::Registry& r = detail::registry();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    const std::uint64_t session = r.session.fetch_add(1) + 1;
    // The earlier session's events are dropped here, not by the first step that records (which
    // would then pay for it); each buffer keeps its capacity for the next.
    for (const auto& b : r.buffers) {
      std::lock_guard<std::mutex> block(b->mu);
      b->clear();
      b->session = session;
    }
    // Stamps are the time-stamp counter for the whole session, or ns for the whole session.
    r.tsc = r.tsc_allowed && detail::tsc_usable();
    detail::g_stamp_tsc.store(r.tsc, std::memory_order_relaxed);
    r.pairs.assign(1, detail::read_pair());
    r.start_ns.store(r.pairs.front().ns);
  }
  detail::g_memory.store(options.memory, std::memory_order_relaxed);
  detail::g_on.store(true, std::memory_order_relaxed);
}

void stop() { detail::g_on.store(false, std::memory_order_relaxed); }

bool is_on() { return detail::on(); }

std::size_t event_count() { return detail::collect(nullptr).size(); }

}  // namespace profiler

NamedScope::NamedScope(std::string_view name) {
  if (name.empty() || !detail::is_utf8(name)) {
    throw SpecError(
        fmt::format("[named_scope] the scope name '{}' is {}; give a non-empty UTF-8 name",
                    detail::printable(name), name.empty() ? "empty" : "not valid UTF-8"));
  }
  const std::shared_ptr<const std::string>& outer = profiler::detail::current_scope();
  std::string path = outer ? fmt::format("{}/{}", *outer, name) : std::string(name);
  profiler::detail::t_scopes.push_back(std::make_shared<const std::string>(std::move(path)));
}

NamedScope::~NamedScope() { profiler::detail::t_scopes.pop_back(); }

std::string current_named_scope() {
  const auto& s = profiler::detail::current_scope();
  return s ? *s : std::string();
}

}  // namespace shardplan
