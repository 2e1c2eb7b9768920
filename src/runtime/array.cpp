#include "shardplan/array.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <sstream>

#include "box_copy.hpp"
#include "reduce.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/detail/agreement.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"

namespace shardplan {
namespace {

std::vector<std::int64_t> origin_of(const Block& b) {
  std::vector<std::int64_t> o;
  o.reserve(b.size());
  for (const auto& s : b) o.push_back(s.start);
  return o;
}

// The valid rows of a block, per dimension (fewer than the shard's in a padded block).
std::vector<std::int64_t> extent_of(const Block& b) {
  std::vector<std::int64_t> e;
  e.reserve(b.size());
  for (const auto& s : b) e.push_back(s.size);
  return e;
}

// A padded block's buffer holds zeros after its valid rows (NamedSharding's Uneven::kPad):
// cleared whole before the valid rows are written, only when the block is padded.
void zero_padding(std::byte* buffer, const Shape& shard, const Block& b, std::size_t elem) {
  std::int64_t valid = 1;
  for (const auto& s : b) valid *= s.size;
  if (valid != shard.numel()) {
    std::memset(buffer, 0, static_cast<std::size_t>(shard.numel()) * elem);
  }
}

void check_devices(const Mesh& mesh, const Executor& executor, std::string_view where) {
  int most = -1;
  for (const int d : mesh.devices()) most = std::max(most, d);
  if (most >= executor.num_devices()) {
    throw ArrayError(fmt::format("[{}] {} uses device {}, but the executor has {} device{}", where,
                                 mesh.to_string(), most, executor.num_devices(),
                                 executor.num_devices() == 1 ? "" : "s"));
  }
}

void check_pending(const Pending& p, const NamedSharding& sharding) {
  for (const auto& axis : p.axes) {
    if (!sharding.mesh().has_axis(axis)) {
      throw SpecError(fmt::format("[array] pending axis '{}' is not an axis of {}", axis,
                                  sharding.mesh().to_string()));
    }
    for (const auto& entry : sharding.spec().dims()) {
      for (const auto& a : entry) {
        if (a == axis) {
          throw SpecError(fmt::format("[array] pending axis '{}' also shards a dimension in {}",
                                      axis, sharding.spec().to_string()));
        }
      }
    }
  }
}

// Buffers for every mesh device this process holds, allocated on the host thread: all or
// nothing.
std::vector<std::shared_ptr<Buffer>> allocate_shards(const Executor& executor, const Mesh& mesh,
                                                     std::int64_t bytes) {
  std::vector<std::shared_ptr<Buffer>> out(static_cast<std::size_t>(executor.num_devices()));
  for (const int d : mesh.devices()) {
    if (!executor.is_local(d)) continue;
    out[static_cast<std::size_t>(d)] = std::make_shared<Buffer>(executor.allocate(d, bytes));
  }
  return out;
}

}  // namespace

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

std::vector<bool> varying_axes(const Mesh& mesh, const std::vector<std::string>& axes) {
  std::vector<bool> varies(static_cast<std::size_t>(mesh.ndim()), false);
  for (const auto& a : axes) varies[static_cast<std::size_t>(mesh.axis_index(a))] = true;
  return varies;
}

std::vector<int> device_group(const Mesh& mesh, int device, const std::vector<std::string>& axes) {
  // The members differ from `device` only in the coordinates of `axes`: enumerate those
  // coordinates (the last mesh axis fastest), which lists the members in mesh order, in time
  // proportional to the group rather than the mesh.
  const auto ndim = static_cast<std::size_t>(mesh.ndim());
  const std::vector<bool> varies = varying_axes(mesh, axes);
  const std::vector<std::int64_t>& sizes = mesh.axis_sizes();
  std::vector<std::int64_t> stride(ndim, 1);
  for (std::size_t i = ndim; i-- > 1;) stride[i - 1] = stride[i] * sizes[i];
  std::int64_t base = mesh.position_of_device(device);
  std::int64_t count = 1;
  for (std::size_t i = 0; i < ndim; ++i) {
    if (!varies[i]) continue;
    base -= (base / stride[i] % sizes[i]) * stride[i];  // coordinate i set to 0
    count *= sizes[i];
  }
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(count));
  std::vector<std::int64_t> coord(ndim, 0);
  for (std::int64_t k = 0; k < count; ++k) {
    std::int64_t pos = base;
    for (std::size_t i = 0; i < ndim; ++i) pos += coord[i] * stride[i];
    out.push_back(mesh.devices()[static_cast<std::size_t>(pos)]);
    for (std::size_t i = ndim; i-- > 0;) {  // next coordinates, the last varying axis fastest
      if (!varies[i]) continue;
      if (++coord[i] < sizes[i]) break;
      coord[i] = 0;
    }
  }
  return out;
}

const Array::Impl& Array::impl() const {
  if (!impl_) throw ArrayError("[array] this Array is empty (default-constructed)");
  return *impl_;
}

Array Array::from_buffers(Executor executor, Shape shape, DType dtype, NamedSharding sharding,
                          std::vector<std::shared_ptr<Buffer>> buffers, Pending pending) {
  auto blocks = std::make_shared<const std::vector<Block>>(sharding.device_blocks(shape));
  return from_buffers(std::move(executor), std::move(shape), dtype, std::move(sharding),
                      std::move(blocks), std::move(buffers), std::move(pending));
}

Array Array::from_buffers(Executor executor, Shape shape, DType dtype, NamedSharding sharding,
                          std::shared_ptr<const std::vector<Block>> blocks,
                          std::vector<std::shared_ptr<Buffer>> buffers, Pending pending) {
  const Mesh& mesh = sharding.mesh();
  check_devices(mesh, executor, "array");
  check_pending(pending, sharding);
  byte_size(shape, dtype);  // the global bytes must fit in int64, as a Tensor's do
  Shape shard_shape = sharding.shard_shape(shape);
  auto impl = std::make_shared<Impl>(Impl{.executor = executor,
                                          .shape = std::move(shape),
                                          .dtype = dtype,
                                          .sharding = sharding,
                                          .shard_shape = std::move(shard_shape),
                                          .blocks = std::move(blocks),
                                          .pending = std::move(pending),
                                          .buffers = std::move(buffers)});
  impl->buffers.resize(static_cast<std::size_t>(executor.num_devices()));
  const std::int64_t bytes = byte_size(impl->shard_shape, dtype);
  for (const int d : mesh.devices()) {
    if (!executor.is_local(d)) continue;  // another process holds its buffer
    const auto& b = impl->buffers[static_cast<std::size_t>(d)];
    if (!b || b->size() != bytes || (bytes > 0 && b->device() != d)) {
      throw ArrayError(fmt::format(
          "[array] device {} needs a buffer of {} bytes on itself for a shard of {} {}; got {}", d,
          bytes, name(dtype), impl->shard_shape.to_string(),
          !b ? std::string("none") : fmt::format("{} bytes on device {}", b->size(), b->device())));
    }
  }
  Array a;
  a.impl_ = std::move(impl);
  return a;
}

Array Array::generate(Shape shape, DType dtype, const NamedSharding& sharding,
                      const Executor& executor, const Generator& g) {
  if (!is_computable(dtype)) {
    throw SpecError(
        fmt::format("[array] cannot generate {} values (f32, f64, bf16, i32, i64)", name(dtype)));
  }
  const Mesh& mesh = sharding.mesh();
  check_devices(mesh, executor, "array");
  byte_size(shape, dtype);  // throws before anything is allocated when the bytes overflow
  const Shape shard = sharding.shard_shape(shape);
  const auto blocks = sharding.device_blocks(shape);
  const std::size_t elem = size_of(dtype);
  auto buffers = allocate_shards(executor, mesh, byte_size(shard, dtype));
  const int rank = shape.rank();
  const std::vector<std::int64_t> zero(static_cast<std::size_t>(rank), 0);
  executor.run(mesh.devices(), [&](int d) {
    std::byte* out = buffers[static_cast<std::size_t>(d)]->data();
    const Block& b = blocks[static_cast<std::size_t>(d)];
    if (shard.numel() == 0) return;
    zero_padding(out, shard, b, elem);
    // Each contiguous run of the valid rows starts at a global row-major index: the offset of
    // the run in the global array, in elements.
    const auto origin = origin_of(b);
    const auto extent = extent_of(b);
    const auto e = static_cast<std::int64_t>(elem);
    detail::for_each_run(shape.begin(), origin.data(), shard.begin(), zero.data(), extent.data(),
                         rank, elem, [&](std::int64_t at, std::int64_t to, std::int64_t bytes) {
                           generate_into(dtype, out + to, bytes / e,
                                         static_cast<std::uint64_t>(at / e), g);
                         });
  });
  return from_buffers(executor, std::move(shape), dtype, sharding, std::move(buffers));
}

void Array::no_executor() const {
  throw ArrayError(fmt::format(
      "[array] a tracer of a call without arrays ({}{}, lower() on TensorSpecs) has no executor",
      name(impl().dtype), impl().shape.to_string()));
}

const Array::Impl& Array::concrete(std::string_view what) const {
  const Impl& i = impl();
  if (i.donated.set.load(std::memory_order_acquire)) {
    throw ArrayError(fmt::format(
        "[array] this {}{} array was donated to an sjit call (donate_argnums) and its buffers "
        "reused; use the call's outputs instead",
        name(i.dtype), i.shape.to_string()));
  }
  if (i.trace != nullptr) {
    throw ArrayError(fmt::format(
        "[array] the {} of a tracer ({}{} inside sjit) is not known while tracing; it is decided "
        "when the program is compiled",
        what, name(i.dtype), i.shape.to_string()));
  }
  return i;
}

const Block& Array::block(int device) const {
  const Impl& i = concrete("shards");
  if (device < 0 || device >= static_cast<int>(i.buffers.size()) ||
      !i.buffers[static_cast<std::size_t>(device)]) {
    if (device >= 0 && device < i.executor->num_devices() && !i.executor->is_local(device)) {
      throw ArrayError(fmt::format(
          "[array] device {} is held by process {}, not this one ({}); its shard is there", device,
          i.executor->process_of(device), distributed::process_index()));
    }
    throw ArrayError(fmt::format("[array] device {} holds no shard of this array (mesh {})", device,
                                 mesh().to_string()));
  }
  return (*i.blocks)[static_cast<std::size_t>(device)];
}

const Buffer& Array::shard(int device) const {
  block(device);  // checks the device
  return *impl().buffers[static_cast<std::size_t>(device)];
}

Tensor Array::shard_tensor(int device) const {
  const Buffer& b = shard(device);
  Tensor t(shard_shape(), dtype());
  if (b.size() > 0) std::memcpy(t.bytes(), b.data(), static_cast<std::size_t>(b.size()));
  return t;
}

Tensor Array::to_host() const {
  const Impl& i = concrete("value");
  if (!i.executor->holds_all(mesh().devices())) return to_host_over_processes();
  Tensor out(i.shape, i.dtype);
  const Mesh& m = mesh();
  const int rank = i.shape.rank();
  const std::size_t elem = size_of(i.dtype);
  // One device per distinct block writes it: the first of its replica group, reducing over the
  // pending axes in mesh order when the array is pending.
  std::vector<int> writers;
  std::vector<std::vector<int>> summands(i.buffers.size());  // by writer's device id
  for (const auto& group : i.sharding.replica_groups(i.shape)) {
    const int first = group.front();
    writers.push_back(first);
    summands[static_cast<std::size_t>(first)] =
        i.pending.empty() ? std::vector<int>{first} : device_group(m, first, i.pending.axes);
  }
  const std::int64_t shard_n = i.shard_shape.numel();
  i.executor->run(writers, [&](int d) {
    const auto& parts_of = summands[static_cast<std::size_t>(d)];
    const Block& b = (*i.blocks)[static_cast<std::size_t>(d)];
    const auto origin = origin_of(b);
    const std::vector<std::int64_t> zero(static_cast<std::size_t>(rank), 0);
    const std::byte* src = i.buffers[static_cast<std::size_t>(d)]->data();
    Tensor reduced;
    if (parts_of.size() > 1) {
      std::vector<const std::byte*> parts;
      for (const int s : parts_of) parts.push_back(i.buffers[static_cast<std::size_t>(s)]->data());
      reduced = Tensor(i.shard_shape, i.dtype);
      detail::reduce_into(i.dtype, i.pending.op, parts, reduced.bytes(), shard_n);
      src = reduced.bytes();
    }
    detail::copy_box(src, i.shard_shape.begin(), zero.data(), out.bytes(), i.shape.begin(),
                     origin.data(), extent_of(b).data(), rank, elem);
  });
  return out;
}

namespace {

/// Runs `prepare` (a gather's host allocations); when the gathered array has at least
/// distributed::detail::kAgreeOnHostAllocationsFrom bytes (every process decides alike), every
/// process then agrees that every one could, before anything crosses: a process out of host
/// memory is named everywhere instead of the others waiting in the gather. `what()` names the
/// gather in the error.
template <class What, class Prepare>
void allocate_then_agree(std::int64_t bytes, const What& what, const Prepare& prepare) {
  if (bytes < distributed::detail::kAgreeOnHostAllocationsFrom) {
    prepare();
    return;
  }
  std::exception_ptr failed;
  try {
    distributed::detail::allocation_fault_point();
    prepare();
  } catch (...) {
    failed = std::current_exception();
  }
  distributed::detail::agree(failed, failed ? what() : std::string());
}

}  // namespace

Tensor Array::to_host_over_processes() const {
  const Impl& i = concrete("value");
  if (!i.pending.empty()) {
    // Reduced over the pending axes first, in the same device order as the one-process path.
    return all_reduce(*this, {}).to_host();
  }
  const int rank = i.shape.rank();
  const std::size_t elem = size_of(i.dtype);
  const std::int64_t shard_bytes = byte_size(i.shard_shape, i.dtype);
  // Each distinct block is sent by the process of the first device holding it, in the order of
  // the replica groups; every process receives all of them and places them.
  const auto groups = i.sharding.replica_groups(i.shape);
  std::vector<std::byte> mine;
  Tensor out;
  allocate_then_agree(
      byte_size(i.shape, i.dtype),
      [&] { return fmt::format("[array] to_host of {}", to_string()); },
      [&] {
        out = Tensor(i.shape, i.dtype);
        for (const auto& group : groups) {
          const int first = group.front();
          if (!i.executor->is_local(first)) continue;
          const Buffer& b = *i.buffers[static_cast<std::size_t>(first)];
          mine.insert(mine.end(), b.data(), b.data() + shard_bytes);
        }
      });
  const auto all = distributed::allgather_bytes(mine);
  std::vector<std::size_t> taken(all.size(), 0);  // bytes used of each process's part
  const std::vector<std::int64_t> zero(static_cast<std::size_t>(rank), 0);
  for (const auto& group : groups) {
    const int first = group.front();
    const auto p = static_cast<std::size_t>(i.executor->process_of(first));
    if (taken[p] + static_cast<std::size_t>(shard_bytes) > all[p].size()) {
      throw DistributedError(fmt::format(
          "[array] process {} sent {} bytes of blocks for a {}{} array, fewer than its devices "
          "hold: the processes disagree on the array",
          p, all[p].size(), name(i.dtype), i.shape.to_string()));
    }
    const Block& b = (*i.blocks)[static_cast<std::size_t>(first)];
    detail::copy_box(all[p].data() + taken[p], i.shard_shape.begin(), zero.data(), out.bytes(),
                     i.shape.begin(), origin_of(b).data(), extent_of(b).data(), rank, elem);
    taken[p] += static_cast<std::size_t>(shard_bytes);
  }
  return out;
}

Array Array::relabel(const NamedSharding& sharding) const {
  const Impl& i = concrete("sharding");
  if (!(sharding.mesh() == i.sharding.mesh()) ||
      !sharding.is_equivalent_to(i.sharding, i.shape.rank())) {
    throw SpecError(fmt::format("[array] {} is not equivalent to {} for shape {}",
                                sharding.to_string(), i.sharding.to_string(), i.shape.to_string()));
  }
  return from_buffers(*i.executor, i.shape, i.dtype, sharding, i.buffers, i.pending);
}

std::string Array::visualize() const {
  std::string pic = sharding().visualize(shape());
  if (is_pending()) {
    std::string axes;
    for (const auto& a : pending().axes) axes += (axes.empty() ? "'" : ", '") + a + "'";
    pic += fmt::format("pending {} over {}\n", shardplan::to_string(pending().op), axes);
  }
  return pic;
}

std::string Array::to_string() const {
  if (!impl_) return "Array(empty)";
  if (impl_->trace != nullptr) {
    return fmt::format("Tracer({}{}, %{})", name(dtype()), shape().to_string(), impl_->node);
  }
  std::string s =
      fmt::format("Array({}{}, {}", name(dtype()), shape().to_string(), sharding().to_string());
  if (is_pending()) {
    std::string axes;
    for (const auto& a : pending().axes) axes += (axes.empty() ? "'" : ", '") + a + "'";
    s += fmt::format(", pending {} over {}", shardplan::to_string(pending().op), axes);
  }
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Array& a) { return os << a.to_string(); }

Array device_put(const Tensor& tensor, const NamedSharding& sharding, const Executor& executor) {
  const Mesh& mesh = sharding.mesh();
  check_devices(mesh, executor, "device_put");
  const Shape shard = sharding.shard_shape(tensor.shape());
  const auto blocks = sharding.device_blocks(tensor.shape());
  const std::size_t elem = size_of(tensor.dtype());
  auto buffers = allocate_shards(executor, mesh, byte_size(shard, tensor.dtype()));
  const int rank = tensor.shape().rank();
  executor.run(mesh.devices(), [&](int d) {
    const Block& b = blocks[static_cast<std::size_t>(d)];
    std::byte* dst = buffers[static_cast<std::size_t>(d)]->data();
    zero_padding(dst, shard, b, elem);
    const std::vector<std::int64_t> zero(static_cast<std::size_t>(rank), 0);
    detail::copy_box(tensor.bytes(), tensor.shape().begin(), origin_of(b).data(), dst,
                     shard.begin(), zero.data(), extent_of(b).data(), rank, elem);
  });
  return Array::from_buffers(executor, tensor.shape(), tensor.dtype(), sharding,
                             std::move(buffers));
}

Tree<Array> device_put(const Tree<Tensor>& tensors, const Tree<NamedSharding>& shardings,
                       const Executor& executor) {
  // A none node of `shardings` means replicated (as None in JAX), over the mesh of its leaves.
  std::optional<NamedSharding> replicated;
  if (const auto leaves = shardings.leaves(); !leaves.empty()) {
    replicated.emplace(leaves.front().mesh(), PartitionSpec());
  }
  return map_prefix<Array>(
      shardings, tensors,
      [&](const std::string& path, const NamedSharding* s, const Tree<Tensor>& sub) {
        if (s == nullptr && sub.num_leaves() > 0) {
          if (!replicated) {
            throw TreeError(fmt::format(
                "[device_put] the subtree at '{}' is None (replicated), but no sharding in the "
                "tree names a mesh to replicate it over",
                path.empty() ? "the root" : path));
          }
          s = &*replicated;
        }
        return sub.map_with_path(
            [&](const std::string& leaf_path, const Tensor& t) {
              try {
                return device_put(t, *s, executor);
              } catch (const SpecError& e) {
                throw SpecError(fmt::format("{} (leaf '{}')", e.what(), leaf_path));
              }
            },
            path);
      });
}

Tree<Tensor> to_host(const Tree<Array>& arrays) {
  return arrays.map([](const Array& a) { return a.to_host(); });
}

std::optional<Tensor> to_host_on_process(const Array& a, int process) {
  const int me = distributed::process_index(), count = distributed::process_count();
  if (process < 0 || process >= count) {
    throw DistributedError(
        fmt::format("[to_host_on_process] process {} is not one of the {} "
                    "processes",
                    process, count));
  }
  if (a.executor().holds_all(a.mesh().devices())) {
    if (me == process) return a.to_host();
    return std::nullopt;
  }
  if (a.is_pending()) return to_host_on_process(all_reduce(a, {}), process);
  const Shape& shape = a.shape();
  const std::int64_t shard_bytes = a.shard_nbytes();
  const auto groups = a.sharding().replica_groups(shape);
  const Executor& e = a.executor();
  // Each distinct block comes from the process of the first device holding it, in group order.
  // The receiving process allocates first, and every process agrees that it could (the senders
  // would wait for it otherwise).
  std::vector<Tensor> received;  // blocks of other processes, in group order
  Tensor out;
  allocate_then_agree(
      byte_size(shape, a.dtype()),
      [&] { return fmt::format("[to_host_on_process] of {}", a.to_string()); },
      [&] {
        if (me != process) return;
        received.reserve(groups.size());
        for (const auto& group : groups) {
          if (e.is_local(group.front()) || shard_bytes == 0) continue;
          received.emplace_back(a.shard_shape(), a.dtype());
        }
        out = Tensor(shape, a.dtype());
      });
  if (me != process) {
    std::vector<distributed::Message> sends;
    for (const auto& group : groups) {
      if (!e.is_local(group.front()) || shard_bytes == 0) continue;
      sends.push_back({process, const_cast<std::byte*>(a.shard(group.front()).data()),
                       static_cast<std::size_t>(shard_bytes)});
    }
    distributed::exchange(sends, {});
    return std::nullopt;
  }
  std::vector<distributed::Message> receives;
  std::size_t at = 0;
  for (const auto& group : groups) {
    if (e.is_local(group.front()) || shard_bytes == 0) continue;
    receives.push_back({e.process_of(group.front()), received[at++].bytes(),
                        static_cast<std::size_t>(shard_bytes)});
  }
  distributed::exchange({}, receives);
  const int rank = shape.rank();
  const std::size_t elem = size_of(a.dtype());
  const std::vector<std::int64_t> zero(static_cast<std::size_t>(rank), 0);
  const auto blocks = a.sharding().device_blocks(shape);
  std::size_t next = 0;
  for (const auto& group : groups) {
    const int first = group.front();
    const std::byte* src = nullptr;
    if (e.is_local(first)) {
      src = a.shard(first).data();
    } else if (shard_bytes != 0) {
      src = received[next++].bytes();
    }
    if (src == nullptr) continue;
    const Block& b = blocks[static_cast<std::size_t>(first)];
    detail::copy_box(src, a.shard_shape().begin(), zero.data(), out.bytes(), shape.begin(),
                     origin_of(b).data(), extent_of(b).data(), rank, elem);
  }
  return out;
}

Array local_data_to_global_array(const Tensor& local, const NamedSharding& sharding,
                                 const Executor& executor) {
  if (local.shape().rank() == 0) {
    throw SpecError(
        "[local_data_to_global_array] a process's data needs a dimension to stack "
        "along (it is a scalar)");
  }
  distributed::check_same("the shape and dtype of each process's local data",
                          fmt::format("{}{}", name(local.dtype()), local.shape().to_string()));
  const int processes = distributed::process_count();
  const std::int64_t rows = local.shape()[0];
  std::vector<std::int64_t> dims(local.shape().begin(), local.shape().end());
  std::int64_t global_rows = 0;
  if (!detail::checked_mul(rows, std::int64_t{processes}, &global_rows)) {
    throw SpecError(
        fmt::format("[local_data_to_global_array] {} rows times {} processes "
                    "overflow int64",
                    rows, processes));
  }
  dims[0] = global_rows;
  const Shape shape(dims);
  const Mesh& mesh = sharding.mesh();
  check_devices(mesh, executor, "local_data_to_global_array");
  const auto blocks = sharding.device_blocks(shape);
  // Every process decides the same way: from the blocks of every device, not only its own.
  bool within = true;
  for (const int d : mesh.devices()) {
    const auto& b = blocks[static_cast<std::size_t>(d)];
    const std::int64_t first = executor.process_of(d) * rows;
    within = within && b[0].start >= first && b[0].start + b[0].size <= first + rows;
  }
  if (!within) {
    // Rows cross processes: every process gets every process's rows, then places its blocks.
    const auto all = distributed::allgather_bytes(std::span(
        local.bytes(), static_cast<std::size_t>(byte_size(local.shape(), local.dtype()))));
    Tensor global(shape, local.dtype());
    std::size_t at = 0;
    for (const auto& part : all) {
      if (!part.empty()) std::memcpy(global.bytes() + at, part.data(), part.size());
      at += part.size();
    }
    return device_put(global, sharding, executor);
  }
  const Shape shard = sharding.shard_shape(shape);
  const std::size_t elem = size_of(local.dtype());
  auto buffers = allocate_shards(executor, mesh, byte_size(shard, local.dtype()));
  const int rank = shape.rank();
  const std::int64_t my_first = distributed::process_index() * rows;
  executor.run(mesh.devices(), [&](int d) {
    const Block& b = blocks[static_cast<std::size_t>(d)];
    std::byte* dst = buffers[static_cast<std::size_t>(d)]->data();
    zero_padding(dst, shard, b, elem);
    auto origin = origin_of(b);
    origin[0] -= my_first;  // into this process's rows
    const std::vector<std::int64_t> zero(static_cast<std::size_t>(rank), 0);
    detail::copy_box(local.bytes(), local.shape().begin(), origin.data(), dst, shard.begin(),
                     zero.data(), extent_of(b).data(), rank, elem);
  });
  return Array::from_buffers(executor, shape, local.dtype(), sharding, std::move(buffers));
}

}  // namespace shardplan
