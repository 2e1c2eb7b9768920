// CommDebugMode and MemoryDebugMode: the modes alive, each with its own counts under a lock. A
// run adds to them once, when it ends.
#include "debug_modes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace shardplan::profiler {

struct CommDebugMode::State {
  std::mutex mu;
  CommCounts counts;
};

struct MemoryDebugMode::State {
  std::mutex mu;
  std::vector<MemoryRun> runs;
};

namespace detail {

std::atomic<int> g_comm_modes{0};
std::atomic<int> g_memory_modes{0};

namespace {

struct Alive {
  std::mutex mu;
  std::vector<CommDebugMode::State*> comm;
  std::vector<MemoryDebugMode::State*> memory;
};

Alive& alive() {
  static Alive* a = new Alive();  // never destroyed: runs may end during exit
  return *a;
}

void add_to(CollectiveCount& to, const CollectiveCount& c) {
  to.count += c.count;
  to.bytes += c.bytes;
  to.total_bytes += c.total_bytes;
}

template <class T>
void enlist(std::vector<T*> Alive::*list, std::atomic<int>& modes, T* state) {
  Alive& a = alive();
  std::lock_guard<std::mutex> lock(a.mu);
  (a.*list).push_back(state);
  modes.fetch_add(1, std::memory_order_relaxed);
}

template <typename T>
void delist(std::vector<T*> Alive::*list, std::atomic<int>& modes, T* state) {
  Alive& a = alive();
  std::lock_guard<std::mutex> lock(a.mu);
  std::vector<T*>& v = a.*list;
  v.erase(std::remove(v.begin(), v.end(), state), v.end());
  modes.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace

void add_comm(const ScopeCounts& counts) {
  Alive& a = alive();
  std::lock_guard<std::mutex> lock(a.mu);
  for (CommDebugMode::State* s : a.comm) {
    std::lock_guard<std::mutex> slock(s->mu);
    for (const auto& [scope, by_kind] : counts) {
      for (const auto& [kind, c] : by_kind) {
        add_to(s->counts.by_kind[kind], c);
        add_to(s->counts.by_scope[scope][kind], c);
      }
    }
  }
}

void add_memory(const MemoryRun& run) {
  Alive& a = alive();
  std::lock_guard<std::mutex> lock(a.mu);
  for (MemoryDebugMode::State* s : a.memory) {
    std::lock_guard<std::mutex> slock(s->mu);
    s->runs.push_back(run);
  }
}

}  // namespace detail

std::int64_t CommCounts::total_count() const {
  std::int64_t n = 0;
  for (const auto& [kind, c] : by_kind) n += c.count;
  return n;
}

std::string CommCounts::to_string() const {
  std::string s = fmt::format("{:<24} {:<16} {:>8} {:>14} {:>14}\n", "scope", "kind", "count",
                              "bytes", "total bytes");
  const auto rows = [&s](const std::string& scope,
                         const std::map<CollectiveKind, CollectiveCount>& kinds) {
    for (const auto& [kind, c] : kinds) {
      s += fmt::format("{:<24} {:<16} {:>8} {:>14} {:>14}\n", scope, shardplan::to_string(kind),
                       c.count, c.bytes, c.total_bytes);
    }
  };
  rows("(all)", by_kind);
  for (const auto& [scope, kinds] : by_scope) rows(scope.empty() ? "(none)" : scope, kinds);
  return s;
}

CommDebugMode::CommDebugMode() : state_(std::make_shared<State>()) {
  detail::enlist(&detail::Alive::comm, detail::g_comm_modes, state_.get());
}

CommDebugMode::~CommDebugMode() {
  detail::delist(&detail::Alive::comm, detail::g_comm_modes, state_.get());
}

CommCounts CommDebugMode::counts() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->counts;
}

void CommDebugMode::reset() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->counts = CommCounts{};
}

MemoryDebugMode::MemoryDebugMode() : state_(std::make_shared<State>()) {
  detail::enlist(&detail::Alive::memory, detail::g_memory_modes, state_.get());
}

MemoryDebugMode::~MemoryDebugMode() {
  detail::delist(&detail::Alive::memory, detail::g_memory_modes, state_.get());
}

std::vector<MemoryRun> MemoryDebugMode::runs() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->runs;
}

}  // namespace shardplan::profiler
