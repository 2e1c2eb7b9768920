#include "program_profile.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "../../profiler/recorder.hpp"
#include "../ir/primitive.hpp"

namespace shardplan::detail {
namespace {

using profiler::detail::Category;
using profiler::detail::GroupTable;
using profiler::detail::Proto;
using profiler::detail::Slice;

// The step's op: a primitive's name (static text), or for a fused step its ops' names (made once,
// when the step was fused: Step::fused_name).
void name_step(const Step& st, Proto& p) {
  if (st.fused && st.fused_name) {
    p.owned = st.fused_name;
    return;
  }
  p.name = st.local.op->name;
}

// Per device of the mesh, its group of a collective over the axes `along` marks: the devices
// that differ from it only along them (all devices when none is marked).
std::shared_ptr<const GroupTable> make_groups(const Mesh& mesh, const std::vector<bool>& along) {
  const std::vector<int>& devices = mesh.devices();
  auto table = std::make_shared<GroupTable>();
  table->group_of_device.assign(
      static_cast<std::size_t>(*std::max_element(devices.begin(), devices.end())) + 1, -1);
  // A group's key: the device's coordinates with those along `axes` zeroed.
  std::map<std::vector<std::int64_t>, int> by_key;
  for (const int d : devices) {
    std::vector<std::int64_t> key = mesh.coords_of_position(mesh.position_of_device(d));
    for (std::size_t k = 0; k < along.size(); ++k) {
      if (along[k]) key[k] = 0;
    }
    const auto [it, added] = by_key.emplace(std::move(key), static_cast<int>(table->groups.size()));
    if (added) table->groups.emplace_back();
    table->groups[static_cast<std::size_t>(it->second)].push_back(d);
    table->group_of_device[static_cast<std::size_t>(d)] = it->second;
  }
  return table;
}

// make_groups, kept per thread for the meshes (devices and axis sizes) and axes it last served:
// a reshard's collectives name the same groups every time its step runs. The lookup allocates
// nothing (a few comparisons), the table is made once; what an event holds outlives the entry.
std::shared_ptr<const GroupTable> groups_of(const Mesh& mesh,
                                            const std::vector<std::string>& axes) {
  std::vector<bool> along(mesh.axis_names().size(), axes.empty());
  for (const std::string& a : axes) along[static_cast<std::size_t>(mesh.axis_index(a))] = true;
  struct Entry {
    std::vector<int> devices;
    std::vector<std::int64_t> sizes;
    std::vector<bool> along;
    std::shared_ptr<const GroupTable> groups;
  };
  thread_local std::vector<Entry> cache;
  thread_local std::size_t next = 0;  // the entry replaced next once the cache is full
  for (const Entry& e : cache) {
    if (e.along == along && e.sizes == mesh.axis_sizes() && e.devices == mesh.devices()) {
      return e.groups;
    }
  }
  Entry made{mesh.devices(), mesh.axis_sizes(), along, make_groups(mesh, along)};
  constexpr std::size_t kEntries = 32;
  if (cache.size() < kEntries) return cache.emplace_back(std::move(made)).groups;
  next = (next + 1) % kEntries;
  return (cache[next] = std::move(made)).groups;
}

// The events of one step, gathered before they go to the buffer under one lock.
struct Scratch {
  std::vector<Proto> protos;
  std::vector<Slice> slices;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
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
  Scratch& out = scratch();
  Proto& proto = out.protos.emplace_back();
  proto.scope = scope_of(graph, st);
  name_step(st, proto);
  proto.step_start = start_ns;
  proto.step_end = end_ns;
  proto.waits = waits;
  for (const int d : mesh.devices()) {
    if (!executor.is_local(d)) continue;
    const std::int64_t s = spans[2 * static_cast<std::size_t>(d)];
    const std::int64_t e = spans[2 * static_cast<std::size_t>(d) + 1];
    if (s == 0 && e == 0) continue;
    out.slices.push_back(Slice{.start_ns = s, .end_ns = e, .device = d});
  }
  profiler::detail::record(out.protos, out.slices);
}

void profile_reshard_step(const Executor& executor, const Mesh& mesh, const Graph& graph,
                          const Step& st, const std::vector<CollectiveRecord>& records,
                          const std::vector<StepSpan>& ran, std::int64_t start_ns,
                          std::int64_t end_ns) {
  const bool timed = ran.size() == records.size();
  Scratch& out = scratch();
  // One proto per collective (its kind, groups and bytes; the first brings the reshard's event:
  // Proto::with_reshard); a reshard that ran none has one of its own.
  Proto reshard{.cat = Category::kReshard, .scope = scope_of(graph, st)};
  if (index(st.node) < graph.size()) reshard.name = graph[st.node].op->name;
  reshard.step_start = start_ns;
  reshard.step_end = end_ns;
  for (std::size_t k = 0; k < records.size(); ++k) {
    Proto p = reshard;
    p.cat = Category::kCollective;
    p.kind = static_cast<int>(records[k].kind);
    p.groups = groups_of(mesh, records[k].axes);
    p.bytes_in = std::make_shared<const std::vector<std::int64_t>>(records[k].bytes_in);
    p.with_reshard = k == 0;
    out.protos.push_back(std::move(p));
  }
  if (records.empty()) out.protos.push_back(std::move(reshard));
  for (const int d : mesh.devices()) {
    if (!executor.is_local(d)) continue;
    if (records.empty()) {
      out.slices.push_back(Slice{.start_ns = start_ns, .end_ns = end_ns, .device = d});
    }
    for (std::size_t k = 0; k < records.size(); ++k) {
      out.slices.push_back(Slice{.start_ns = timed ? ran[k].first : start_ns,
                                 .end_ns = timed ? ran[k].second : end_ns,
                                 .proto = static_cast<std::uint32_t>(k),
                                 .device = d});
    }
  }
  profiler::detail::record(out.protos, out.slices);
}

}  // namespace shardplan::detail
