// shard_map (include/shardplan/shard_map.hpp): the body traced on per-device tracers between
// shard_map_in and shard_map_out nodes, the axes each value varies over tracked as it is recorded
// (vary_operands, called by apply for every node), the out_specs checked against them, and the
// collectives of shardplan::lax. Outside any trace the call is traced and run as a program.
#include "shardplan/shard_map.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

#include "../compiler/compile.hpp"
#include "../ir/array_access.hpp"
#include "../ir/primitives.hpp"
#include "primitives/shard_map_ops.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "../compiler/spmd_check.hpp"
#include "../frontend/trace.hpp"

namespace shardplan::detail {
namespace {

std::vector<std::string> axes_of_bits(const Mesh& mesh, std::int64_t bits) {
  std::vector<std::string> axes;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if ((bits >> i) & 1) axes.push_back(mesh.axis_names()[static_cast<std::size_t>(i)]);
  }
  return axes;
}

std::int64_t devices_along(const Mesh& mesh, const std::vector<std::string>& axes) {
  std::int64_t n = 1;
  for (const std::string& a : axes) n *= mesh.axis_size(a);
  return n;
}

BlockAttrs block_attrs(const Mesh& mesh, const PartitionSpec& spec, int rank) {
  BlockAttrs a{spec, std::vector<std::int64_t>(static_cast<std::size_t>(rank), 1)};
  for (std::size_t d = 0; d < spec.dims().size() && d < a.split.size(); ++d) {
    a.split[d] = devices_along(mesh, spec.dims()[d]);
  }
  return a;
}

// A global value's blocks as per-device values.
Array to_blocks(const Mesh& mesh, const Array& x, const PartitionSpec& spec) {
  return apply(prim::shard_map_in, block_attrs(mesh, spec, x.shape().rank()), {x});
}

std::string quoted(const std::vector<std::string>& axes) {
  std::vector<std::string> q;
  for (const std::string& a : axes) q.push_back(fmt::format("'{}'", a));
  return fmt::format("{}", fmt::join(q, ", "));
}

// Shapes and specs of the call, checked before anything is traced.
void check_call(const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                const std::vector<Array>& args) {
  if (in_specs.size() != args.size()) {
    throw SpecError(fmt::format("[shard_map] {} in_specs for {} arguments: give one per argument",
                                in_specs.size(), args.size()));
  }
  for (std::size_t k = 0; k < args.size(); ++k) {
    const std::string what = fmt::format("shard_map argument {} ({}{})", k, name(args[k].dtype()),
                                         args[k].shape().to_string());
    in_specs[k].validate(mesh, args[k].shape().rank(), what);
    NamedSharding(mesh, in_specs[k]).shard_shape(args[k].shape(), what);
  }
}

// Inside a trace (sjit, a gradient's, or the eager call's own).
std::vector<Array> traced_call(TraceContext& ctx, const ShardMapBody& body, const Mesh& mesh,
                               const std::vector<PartitionSpec>& in_specs,
                               const std::vector<PartitionSpec>& out_specs, bool check,
                               const std::vector<Array>& args) {
  if (!(ctx.mesh == mesh)) {
    throw SpecError(fmt::format("[shard_map] its mesh {} is not the mesh {} of the sjit it is called in",
                                mesh.to_string(), ctx.mesh.to_string()));
  }
  if (mesh.ndim() > 62) {  // the axes a value varies over are a bitmask
    throw SpecError(fmt::format("[shard_map] a mesh of {} axes: at most 62", mesh.ndim()));
  }
  std::vector<Array> blocks;
  for (std::size_t k = 0; k < args.size(); ++k) {
    blocks.push_back(to_blocks(mesh, args[k], in_specs[k]));
  }
  std::vector<Array> outs;
  {
    ++ctx.shard_map_depth;
    struct Leave {
      TraceContext& c;
      ~Leave() { --c.shard_map_depth; }
    } leave{ctx};
    outs = body(blocks);
  }
  if (outs.size() != out_specs.size()) {
    throw SpecError(fmt::format(
        "[shard_map] the function returned {} results for {} out_specs: give one per result",
        outs.size(), out_specs.size()));
  }
  std::vector<Array> results;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    Array out = outs[k];
    const std::string what = fmt::format("shard_map output {} ({}{} per device)", k,
                                         name(out.dtype()), out.shape().to_string());
    out_specs[k].validate(mesh, out.shape().rank(), what);
    // A global value returned as it is (an array the function closed over, a constant): the
    // same on every device.
    if (ctx.vary_of(out) == kNotManual) out = to_blocks(mesh, out, PartitionSpec());
    const std::int64_t differs =
        ctx.vary_of(out) & ~axis_bits(mesh, spec_axes(out_specs[k]));
    if (check && differs != 0) {
      const std::vector<std::string> axes = axes_of_bits(mesh, differs);
      throw SpecError(fmt::format(
          "[shard_map] {} may differ over mesh axis {} (it is computed from values that vary "
          "over {}), but out_specs[{}] = {} says it is the same there: reduce it over {} (psum, "
          "pmax, ...) or name {} in its out_spec (or pass check = false)",
          what, quoted({axes[0]}), quoted(axes), k, out_specs[k].to_string(), quoted({axes[0]}),
          quoted({axes[0]})));
    }
    BlockAttrs attrs = block_attrs(mesh, out_specs[k], out.shape().rank());
    attrs.summed = axes_of_bits(mesh, axis_bits(mesh, spec_axes(out_specs[k])) & ~ctx.vary_of(out));
    attrs.summed_size = devices_along(mesh, attrs.summed);
    results.push_back(apply(prim::shard_map_out, std::move(attrs), {out}));
  }
  return results;
}

// Outside any trace: traced into a program of its own and run (as jax.shard_map eagerly). Over
// processes, as an sjit call: every process checks that all traced the same program, and a
// failure to trace or compile it on some processes (the body throwing on one) is named on every
// process before any collective (check_same_program), instead of the others waiting in the
// program's first collective for a process that never comes.
std::vector<Array> eager_call(const ShardMapBody& body, const Mesh& mesh,
                              const std::vector<PartitionSpec>& in_specs,
                              const std::vector<PartitionSpec>& out_specs, bool check,
                              const std::vector<Array>& args) {
  if (args.empty()) {
    check_call(mesh, in_specs, args);
    throw SpecError("[shard_map] called outside sjit with no arguments: nothing says which "
                    "devices run it (pass an array, or call it inside sjit)");
  }
  const Executor& executor = args[0].executor();
  const bool spans = !executor.holds_all(mesh.devices());
  std::optional<Program> program;
  std::vector<Array> inputs = args;
  std::string text;  // the call as every process must make it: its inputs and traced program
  std::exception_ptr failed;
  try {
    check_call(mesh, in_specs, args);
    for (std::size_t k = 0; k < args.size(); ++k) {
      if (!(args[k].mesh() == mesh)) {
        throw ArrayError(fmt::format("[shard_map] argument {} is on {}, not on the shard_map's mesh {}",
                                     k, args[k].mesh().to_string(), mesh.to_string()));
      }
    }
    TraceContext tc(executor, mesh);
    tc.allow_unknown_annotations = true;  // as outside sjit: an annotation there changes nothing
    Graph g;
    {
      TraceScope scope(&tc);
      std::vector<Array> tracers;
      for (const Array& a : args) tracers.push_back(tc.add_argument(TensorType{a.shape(), a.dtype()}));
      g = tc.finish(traced_call(tc, body, mesh, in_specs, out_specs, check, tracers));
    }
    CompileSpec spec{.mesh = mesh,
                     .outputs = std::vector<std::optional<PartitionSpec>>(g.outputs.size()),
                     .devices_per_process = devices_per_process(&executor, mesh)};
    inputs.insert(inputs.end(), tc.captured.begin(), tc.captured.end());
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      detail::refuse_padded(inputs[k], "shard_map", fmt::format("input {}", k));
      spec.inputs.push_back(InputSpec{.spec = inputs[k].sharding().spec(),
                                      .pending = inputs[k].pending(),
                                      .origin = fmt::format("shard_map input {}", k)});
      text += fmt::format("{} pending over [{}]\n", inputs[k].sharding().spec().to_string(),
                          fmt::join(inputs[k].pending().axes, ","));
    }
    text += g.to_string();
    program.emplace(compile(g, spec));
  } catch (...) {
    if (!spans) throw;
    failed = std::current_exception();
  }
  if (spans) check_same_program("shard_map", failed ? nullptr : &text, 0, "", failed);
  return program->run(executor, inputs);
}

}  // namespace

std::int64_t vary_operands(TraceContext& ctx, const Primitive& op, const Node& n,
                           std::vector<Array>& operands, bool& pass) {
  std::vector<std::int64_t> vary;
  bool any = false;
  for (const Array& a : operands) {
    vary.push_back(ctx.vary_of(a));
    any = any || vary.back() != kNotManual;
  }
  if (&op == &prim::shard_map_in) {
    if (any) {
      throw SpecError("[shard_map] a shard_map inside another shard_map's function is not "
                      "supported (every mesh axis is already manual there)");
    }
    return op.vary(n, ctx.mesh, vary);
  }
  if (!any) return kNotManual;
  if (op.sharding_identity) {
    if (n.is(prim::sharding_constraint) && n.attrs.get<ConstraintAttrs>().spec) {
      throw SpecError(fmt::format(
          "[with_sharding_constraint] {} is a per-device value inside shard_map's function: "
          "it has no global sharding to constrain (constrain it outside the shard_map)",
          to_string(TensorType{operands[0].shape(), operands[0].dtype()})));
    }
    pass = true;  // a gradient sharded like its (per-device) parameter, an annotation
    return vary[0];
  }
  if (op.vary != nullptr) return op.vary(n, ctx.mesh, vary);
  std::int64_t all = 0;
  for (const std::int64_t v : vary) {
    if (v != kNotManual) all |= v;
  }
  for (std::size_t k = 0; k < operands.size(); ++k) {
    if (vary[k] == kNotManual) {
      operands[k] = to_blocks(ctx.mesh, operands[k], PartitionSpec());
      vary[k] = 0;
    }
    if (vary[k] != all) {
      const std::vector<std::string> more = axes_of_bits(ctx.mesh, all & ~vary[k]);
      operands[k] = apply(prim::pvary, AxesAttrs{more, devices_along(ctx.mesh, more)}, {operands[k]});
    }
  }
  return all;
}

Array per_device(const Array& global) {
  TraceContext* ctx = current_trace();
  if (ctx == nullptr) return global;
  return to_blocks(ctx->mesh, global, PartitionSpec());
}

std::vector<Array> shard_map_call(const ShardMapBody& body, const Mesh& mesh,
                                  const std::vector<PartitionSpec>& in_specs,
                                  const std::vector<PartitionSpec>& out_specs, bool check,
                                  const std::vector<Array>& args) {
  TraceContext* ctx = current_trace();
  const bool traced =
      ctx != nullptr || std::any_of(args.begin(), args.end(), [](const Array& a) { return a.is_tracer(); });
  if (!traced) return eager_call(body, mesh, in_specs, out_specs, check, args);
  if (ctx == nullptr) throw ArrayError("[shard_map] a tracer used outside the sjit that made it");
  check_call(mesh, in_specs, args);
  return traced_call(*ctx, body, mesh, in_specs, out_specs, check, args);
}

}  // namespace shardplan::detail

namespace shardplan::lax {
namespace {

using detail::TraceContext;

bool per_device(const Array& x) {
  const TraceContext* ctx = detail::current_trace();
  return ctx != nullptr && ctx->vary_of(x) != detail::kNotManual;
}

[[noreturn]] void outside(std::string_view op) {
  throw SpecError(fmt::format("[lax.{}] called outside a shard_map's function: it names mesh "
                              "axes that only a shard_map makes manual",
                              op));
}

// The trace of the shard_map body `op` is called in, or SpecError. A collective is also valid
// on the per-device values of a body whose call has returned (a custom_vjp's backward function,
// run where the backward pass reaches it): `per_device` says the operand is one.
TraceContext& body_trace(std::string_view op, bool per_device = false) {
  TraceContext* ctx = detail::current_trace();
  if (ctx == nullptr || (ctx->shard_map_depth == 0 && !per_device)) outside(op);
  return *ctx;
}

// The mesh a collective on x runs over: the trace's, or, run eagerly on per-device values (a
// custom_vjp's backward function outside any trace), x's own.
const Mesh& mesh_of(std::string_view op, const Array& x) {
  if (detail::current_trace() == nullptr && detail::eager_per_device() && !x.is_tracer()) {
    return x.mesh();
  }
  return body_trace(op, per_device(x)).mesh;
}

// The axes, checked against the mesh (known, not repeated, at least one).
std::vector<std::string> checked_axes(std::string_view op, const Mesh& mesh, const AxisSet& axes) {
  const std::vector<std::string>& names = axes.names();
  if (names.empty()) throw SpecError(fmt::format("[lax.{}] names no mesh axis", op));
  std::set<std::string> seen;
  for (const std::string& a : names) {
    const auto& all = mesh.axis_names();
    if (std::find(all.begin(), all.end(), a) == all.end()) {
      throw SpecError(fmt::format("[lax.{}] axis '{}' is not an axis of the mesh {} (axes: {})", op,
                                  a, mesh.to_string(), detail::quoted(all)));
    }
    if (!seen.insert(a).second) {
      throw SpecError(fmt::format("[lax.{}] axis '{}' is named twice", op, a));
    }
  }
  return names;
}

// x as a collective over `axes` reads it: a per-device value, made to vary over them first (a
// value the same over an axis enters its psum once per device, as JAX's does).
Array collective_operand(std::string_view op, const Array& x, const std::vector<std::string>& axes) {
  if (detail::current_trace() == nullptr && detail::eager_per_device()) return x;  // no types
  TraceContext& ctx = body_trace(op, per_device(x));
  // An array the function closed over, or a constant it made: read whole on every device.
  const Array in = ctx.vary_of(x) == detail::kNotManual
                       ? detail::to_blocks(ctx.mesh, x, PartitionSpec())
                       : x;
  const std::int64_t missing = detail::axis_bits(ctx.mesh, axes) & ~ctx.vary_of(in);
  if (missing == 0) return in;
  const std::vector<std::string> more = detail::axes_of_bits(ctx.mesh, missing);
  return detail::apply(detail::prim::pvary,
                       detail::AxesAttrs{more, detail::devices_along(ctx.mesh, more)}, {in});
}

Array reduce(std::string_view op, ReduceOp how, const Array& x, const AxisSet& axes) {
  const Mesh& mesh = mesh_of(op, x);
  const std::vector<std::string> names = checked_axes(op, mesh, axes);
  // psum counts booleans as JAX does: as i32 0 / 1.
  const bool count = how == ReduceOp::kSum && x.dtype() == DType::kBool;
  const Array in = collective_operand(op, count ? astype(x, DType::kI32) : x, names);
  return detail::apply(detail::prim::preduce,
                       detail::ReduceAxesAttrs{names, detail::devices_along(mesh, names), how}, {in});
}

int normalized(std::string_view op, int dim, int rank, const Array& x) {
  const int d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank) {
    throw SpecError(fmt::format("[lax.{}] dimension {} is out of range for {}", op, dim,
                                detail::to_string(detail::TensorType{x.shape(), x.dtype()})));
  }
  return d;
}

}  // namespace

Array psum(const Array& x, const AxisSet& axes) { return reduce("psum", ReduceOp::kSum, x, axes); }
Array pmax(const Array& x, const AxisSet& axes) { return reduce("pmax", ReduceOp::kMax, x, axes); }
Array pmin(const Array& x, const AxisSet& axes) { return reduce("pmin", ReduceOp::kMin, x, axes); }
Array pmean(const Array& x, const AxisSet& axes) {
  const Array s = reduce("pmean", ReduceOp::kSum, x, axes);
  return s / static_cast<double>(axis_size(axes));
}

Array all_gather(const Array& x, const AxisSet& axes, int axis, bool tiled) {
  const Mesh& mesh = mesh_of("all_gather", x);
  const std::vector<std::string> names = checked_axes("all_gather", mesh, axes);
  const int rank = x.shape().rank();
  const int d = normalized("all_gather", axis, tiled ? rank : rank + 1, x);
  const Array in = collective_operand("all_gather", x, names);
  return detail::apply(detail::prim::pall_gather,
                       detail::GatherAttrs{names, detail::devices_along(mesh, names), d, tiled}, {in});
}

Array psum_scatter(const Array& x, const AxisSet& axes, int scatter_dimension, bool tiled) {
  const Mesh& mesh = mesh_of("psum_scatter", x);
  const std::vector<std::string> names = checked_axes("psum_scatter", mesh, axes);
  const int d = normalized("psum_scatter", scatter_dimension, x.shape().rank(), x);
  const Array in = collective_operand("psum_scatter", x, names);
  return detail::apply(detail::prim::psum_scatter,
                       detail::GatherAttrs{names, detail::devices_along(mesh, names), d, tiled}, {in});
}

Array ppermute(const Array& x, const std::string& axis,
               const std::vector<std::pair<int, int>>& perm) {
  const Mesh& mesh = mesh_of("ppermute", x);
  const std::vector<std::string> names = checked_axes("ppermute", mesh, AxisSet(axis));
  const std::int64_t n = mesh.axis_size(axis);
  std::set<int> sources, destinations;
  detail::PermuteAttrs attrs{axis, n, {}};
  for (const auto& [from, to] : perm) {
    if (from < 0 || from >= n || to < 0 || to >= n) {
      throw SpecError(fmt::format("[lax.ppermute] pair ({}, {}) is outside axis '{}' of {} devices",
                                  from, to, axis, n));
    }
    if (!sources.insert(from).second || !destinations.insert(to).second) {
      throw SpecError(fmt::format("[lax.ppermute] pair ({}, {}): a device may send once and "
                                  "receive once (perm is not a permutation)",
                                  from, to));
    }
    attrs.pairs.push_back({from, to});
  }
  const Array in = collective_operand("ppermute", x, names);
  return detail::apply(detail::prim::ppermute, std::move(attrs), {in});
}

Array all_to_all(const Array& x, const AxisSet& axes, int split_axis, int concat_axis, bool tiled) {
  const Mesh& mesh = mesh_of("all_to_all", x);
  const std::vector<std::string> names = checked_axes("all_to_all", mesh, axes);
  const std::int64_t n = detail::devices_along(mesh, names);
  const int rank = x.shape().rank();
  const int s = normalized("all_to_all", split_axis, rank, x);
  const int c = normalized("all_to_all", concat_axis, rank, x);
  const std::int64_t rows = x.shape()[s];
  if (tiled ? rows % n != 0 : rows != n) {
    throw SpecError(fmt::format(
        "[lax.all_to_all] split dimension {} of {} has {} rows, {} the {} devices along ({})", s,
        detail::to_string(detail::TensorType{x.shape(), x.dtype()}), rows,
        tiled ? "not divisible by" : "but (not tiled) must equal", n, fmt::join(names, ", ")));
  }
  Array in = collective_operand("all_to_all", x, names);
  // The chunks to send on a leading dimension: [n, ...] (tiled: dimension s cut in n).
  std::vector<std::int64_t> dims = x.shape().dims();
  if (tiled) {
    dims[static_cast<std::size_t>(s)] = rows / n;
    dims.insert(dims.begin() + s, n);
    in = reshape(in, Shape(dims));
  }
  std::vector<int> front{s};
  for (int d = 0; d < static_cast<int>(dims.size()); ++d) {
    if (d != s) front.push_back(d);
  }
  in = transpose(in, front);
  const Array got = detail::apply(detail::prim::pall_to_all, detail::AxesAttrs{names, n}, {in});
  // The sources' rows [n, rest...] moved to dimension c of the rest (merged with it when tiled).
  const int rest = got.shape().rank() - 1;
  std::vector<int> perm;
  for (int d = 1; d <= rest; ++d) {
    if (d - 1 == c) perm.push_back(0);
    perm.push_back(d);
  }
  if (c >= rest) perm.push_back(0);
  Array out = transpose(got, perm);
  if (!tiled) return out;
  std::vector<std::int64_t> merged = x.shape().dims();
  merged[static_cast<std::size_t>(s)] = rows / n;
  merged[static_cast<std::size_t>(c)] *= n;
  return reshape(out, Shape(merged));
}

Array axis_index(const AxisSet& axes) {
  TraceContext& ctx = body_trace("axis_index");
  const std::vector<std::string> names = checked_axes("axis_index", ctx.mesh, axes);
  const std::int64_t n = detail::devices_along(ctx.mesh, names);
  const Array ids = detail::traced_iota(Shape{n}, DType::kI32, 0);
  return reshape(detail::to_blocks(ctx.mesh, ids, PartitionSpec({names})), Shape{});
}

std::int64_t axis_size(const AxisSet& axes) {
  TraceContext& ctx = body_trace("axis_size", detail::current_trace() != nullptr);
  return detail::devices_along(ctx.mesh, checked_axes("axis_size", ctx.mesh, axes));
}

Array pvary(const Array& x, const AxisSet& axes) {
  const Mesh& mesh = mesh_of("pvary", x);
  return collective_operand("pvary", x, checked_axes("pvary", mesh, axes));
}

}  // namespace shardplan::lax
