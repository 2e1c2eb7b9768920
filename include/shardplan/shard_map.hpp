#pragma once
// shard_map (jax.shard_map): a function run once per device on that device's blocks, with
// explicit collectives over named mesh axes (shardplan::lax), where automatic partitioning is not
// what is wanted: a hand-written collective, a ring algorithm, an expert dispatch.
//
//   auto f = shard_map([](const Array& a, const Array& b) {  // a: [2, 8], b: [8, 4] blocks
//                        return lax::psum(matmul(a, b), "y");
//                      },
//                      mesh, {P("x", "y"), P("y")}, {P("x")});
//   Array c = f(a, b);  // [8, 4], sharded P("x")
//
// Inside f every value is a per-device value and carries the mesh axes it may differ over (JAX's
// check_vma): an argument varies over the axes its in_spec names; an op's result over the union
// of its operands' (an operand varying over fewer is made to vary first, lax::pvary); psum and
// friends make it the same over theirs. An axis an out_spec does not name asserts the output is
// the same over it; with `check` a result that may differ there is a SpecError naming the output
// and the axis. Arrays f uses without taking them as arguments are read whole (replicated).
// Eagerly, inside sjit (with automatic partitioning around it), under value_and_grad (JAX's
// transposes: psum <-> pvary, all_gather <-> psum_scatter, ppermute <-> the inverse permutation,
// all_to_all <-> all_to_all back) and over processes (the collectives go over MPI there).
// docs/shard_map.md.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/partition_spec.hpp"

namespace shardplan {

/// One mesh axis name or several (in that order: the first is the major one), as JAX's
/// axis_name: lax::psum(x, "x"), lax::psum(x, {"x", "y"}).
class AxisSet {
 public:
  AxisSet(const char* axis) : names_{axis} {}                                  // NOLINT
  AxisSet(std::string axis) : names_{std::move(axis)} {}                       // NOLINT
  AxisSet(std::initializer_list<std::string> axes) : names_(axes) {}           // NOLINT
  AxisSet(std::vector<std::string> axes) : names_(std::move(axes)) {}          // NOLINT
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
};

namespace detail {
using ShardMapBody = std::function<std::vector<Array>(const std::vector<Array>&)>;
/// The call of a shard_map'd function: `args` as the body sees them, its outputs assembled.
std::vector<Array> shard_map_call(const ShardMapBody& body, const Mesh& mesh,
                                  const std::vector<PartitionSpec>& in_specs,
                                  const std::vector<PartitionSpec>& out_specs, bool check,
                                  const std::vector<Array>& args);

template <class R>
std::vector<Array> as_outputs(R&& r) {
  using T = std::remove_cvref_t<R>;
  if constexpr (std::is_same_v<T, Array>) {
    return {std::forward<R>(r)};
  } else if constexpr (std::is_same_v<T, std::vector<Array>>) {
    return std::forward<R>(r);
  } else {
    return std::apply([](auto&&... a) { return std::vector<Array>{a...}; }, std::forward<R>(r));
  }
}
template <class R>
R from_outputs(std::vector<Array> outs) {
  if constexpr (std::is_same_v<R, Array>) {
    return outs.at(0);
  } else if constexpr (std::is_same_v<R, std::vector<Array>>) {
    return outs;
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return R{outs.at(I)...};
    }(std::make_index_sequence<std::tuple_size_v<R>>());
  }
}
}  // namespace detail

/// jax.shard_map(f, mesh=, in_specs=, out_specs=, check_vma=): a callable taking f's arguments
/// (Arrays, or one std::vector<Array>) as global arrays, resharding each to its in_spec, calling
/// f once per device with that device's blocks, and returning f's results (an Array, a
/// std::vector<Array> or a std::tuple/std::pair of Arrays) as global arrays sharded by out_specs
/// (a block's dimension times the devices along the axes its out_spec names). One in_spec per
/// argument and one out_spec per result. Errors (SpecError) name the argument or output, the
/// spec, the shape and the axis: a count that differs, an axis not in the mesh, a dimension the
/// axes do not divide, an output that may differ over an axis its out_spec leaves out.
template <class F>
auto shard_map(F f, Mesh mesh, std::vector<PartitionSpec> in_specs,
               std::vector<PartitionSpec> out_specs, bool check = true) {
  return [f = std::move(f), mesh = std::move(mesh), in_specs = std::move(in_specs),
          out_specs = std::move(out_specs), check](const auto&... args) {
    constexpr bool vector_call =
        sizeof...(args) == 1 &&
        (std::is_same_v<std::remove_cvref_t<decltype(args)>, std::vector<Array>> && ...);
    if constexpr (vector_call) {
      using R = decltype(f(args...));
      auto outs = detail::shard_map_call(
          // `const auto&`: a dependent call, checked only where this branch is the one taken.
          [&](const auto& a) { return detail::as_outputs(f(a)); }, mesh, in_specs, out_specs,
          check, args...);
      return detail::from_outputs<R>(std::move(outs));
    } else {
      using R = decltype(f(args...));
      const std::vector<Array> flat{args...};
      auto outs = detail::shard_map_call(
          [&](const std::vector<Array>& a) {
            return [&]<std::size_t... I>(std::index_sequence<I...>) {
              return detail::as_outputs(f(a.at(I)...));
            }(std::make_index_sequence<sizeof...(args)>());
          },
          mesh, in_specs, out_specs, check, flat);
      return detail::from_outputs<R>(std::move(outs));
    }
  };
}

/// How ring attention's key/value blocks reach each device. kPermute: each step every device
/// passes the block it holds to the next (lax::ppermute; Megatron's cp_comm_type "p2p", PyTorch's
/// rotate method "alltoall"), so no device holds more than two blocks. kAllGather: every device
/// gathers all the blocks once (lax::all_gather) and reads each step's from them (PyTorch's
/// rotate method "allgather", torchtitan's default): one collective instead of n - 1, n blocks
/// held; the backward pass gathers again and sends the blocks' gradients round the ring as
/// kPermute does. The steps, and so the results, are the same bit for bit.
enum class RingRotate : std::uint8_t { kPermute, kAllGather };

/// Context parallelism. Inside shard_map's function, with the sequence split over mesh axis
/// `axis`: attention by ring, q [B, t, N, H] and k, v [B, t, K, H] this device's block of the
/// sequence (N a multiple of K). The key/value blocks travel round the devices of `axis`
/// (lax::ppermute), each meeting this device's queries in the fused attention kernel, the
/// partial results merged by their log-sum-exp; no device ever holds the whole sequence's keys,
/// forward or backward (custom_vjp: the blocks go round again with their gradients). Causal: the
/// sequence must be in the load-balanced order (load_balanced_positions: device d holds chunks d
/// and 2n-1-d of 2n, so every device does the same work at every step), and t is even. Equal to
/// dot_product_attention over the whole sequence to float rounding, non-finite values included
/// (docs/sjit.md "Non-finite values in attention"). `scale`: 1/sqrt(H) when not given; NaN,
/// infinite or not positive is a SpecError.
/// `rotate`: how the key/value blocks reach each device (RingRotate); the results are the same.
Array ring_attention(const Array& q, const Array& k, const Array& v, const std::string& axis,
                     bool is_causal, std::optional<double> scale = std::nullopt,
                     RingRotate rotate = RingRotate::kPermute);
/// Context parallelism's other kernels, inside shard_map's function with the sequence split over
/// `axis` (the arguments and the load-balanced order as ring_attention's). All-gather of K/V
/// (Llama 3's context parallelism, Megatron's cp_comm_type "all_gather"): k and v gathered whole
/// over `axis` (two all-gathers), this device's queries attend to them under a mask of the
/// tokens' positions; the backward pass reduce-scatters dk and dv. A device holds the whole
/// sequence's k and v, and keeps them for the backward pass. Equal to dot_product_attention over
/// the whole sequence: the output and dq bit for bit (the same keys in the same order), dk and dv
/// to float rounding (the devices' partial sums added by the reduce-scatter).
Array allgather_kv_attention(const Array& q, const Array& k, const Array& v,
                             const std::string& axis, bool is_causal,
                             std::optional<double> scale = std::nullopt);
/// Ulysses (DeepSpeed-Ulysses, Megatron's cp_comm_type "a2a"): q, k and v moved by all-to-all
/// from a split of the sequence to a split of the heads (three all-to-alls), attention over the
/// whole sequence on this device's heads, the output moved back (one more); the backward pass
/// transposes each. Bit for bit dot_product_attention over the whole sequence, values and
/// gradients (each head's attention is computed whole on one device). The query heads and the
/// kv heads (of the block) must each be a multiple of the size of `axis`: else a SpecError
/// naming both counts and the size.
Array ulysses_attention(const Array& q, const Array& k, const Array& v, const std::string& axis,
                        bool is_causal, std::optional<double> scale = std::nullopt);
/// Which kernel context_parallel_attention runs: ring_attention (with its RingRotate),
/// allgather_kv_attention or ulysses_attention.
enum class ContextKernel : std::uint8_t { kRing, kAllGatherKv, kUlysses };

/// The load-balanced order of t tokens over n devices: element p is the position of the token
/// at index p of the reordered sequence. Device d's block (indices 2c d .. 2c (d+1), c = t/2n)
/// holds chunks d and 2n-1-d. Throws SpecError when t is not a multiple of 2n.
std::vector<std::int64_t> load_balanced_positions(std::int64_t t, std::int64_t n);
/// ring_attention on global arrays [B, T, N, H] / [B, T, K, H] sharded as `spec`, whose
/// dimension 1 (the sequence, in the load-balanced order when causal) is split over `axis`
/// alone: shard_map(ring_attention) with in and out specs `spec`; `kernel` runs
/// allgather_kv_attention or ulysses_attention instead (`rotate` is the ring's alone).
Array context_parallel_attention(const Array& q, const Array& k, const Array& v, const Mesh& mesh,
                                 const PartitionSpec& spec, const std::string& axis, bool is_causal,
                                 std::optional<double> scale = std::nullopt,
                                 RingRotate rotate = RingRotate::kPermute,
                                 ContextKernel kernel = ContextKernel::kRing);

/// The collectives of shard_map's function (jax.lax's), over the mesh axes named. Each is an
/// error (SpecError naming it and the axis) outside a shard_map or over an axis the mesh does not
/// have. Gradients follow JAX's transposes.
namespace lax {

/// The sum over the devices along `axes` (all-reduce): the result is the same over them. A value
/// that is already the same over an axis is summed as many times as the axis has devices.
Array psum(const Array& x, const AxisSet& axes);
/// psum divided by the number of devices along `axes`.
Array pmean(const Array& x, const AxisSet& axes);
/// The elementwise maximum / minimum over the devices along `axes`. Gradient: to the devices
/// that hold the extreme value, shared equally on a tie.
Array pmax(const Array& x, const AxisSet& axes);
Array pmin(const Array& x, const AxisSet& axes);
/// The devices' blocks along `axes` concatenated on dimension `axis` (tiled) or stacked on a
/// new dimension `axis` (not tiled), in device order. The result may still differ over `axes` as
/// JAX's all_gather says (its gradient is psum_scatter's); psum a value to make it the same.
Array all_gather(const Array& x, const AxisSet& axes, int axis = 0, bool tiled = false);
/// psum, each device keeping its part of dimension `scatter_dimension`: 1/n of it (tiled), or
/// its one row of a dimension of size n, which is removed (not tiled).
Array psum_scatter(const Array& x, const AxisSet& axes, int scatter_dimension = 0,
                   bool tiled = false);
/// Each (source, destination) pair of coordinates along `axis`: the devices at the destination
/// receive the block of the device at the source (the other coordinates equal); a device no
/// pair sends to gets zeros.
Array ppermute(const Array& x, const std::string& axis,
               const std::vector<std::pair<int, int>>& perm);
/// Dimension `split_axis` cut into n chunks (n devices along `axes`), chunk j sent to the j-th
/// device, the received chunks concatenated on `concat_axis` in device order (tiled); not tiled,
/// `split_axis` must have n rows and is removed, the chunks stacked on a new `concat_axis`.
Array all_to_all(const Array& x, const AxisSet& axes, int split_axis, int concat_axis,
                 bool tiled = false);
/// This device's coordinate along `axes` (row-major over several), an i32 scalar.
Array axis_index(const AxisSet& axes);
/// The number of devices along `axes` (known when traced: a plain number).
std::int64_t axis_size(const AxisSet& axes);
/// x made to vary over `axes` (the same values; jax.lax.pvary): what mixing it with a varying
/// value does implicitly. Its gradient is psum over `axes`.
Array pvary(const Array& x, const AxisSet& axes);

}  // namespace lax
}  // namespace shardplan
