#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "shardplan/executor.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/tensor.hpp"
#include "shardplan/tree.hpp"

namespace shardplan {

namespace detail {
struct ArrayAccess;
}  // namespace detail

/// How the per-device values of a pending (partial) array combine into the true value.
enum class ReduceOp { kSum, kMean, kMax, kMin };
std::string_view to_string(ReduceOp op);

/// A reduction not yet done: the true value of a block is `op` over the values held by the
/// devices that differ only along `axes` (as after a contraction over a sharded dimension, where
/// each device holds a partial sum). Empty `axes`: nothing pending.
struct Pending {
  ReduceOp op = ReduceOp::kSum;
  std::vector<std::string> axes;
  bool empty() const { return axes.empty(); }
  friend bool operator==(const Pending&, const Pending&) = default;
};

/// A global array sharded over the devices of an Executor, as jax.Array: a global shape, a
/// dtype, a NamedSharding, and one buffer per mesh device holding exactly that device's block
/// (replicas hold copies). Optionally pending: each device's buffer is a summand (or a value to
/// max/min/mean) over some mesh axes, reduced by reshard() or all_reduce().
///
/// A handle: copies share the (immutable) buffers.
class Array {
 public:
  /// An empty handle (valid() is false).
  Array() = default;

  /// Low level: an array made of one buffer per device id (devices outside the mesh hold an
  /// empty pointer), each of the shard's bytes. Throws ArrayError when a buffer is missing, has
  /// the wrong size or lives on another device, and SpecError for a shape the sharding cannot
  /// split or pending axes that are not mesh axes unused by the spec.
  static Array from_buffers(Executor executor, Shape shape, DType dtype, NamedSharding sharding,
                            std::vector<std::shared_ptr<Buffer>> buffers, Pending pending = {});
  /// As above, with the sharding's device blocks for `shape` already computed (a program
  /// computes them once per step, not once per run).
  static Array from_buffers(Executor executor, Shape shape, DType dtype, NamedSharding sharding,
                            std::shared_ptr<const std::vector<Block>> blocks,
                            std::vector<std::shared_ptr<Buffer>> buffers, Pending pending = {});

  /// An array whose element at each global row-major index is the generator's; every device
  /// fills only its own block (no device, nor the host, ever holds the whole array).
  static Array generate(Shape shape, DType dtype, const NamedSharding& sharding,
                        const Executor& executor, const Generator& g);
  static Array zeros(Shape shape, DType dtype, const NamedSharding& sharding,
                     const Executor& executor) {
    return generate(std::move(shape), dtype, sharding, executor, Generator::full(0));
  }
  static Array ones(Shape shape, DType dtype, const NamedSharding& sharding,
                    const Executor& executor) {
    return generate(std::move(shape), dtype, sharding, executor, Generator::full(1));
  }
  static Array normal(Shape shape, DType dtype, const NamedSharding& sharding,
                      const Executor& executor, std::uint64_t seed, double mean = 0,
                      double stddev = 1) {
    return generate(std::move(shape), dtype, sharding, executor,
                    Generator::normal(seed, mean, stddev));
  }
  static Array uniform(Shape shape, DType dtype, const NamedSharding& sharding,
                       const Executor& executor, std::uint64_t seed, double low = 0,
                       double high = 1) {
    return generate(std::move(shape), dtype, sharding, executor,
                    Generator::uniform(seed, low, high));
  }

  bool valid() const { return impl_ != nullptr; }
  /// True for the stand-ins sjit passes to a function while tracing it: they have a shape and a
  /// dtype but no buffers (their values and shardings are decided when the program is compiled).
  bool is_tracer() const;
  const Shape& shape() const;
  DType dtype() const;
  /// Throws ArrayError for a tracer.
  const NamedSharding& sharding() const;
  const Mesh& mesh() const;
  /// Throws ArrayError for a tracer of a call that has no arrays (lower() on TensorSpecs).
  const Executor& executor() const;
  const Pending& pending() const;
  bool is_pending() const;
  /// The shape of each device's block.
  const Shape& shard_shape() const;
  std::int64_t shard_nbytes() const { return byte_size(shard_shape(), dtype()); }
  /// Bytes of the global array.
  std::int64_t nbytes() const { return byte_size(shape(), dtype()); }
  /// The block of the global array that `device` holds. Throws ArrayError for a device outside
  /// the mesh.
  const Block& block(int device) const;
  /// The buffer of `device`. Throws ArrayError for a device outside the mesh.
  const Buffer& shard(int device) const;
  /// A host copy of `device`'s buffer, with the shard's shape.
  Tensor shard_tensor(int device) const;
  /// The global array on the host (gathered; a pending array is reduced first, in a fixed
  /// device order). When the array's devices span processes it is collective: every process
  /// calls it and every process gets the whole array (process_allgather in JAX's terms).
  Tensor to_host() const;
  /// The picture of the sharding (1-D and 2-D), with a line for a pending reduction.
  std::string visualize() const;

  /// The same buffers under an equivalent sharding (one that places every element on the same
  /// devices, e.g. naming a size-1 axis). Throws SpecError when `sharding` is not equivalent.
  Array relabel(const NamedSharding& sharding) const;

  /// "Array(f32[8, 4], NamedSharding(...))".
  std::string to_string() const;

 private:
  Tensor to_host_over_processes() const;
  struct Impl;  // shardplan/detail/array_impl.hpp
  const Impl& impl() const;
  const Impl& concrete(std::string_view what) const;  // throws ArrayError for a tracer
  [[noreturn]] void no_executor() const;              // the ArrayError of executor()
  friend struct detail::ArrayAccess;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace shardplan

#include "shardplan/detail/array_impl.hpp"  // Array::Impl and the inline accessors

namespace shardplan {

std::ostream& operator<<(std::ostream& os, const Array& a);

/// jax.device_put: the tensor split over the sharding's mesh, each device given its block (its
/// rows, then zeros, under Uneven::kPad). Throws SpecError when the shape does not divide and the
/// sharding refuses (naming shape, dimension and axes), ArrayError for devices it lacks.
Array device_put(const Tensor& tensor, const NamedSharding& sharding, const Executor& executor);
/// Every leaf put with the sharding of the leaf of `shardings` that covers it (`shardings` is a
/// prefix of `tensors`). Throws TreeError naming the path where the structures differ.
Tree<Array> device_put(const Tree<Tensor>& tensors, const Tree<NamedSharding>& shardings,
                       const Executor& executor);
/// Every leaf gathered to the host.
Tree<Tensor> to_host(const Tree<Array>& arrays);

/// The global array on one process only (`process`; orbax and multihost_utils gather to one host
/// this way): collective over processes when the array's devices span them, and only `process`
/// receives bytes. Returns the array there, nullopt on every other process. Throws
/// DistributedError for a process outside the group.
std::optional<Tensor> to_host_on_process(const Array& a, int process);

/// scalax's local_data_to_global_array (JAX's make_array_from_process_local_data): every process
/// passes its rows, a tensor of the same shape and dtype on every process (checked: a
/// DistributedError names what differs), and gets one global array that stacks them along
/// dimension 0 in process order (shape [processes * rows, ...]), placed with `sharding`; each
/// process fills only its own devices. Collective. When every device's block lies within the
/// rows of the process holding it (a batch sharded over the devices in process order) no rows
/// cross processes; otherwise the processes exchange their rows first.
Array local_data_to_global_array(const Tensor& local, const NamedSharding& sharding,
                                 const Executor& executor);
/// The picture of an array's sharding, as jax.debug.visualize_array_sharding.
inline std::string visualize(const Array& a) { return a.visualize(); }

/// Device ids that differ from `device` only along `axes` (itself included), in mesh order: the
/// group a collective over `axes` runs in. Throws SpecError for an unknown axis.
std::vector<int> device_group(const Mesh& mesh, int device, const std::vector<std::string>& axes);
/// Per mesh axis (in mesh order), whether it is one of `axes`: the axes along which the members
/// of a device group over `axes` differ. Throws SpecError for an unknown axis.
std::vector<bool> varying_axes(const Mesh& mesh, const std::vector<std::string>& axes);

}  // namespace shardplan
