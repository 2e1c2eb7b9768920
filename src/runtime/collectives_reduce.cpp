// The reductions of a pending array: all_reduce (reduce-scatter, then all-gather, inside each
// device group) and reduce_scatter.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "box_copy.hpp"
#include "collectives_impl.hpp"
#include "reduce.hpp"
#include "shardplan/error.hpp"

namespace shardplan {

using detail::allocate_like;
using detail::allocate_on;
using detail::chunk_start;
using detail::make_record;
using detail::make_spec;
using detail::padded_dims;
using detail::prepare_then_agree;
using detail::quoted;
using detail::ShardSource;
using detail::spans_processes;

namespace {

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

/// One all_reduce, in its steps: reduce-scatter inside each device group (the member of rank r
/// reduces chunk r of every member's shard into chunk r of its output), then all-gather inside
/// each group (every member copies every other reduced chunk). Each chunk is reduced in group
/// order, so the bits are the same every run. Over processes the same two phases run with the
/// chunks of other processes' members sent point to point (a message per chunk, listed in mesh
/// order then group order on both sides, so each pair of processes agrees on the order): the
/// additions of every element, and so the bits, are those of one process.
class AllReduce {
 public:
  AllReduce(const Array& x, std::vector<std::string> axes);
  /// Phase 1: allocates the output and the chunks received from other processes (all of it
  /// before the agreement, prepare_then_agree), exchanges them, reduces each device's chunk.
  void reduce_scatter();
  /// Phase 2: moves each reduced chunk to the other members of its group.
  void all_gather();
  /// The reduced array (pending over the axes not reduced) and the record.
  Array result(CollectiveRecord* record);

 private:
  std::size_t at(int d) const { return static_cast<std::size_t>(d); }
  /// Start of chunk r of a group of n (in elements), and its bytes.
  std::int64_t lo_of(std::size_t r, std::size_t n) const {
    return chunk_start(static_cast<std::int64_t>(r), total_, static_cast<std::int64_t>(n));
  }
  std::int64_t chunk_bytes(std::size_t r, std::size_t n) const {
    return (lo_of(r + 1, n) - lo_of(r, n)) * static_cast<std::int64_t>(elem_);
  }
  /// Where chunk `lo` lies in device d's output.
  std::byte* chunk(int d, std::int64_t lo) const {
    return out_[at(d)]->data() + lo * static_cast<std::int64_t>(elem_);
  }
  void prepare();
  void reduce_chunk(int d);
  void list_gather_messages();
  void gather_chunks(int d);

  const Array& x_;
  const std::vector<std::string> axes_;
  const Mesh& mesh_;
  const Executor& exec_;
  const std::size_t elem_;
  const std::int64_t total_;  // elements of a shard
  const bool remote_;         // the mesh spans processes
  CollectiveRecord rec_;
  std::vector<std::vector<int>> group_;  // by device: its group, in mesh order
  std::vector<std::size_t> rank_in_;     // by device: its rank in its group
  std::vector<std::shared_ptr<Buffer>> out_;
  std::vector<std::vector<std::shared_ptr<Buffer>>> received_;  // by reader, group order
  std::vector<std::vector<const std::byte*>> sources_;          // where each received chunk lies
  std::vector<char> in_place_;
  std::vector<distributed::Message> sends_, receives_;
  std::vector<int> holder_;  // by reducing member: the local device its chunk was received on
};

AllReduce::AllReduce(const Array& x, std::vector<std::string> axes)
    : x_(x),
      axes_(std::move(axes)),
      mesh_(x.mesh()),
      exec_(x.executor()),
      elem_(size_of(x.dtype())),
      total_(x.shard_shape().numel()),
      remote_(spans_processes(x)),
      rec_(make_record(CollectiveKind::kAllReduce, axes_, x)) {
  const auto n_dev = static_cast<std::size_t>(exec_.num_devices());
  group_.resize(n_dev);
  rank_in_.resize(n_dev);
  received_.resize(n_dev);
  sources_.resize(n_dev);
  in_place_.assign(n_dev, 0);
  holder_.assign(n_dev, -1);
  for (const int d : mesh_.devices()) {
    auto g = device_group(mesh_, d, axes_);
    rank_in_[at(d)] = static_cast<std::size_t>(std::find(g.begin(), g.end(), d) - g.begin());
    group_[at(d)] = std::move(g);
  }
}

void AllReduce::prepare() {
  out_ = allocate_like(x_, mesh_, total_ * static_cast<std::int64_t>(elem_));
  for (const int d : mesh_.devices()) {
    const auto& g = group_[at(d)];
    const std::size_t r = rank_in_[at(d)];
    const std::int64_t lo = lo_of(r, g.size());
    const std::int64_t bytes = chunk_bytes(r, g.size());
    if (exec_.is_local(d)) {
      received_[at(d)].resize(g.size());
      sources_[at(d)].resize(g.size());
    }
    if (!remote_ || bytes == 0) continue;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const int m = g[i];
      if (exec_.process_of(m) == exec_.process_of(d)) continue;
      if (exec_.is_local(m)) {
        sends_.push_back(
            {exec_.process_of(d),
             const_cast<std::byte*>(x_.shard(m).data()) + lo * static_cast<std::int64_t>(elem_),
             static_cast<std::size_t>(bytes)});
      } else if (exec_.is_local(d)) {
        // The first such chunk is received into d's output, where it is reduced in place.
        auto& in = received_[at(d)];
        std::byte* into = nullptr;
        if (!in_place_[at(d)]) {
          in_place_[at(d)] = 1;
          into = chunk(d, lo);
        } else {
          in[i] = allocate_on(exec_, d, bytes);
          rec_.staging_bytes[at(d)] += bytes;
          into = in[i]->data();
        }
        receives_.push_back({exec_.process_of(m), into, static_cast<std::size_t>(bytes)});
        sources_[at(d)][i] = into;
      }
    }
  }
}

void AllReduce::reduce_chunk(int d) {
  const auto& g = group_[at(d)];
  const auto& in = sources_[at(d)];
  const std::size_t r = rank_in_[at(d)];
  const std::int64_t lo = lo_of(r, g.size());
  const std::int64_t count = lo_of(r + 1, g.size()) - lo;
  std::vector<const std::byte*> parts;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (in[i] != nullptr) {
      parts.push_back(in[i]);
    } else if (exec_.is_local(g[i])) {
      parts.push_back(x_.shard(g[i]).data() + lo * static_cast<std::int64_t>(elem_));
    } else {
      parts.push_back(nullptr);  // an empty chunk of another process's member: nothing to read
    }
  }
  detail::reduce_into(x_.dtype(), x_.pending().op, parts, chunk(d, lo), count);
  rec_.bytes_in[at(d)] +=
      static_cast<std::int64_t>(g.size() - 1) * count * static_cast<std::int64_t>(elem_);
}

void AllReduce::reduce_scatter() {
  prepare_then_agree(x_, rec_.kind, [&] { prepare(); });
  if (remote_) distributed::exchange(sends_, receives_);
  exec_.run(mesh_.devices(), [&](int d) { reduce_chunk(d); });
  received_.clear();
}

// A chunk reduced on another process crosses once to each process holding members of its
// group, straight into the output of the first of them (in group order); the others copy it
// from there.
void AllReduce::list_gather_messages() {
  sends_.clear();
  receives_.clear();
  const int me = distributed::process_index();
  for (const int m : mesh_.devices()) {
    const auto& g = group_[at(m)];
    const std::size_t r = rank_in_[at(m)];
    const std::int64_t lo = lo_of(r, g.size());
    const std::int64_t bytes = chunk_bytes(r, g.size());
    if (bytes == 0) continue;
    std::vector<int> first(static_cast<std::size_t>(distributed::process_count()), -1);
    for (const int d : g) {
      if (first[static_cast<std::size_t>(exec_.process_of(d))] < 0)
        first[static_cast<std::size_t>(exec_.process_of(d))] = d;
    }
    const int owner = exec_.process_of(m);
    for (int p = 0; p < static_cast<int>(first.size()); ++p) {
      if (p == owner || first[static_cast<std::size_t>(p)] < 0) continue;
      if (owner == me) {
        sends_.push_back({p, chunk(m, lo), static_cast<std::size_t>(bytes)});
      } else if (p == me) {
        const int d = first[static_cast<std::size_t>(p)];
        holder_[at(m)] = d;
        receives_.push_back({owner, chunk(d, lo), static_cast<std::size_t>(bytes)});
      }
    }
  }
}

void AllReduce::gather_chunks(int d) {
  const auto& g = group_[at(d)];
  std::byte* dst = out_[at(d)]->data();
  for (std::size_t r = 0; r < g.size(); ++r) {
    const std::int64_t lo = lo_of(r, g.size());
    const std::int64_t bytes = chunk_bytes(r, g.size());
    if (bytes == 0) continue;
    const int m = g[r];
    if (m == d) continue;  // reduced here
    rec_.bytes_in[at(d)] += bytes;
    const int held = holder_[at(m)];
    if (held == d) continue;  // received here in place
    std::memcpy(dst + lo * static_cast<std::int64_t>(elem_), chunk(held >= 0 ? held : m, lo),
                static_cast<std::size_t>(bytes));
  }
}

void AllReduce::all_gather() {
  if (remote_) {
    list_gather_messages();
    distributed::exchange(sends_, receives_);
  }
  exec_.run(mesh_.devices(), [&](int d) { gather_chunks(d); });
}

Array AllReduce::result(CollectiveRecord* record) {
  Array reduced = Array::from_buffers(x_.executor(), x_.shape(), x_.dtype(), x_.sharding(),
                                      std::move(out_), remaining_pending(x_, axes_));
  if (record) *record = std::move(rec_);
  return reduced;
}

}  // namespace

namespace detail {

std::vector<std::int64_t> reduce_scatter_staging(const Shape& shape, DType dtype,
                                                 const NamedSharding& from,
                                                 const std::vector<std::string>& axes,
                                                 const std::function<int(int)>& process_of) {
  // As reduce_scatter's ShardSource: every member's whole shard, none placed.
  const Mesh& mesh = from.mesh();
  const auto reads =
      remote_reads(mesh, process_of, [&](int d) { return device_group(mesh, d, axes); }, nullptr);
  const auto devices =
      static_cast<std::size_t>(*std::max_element(mesh.devices().begin(), mesh.devices().end()) + 1);
  return staged_copies(reads, byte_size(from.shard_shape(shape), dtype), devices);
}

std::vector<std::int64_t> all_reduce_staging(const Shape& shape, DType dtype,
                                             const NamedSharding& from,
                                             const std::vector<std::string>& axes,
                                             const std::function<int(int)>& process_of) {
  // As AllReduce::prepare: device d reduces chunk r (its rank) of its group; of the members of
  // other processes, the first is received into d's output, each other one into a chunk staged.
  const Mesh& mesh = from.mesh();
  const std::int64_t total = from.shard_shape(shape).numel();
  const auto elem = static_cast<std::int64_t>(size_of(dtype));
  std::vector<std::int64_t> staged(
      static_cast<std::size_t>(*std::max_element(mesh.devices().begin(), mesh.devices().end()) + 1),
      0);
  for (const int d : mesh.devices()) {
    const std::vector<int> g = device_group(mesh, d, axes);
    const auto n = static_cast<std::int64_t>(g.size());
    const auto r = static_cast<std::int64_t>(std::find(g.begin(), g.end(), d) - g.begin());
    const std::int64_t bytes = (chunk_start(r + 1, total, n) - chunk_start(r, total, n)) * elem;
    const auto others = std::count_if(g.begin(), g.end(),
                                      [&](int m) { return process_of(m) != process_of(d); });
    if (bytes > 0 && others > 1) staged[static_cast<std::size_t>(d)] = (others - 1) * bytes;
  }
  return staged;
}

}  // namespace detail

Array all_reduce(const Array& x, const std::vector<std::string>& axes, CollectiveRecord* record) {
  AllReduce op(x, reduced_axes(x, axes, "all_reduce"));
  op.reduce_scatter();
  op.all_gather();
  return op.result(record);
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
  std::int64_t ways = 1;
  for (const auto& a : axes) ways *= x.mesh().axis_size(a);
  if (!detail::split_nests(x.shape()[dim], x.sharding().num_shards(dim), ways)) {
    throw SpecError(fmt::format(
        "[reduce_scatter] dim {} of {} ({} rows, padded) split further over {} gives blocks that "
        "do not lie inside the blocks each device holds now; all_reduce, then reshard",
        dim, x.to_string(), x.shape()[dim], quoted(axes)));
  }
  const NamedSharding target(x.mesh(), make_spec(dims), x.sharding().uneven());
  const Shape tshard = target.shard_shape(x.shape(), "reduce_scatter");
  const auto tblocks = target.device_blocks(x.shape());
  const std::size_t elem = size_of(x.dtype());
  const Mesh& mesh = x.mesh();
  CollectiveRecord rec = make_record(CollectiveKind::kReduceScatter, axes, x);
  std::vector<std::shared_ptr<Buffer>> out;
  std::optional<ShardSource> source;
  prepare_then_agree(x, rec.kind, [&] {
    out = allocate_like(x, mesh, tshard.numel() * static_cast<std::int64_t>(elem));
    source.emplace(x, [&](int d) { return device_group(mesh, d, axes); }, ShardSource::Place{},
                   &rec.staging_bytes);
  });
  source->exchange();
  const ShardSource& shard_of = *source;
  x.executor().run(mesh.devices(), [&](int d) {
    const auto g = device_group(mesh, d, axes);
    const Block& old_block = x.block(d);
    const Block& nb = tblocks[static_cast<std::size_t>(d)];
    // The new block's rows, reduced; a padded block's rows after them are zeros.
    std::vector<std::int64_t> offset(static_cast<std::size_t>(rank));
    std::vector<std::int64_t> rows(static_cast<std::size_t>(rank));
    std::int64_t valid = 1;
    for (int k = 0; k < rank; ++k) {
      const auto i = static_cast<std::size_t>(k);
      offset[i] = nb[i].start - old_block[i].start;
      rows[i] = nb[i].size;
      valid *= nb[i].size;
    }
    const std::vector<std::int64_t> zero(static_cast<std::size_t>(rank), 0);
    std::byte* dst = out[static_cast<std::size_t>(d)]->data();
    if (valid != tshard.numel()) {
      std::memset(dst, 0, static_cast<std::size_t>(tshard.numel()) * elem);
    }
    std::vector<const std::byte*> parts(g.size());
    detail::for_each_run(x.shard_shape().begin(), offset.data(), tshard.begin(), zero.data(),
                         rows.data(), rank, elem,
                         [&](std::int64_t s, std::int64_t t, std::int64_t bytes) {
                           for (std::size_t m = 0; m < g.size(); ++m) {
                             parts[m] = shard_of(g[m]) + s;
                           }
                           detail::reduce_into(x.dtype(), x.pending().op, parts, dst + t,
                                               bytes / static_cast<std::int64_t>(elem));
                         });
    rec.bytes_in[static_cast<std::size_t>(d)] +=
        static_cast<std::int64_t>(g.size() - 1) * valid * static_cast<std::int64_t>(elem);
  });
  Array result = Array::from_buffers(x.executor(), x.shape(), x.dtype(), target, std::move(out),
                                     remaining_pending(x, axes));
  if (record) *record = std::move(rec);
  return result;
}

}  // namespace shardplan
