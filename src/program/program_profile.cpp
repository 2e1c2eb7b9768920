#include "program_profile.hpp"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>

#include "../profiler/recorder.hpp"
#include "primitive.hpp"

namespace shardplan::detail {
namespace {

using profiler::detail::Category;
using profiler::detail::Event;

// Waits shorter than this are not written (a step's devices rarely end within a microsecond of
// each other; a trace of every few-nanosecond gap would only be bigger).
constexpr std::int64_t kMinWaitNs = 1000;

// The step's op: a primitive's name (static text), or for a fused step its ops' names (made per
// run of the step, held by its events).
void name_step(const Step& st, Event& e) {
  if (!st.fused) {
    e.name = st.local.op->name;
    return;
  }
  std::string s = "fused(";
  for (std::size_t i = 0; i < st.fused->size(); ++i) {
    if (i > 0) s += ", ";
    s += (*st.fused)[i].local.op->name;
  }
  s += ")";
  e.owned = std::make_shared<const std::string>(std::move(s));
}

// Per device of the mesh (by position), its group of a collective over `axes`: the devices that
// differ from it only along them (all devices when none is named), one list per group.
std::vector<std::shared_ptr<const std::vector<int>>> groups_of(
    const Mesh& mesh, const std::vector<std::string>& axes) {
  std::vector<bool> along(mesh.axis_names().size(), axes.empty());
  for (const std::string& a : axes) along[static_cast<std::size_t>(mesh.axis_index(a))] = true;
  const std::vector<int>& devices = mesh.devices();
  // A group's key: the device's coordinates with those along `axes` zeroed.
  std::map<std::vector<std::int64_t>, std::shared_ptr<std::vector<int>>> by_key;
  std::vector<std::shared_ptr<const std::vector<int>>> out(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    std::vector<std::int64_t> key = mesh.coords_of_position(mesh.position_of_device(devices[i]));
    for (std::size_t k = 0; k < along.size(); ++k) {
      if (along[k]) key[k] = 0;
    }
    std::shared_ptr<std::vector<int>>& group = by_key[key];
    if (!group) group = std::make_shared<std::vector<int>>();
    group->push_back(devices[i]);
    out[i] = group;
  }
  return out;
}

// The events of one step, gathered before they go to the buffer under one lock.
std::vector<Event>& scratch() {
  thread_local std::vector<Event> events;
  return events;
}

}  // namespace

// The scope open while the program runs (the caller's), then the node's (relative to the traced
// function; none for an eager op's program). Joined strings are kept per thread for the pair of
// scopes they join; the memo holds both, so neither address can become another scope's.
std::shared_ptr<const std::string> scope_of(const Graph& graph, const Step& st) {
  const std::shared_ptr<const std::string>& caller = profiler::detail::current_scope();
  const std::shared_ptr<const std::string> node =
      index(st.node) < graph.size() ? graph[st.node].scope : nullptr;
  if (!node) return caller;
  if (!caller) return node;
  struct Joined {
    std::shared_ptr<const std::string> caller, node, joined;
  };
  using Key = std::pair<const std::string*, const std::string*>;
  thread_local std::map<Key, Joined> memo;
  const Key key{caller.get(), node.get()};
  if (const auto it = memo.find(key); it != memo.end()) return it->second.joined;
  if (memo.size() >= 4096) memo.clear();
  auto joined = std::make_shared<const std::string>(*caller + "/" + *node);
  memo.emplace(key, Joined{caller, node, joined});
  return joined;
}

void profile_kernel_step(const Executor& executor, const Mesh& mesh, const Graph& graph,
                         const Step& st, const std::vector<std::int64_t>& spans,
                         std::int64_t start_ns, std::int64_t end_ns, bool waits) {
  Event proto{.cat = Category::kKernel, .scope = scope_of(graph, st)};
  name_step(st, proto);
  std::vector<Event>& events = scratch();
  const auto add = [&](Category cat, int d, std::int64_t from, std::int64_t to) {
    if (cat == Category::kWait && to - from < kMinWaitNs) return;
    Event& e = events.emplace_back(proto);
    e.cat = cat;
    e.device = d;
    e.start_ns = from;
    e.end_ns = to;
  };
  for (const int d : mesh.devices()) {
    if (!executor.is_local(d)) continue;
    const std::int64_t s = spans[2 * static_cast<std::size_t>(d)];
    const std::int64_t e = spans[2 * static_cast<std::size_t>(d) + 1];
    if (s == 0 && e == 0) continue;
    if (waits) add(Category::kWait, d, start_ns, s);
    add(Category::kKernel, d, s, e);
    if (waits) add(Category::kWait, d, e, end_ns);
  }
  profiler::detail::record(events);
}

void profile_reshard_step(const Executor& executor, const Mesh& mesh, const Graph& graph,
                          const Step& st, const std::vector<CollectiveRecord>& records,
                          std::int64_t start_ns, std::int64_t end_ns) {
  std::vector<profiler::detail::Span> spans = std::move(profiler::detail::reshard_spans());
  profiler::detail::reshard_spans().clear();
  if (spans.size() != records.size()) {
    spans.assign(records.size(), profiler::detail::Span{start_ns, end_ns});
  }
  Event proto{.cat = Category::kReshard,
              .start_ns = start_ns,
              .end_ns = end_ns,
              .scope = scope_of(graph, st)};
  if (index(st.node) < graph.size()) proto.name = graph[st.node].op->name;
  std::vector<std::vector<std::shared_ptr<const std::vector<int>>>> groups;
  for (const CollectiveRecord& rec : records) groups.push_back(groups_of(mesh, rec.axes));
  std::vector<Event>& events = scratch();
  for (std::size_t i = 0; i < mesh.devices().size(); ++i) {
    const int d = mesh.devices()[i];
    if (!executor.is_local(d)) continue;
    events.emplace_back(proto).device = d;
    for (std::size_t k = 0; k < records.size(); ++k) {
      const CollectiveRecord& rec = records[k];
      const auto at = static_cast<std::size_t>(d);
      Event& e = events.emplace_back(proto);
      e.cat = Category::kCollective;
      e.device = d;
      e.start_ns = spans[k].start_ns;
      e.end_ns = spans[k].end_ns;
      e.bytes = at < rec.bytes_in.size() ? rec.bytes_in[at] : 0;
      e.kind = static_cast<int>(rec.kind);
      e.group = groups[k][i];
    }
  }
  profiler::detail::record(events);
}

}  // namespace shardplan::detail
