// all_gather, all_to_all and permute, and the data movement under them and reshard (move_to).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "box_copy.hpp"
#include "collectives_impl.hpp"
#include "shardplan/error.hpp"

namespace shardplan {

using detail::allocate_like;
using detail::make_record;
using detail::make_spec;
using detail::move_to;
using detail::padded_dims;
using detail::prepare_then_agree;
using detail::quoted;
using detail::ShardSource;

namespace {

/// Where the buffer of source block `bs` (of shape `sshard`) lies in the row-major buffer of
/// target block `bt` (of shape `tshard`), in bytes, when it lies there whole and in one piece:
/// the source unpadded (its buffer is its rows), inside the target's rows, its dimensions of
/// one index, then one partial dimension, then dimensions the target buffer holds whole; else
/// -1.
std::int64_t contiguous_offset(const Block& bs, const Shape& sshard, const Block& bt,
                               const Shape& tshard, std::size_t elem) {
  const std::size_t rank = bs.size();
  for (std::size_t k = 0; k < rank; ++k) {
    const int i = static_cast<int>(k);
    if (bs[k].size != sshard[i] || bs[k].start < bt[k].start ||
        bs[k].start + bs[k].size > bt[k].start + bt[k].size) {
      return -1;
    }
  }
  std::size_t first = 0;  // the first dimension of more than one index
  while (first < rank && bs[first].size == 1) ++first;
  for (std::size_t k = first + 1; k < rank; ++k) {
    if (bs[k].size != tshard[static_cast<int>(k)]) return -1;
  }
  std::int64_t offset = 0, stride = 1;
  for (std::size_t k = rank; k-- > 0;) {
    offset += (bs[k].start - bt[k].start) * stride;
    stride *= tshard[static_cast<int>(k)];
  }
  return offset * static_cast<std::int64_t>(elem);
}

void require_not_pending(const Array& x, std::string_view op) {
  if (x.is_pending()) {
    throw ArrayError(
        fmt::format("[{}] {} is pending a {} over {}; reduce it first (all_reduce, "
                    "reduce_scatter or reshard)",
                    op, x.to_string(), to_string(x.pending().op), quoted(x.pending().axes)));
  }
}

// The member of `group` sharing the most mesh coordinates with `device` (the first on ties),
// among the members held by the process holding `device` when there are any (reading a replica
// in memory, not over the network).
int nearest(const Mesh& mesh, const std::function<int(int)>& process_of,
            const std::vector<int>& group, int device) {
  const auto c = mesh.coords_of_position(mesh.position_of_device(device));
  const int process = process_of(device);
  const bool any_here =
      std::any_of(group.begin(), group.end(), [&](int g) { return process_of(g) == process; });
  int best = group.front();
  int best_same = -1;
  for (const int g : group) {
    if (any_here && process_of(g) != process) continue;
    const auto gc = mesh.coords_of_position(mesh.position_of_device(g));
    int same = 0;
    for (std::size_t i = 0; i < c.size(); ++i) same += gc[i] == c[i];
    if (same > best_same) {
      best_same = same;
      best = g;
    }
  }
  return best;
}

// What move_to reads for each device's block of `target`: the replica groups of `from` whose
// block overlaps it and the member it reads each from (itself when it is one, else the nearest),
// and where a source shard lies whole in a target block. The run (move_to) and the plan
// (move_staging) read the same.
class MoveSources {
 public:
  MoveSources(const Shape& shape, DType dtype, const NamedSharding& from,
              const NamedSharding& target, std::function<int(int)> process_of)
      : rank_(shape.rank()),
        elem_(size_of(dtype)),
        mesh_(target.mesh()),
        process_of_(std::move(process_of)),
        tshard_(target.shard_shape(shape)),
        sshard_(from.shard_shape(shape)),
        tblocks_(target.device_blocks(shape)),
        groups_(from.replica_groups(shape)),
        sblocks_(from.device_blocks(shape)) {}

  const Block& source_block(int m) const { return sblocks_[static_cast<std::size_t>(m)]; }
  const Block& target_block(int d) const { return tblocks_[static_cast<std::size_t>(d)]; }

  /// The groups whose block overlaps the target block of d, and the member d reads each from.
  std::vector<std::pair<const std::vector<int>*, int>> operator()(int d) const {
    std::vector<std::pair<const std::vector<int>*, int>> out;
    const Block& bt = target_block(d);
    for (const auto& group : groups_) {
      const Block& bs = source_block(group.front());
      bool overlaps = true;
      for (int k = 0; k < rank_ && overlaps; ++k) {
        const auto i = static_cast<std::size_t>(k);
        overlaps = std::max(bt[i].start, bs[i].start) <
                   std::min(bt[i].start + bt[i].size, bs[i].start + bs[i].size);
      }
      if (!overlaps) continue;
      const bool holds = std::find(group.begin(), group.end(), d) != group.end();
      out.emplace_back(&group, holds ? d : nearest(mesh_, process_of_, group, d));
    }
    return out;
  }

  /// The devices whose shards d reads.
  std::vector<int> reads(int d) const {
    std::vector<int> out;
    for (const auto& [group, src] : (*this)(d)) out.push_back(src);
    return out;
  }

  /// Where shard m lies in device d's output, in bytes, when whole and in one piece; else -1.
  std::int64_t offset(int m, int d) const {
    return contiguous_offset(source_block(m), sshard_, target_block(d), tshard_, elem_);
  }

 private:
  int rank_;
  std::size_t elem_;
  const Mesh& mesh_;
  std::function<int(int)> process_of_;
  Shape tshard_, sshard_;
  std::vector<Block> tblocks_;
  std::vector<std::vector<int>> groups_;
  std::vector<Block> sblocks_;
};

}  // namespace

namespace detail {

std::vector<std::int64_t> move_staging(const Shape& shape, DType dtype, const NamedSharding& from,
                                       const NamedSharding& target,
                                       const std::function<int(int)>& process_of) {
  const Mesh& mesh = target.mesh();
  const MoveSources sources(shape, dtype, from, target, process_of);
  const auto reads = remote_reads(
      mesh, process_of, [&](int d) { return sources.reads(d); },
      [&](int m, int d) { return sources.offset(m, d) >= 0; });
  const auto devices =
      static_cast<std::size_t>(*std::max_element(mesh.devices().begin(), mesh.devices().end()) + 1);
  return staged_copies(reads, byte_size(from.shard_shape(shape), dtype), devices);
}

// The data movement under all_gather, all_to_all and reshard: each device builds its block of
// `target` from the source blocks that overlap it, reading its own buffer where it holds the
// part and the nearest replica otherwise; only bytes read from other devices count.
Array move_to(const Array& x, const NamedSharding& target, CollectiveRecord& rec) {
  const Shape& shape = x.shape();
  const int rank = shape.rank();
  const std::size_t elem = size_of(x.dtype());
  const Mesh& mesh = target.mesh();
  const Shape tshard = target.shard_shape(shape);
  const Executor& e = x.executor();
  const MoveSources sources(shape, x.dtype(), x.sharding(), target,
                            [&](int d) { return e.process_of(d); });
  std::vector<std::shared_ptr<Buffer>> out;
  std::optional<ShardSource> source;
  prepare_then_agree(x, rec.kind, [&] {
    out = allocate_like(x, mesh, tshard.numel() * static_cast<std::int64_t>(elem));
    // A padded target block holds zeros after its rows; cleared before anything is received
    // into it.
    if (target.is_padded(shape)) {
      for (const int d : mesh.devices()) {
        if (out[static_cast<std::size_t>(d)] && tshard.numel() > 0) {
          std::memset(out[static_cast<std::size_t>(d)]->data(), 0,
                      static_cast<std::size_t>(tshard.numel()) * elem);
        }
      }
    }
    source.emplace(
        x, [&](int d) { return sources.reads(d); },
        [&](int m, int d) -> std::byte* {
          const std::int64_t at = sources.offset(m, d);
          return at < 0 ? nullptr : out[static_cast<std::size_t>(d)]->data() + at;
        },
        &rec.staging_bytes);
  });
  source->exchange();
  const ShardSource& shard_of = *source;
  const Shape& sshard = x.shard_shape();
  x.executor().run(mesh.devices(), [&](int d) {
    const Block& bt = sources.target_block(d);
    std::byte* dst = out[static_cast<std::size_t>(d)]->data();
    std::vector<std::int64_t> src_origin(static_cast<std::size_t>(rank));
    std::vector<std::int64_t> dst_origin(static_cast<std::size_t>(rank));
    std::vector<std::int64_t> extent(static_cast<std::size_t>(rank));
    for (const auto& [group_ptr, src] : sources(d)) {
      const std::vector<int>& group = *group_ptr;
      const Block& bs = sources.source_block(group.front());
      bool empty = false;
      std::int64_t numel = 1;
      for (int k = 0; k < rank; ++k) {
        const auto i = static_cast<std::size_t>(k);
        const std::int64_t lo = std::max(bt[i].start, bs[i].start);
        const std::int64_t hi = std::min(bt[i].start + bt[i].size, bs[i].start + bs[i].size);
        if (hi <= lo) {
          empty = true;
          break;
        }
        src_origin[i] = lo - bs[i].start;
        dst_origin[i] = lo - bt[i].start;
        extent[i] = hi - lo;
        numel *= hi - lo;
      }
      if (empty) continue;
      if (src != d && shard_of.placed(src)) {  // received in place
        rec.bytes_in[static_cast<std::size_t>(d)] += numel * static_cast<std::int64_t>(elem);
        continue;
      }
      detail::copy_box(shard_of(src), sshard.begin(), src_origin.data(), dst, tshard.begin(),
                       dst_origin.data(), extent.data(), rank, elem);
      if (src != d)
        rec.bytes_in[static_cast<std::size_t>(d)] += numel * static_cast<std::int64_t>(elem);
    }
  });
  return Array::from_buffers(x.executor(), shape, x.dtype(), target, std::move(out));
}

}  // namespace detail

Array all_gather(const Array& x, const std::vector<std::string>& axes, CollectiveRecord* record) {
  require_not_pending(x, "all_gather");
  const int rank = x.shape().rank();
  auto dims = padded_dims(x.sharding().spec(), rank);
  for (const auto& a : axes) {
    bool found = false;
    for (auto& e : dims) {
      const auto it = std::find(e.begin(), e.end(), a);
      if (it != e.end()) {
        e.erase(it);
        found = true;
      }
    }
    if (!found) {
      throw SpecError(
          fmt::format("[all_gather] axis '{}' shards no dimension of {}", a, x.to_string()));
    }
  }
  CollectiveRecord rec = make_record(CollectiveKind::kAllGather, axes, x);
  Array out = move_to(x, NamedSharding(x.mesh(), make_spec(dims), x.sharding().uneven()), rec);
  if (record) *record = std::move(rec);
  return out;
}

Array all_to_all(const Array& x, const std::vector<std::string>& axes, int from_dim, int to_dim,
                 CollectiveRecord* record) {
  require_not_pending(x, "all_to_all");
  const int rank = x.shape().rank();
  if (from_dim < 0 || from_dim >= rank || to_dim < 0 || to_dim >= rank || from_dim == to_dim) {
    throw SpecError(fmt::format("[all_to_all] dimensions {} -> {} are not two dimensions of {}",
                                from_dim, to_dim, x.to_string()));
  }
  auto dims = padded_dims(x.sharding().spec(), rank);
  auto& from = dims[static_cast<std::size_t>(from_dim)];
  if (axes.empty() || axes.size() > from.size() ||
      !std::equal(axes.begin(), axes.end(),
                  from.end() - static_cast<std::ptrdiff_t>(axes.size()))) {
    throw SpecError(fmt::format("[all_to_all] {} are not the minor axes of dimension {} of {}",
                                quoted(axes), from_dim, x.to_string()));
  }
  from.resize(from.size() - axes.size());
  auto& to = dims[static_cast<std::size_t>(to_dim)];
  to.insert(to.end(), axes.begin(), axes.end());
  CollectiveRecord rec = make_record(CollectiveKind::kAllToAll, axes, x);
  Array out = move_to(x, NamedSharding(x.mesh(), make_spec(dims), x.sharding().uneven()), rec);
  if (record) *record = std::move(rec);
  return out;
}

Array permute(const Array& x, const std::string& axis,
              const std::vector<std::pair<int, int>>& pairs, CollectiveRecord* record) {
  const Mesh& mesh = x.mesh();
  const int ax = mesh.axis_index(axis);
  const std::int64_t size = mesh.axis_sizes()[static_cast<std::size_t>(ax)];
  std::vector<int> source_of(static_cast<std::size_t>(size), -1);
  for (const auto& [from, to] : pairs) {
    if (from < 0 || from >= size || to < 0 || to >= size) {
      throw SpecError(fmt::format("[permute] pair ({}, {}) is outside axis '{}' of size {}", from,
                                  to, axis, size));
    }
    if (source_of[static_cast<std::size_t>(to)] >= 0) {
      throw SpecError(fmt::format("[permute] coordinate {} of axis '{}' receives twice", to, axis));
    }
    source_of[static_cast<std::size_t>(to)] = from;
  }
  const std::int64_t bytes = x.shard_nbytes();
  CollectiveRecord rec = make_record(CollectiveKind::kPermute, {axis}, x);
  // The device whose shard d receives, or -1 (d gets zeros).
  auto source = [&](int d) {
    auto c = mesh.coords_of_position(mesh.position_of_device(d));
    const int from = source_of[static_cast<std::size_t>(c[static_cast<std::size_t>(ax)])];
    if (from < 0) return -1;
    c[static_cast<std::size_t>(ax)] = from;
    std::int64_t pos = 0;
    for (int i = 0; i < mesh.ndim(); ++i) {
      pos = pos * mesh.axis_sizes()[static_cast<std::size_t>(i)] + c[static_cast<std::size_t>(i)];
    }
    return mesh.devices()[static_cast<std::size_t>(pos)];
  };
  std::vector<std::shared_ptr<Buffer>> out;
  std::optional<ShardSource> shards;
  // A shard from another process is received straight into its one reader's output (the
  // shards of a permutation each go to one device): nothing is staged.
  prepare_then_agree(x, rec.kind, [&] {
    out = allocate_like(x, mesh, bytes);
    shards.emplace(
        x,
        [&](int d) {
          const int src = source(d);
          return src < 0 ? std::vector<int>{} : std::vector<int>{src};
        },
        [&](int, int d) { return out[static_cast<std::size_t>(d)]->data(); }, &rec.staging_bytes);
  });
  shards->exchange();
  const ShardSource& shard_of = *shards;
  x.executor().run(mesh.devices(), [&](int d) {
    std::byte* dst = out[static_cast<std::size_t>(d)]->data();
    const int src = source(d);
    if (src < 0) {
      if (bytes > 0) std::memset(dst, 0, static_cast<std::size_t>(bytes));
      return;
    }
    if (bytes > 0 && !(src != d && shard_of.placed(src))) {
      std::memcpy(dst, shard_of(src), static_cast<std::size_t>(bytes));
    }
    if (src != d) rec.bytes_in[static_cast<std::size_t>(d)] += bytes;
  });
  Array result = Array::from_buffers(x.executor(), x.shape(), x.dtype(), x.sharding(),
                                     std::move(out), x.pending());
  if (record) *record = std::move(rec);
  return result;
}

}  // namespace shardplan
