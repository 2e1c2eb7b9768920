#include "shardplan/collectives.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

#include "box_copy.hpp"
#include "reduce.hpp"
#include "shardplan/detail/agreement.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan {
namespace {

std::string quoted(const std::vector<std::string>& axes) {
  std::string s;
  for (const auto& a : axes) s += (s.empty() ? "'" : ", '") + a + "'";
  return s.empty() ? "no axes" : s;
}

std::vector<AxisNames> padded_dims(const PartitionSpec& spec, int rank) {
  std::vector<AxisNames> dims(spec.dims().begin(), spec.dims().end());
  if (static_cast<int>(dims.size()) < rank) dims.resize(static_cast<std::size_t>(rank));
  return dims;
}

// A spec from per-dimension entries, without trailing unsharded ones (P('x'), not P('x', None)).
PartitionSpec make_spec(std::vector<AxisNames> dims) {
  while (!dims.empty() && dims.back().empty()) dims.pop_back();
  return PartitionSpec(std::move(dims));
}

/// A buffer a collective allocates (an output shard, a buffer it receives into).
std::shared_ptr<Buffer> allocate_on(const Executor& e, int d, std::int64_t bytes) {
  distributed::detail::allocation_fault_point();
  return std::make_shared<Buffer>(e.allocate(d, bytes));
}

std::vector<std::shared_ptr<Buffer>> allocate_like(const Array& x, const Mesh& mesh,
                                                   std::int64_t bytes) {
  std::vector<std::shared_ptr<Buffer>> out(static_cast<std::size_t>(x.executor().num_devices()));
  for (const int d : mesh.devices()) {
    if (!x.executor().is_local(d)) continue;  // another process's
    out[static_cast<std::size_t>(d)] = allocate_on(x.executor(), d, bytes);
  }
  return out;
}

CollectiveRecord make_record(std::string kind, std::vector<std::string> axes, const Array& x) {
  return CollectiveRecord{
      std::move(kind), std::move(axes),
      std::vector<std::int64_t>(static_cast<std::size_t>(x.executor().num_devices()), 0)};
}

/// True when some device of the array's mesh is held by another process.
bool spans_processes(const Array& x) { return !x.executor().holds_all(x.mesh().devices()); }

/// Over processes, a collective first prepares what may fail on one process only (its output
/// and the buffers it receives into: an out-of-memory), then every process agrees that every
/// process prepared (distributed::detail::agree: one all-gather of a number each) before any
/// shard crosses. So a failure on one process is a DistributedError naming it on every process,
/// not the others waiting in the exchange. A program that holds the failure of an earlier step
/// joins this agreement in place of the collective (Program::run). In one process `prepare`
/// runs as it is and its errors keep their type.
template <class Prepare>
void prepare_then_agree(const Array& x, std::string_view kind, const Prepare& prepare) {
  if (!spans_processes(x)) {
    prepare();
    return;
  }
  std::exception_ptr failed;
  try {
    prepare();
  } catch (...) {
    failed = std::current_exception();
  }
  distributed::detail::agree(failed, failed ? fmt::format("[{}] of {}", kind, x.to_string()) : "");
}

/// The shards a collective reads: this process's own, and a copy of each shard of another
/// process that one of this process's devices reads. `reads(d)` lists the devices whose shards
/// device d reads; every process evaluates it for every device, so each knows what to send
/// to whom without asking, and the messages between two processes go in device order on both
/// sides. A copy lives in this process's memory, counted on the first local device that reads
/// it (it is what that device receives). Making one allocates the copies (nothing crosses);
/// exchange() then moves the shards, collective when the array spans processes.
class ShardSource {
 public:
  /// `place(m, d)`, when given, may name where in device d's output shard m belongs whole and in
  /// one piece, for a shard of another process that only d reads here: it is then received
  /// there directly (placed(m)), saving a copy.
  using Place = std::function<std::byte*(int m, int d)>;
  ShardSource(const Array& x, const std::function<std::vector<int>(int)>& reads,
              const Place& place = {})
      : x_(x) {
    if (!spans_processes(x)) return;
    const Executor& e = x.executor();
    const Mesh& mesh = x.mesh();
    const int me = distributed::process_index();
    const int processes = distributed::process_count();
    const std::int64_t bytes = x.shard_nbytes();
    // needed[p]: the other processes' devices whose shards process p's devices read, sorted;
    // reader[m]: the first of this process's devices reading m.
    std::vector<std::vector<int>> needed(static_cast<std::size_t>(processes));
    std::vector<int> reader(static_cast<std::size_t>(e.num_devices()), -1);
    std::vector<int> readers(static_cast<std::size_t>(e.num_devices()), 0);  // local readers
    for (const int d : mesh.devices()) {
      const int p = e.process_of(d);
      for (const int m : reads(d)) {
        if (e.process_of(m) == p) continue;
        needed[static_cast<std::size_t>(p)].push_back(m);
        if (p == me) {
          if (reader[static_cast<std::size_t>(m)] < 0) reader[static_cast<std::size_t>(m)] = d;
          ++readers[static_cast<std::size_t>(m)];
        }
      }
    }
    for (auto& v : needed) {
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
    }
    remote_.resize(static_cast<std::size_t>(e.num_devices()));
    placed_.assign(static_cast<std::size_t>(e.num_devices()), 0);
    if (bytes == 0) return;
    for (const int m : needed[static_cast<std::size_t>(me)]) {
      const int d = reader[static_cast<std::size_t>(m)];
      std::byte* into = nullptr;
      if (place && readers[static_cast<std::size_t>(m)] == 1) into = place(m, d);
      if (into != nullptr) {
        placed_[static_cast<std::size_t>(m)] = 1;
      } else {
        auto& copy = remote_[static_cast<std::size_t>(m)];
        copy = allocate_on(e, d, bytes);
        into = copy->data();
      }
      receives_.push_back({e.process_of(m), into, static_cast<std::size_t>(bytes)});
    }
    for (int p = 0; p < processes; ++p) {
      if (p == me) continue;
      for (const int m : needed[static_cast<std::size_t>(p)]) {
        if (e.process_of(m) != me) continue;
        sends_.push_back(
            {p, const_cast<std::byte*>(x.shard(m).data()), static_cast<std::size_t>(bytes)});
      }
    }
  }

  /// Moves the shards between processes (nothing when the array does not span them).
  void exchange() {
    if (spans_processes(x_)) distributed::exchange(sends_, receives_);
  }

  /// True when shard m was received straight into its reader's output (nothing left to copy).
  bool placed(int m) const { return !placed_.empty() && placed_[static_cast<std::size_t>(m)]; }

  /// Device m's shard: its own buffer here, or the copy received from its process.
  const std::byte* operator()(int m) const {
    if (!remote_.empty() && remote_[static_cast<std::size_t>(m)]) {
      return remote_[static_cast<std::size_t>(m)]->data();
    }
    return x_.shard(m).data();
  }

 private:
  const Array& x_;
  std::vector<std::shared_ptr<Buffer>> remote_;  // by device id
  std::vector<char> placed_;                     // by device id
  std::vector<distributed::Message> sends_, receives_;
};

/// Where block `bs` lies in the row-major buffer of block `bt`, in bytes, when it lies there
/// whole and in one piece (dimensions of one index, then one partial dimension, then full
/// ones); else -1.
std::int64_t contiguous_offset(const Block& bs, const Block& bt, std::size_t elem) {
  const std::size_t rank = bs.size();
  for (std::size_t k = 0; k < rank; ++k) {
    if (bs[k].start < bt[k].start || bs[k].start + bs[k].size > bt[k].start + bt[k].size) {
      return -1;
    }
  }
  std::size_t first = 0;  // the first dimension of more than one index
  while (first < rank && bs[first].size == 1) ++first;
  for (std::size_t k = first + 1; k < rank; ++k) {
    if (bs[k].size != bt[k].size) return -1;
  }
  std::int64_t offset = 0, stride = 1;
  for (std::size_t k = rank; k-- > 0;) {
    offset += (bs[k].start - bt[k].start) * stride;
    stride *= bt[k].size;
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
int nearest(const Mesh& mesh, const Executor& e, const std::vector<int>& group, int device) {
  const auto c = mesh.coords_of_position(mesh.position_of_device(device));
  const int process = e.process_of(device);
  const bool any_here =
      std::any_of(group.begin(), group.end(), [&](int g) { return e.process_of(g) == process; });
  int best = group.front();
  int best_same = -1;
  for (const int g : group) {
    if (any_here && e.process_of(g) != process) continue;
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

// The data movement under all_gather, all_to_all and reshard: each device builds its block of
// `target` from the source blocks that overlap it, reading its own buffer where it holds the
// part and the nearest replica otherwise; only bytes read from other devices count.
Array move_to(const Array& x, const NamedSharding& target, CollectiveRecord& rec) {
  const Shape& shape = x.shape();
  const int rank = shape.rank();
  const std::size_t elem = size_of(x.dtype());
  const Mesh& mesh = target.mesh();
  const Shape tshard = target.shard_shape(shape);
  const auto tblocks = target.device_blocks(shape);
  const auto groups = x.sharding().replica_groups(shape);
  const auto sblocks = x.sharding().device_blocks(shape);
  // The groups whose block overlaps the target block of d, and the member d reads each from.
  auto sources = [&](int d) {
    std::vector<std::pair<const std::vector<int>*, int>> out;
    const Block& bt = tblocks[static_cast<std::size_t>(d)];
    for (const auto& group : groups) {
      const Block& bs = sblocks[static_cast<std::size_t>(group.front())];
      bool overlaps = true;
      for (int k = 0; k < rank && overlaps; ++k) {
        const auto i = static_cast<std::size_t>(k);
        overlaps = std::max(bt[i].start, bs[i].start) <
                   std::min(bt[i].start + bt[i].size, bs[i].start + bs[i].size);
      }
      if (!overlaps) continue;
      const bool holds = std::find(group.begin(), group.end(), d) != group.end();
      out.emplace_back(&group, holds ? d : nearest(mesh, x.executor(), group, d));
    }
    return out;
  };
  std::vector<std::shared_ptr<Buffer>> out;
  std::optional<ShardSource> source;
  prepare_then_agree(x, rec.kind, [&] {
    out = allocate_like(x, mesh, tshard.numel() * static_cast<std::int64_t>(elem));
    source.emplace(
        x,
        [&](int d) {
          std::vector<int> reads;
          for (const auto& [group, src] : sources(d)) reads.push_back(src);
          return reads;
        },
        [&](int m, int d) -> std::byte* {
          const std::int64_t at = contiguous_offset(sblocks[static_cast<std::size_t>(m)],
                                                    tblocks[static_cast<std::size_t>(d)], elem);
          return at < 0 ? nullptr : out[static_cast<std::size_t>(d)]->data() + at;
        });
  });
  source->exchange();
  const ShardSource& shard_of = *source;
  const Shape& sshard = x.shard_shape();
  x.executor().run(mesh.devices(), [&](int d) {
    const Block& bt = tblocks[static_cast<std::size_t>(d)];
    std::byte* dst = out[static_cast<std::size_t>(d)]->data();
    std::vector<std::int64_t> src_origin(static_cast<std::size_t>(rank));
    std::vector<std::int64_t> dst_origin(static_cast<std::size_t>(rank));
    std::vector<std::int64_t> extent(static_cast<std::size_t>(rank));
    for (const auto& [group_ptr, src] : sources(d)) {
      const std::vector<int>& group = *group_ptr;
      const Block& bs = sblocks[static_cast<std::size_t>(group.front())];
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

std::vector<std::string> reduced_axes(const Array& x, const std::vector<std::string>& axes,
                                      std::string_view op) {
  if (!x.is_pending()) {
    throw ArrayError(fmt::format("[{}] {} is not pending: nothing to reduce", op, x.to_string()));
  }
  if (axes.empty()) return x.pending().axes;
  for (const auto& a : axes) {
    const auto& p = x.pending().axes;
    if (std::find(p.begin(), p.end(), a) == p.end()) {
      throw SpecError(fmt::format("[{}] axis '{}' is not pending in {} (pending: {})", op, a,
                                  x.to_string(), quoted(p)));
    }
  }
  return axes;
}

Pending remaining_pending(const Array& x, const std::vector<std::string>& reduced) {
  Pending rest{x.pending().op, {}};
  for (const auto& a : x.pending().axes) {
    if (std::find(reduced.begin(), reduced.end(), a) == reduced.end()) rest.axes.push_back(a);
  }
  return rest;
}

// Start of chunk r of `total` elements cut into n nearly equal chunks: floor(r * total / n),
// written so that r * total is never formed (it can pass int64 for a large shard).
std::int64_t chunk_start(std::int64_t r, std::int64_t total, std::int64_t n) {
  return r * (total / n) + r * (total % n) / n;
}

// a + b for byte counts that are statistics (sums over devices or steps): they saturate at
// INT64_MAX instead of wrapping (docs/runtime.md, "Sizes").
std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  std::int64_t s = 0;
  return detail::checked_add(a, b, &s) ? s : std::numeric_limits<std::int64_t>::max();
}

}  // namespace

std::int64_t CollectiveRecord::max_bytes_in() const {
  return bytes_in.empty() ? 0 : *std::max_element(bytes_in.begin(), bytes_in.end());
}

std::int64_t CollectiveRecord::total_bytes_in() const {
  return std::accumulate(bytes_in.begin(), bytes_in.end(), std::int64_t{0}, saturating_add);
}

std::string CollectiveRecord::to_string() const {
  return fmt::format("{} over {}{}: {} max per device, {} in all", kind, quoted(axes),
                     kind == "all_reduce" ? " (reduce-scatter, then all-gather)" : "",
                     format_bytes(max_bytes_in()), format_bytes(total_bytes_in()));
}

std::ostream& operator<<(std::ostream& os, const CollectiveRecord& r) {
  return os << r.to_string();
}

std::int64_t ReshardResult::max_bytes_in() const {
  std::int64_t n = 0;
  for (const auto& s : steps) n = saturating_add(n, s.max_bytes_in());
  return n;
}

void check_same_placement(const Array& a, const Array& b, std::string_view where) {
  if (!(a.executor() == b.executor())) {
    throw ArrayError(fmt::format("[{}] the arrays live on different executors: {} and {}", where,
                                 a.to_string(), b.to_string()));
  }
  if (!(a.mesh() == b.mesh())) {
    throw ArrayError(fmt::format(
        "[{}] the arrays are on different meshes or device orders: {} with devices {} and {} with "
        "devices {}",
        where, a.mesh().to_string(), fmt::join(a.mesh().devices(), ","), b.mesh().to_string(),
        fmt::join(b.mesh().devices(), ",")));
  }
}

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
  CollectiveRecord rec = make_record("all_gather", axes, x);
  Array out = move_to(x, NamedSharding(x.mesh(), make_spec(dims)), rec);
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
  CollectiveRecord rec = make_record("all_to_all", axes, x);
  Array out = move_to(x, NamedSharding(x.mesh(), make_spec(dims)), rec);
  if (record) *record = std::move(rec);
  return out;
}

Array all_reduce(const Array& x, const std::vector<std::string>& axes_in,
                 CollectiveRecord* record) {
  const auto axes = reduced_axes(x, axes_in, "all_reduce");
  const Mesh& mesh = x.mesh();
  const std::size_t elem = size_of(x.dtype());
  const std::int64_t total = x.shard_shape().numel();
  CollectiveRecord rec = make_record("all_reduce", axes, x);
  const std::size_t n_dev = static_cast<std::size_t>(x.executor().num_devices());
  std::vector<std::vector<int>> group(n_dev);
  std::vector<std::size_t> rank_in(n_dev);
  for (const int d : mesh.devices()) {
    auto g = device_group(mesh, d, axes);
    rank_in[static_cast<std::size_t>(d)] =
        static_cast<std::size_t>(std::find(g.begin(), g.end(), d) - g.begin());
    group[static_cast<std::size_t>(d)] = std::move(g);
  }
  auto lo_of = [&](std::size_t r, std::size_t n) {
    return chunk_start(static_cast<std::int64_t>(r), total, static_cast<std::int64_t>(n));
  };
  const Executor& exec = x.executor();
  const int me = distributed::process_index();
  // Over processes the same two phases run with the chunks of other processes' members sent
  // point to point (a message per chunk, listed in mesh order then group order on both sides,
  // so each pair of processes agrees on the order): the additions of every element, and so the
  // bits, are those of one process.
  const bool remote = spans_processes(x);
  // Phase 1 (reduce-scatter inside each group): the member of rank r reduces chunk r of every
  // member's shard into chunk r of its output, receiving the chunks of members held by other
  // processes. Everything that is allocated (the output, the received chunks) is before the
  // agreement (prepare_then_agree); phase 2 receives into the output.
  std::vector<std::shared_ptr<Buffer>> out;
  auto chunk = [&](int d, std::int64_t lo) {
    return out[static_cast<std::size_t>(d)]->data() + lo * static_cast<std::int64_t>(elem);
  };
  std::vector<std::vector<std::shared_ptr<Buffer>>> received(n_dev);  // by reader, group order
  std::vector<std::vector<const std::byte*>> sources(n_dev);  // where each received chunk lies
  std::vector<char> in_place(n_dev, 0);
  std::vector<distributed::Message> sends, receives;
  prepare_then_agree(x, rec.kind, [&] {
    out = allocate_like(x, mesh, total * static_cast<std::int64_t>(elem));
    for (const int d : mesh.devices()) {
      const auto& g = group[static_cast<std::size_t>(d)];
      const std::size_t r = rank_in[static_cast<std::size_t>(d)];
      const std::int64_t lo = lo_of(r, g.size());
      const std::int64_t bytes = (lo_of(r + 1, g.size()) - lo) * static_cast<std::int64_t>(elem);
      if (exec.is_local(d)) {
        received[static_cast<std::size_t>(d)].resize(g.size());
        sources[static_cast<std::size_t>(d)].resize(g.size());
      }
      if (!remote || bytes == 0) continue;
      for (std::size_t i = 0; i < g.size(); ++i) {
        const int m = g[i];
        if (exec.process_of(m) == exec.process_of(d)) continue;
        if (exec.is_local(m)) {
          sends.push_back(
              {exec.process_of(d),
               const_cast<std::byte*>(x.shard(m).data()) + lo * static_cast<std::int64_t>(elem),
               static_cast<std::size_t>(bytes)});
        } else if (exec.is_local(d)) {
          // The first such chunk is received into d's output, where it is reduced in place.
          auto& in = received[static_cast<std::size_t>(d)];
          std::byte* into = nullptr;
          if (!in_place[static_cast<std::size_t>(d)]) {
            in_place[static_cast<std::size_t>(d)] = 1;
            into = chunk(d, lo);
          } else {
            in[i] = allocate_on(exec, d, bytes);
            into = in[i]->data();
          }
          receives.push_back({exec.process_of(m), into, static_cast<std::size_t>(bytes)});
          sources[static_cast<std::size_t>(d)][i] = into;
        }
      }
    }
  });
  if (remote) distributed::exchange(sends, receives);
  exec.run(mesh.devices(), [&](int d) {
    const auto& g = group[static_cast<std::size_t>(d)];
    const auto& in = sources[static_cast<std::size_t>(d)];
    const std::size_t r = rank_in[static_cast<std::size_t>(d)];
    const std::int64_t lo = lo_of(r, g.size());
    const std::int64_t count = lo_of(r + 1, g.size()) - lo;
    std::vector<const std::byte*> parts;
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (in[i] != nullptr) {
        parts.push_back(in[i]);
      } else if (exec.is_local(g[i])) {
        parts.push_back(x.shard(g[i]).data() + lo * static_cast<std::int64_t>(elem));
      } else {
        parts.push_back(nullptr);  // an empty chunk of another process's member: nothing to read
      }
    }
    detail::reduce_into(x.dtype(), x.pending().op, parts, chunk(d, lo), count);
    rec.bytes_in[static_cast<std::size_t>(d)] +=
        static_cast<std::int64_t>(g.size() - 1) * count * static_cast<std::int64_t>(elem);
  });
  received.clear();
  // Phase 2 (all-gather inside each group): every member copies every other reduced chunk. A
  // chunk reduced on another process crosses once to each process holding members of its
  // group, straight into the output of the first of them (in group order); the others copy it
  // from there.
  std::vector<int> holder(n_dev, -1);  // by reducing member: the local device it was received on
  if (remote) {
    sends.clear();
    receives.clear();
    for (const int m : mesh.devices()) {
      const auto& g = group[static_cast<std::size_t>(m)];
      const std::size_t r = rank_in[static_cast<std::size_t>(m)];
      const std::int64_t lo = lo_of(r, g.size());
      const std::int64_t bytes = (lo_of(r + 1, g.size()) - lo) * static_cast<std::int64_t>(elem);
      if (bytes == 0) continue;
      std::vector<int> first(static_cast<std::size_t>(distributed::process_count()), -1);
      for (const int d : g) {
        if (first[static_cast<std::size_t>(exec.process_of(d))] < 0)
          first[static_cast<std::size_t>(exec.process_of(d))] = d;
      }
      const int owner = exec.process_of(m);
      for (int p = 0; p < static_cast<int>(first.size()); ++p) {
        if (p == owner || first[static_cast<std::size_t>(p)] < 0) continue;
        if (owner == me) {
          sends.push_back({p, chunk(m, lo), static_cast<std::size_t>(bytes)});
        } else if (p == me) {
          const int d = first[static_cast<std::size_t>(p)];
          holder[static_cast<std::size_t>(m)] = d;
          receives.push_back({owner, chunk(d, lo), static_cast<std::size_t>(bytes)});
        }
      }
    }
    distributed::exchange(sends, receives);
  }
  exec.run(mesh.devices(), [&](int d) {
    const auto& g = group[static_cast<std::size_t>(d)];
    std::byte* dst = out[static_cast<std::size_t>(d)]->data();
    for (std::size_t r = 0; r < g.size(); ++r) {
      const std::int64_t lo = lo_of(r, g.size());
      const std::int64_t bytes = (lo_of(r + 1, g.size()) - lo) * static_cast<std::int64_t>(elem);
      if (bytes == 0) continue;
      const int m = g[r];
      if (m == d) continue;  // reduced here
      rec.bytes_in[static_cast<std::size_t>(d)] += bytes;
      const int at = holder[static_cast<std::size_t>(m)];
      if (at == d) continue;  // received here in place
      std::memcpy(dst + lo * static_cast<std::int64_t>(elem), chunk(at >= 0 ? at : m, lo),
                  static_cast<std::size_t>(bytes));
    }
  });
  Array result = Array::from_buffers(x.executor(), x.shape(), x.dtype(), x.sharding(),
                                     std::move(out), remaining_pending(x, axes));
  if (record) *record = std::move(rec);
  return result;
}

Array reduce_scatter(const Array& x, int dim, const std::vector<std::string>& axes_in,
                     CollectiveRecord* record) {
  const auto axes = reduced_axes(x, axes_in, "reduce_scatter");
  const int rank = x.shape().rank();
  if (dim < 0 || dim >= rank) {
    throw SpecError(fmt::format("[reduce_scatter] no dimension {} in {}", dim, x.to_string()));
  }
  auto dims = padded_dims(x.sharding().spec(), rank);
  auto& e = dims[static_cast<std::size_t>(dim)];
  e.insert(e.end(), axes.begin(), axes.end());
  const NamedSharding target(x.mesh(), make_spec(dims));
  const Shape tshard = target.shard_shape(x.shape(), "reduce_scatter");
  const auto tblocks = target.device_blocks(x.shape());
  const std::size_t elem = size_of(x.dtype());
  const Mesh& mesh = x.mesh();
  CollectiveRecord rec = make_record("reduce_scatter", axes, x);
  std::vector<std::shared_ptr<Buffer>> out;
  std::optional<ShardSource> source;
  prepare_then_agree(x, rec.kind, [&] {
    out = allocate_like(x, mesh, tshard.numel() * static_cast<std::int64_t>(elem));
    source.emplace(x, [&](int d) { return device_group(mesh, d, axes); });
  });
  source->exchange();
  const ShardSource& shard_of = *source;
  x.executor().run(mesh.devices(), [&](int d) {
    const auto g = device_group(mesh, d, axes);
    const Block& old_block = x.block(d);
    const Block& nb = tblocks[static_cast<std::size_t>(d)];
    std::vector<std::int64_t> offset(static_cast<std::size_t>(rank));
    for (int k = 0; k < rank; ++k) {
      offset[static_cast<std::size_t>(k)] =
          nb[static_cast<std::size_t>(k)].start - old_block[static_cast<std::size_t>(k)].start;
    }
    const std::vector<std::int64_t> zero(static_cast<std::size_t>(rank), 0);
    std::byte* dst = out[static_cast<std::size_t>(d)]->data();
    std::vector<const std::byte*> parts(g.size());
    detail::for_each_run(x.shard_shape().begin(), offset.data(), tshard.begin(), zero.data(),
                         tshard.begin(), rank, elem,
                         [&](std::int64_t s, std::int64_t t, std::int64_t bytes) {
                           for (std::size_t m = 0; m < g.size(); ++m) {
                             parts[m] = shard_of(g[m]) + s;
                           }
                           detail::reduce_into(x.dtype(), x.pending().op, parts, dst + t,
                                               bytes / static_cast<std::int64_t>(elem));
                         });
    rec.bytes_in[static_cast<std::size_t>(d)] +=
        static_cast<std::int64_t>(g.size() - 1) * tshard.numel() * static_cast<std::int64_t>(elem);
  });
  Array result = Array::from_buffers(x.executor(), x.shape(), x.dtype(), target, std::move(out),
                                     remaining_pending(x, axes));
  if (record) *record = std::move(rec);
  return result;
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
  CollectiveRecord rec = make_record("permute", {axis}, x);
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
  prepare_then_agree(x, rec.kind, [&] {
    out = allocate_like(x, mesh, bytes);
    shards.emplace(x, [&](int d) {
      const int src = source(d);
      return src < 0 ? std::vector<int>{} : std::vector<int>{src};
    });
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
    if (bytes > 0) std::memcpy(dst, shard_of(src), static_cast<std::size_t>(bytes));
    if (src != d) rec.bytes_in[static_cast<std::size_t>(d)] += bytes;
  });
  Array result = Array::from_buffers(x.executor(), x.shape(), x.dtype(), x.sharding(),
                                     std::move(out), x.pending());
  if (record) *record = std::move(rec);
  return result;
}

namespace {

// How a pending array is reduced on the way to `target`: the dimension to reduce-scatter into
// (and the axes in their order) when the target shards one dimension over exactly the pending
// axes after what it already has; -1 for an all-reduce.
std::pair<int, std::vector<std::string>> pending_route(const PartitionSpec& cur,
                                                       const Pending& pending,
                                                       const PartitionSpec& target, int rank) {
  const auto& pend = pending.axes;
  const auto cdims = padded_dims(cur, rank);
  const auto tdims = padded_dims(target, rank);
  for (int d = 0; d < rank; ++d) {
    const auto& ce = cdims[static_cast<std::size_t>(d)];
    const auto& te = tdims[static_cast<std::size_t>(d)];
    if (te.size() != ce.size() + pend.size() || !std::equal(ce.begin(), ce.end(), te.begin())) {
      continue;
    }
    std::vector<std::string> suffix(te.begin() + static_cast<std::ptrdiff_t>(ce.size()), te.end());
    if (std::is_permutation(suffix.begin(), suffix.end(), pend.begin(), pend.end())) {
      return {d, suffix};
    }
  }
  return {-1, {}};
}

// The name and axes of the move from `cur` to `target` (not equivalent, nothing pending).
std::pair<std::string, std::vector<std::string>> move_route(const PartitionSpec& cur,
                                                            const PartitionSpec& target, int rank) {
  const auto cdims = padded_dims(cur, rank);
  const auto tdims = padded_dims(target, rank);
  auto is_prefix = [](const AxisNames& a, const AxisNames& b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
  };
  bool refines = true, coarsens = true;
  std::vector<std::string> used_c, used_t, removed;
  for (int d = 0; d < rank; ++d) {
    const auto& ce = cdims[static_cast<std::size_t>(d)];
    const auto& te = tdims[static_cast<std::size_t>(d)];
    refines = refines && is_prefix(ce, te);
    coarsens = coarsens && is_prefix(te, ce);
    used_c.insert(used_c.end(), ce.begin(), ce.end());
    used_t.insert(used_t.end(), te.begin(), te.end());
    if (is_prefix(te, ce)) {
      removed.insert(removed.end(), ce.begin() + static_cast<std::ptrdiff_t>(te.size()), ce.end());
    }
  }
  if (refines) return {"slice", {}};
  if (coarsens) return {"all_gather", removed};
  if (std::is_permutation(used_c.begin(), used_c.end(), used_t.begin(), used_t.end())) {
    std::vector<std::string> axes;
    for (int d = 0; d < rank; ++d) {
      const auto& ce = cdims[static_cast<std::size_t>(d)];
      for (const auto& a : tdims[static_cast<std::size_t>(d)]) {
        if (std::find(ce.begin(), ce.end(), a) == ce.end()) axes.push_back(a);
      }
    }
    return {"all_to_all", axes};
  }
  return {"general", {}};
}

void check_reshard(const Mesh& mesh, const NamedSharding& target, const Shape& shape,
                   const std::string& what) {
  if (!(mesh == target.mesh())) {
    throw ArrayError(fmt::format(
        "[reshard] {} is on {} with devices {}; the new sharding is on {} with devices {} (reshard "
        "moves between shardings of one mesh)",
        what, mesh.to_string(), fmt::join(mesh.devices(), ","), target.mesh().to_string(),
        fmt::join(target.mesh().devices(), ",")));
  }
  target.spec().validate(target.mesh(), shape.rank(), "reshard");
  target.shard_shape(shape, "reshard");
}

// Bytes each device would receive moving from `from` to `target` (see move_to).
std::vector<std::int64_t> move_bytes(const Shape& shape, std::size_t elem,
                                     const NamedSharding& from, const NamedSharding& target) {
  const int rank = shape.rank();
  const Mesh& mesh = target.mesh();
  const auto tblocks = target.device_blocks(shape);
  const auto fblocks = from.device_blocks(shape);
  // The source's distinct blocks tile the array, one per replica group, and every device is in
  // exactly one group: what a device receives from the other groups is its target block less
  // the part its own source block already holds (tests check this against the sum over groups).
  std::vector<std::int64_t> bytes(tblocks.size(), 0);
  for (const int d : mesh.devices()) {
    const Block& bt = tblocks[static_cast<std::size_t>(d)];
    const Block& bs = fblocks[static_cast<std::size_t>(d)];
    std::int64_t whole = 1, own = 1;
    for (int k = 0; k < rank; ++k) {
      const auto i = static_cast<std::size_t>(k);
      whole *= bt[i].size;
      own *=
          std::max<std::int64_t>(0, std::min(bt[i].start + bt[i].size, bs[i].start + bs[i].size) -
                                        std::max(bt[i].start, bs[i].start));
    }
    bytes[static_cast<std::size_t>(d)] = (whole - own) * static_cast<std::int64_t>(elem);
  }
  return bytes;
}

}  // namespace

ReshardResult reshard(const Array& x, const NamedSharding& target) {
  check_reshard(x.mesh(), target, x.shape(), x.to_string());
  const int rank = x.shape().rank();
  ReshardResult result{x, {}};
  Array& cur = result.array;
  if (cur.is_pending()) {
    const auto [scatter_dim, order] =
        pending_route(cur.sharding().spec(), cur.pending(), target.spec(), rank);
    CollectiveRecord rec;
    cur = scatter_dim >= 0 ? reduce_scatter(cur, scatter_dim, order, &rec)
                           : all_reduce(cur, {}, &rec);
    result.steps.push_back(std::move(rec));
  }
  if (cur.sharding().is_equivalent_to(target, rank)) {
    // The same blocks, perhaps under another name (size-1 axes): no data moves.
    if (!(cur.sharding() == target)) cur = cur.relabel(target);
    return result;
  }
  auto [kind, axes] = move_route(cur.sharding().spec(), target.spec(), rank);
  CollectiveRecord rec = make_record(kind, axes, cur);
  cur = move_to(cur, target, rec);
  result.steps.push_back(std::move(rec));
  return result;
}

namespace {

/// The size of every device group over `axes` (each axis counted once).
std::int64_t group_size(const Mesh& mesh, const std::vector<std::string>& axes) {
  const std::vector<bool> varies = varying_axes(mesh, axes);
  std::int64_t n = 1;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (varies[static_cast<std::size_t>(i)]) n *= mesh.axis_sizes()[static_cast<std::size_t>(i)];
  }
  return n;
}

/// The index of `device` in device_group(mesh, device, axes) (which lists the group in mesh
/// order): its coordinates on the varying axes read as one mixed-radix number.
std::int64_t rank_in_group(const Mesh& mesh, int device, const std::vector<std::string>& axes) {
  const std::vector<bool> varies = varying_axes(mesh, axes);
  const auto coords = mesh.coords_of_position(mesh.position_of_device(device));
  std::int64_t r = 0;
  for (int i = 0; i < mesh.ndim(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (varies[k]) r = r * mesh.axis_sizes()[k] + coords[k];
  }
  return r;
}

}  // namespace

std::vector<CollectiveRecord> plan_reshard(const Shape& shape, DType dtype,
                                           const NamedSharding& from, const Pending& pending,
                                           const NamedSharding& target) {
  check_reshard(from.mesh(), target, shape, fmt::format("{}{}", name(dtype), shape.to_string()));
  byte_size(shape, dtype);  // the global bytes fit; so do a shard's and a device's traffic below
  const int rank = shape.rank();
  const std::size_t elem = size_of(dtype);
  const Mesh& mesh = from.mesh();
  const auto num =
      static_cast<std::size_t>(*std::max_element(mesh.devices().begin(), mesh.devices().end()) + 1);
  std::vector<CollectiveRecord> steps;
  NamedSharding cur = from;
  if (!pending.empty()) {
    const auto [scatter_dim, order] = pending_route(from.spec(), pending, target.spec(), rank);
    if (scatter_dim >= 0) {
      auto dims = padded_dims(from.spec(), rank);
      auto& e = dims[static_cast<std::size_t>(scatter_dim)];
      e.insert(e.end(), order.begin(), order.end());
      cur = NamedSharding(mesh, make_spec(dims));
      const std::int64_t shard = byte_size(cur.shard_shape(shape), dtype);
      CollectiveRecord rec{"reduce_scatter", order, std::vector<std::int64_t>(num, 0)};
      const std::int64_t n = group_size(mesh, order);  // every group has the same size
      for (const int d : mesh.devices())
        rec.bytes_in[static_cast<std::size_t>(d)] = (n - 1) * shard;
      steps.push_back(std::move(rec));
    } else {
      const std::int64_t total = from.shard_shape(shape).numel();
      CollectiveRecord rec{"all_reduce", pending.axes, std::vector<std::int64_t>(num, 0)};
      const std::int64_t n = group_size(mesh, pending.axes);
      for (const int d : mesh.devices()) {
        const std::int64_t r = rank_in_group(mesh, d, pending.axes);
        const std::int64_t chunk = chunk_start(r + 1, total, n) - chunk_start(r, total, n);
        // ((n - 1) * chunk + total - chunk) * elem: close to twice the shard's bytes, which may
        // not fit even though the shard does.
        std::int64_t in = 0;
        if (!detail::checked_mul(n - 1, chunk, &in) ||
            !detail::checked_add(in, total - chunk, &in) ||
            !detail::checked_mul(in, static_cast<std::int64_t>(elem), &in)) {
          throw SpecError(fmt::format(
              "[plan_reshard] bytes device {} receives in the all_reduce of {}{} overflow int64", d,
              name(dtype), shape.to_string()));
        }
        rec.bytes_in[static_cast<std::size_t>(d)] = in;
      }
      steps.push_back(std::move(rec));
    }
  }
  if (cur.is_equivalent_to(target, rank)) return steps;
  auto [kind, axes] = move_route(cur.spec(), target.spec(), rank);
  CollectiveRecord rec{kind, axes, move_bytes(shape, elem, cur, target)};
  rec.bytes_in.resize(num, 0);
  steps.push_back(std::move(rec));
  return steps;
}

}  // namespace shardplan
