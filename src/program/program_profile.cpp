#include "program_profile.hpp"

#include <fmt/format.h>

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

std::shared_ptr<const std::string> step_name(const Step& st) {
  if (!st.fused) return std::make_shared<const std::string>(st.local.op->name);
  std::string s = "fused(";
  for (std::size_t i = 0; i < st.fused->size(); ++i) {
    if (i > 0) s += ", ";
    s += (*st.fused)[i].local.op->name;
  }
  s += ")";
  return std::make_shared<const std::string>(std::move(s));
}

// The node's scope, or for a node traced outside any (an eager op's program), the scope open
// while it runs.
std::shared_ptr<const std::string> scope_of(const Graph& graph, const Step& st) {
  if (index(st.node) < graph.size() && graph[st.node].scope) return graph[st.node].scope;
  return profiler::detail::current_scope();
}

// The devices of `mesh` that differ from `d` only along `axes` (all others when none is named).
std::shared_ptr<const std::vector<int>> peers_of(const Mesh& mesh, int d,
                                                 const std::vector<std::string>& axes) {
  std::vector<bool> along(static_cast<std::size_t>(mesh.axis_names().size()), axes.empty());
  for (const std::string& a : axes) along[static_cast<std::size_t>(mesh.axis_index(a))] = true;
  const std::vector<std::int64_t> mine = mesh.coords_of_position(mesh.position_of_device(d));
  auto peers = std::make_shared<std::vector<int>>();
  for (const int e : mesh.devices()) {
    if (e == d) continue;
    const std::vector<std::int64_t> theirs = mesh.coords_of_position(mesh.position_of_device(e));
    bool same_group = true;
    for (std::size_t k = 0; k < along.size(); ++k) {
      same_group = same_group && (along[k] || mine[k] == theirs[k]);
    }
    if (same_group) peers->push_back(e);
  }
  return peers;
}

void add_wait(int d, std::int64_t from, std::int64_t to,
              const std::shared_ptr<const std::string>& name,
              const std::shared_ptr<const std::string>& scope) {
  if (to - from < kMinWaitNs) return;
  profiler::detail::record(Event{.cat = Category::kWait,
                                 .device = d,
                                 .start_ns = from,
                                 .end_ns = to,
                                 .name = name,
                                 .scope = scope});
}

}  // namespace

void profile_kernel_step(const Executor& executor, const Mesh& mesh, const Graph& graph,
                         const Step& st, const std::vector<std::int64_t>& spans,
                         std::int64_t start_ns, std::int64_t end_ns) {
  const std::shared_ptr<const std::string> name = step_name(st);
  const std::shared_ptr<const std::string> scope = scope_of(graph, st);
  for (const int d : mesh.devices()) {
    if (!executor.is_local(d)) continue;
    const std::int64_t s = spans[2 * static_cast<std::size_t>(d)];
    const std::int64_t e = spans[2 * static_cast<std::size_t>(d) + 1];
    if (s == 0 && e == 0) continue;
    add_wait(d, start_ns, s, name, scope);
    profiler::detail::record(Event{.cat = Category::kKernel,
                                   .device = d,
                                   .start_ns = s,
                                   .end_ns = e,
                                   .name = name,
                                   .scope = scope});
    add_wait(d, e, end_ns, name, scope);
  }
}

void profile_reshard_step(const Executor& executor, const Mesh& mesh, const Graph& graph,
                          const Step& st, const std::vector<CollectiveRecord>& records,
                          std::int64_t start_ns, std::int64_t end_ns) {
  std::vector<profiler::detail::Span> spans = std::move(profiler::detail::reshard_spans());
  profiler::detail::reshard_spans().clear();
  if (spans.size() != records.size()) {
    spans.assign(records.size(), profiler::detail::Span{start_ns, end_ns});
  }
  const std::shared_ptr<const std::string> name =
      index(st.node) < graph.size() ? std::make_shared<const std::string>(graph[st.node].op->name)
                                    : nullptr;
  const std::shared_ptr<const std::string> scope = scope_of(graph, st);
  for (const int d : mesh.devices()) {
    if (!executor.is_local(d)) continue;
    profiler::detail::record(Event{.cat = Category::kReshard,
                                   .device = d,
                                   .start_ns = start_ns,
                                   .end_ns = end_ns,
                                   .name = name,
                                   .scope = scope});
    for (std::size_t k = 0; k < records.size(); ++k) {
      const CollectiveRecord& rec = records[k];
      const auto at = static_cast<std::size_t>(d);
      profiler::detail::record(Event{.cat = Category::kCollective,
                                     .device = d,
                                     .start_ns = spans[k].start_ns,
                                     .end_ns = spans[k].end_ns,
                                     .name = name,
                                     .scope = scope,
                                     .bytes = at < rec.bytes_in.size() ? rec.bytes_in[at] : 0,
                                     .kind = static_cast<int>(rec.kind),
                                     .peers = peers_of(mesh, d, rec.axes)});
    }
  }
}

}  // namespace shardplan::detail
