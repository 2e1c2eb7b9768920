#pragma once
// Tracing: while a function runs under sjit, ops on its tracer arguments record nodes of a graph
// instead of computing. The context is per thread; arrays from outside the function that it
// uses (closure values) become extra inputs of the graph.

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "../ir/array_access.hpp"
#include "../ir/graph.hpp"
#include "../ir/primitive.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/remat.hpp"

namespace shardplan::detail {

struct TraceContext {
  TraceContext(std::optional<Executor> e, Mesh m) : executor(std::move(e)), mesh(std::move(m)) {}
  Graph graph;
  // The executor of the call's arrays; none for a call without arrays (lower() on TensorSpecs),
  // whose tracers then have none either.
  std::optional<Executor> executor;
  Mesh mesh;
  int num_args = 0;
  std::vector<Array> captured;  // concrete arrays used inside, inputs num_args + k
  std::map<const void*, ValueId> captured_node;
  const std::map<std::string, RuleTree>* annotation_rules = nullptr;
  bool allow_unknown_annotations = false;
  // What shardings resolved from rules while tracing do with a dimension that does not divide
  // (SjitOptions::uneven).
  Uneven uneven = Uneven::kRefuse;
  // Tracers of other traces (the enclosing one, for grad inside sjit) are captured as inputs,
  // like concrete arrays, instead of being an error.
  bool capture_foreign = false;

  // Checkpointed regions (remat.hpp): each with its policy and the region it is nested in (-1:
  // none); the innermost region open when each node was recorded (-1: none; nodes recorded by
  // node_of for captured arrays are inputs and read as outside any region); the names
  // checkpoint_name gave values. Read by value_and_grad to recompute.
  struct RematRegion {
    RematPolicy policy;
    int parent = -1;
    bool prevent_cse = true;  // the recomputation reads the region's inputs through a barrier
  };
  std::vector<RematRegion> remat_regions;
  std::vector<int> node_region;
  int open_region = -1;
  std::map<ValueId, std::vector<std::string>> value_names;
  /// The region `v` was recorded in, or -1.
  int region_of(ValueId v) const {
    return index(v) < node_region.size() ? node_region[index(v)] : -1;
  }

  // shard_map (shard_map.hpp): per node, the mesh axes its value varies over as a bitmask over
  // the mesh's axes, or kNotManual for a global value (missing entries: global); how many
  // shard_map bodies are being traced (lax::axis_index is only valid inside one).
  std::vector<std::int64_t> node_vary;
  int shard_map_depth = 0;
  /// The axes `v` varies over (kNotManual: a global value).
  std::int64_t vary_of(ValueId v) const {
    return index(v) < node_vary.size() ? node_vary[index(v)] : kNotManual;
  }
  /// The same for an array: a tracer of this trace or of another (the enclosing one, captured by
  /// a gradient's trace); a concrete array is global.
  std::int64_t vary_of(const Array& a) const;

  // custom_vjp regions (autodiff.hpp): the backward function, the region's input and residual
  // values and its outputs (optimization barriers recorded after the forward function); by
  // output value, its region.
  struct CustomRegion {
    std::shared_ptr<const CustomVjpBwd> bwd;
    std::vector<ValueId> inputs, residuals, outputs;
  };
  std::vector<CustomRegion> custom_regions;
  std::map<ValueId, int> custom_output;

  // By node of a primitive with Primitive::kept, the values keep_for_backward made of its result,
  // which its VJP reads (restored) instead of the result.
  std::map<ValueId, std::vector<ValueId>> kept;

  /// The rule given for annotation `name`, or nullptr when unknown names may pass. Throws
  /// SpecError listing the known names otherwise.
  const RuleTree* annotation_rule(const std::string& name) const;

  /// The nodes recorded from now on belong to `phase` (Graph::phase_marks; shardplan::begin_phase).
  void begin_phase(StepPhase phase);
  /// A tracer for a new argument input of `type`.
  Array add_argument(const TensorType& type);
  /// The node of `a` in this trace: its own node for a tracer of this trace; a new input for a
  /// concrete array (captured once). Throws ArrayError for a tracer of another trace.
  ValueId node_of(const Array& a);
  /// Adds `n` and returns a tracer for it; `vary`: the axes it varies over inside shard_map.
  Array record(Node n, std::int64_t vary = kNotManual);
  /// Ends the trace and returns its graph (moved out: call once). `outputs` become the graph's
  /// outputs, in order (an output may be an argument or an array captured from outside); the
  /// captured inputs are numbered after the arguments (input num_args + k is captured[k]).
  Graph finish(const std::vector<Array>& outputs);
};

/// Inside a trace: x constrained to the sharding `like` (a tracer of the same trace) gets when
/// compiled (a gradient sharded like its parameter).
Array with_sharding_like(const Array& x, const Array& like);

/// Inside a shard_map body (shard_map.cpp), for a node of `op` about to be recorded with these
/// operands: the axes its result varies over (kNotManual: a global value, outside any body). A
/// global operand of a per-device op is read whole (shard_map_in with P()), an operand varying
/// over fewer axes than the others is made to vary alike (pvary); `operands` holds what the node
/// reads then. `pass` is set for a sharding identity on a per-device value (a gradient's "like"
/// constraint, an annotation): nothing to record, the operand is the result. Throws SpecError for
/// a with_sharding_constraint on a per-device value and for a shard_map inside a body.
std::int64_t vary_operands(TraceContext& ctx, const Primitive& op, const Node& n,
                           std::vector<Array>& operands, bool& pass);

/// While alive, this thread's concrete arrays count as the per-device values of a shard_map
/// for shardplan::lax (a custom_vjp's backward function run eagerly, outside any trace, by
/// value_and_grad on values a shard_map made).
class EagerPerDeviceScope {
 public:
  EagerPerDeviceScope();
  ~EagerPerDeviceScope();
  EagerPerDeviceScope(const EagerPerDeviceScope&) = delete;
  EagerPerDeviceScope& operator=(const EagerPerDeviceScope&) = delete;
};
bool eager_per_device();

/// A global value of the current trace read whole as a per-device value of shard_map (what a
/// per-device op does implicitly with a global operand): a scalar made per-device before it is
/// broadcast stays a scalar instead of a whole block copied in.
Array per_device(const Array& global);

/// While alive, the nodes this thread records belong to the composite op `name` (a
/// `composite::` name, or null: none; nesting restores the outer one). Opened by a composite's
/// definition around what it traces, and by value_and_grad around each node's backward ops.
class CompositeScope {
 public:
  explicit CompositeScope(const char* name);
  ~CompositeScope();
  CompositeScope(const CompositeScope&) = delete;
  CompositeScope& operator=(const CompositeScope&) = delete;

 private:
  const char* previous_;
};
/// The composite op open on this thread, or null.
const char* current_composite();

/// The trace this thread is recording, or nullptr.
TraceContext* current_trace();

/// Makes `ctx` the current trace for its lifetime (nesting restores the previous one).
class TraceScope {
 public:
  explicit TraceScope(TraceContext* ctx);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  TraceContext* previous_;
};

}  // namespace shardplan::detail
