// shard_map's primitives (shard_map_ops.hpp): their types, fixed layouts, collective plans, the
// axes their results vary over, and JAX's transposes as their VJPs.
#include "shard_map_ops.hpp"

#include <fmt/format.h>

#include <cstring>

#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/shard_map.hpp"

namespace shardplan::detail {

std::string format_attrs(const BlockAttrs& a) { return " spec=" + a.spec.to_string(); }
std::string format_attrs(const ReduceAxesAttrs& a) {
  return fmt::format(" op={} axes=({})", to_string(a.op), fmt::join(a.axes, ","));
}
std::string format_attrs(const GatherAttrs& a) {
  return fmt::format(" axes=({}) dim={} tiled={}", fmt::join(a.axes, ","), a.dim, a.tiled);
}
std::string format_attrs(const PermuteAttrs& a) {
  std::vector<std::string> pairs;
  for (const PermutePair& p : a.pairs) pairs.push_back(fmt::format("({},{})", p.from, p.to));
  return fmt::format(" axis={} perm=[{}]", a.axis, fmt::join(pairs, ","));
}
std::string format_attrs(const AxesAttrs& a) {
  return fmt::format(" axes=({})", fmt::join(a.axes, ","));
}

std::int64_t axis_bits(const Mesh& mesh, const std::vector<std::string>& axes) {
  std::int64_t bits = 0;
  for (const std::string& a : axes) bits |= std::int64_t{1} << mesh.axis_index(a);
  return bits;
}

std::vector<std::string> spec_axes(const PartitionSpec& spec) {
  std::vector<std::string> axes;
  for (const auto& dim : spec.dims()) axes.insert(axes.end(), dim.begin(), dim.end());
  return axes;
}

namespace {

// ---- Types ------------------------------------------------------------------------------------

TensorType block_in_type(const Node& n, std::span<const TensorType> in) {
  const auto& a = n.attr<BlockAttrs>();
  std::vector<std::int64_t> dims = in[0].shape.dims();
  for (std::size_t d = 0; d < a.split.size() && d < dims.size(); ++d) {
    if (dims[d] % a.split[d] != 0) {
      reject("shard_map_in", in,
             fmt::format("dimension {} ({}) is not divisible by the {} devices of {}", d, dims[d],
                         a.split[d], a.spec.to_string()));
    }
    dims[d] /= a.split[d];
  }
  return {Shape(dims), in[0].dtype};
}

TensorType block_out_type(const Node& n, std::span<const TensorType> in) {
  const auto& a = n.attr<BlockAttrs>();
  std::vector<std::int64_t> dims = in[0].shape.dims();
  for (std::size_t d = 0; d < a.split.size() && d < dims.size(); ++d) dims[d] *= a.split[d];
  return {Shape(dims), in[0].dtype};
}

TensorType same_type(const Node&, std::span<const TensorType> in) { return in[0]; }

int checked_dim(std::string_view op, std::span<const TensorType> in, int dim, int rank) {
  if (dim < 0) dim += rank;
  if (dim < 0 || dim >= rank) {
    reject(op, in, fmt::format("dimension {} is out of range for rank {}", dim, rank));
  }
  return dim;
}

TensorType gather_type(const Node& n, std::span<const TensorType> in) {
  const auto& a = n.attr<GatherAttrs>();
  std::vector<std::int64_t> dims = in[0].shape.dims();
  const int rank = static_cast<int>(dims.size());
  if (a.tiled) {
    dims[static_cast<std::size_t>(checked_dim("all_gather", in, a.dim, rank))] *= a.size;
  } else {
    const int d = checked_dim("all_gather", in, a.dim, rank + 1);
    dims.insert(dims.begin() + d, a.size);
  }
  return {Shape(dims), in[0].dtype};
}

TensorType scatter_type(const Node& n, std::span<const TensorType> in) {
  const auto& a = n.attr<GatherAttrs>();
  std::vector<std::int64_t> dims = in[0].shape.dims();
  const auto d =
      static_cast<std::size_t>(checked_dim("psum_scatter", in, a.dim, static_cast<int>(dims.size())));
  if (a.tiled ? dims[d] % a.size != 0 : dims[d] != a.size) {
    reject("psum_scatter", in,
           fmt::format("dimension {} ({}) {} the {} devices along ({})", d, dims[d],
                       a.tiled ? "is not divisible by" : "(not tiled) must equal", a.size,
                       fmt::join(a.axes, ", ")));
  }
  if (a.tiled) {
    dims[d] /= a.size;
  } else {
    dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(d));
  }
  return {Shape(dims), in[0].dtype};
}

TensorType all_to_all_type(const Node& n, std::span<const TensorType> in) {
  const auto& a = n.attr<AxesAttrs>();
  if (in[0].shape.rank() < 1 || in[0].shape[0] != a.size) {
    reject("pall_to_all", in,
           fmt::format("dimension 0 must have one row per device along ({}): {}",
                       fmt::join(a.axes, ", "), a.size));
  }
  return in[0];
}

TensorType reduce_type(const Node& n, std::span<const TensorType> in) {
  if (in[0].dtype == DType::kBool) {
    reject(std::string(to_string(n.attr<ReduceAxesAttrs>().op)) == "sum" ? "psum" : "preduce", in,
           "cannot reduce bool values");
  }
  return in[0];
}

// ---- Layouts, plans, varying axes ---------------------------------------------------------------

OpFactors identity_factors(const Node& n, std::span<const Shape> in) {
  return same_dims(n.type.shape, in);
}

OpFactors unlinked(const Node& n, std::span<const Shape> in) {
  OpFactors f;
  for (const Shape& s : in) f.operands.emplace_back(static_cast<std::size_t>(s.rank()), -1);
  f.result.assign(static_cast<std::size_t>(n.type.shape.rank()), -1);
  return f;
}

constexpr const char* kPerDevice = "a per-device value of shard_map";
FixedLayout block_in_layout(const Node& n) {
  return {{n.attr<BlockAttrs>().spec}, PartitionSpec(), kPerDevice};
}
FixedLayout block_out_layout(const Node& n) {
  return {{PartitionSpec()}, n.attr<BlockAttrs>().spec, "shard_map's out_specs"};
}
FixedLayout per_device_layout(const Node&) { return {{PartitionSpec()}, PartitionSpec(), kPerDevice}; }

PartitionSpec spec_at(int dim, int rank, const std::vector<std::string>& axes) {
  std::vector<AxisNames> dims(static_cast<std::size_t>(rank));
  dims[static_cast<std::size_t>(dim)] = axes;
  while (!dims.empty() && dims.back().empty()) dims.pop_back();
  return PartitionSpec(std::move(dims));
}

CollectivePlan reduce_plan(const Node& n, const TensorType& x) {
  const auto& a = n.attr<ReduceAxesAttrs>();
  return {.view = x.shape, .pending = Pending{a.op, a.axes}};
}

CollectivePlan gather_plan(const Node& n, const TensorType&) {
  const auto& a = n.attr<GatherAttrs>();
  const int rank = n.type.shape.rank();
  const int d = a.dim < 0 ? a.dim + rank : a.dim;
  // Tiled: the blocks side by side along d; stacked: one row each of the new dimension d.
  return {.view = n.type.shape, .from = spec_at(d, rank, a.axes)};
}

CollectivePlan scatter_plan(const Node& n, const TensorType& x) {
  const auto& a = n.attr<GatherAttrs>();
  const int rank = x.shape.rank();
  const int d = a.dim < 0 ? a.dim + rank : a.dim;
  return {.view = x.shape, .pending = Pending{ReduceOp::kSum, a.axes}, .to = spec_at(d, rank, a.axes)};
}

CollectivePlan permute_plan(const Node& n, const TensorType& x) {
  const auto& a = n.attr<PermuteAttrs>();
  CollectivePlan p{.view = x.shape, .permute_axis = a.axis};
  for (const PermutePair& q : a.pairs) p.pairs.emplace_back(q.from, q.to);
  return p;
}

// [n, rest...] on every device: as one array [n (source), n (row), rest...] split over the source
// dimension, resharded to split over the row dimension: device j then holds row j of each source.
CollectivePlan all_to_all_plan(const Node& n, const TensorType& x) {
  const auto& a = n.attr<AxesAttrs>();
  std::vector<std::int64_t> dims = x.shape.dims();
  dims.insert(dims.begin(), a.size);
  const int rank = static_cast<int>(dims.size());
  return {.view = Shape(dims), .from = spec_at(0, rank, a.axes), .to = spec_at(1, rank, a.axes)};
}

std::int64_t block_in_vary(const Node& n, const Mesh& mesh, std::span<const std::int64_t>) {
  return axis_bits(mesh, spec_axes(n.attr<BlockAttrs>().spec));
}
std::int64_t block_out_vary(const Node&, const Mesh&, std::span<const std::int64_t>) {
  return kNotManual;
}
std::int64_t reduce_vary(const Node& n, const Mesh& mesh, std::span<const std::int64_t> in) {
  return in[0] & ~axis_bits(mesh, n.attr<ReduceAxesAttrs>().axes);
}
std::int64_t gather_vary(const Node& n, const Mesh& mesh, std::span<const std::int64_t> in) {
  return in[0] | axis_bits(mesh, n.attr<GatherAttrs>().axes);
}
std::int64_t permute_vary(const Node& n, const Mesh& mesh, std::span<const std::int64_t> in) {
  return in[0] | axis_bits(mesh, {n.attr<PermuteAttrs>().axis});
}
std::int64_t axes_vary(const Node& n, const Mesh& mesh, std::span<const std::int64_t> in) {
  return in[0] | axis_bits(mesh, n.attr<AxesAttrs>().axes);
}

void copy_kernel(const KernelArgs& k) {
  const auto bytes = static_cast<std::size_t>(k.out.shape.numel()) * size_of(k.out.dtype);
  if (bytes > 0) std::memcpy(k.out.data, k.in[0].data, bytes);
}

// ---- VJPs: JAX's transposes --------------------------------------------------------------------

std::vector<Array> block_in_vjp(const Node& n, const std::vector<Array>&, const Array&,
                                const Array& g) {
  return {apply(prim::shard_map_out, n.attrs, {g})};
}
// Each device's block of the cotangent; summed over the axes the value was tiled over (the
// same value sits in every device's block there).
std::vector<Array> block_out_vjp(const Node& n, const std::vector<Array>&, const Array&,
                                 const Array& g) {
  const auto& a = n.attr<BlockAttrs>();
  const Array blocks = apply(prim::shard_map_in, n.attrs, {g});
  if (a.summed.empty()) return {blocks};
  return {apply(prim::preduce, ReduceAxesAttrs{a.summed, a.summed_size, ReduceOp::kSum}, {blocks})};
}
std::vector<Array> pvary_vjp(const Node& n, const std::vector<Array>&, const Array&,
                             const Array& g) {
  const auto& a = n.attr<AxesAttrs>();
  return {apply(prim::preduce, ReduceAxesAttrs{a.axes, a.size, ReduceOp::kSum}, {g})};
}
std::vector<Array> reduce_vjp(const Node& n, const std::vector<Array>& x, const Array& result,
                              const Array& g) {
  const auto& a = n.attr<ReduceAxesAttrs>();
  const Array spread = apply(prim::pvary, AxesAttrs{a.axes, a.size}, {g});
  if (a.op == ReduceOp::kSum) return {spread};
  // max / min: to the devices holding the extreme value, shared equally on a tie (the
  // derivative of the extreme along the tied direction; a value the same on every device, read
  // whole and made to vary, so gets all of it back from pvary's transpose).
  const Array holds = astype(equal(x[0], result), g.dtype());
  const Array holders = apply(prim::preduce, ReduceAxesAttrs{a.axes, a.size, ReduceOp::kSum}, {holds});
  return {spread * holds / holders};
}
std::vector<Array> gather_vjp(const Node& n, const std::vector<Array>&, const Array&,
                              const Array& g) {
  return {apply(prim::psum_scatter, n.attrs, {g})};
}
std::vector<Array> scatter_vjp(const Node& n, const std::vector<Array>&, const Array&,
                               const Array& g) {
  return {apply(prim::pall_gather, n.attrs, {g})};
}
std::vector<Array> permute_vjp(const Node& n, const std::vector<Array>&, const Array&,
                               const Array& g) {
  PermuteAttrs inv = n.attr<PermuteAttrs>();
  for (PermutePair& p : inv.pairs) std::swap(p.from, p.to);
  return {apply(prim::ppermute, std::move(inv), {g})};
}
std::vector<Array> all_to_all_vjp(const Node& n, const std::vector<Array>&, const Array&,
                                  const Array& g) {
  return {apply(prim::pall_to_all, n.attrs, {g})};  // its own inverse
}

std::vector<TestCase> no_cases(const Primitive&, DType) { return {}; }
constexpr PrimitiveTests shard_map_tests(std::string_view ops) {
  return {.public_ops = ops, .dtypes = kNumericTypes, .cases = no_cases, .gradient = true,
          .kind = TestKind::kShardMap};
}
constexpr PrimitiveTests kBlockTests = shard_map_tests("shard_map");
constexpr PrimitiveTests kPvaryTests = shard_map_tests("pvary");
constexpr PrimitiveTests kReduceTests = shard_map_tests("psum pmean pmax pmin");
constexpr PrimitiveTests kGatherTests = shard_map_tests("all_gather");
constexpr PrimitiveTests kScatterTests = shard_map_tests("psum_scatter");
constexpr PrimitiveTests kPermuteTests = shard_map_tests("ppermute");
constexpr PrimitiveTests kAllToAllTests = shard_map_tests("all_to_all");

constexpr Primitive collective(std::string_view name, InferFn* infer, VjpFn* vjp,
                               CollectiveFn* plan, VaryFn* vary, const PrimitiveTests* tests) {
  return Primitive{.name = name,
                   .arity = 1,
                   .infer = infer,
                   .factors = unlinked,
                   .kernel = no_kernel,
                   .flops = no_flops,
                   .vjp = vjp,
                   .fixed_layout = per_device_layout,
                   .collective = plan,
                   .vary = vary,
                   .tests = tests};
}

}  // namespace

namespace prim {
constinit const Primitive shard_map_in{.name = "shard_map_in",
                                       .arity = 1,
                                       .infer = block_in_type,
                                       .factors = unlinked,
                                       .kernel = copy_kernel,
                                       .flops = no_flops,
                                       .vjp = block_in_vjp,
                                       .view = true,
                                       .fixed_layout = block_in_layout,
                                       .vary = block_in_vary,
                                       .tests = &kBlockTests};
constinit const Primitive shard_map_out{.name = "shard_map_out",
                                        .arity = 1,
                                        .infer = block_out_type,
                                        .factors = unlinked,
                                        .kernel = copy_kernel,
                                        .flops = no_flops,
                                        .vjp = block_out_vjp,
                                        .view = true,
                                        .fixed_layout = block_out_layout,
                                        .vary = block_out_vary,
                                        .tests = &kBlockTests};
// The values are the operand's: an alias (no step), as an optimization barrier is.
constinit const Primitive pvary{.name = "pvary",
                                .arity = 1,
                                .infer = same_type,
                                .factors = identity_factors,
                                .kernel = copy_kernel,
                                .flops = no_flops,
                                .vjp = pvary_vjp,
                                .barrier = true,
                                .vary = axes_vary,
                                .tests = &kPvaryTests};
constinit const Primitive preduce =
    collective("preduce", reduce_type, reduce_vjp, reduce_plan, reduce_vary, &kReduceTests);
constinit const Primitive pall_gather =
    collective("pall_gather", gather_type, gather_vjp, gather_plan, gather_vary, &kGatherTests);
constinit const Primitive psum_scatter = collective("psum_scatter", scatter_type, scatter_vjp,
                                                    scatter_plan, gather_vary, &kScatterTests);
constinit const Primitive ppermute = collective("ppermute", same_type, permute_vjp, permute_plan,
                                                permute_vary, &kPermuteTests);
constinit const Primitive pall_to_all = collective("pall_to_all", all_to_all_type, all_to_all_vjp,
                                                   all_to_all_plan, axes_vary, &kAllToAllTests);
}  // namespace prim

}  // namespace shardplan::detail
