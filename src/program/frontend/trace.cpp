#include "trace.hpp"

#include <fmt/format.h>

#include "../ir/primitives.hpp"
#include "../../profiler/recorder.hpp"

#include <string>
#include <utility>
#include <vector>

#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {
thread_local TraceContext* g_current = nullptr;
}  // namespace

TraceContext* current_trace() { return g_current; }

namespace {
thread_local int g_eager_per_device = 0;
}  // namespace
EagerPerDeviceScope::EagerPerDeviceScope() { ++g_eager_per_device; }
EagerPerDeviceScope::~EagerPerDeviceScope() { --g_eager_per_device; }
bool eager_per_device() { return g_eager_per_device > 0; }

namespace {
thread_local const char* g_composite = nullptr;
}  // namespace
CompositeScope::CompositeScope(const char* name) : previous_(g_composite) { g_composite = name; }
CompositeScope::~CompositeScope() { g_composite = previous_; }
const char* current_composite() { return g_composite; }

TraceScope::TraceScope(TraceContext* ctx) : previous_(g_current) { g_current = ctx; }
TraceScope::~TraceScope() { g_current = previous_; }

Array TraceContext::add_argument(const TensorType& type) {
  const int index = num_args++;
  return record(Node{.op = &prim::input, .type = type, .attrs = InputAttrs{index, type}});
}

ValueId TraceContext::node_of(const Array& a) {
  if (a.is_tracer() && !(capture_foreign && ArrayAccess::trace(a) != this)) {
    if (ArrayAccess::trace(a) != this) {
      throw ArrayError(fmt::format(
          "[sjit] {} belongs to another trace (a tracer kept from an earlier call, or from another "
          "sjit); pass it as an argument instead",
          a.to_string()));
    }
    return value_id(static_cast<std::size_t>(ArrayAccess::node(a)));
  }
  const void* id = ArrayAccess::identity(a);
  if (auto it = captured_node.find(id); it != captured_node.end()) return it->second;
  if (!a.is_tracer() && !(a.mesh() == mesh)) {
    throw ArrayError(fmt::format(
        "[sjit] {} used inside the function is on {} with devices {}, but this sjit runs on {} "
        "with devices {}",
        a.to_string(), a.mesh().to_string(), fmt::join(a.mesh().devices(), ","), mesh.to_string(),
        fmt::join(mesh.devices(), ",")));
  }
  const TensorType type{a.shape(), a.dtype()};
  const std::int64_t vary = vary_of(a);  // a per-device value of the enclosing trace stays one
  captured.push_back(a);
  // Numbered when the trace ends (after the arguments).
  const ValueId node =
      graph.add(Node{.op = &prim::input, .type = type, .attrs = InputAttrs{-1, type}});
  if (vary != kNotManual) {
    node_vary.resize(graph.size(), kNotManual);
    node_vary[index(node)] = vary;
  }
  captured_node[id] = node;
  return node;
}

const RuleTree* TraceContext::annotation_rule(const std::string& name) const {
  if (annotation_rules != nullptr) {
    if (auto it = annotation_rules->find(name); it != annotation_rules->end()) return &it->second;
  }
  if (allow_unknown_annotations) return nullptr;
  std::vector<std::string> known;
  if (annotation_rules != nullptr) {
    for (const auto& [k, v] : *annotation_rules) known.push_back(fmt::format("'{}'", k));
  }
  throw SpecError(fmt::format(
      "[sjit] with_sharding_annotation('{}'): no sharding was given for that name (known: {}); "
      "add it to annotation_shardings, or set allow_unknown_annotations",
      name, known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", "))));
}

std::int64_t TraceContext::vary_of(const Array& a) const {
  if (!a.is_tracer()) return kNotManual;
  const auto* owner = static_cast<const TraceContext*>(ArrayAccess::trace(a));
  return owner->vary_of(value_id(static_cast<std::size_t>(ArrayAccess::node(a))));
}

Array TraceContext::record(Node n, std::int64_t vary) {
  const TensorType type = n.type;
  if (!n.scope) n.scope = profiler::detail::current_scope();
  if (n.composite == nullptr) n.composite = current_composite();
  const ValueId id = graph.add(std::move(n));
  if (vary != kNotManual) {
    node_vary.resize(graph.size(), kNotManual);
    node_vary[index(id)] = vary;
  }
  if (open_region >= 0) {
    node_region.resize(graph.size(), -1);
    node_region[index(id)] = open_region;
  }
  return ArrayAccess::tracer(executor, mesh, type, this, static_cast<int>(index(id)));
}

Graph TraceContext::finish(const std::vector<Array>& outputs) {
  std::vector<ValueId> out_nodes;
  out_nodes.reserve(outputs.size());
  for (const Array& a : outputs) out_nodes.push_back(node_of(a));  // may capture an input
  for (std::size_t k = 0; k < captured.size(); ++k) {
    Node& n = graph[captured_node.at(ArrayAccess::identity(captured[k]))];
    n.attrs = InputAttrs{num_args + static_cast<int>(k), n.type};
  }
  graph.outputs = std::move(out_nodes);
  graph.num_inputs = num_args + static_cast<int>(captured.size());
  return std::move(graph);
}

void TraceContext::begin_phase(StepPhase phase) {
  std::vector<std::pair<std::size_t, StepPhase>>& marks = graph.phase_marks;
  if (!marks.empty() && marks.back().second == phase) return;
  if (!marks.empty() && marks.back().first == graph.size()) {
    marks.back().second = phase;  // the phase before recorded nothing
  } else {
    marks.emplace_back(graph.size(), phase);
  }
}

}  // namespace shardplan::detail

namespace shardplan {

void begin_phase(StepPhase phase) {
  if (detail::TraceContext* ctx = detail::current_trace()) ctx->begin_phase(phase);
}

}  // namespace shardplan
