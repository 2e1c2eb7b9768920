// The profiler's recording: the flag, a buffer per thread that records (pool threads append
// without contending: each buffer's mutex is taken by its own thread, and by collect() only),
// the sessions, and the named-scope stack.
#include "shardplan/profiler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <mutex>

#include "recorder.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/detail/utf8.hpp"
#include "shardplan/error.hpp"

namespace shardplan::profiler::detail {

std::atomic<bool> g_on{false};
std::atomic<bool> g_memory{false};
std::atomic<std::int64_t> g_test_clock_skew_ns{0};

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

struct ThreadBuffer {
  std::mutex mu;
  std::uint64_t session = 0;
  std::vector<Event> events;
};

// Buffers are owned here, never freed: a thread that ends leaves its buffer to the next collect
// (the pools' threads live as long as the process anyway).
struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;
  std::atomic<std::uint64_t> session{0};
  std::atomic<std::int64_t> start_ns{0};
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
    b.events.clear();
    b.session = session;
  }
  out = &b;
  return lock;
}
}  // namespace

void record(Event e) {
  ThreadBuffer* b = nullptr;
  const std::unique_lock<std::mutex> lock = open_buffer(b);
  b->events.push_back(std::move(e));
}

void record(std::vector<Event>& events) {
  if (events.empty()) return;
  {
    ThreadBuffer* b = nullptr;
    const std::unique_lock<std::mutex> lock = open_buffer(b);
    b->events.insert(b->events.end(), std::make_move_iterator(events.begin()),
                     std::make_move_iterator(events.end()));
  }
  events.clear();
}

std::vector<Event> collect(std::int64_t* session_start_ns) {
  Registry& r = registry();
  std::vector<Event> all;
  std::lock_guard<std::mutex> lock(r.mu);
  const std::uint64_t session = r.session.load();
  for (const auto& b : r.buffers) {
    std::lock_guard<std::mutex> block(b->mu);
    if (b->session != session) continue;
    all.insert(all.end(), b->events.begin(), b->events.end());
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Event& a, const Event& b) { return a.start_ns < b.start_ns; });
  if (session_start_ns != nullptr) *session_start_ns = r.start_ns.load();
  return all;
}

std::vector<Span>& reshard_spans() {
  thread_local std::vector<Span> spans;
  return spans;
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
      b->events.clear();
      b->session = session;
    }
    r.start_ns.store(detail::now_ns());
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
