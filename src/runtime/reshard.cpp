// reshard (the cheapest route from one sharding to another) and plan_reshard (what it would run,
// and the bytes each device would receive, without running it): one routing serves both.
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "collectives_impl.hpp"
#include "reshard_timed.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"

namespace shardplan {

using detail::chunk_start;
using detail::make_record;
using detail::make_spec;
using detail::move_to;
using detail::padded_dims;

namespace {

// How a pending array is reduced on the way to `target`: reduce-scatters, each into one
// dimension over the pending axes the target appends to that dimension after what it already
// has (their order as the target's): Megatron x FSDP's gradient, pending over (fsdp, tp) and
// sharded [tp, fsdp], is two reduce-scatters, not an all-reduce and a slice. The pending axes
// no scatter covers are all-reduced afterwards, on the scattered parts (HSDP's gradient,
// pending over (replicate, shard) and sharded over shard: a reduce-scatter in each shard group,
// then an all-reduce of the shard across the replicas, as FSDP's HYBRID_SHARD runs it).
// A dimension whose padded blocks would not nest (detail::split_nests) is not scattered into:
// its pending axes are all-reduced and the move after places the rows.
std::vector<std::pair<int, std::vector<std::string>>> pending_route(const Mesh& mesh,
                                                                    const PartitionSpec& cur,
                                                                    const Pending& pending,
                                                                    const PartitionSpec& target,
                                                                    const Shape& shape) {
  const int rank = shape.rank();
  const auto& pend = pending.axes;
  const auto cdims = padded_dims(cur, rank);
  const auto tdims = padded_dims(target, rank);
  std::vector<std::pair<int, std::vector<std::string>>> route;
  for (int d = 0; d < rank; ++d) {
    const auto& ce = cdims[static_cast<std::size_t>(d)];
    const auto& te = tdims[static_cast<std::size_t>(d)];
    if (te.size() <= ce.size() || !std::equal(ce.begin(), ce.end(), te.begin())) continue;
    std::vector<std::string> suffix(te.begin() + static_cast<std::ptrdiff_t>(ce.size()), te.end());
    const bool all_pending = std::all_of(suffix.begin(), suffix.end(), [&](const std::string& a) {
      return std::find(pend.begin(), pend.end(), a) != pend.end();
    });
    if (!all_pending) continue;
    std::int64_t outer = 1, inner = 1;
    for (const auto& a : ce) outer *= mesh.axis_size(a);
    for (const auto& a : suffix) inner *= mesh.axis_size(a);
    if (!detail::split_nests(shape[d], outer, inner)) continue;
    route.emplace_back(d, std::move(suffix));
  }
  // The innermost axes first (the mesh's last: a node's fast links when devices are laid out
  // row-major), so that most of the bytes move there; the bytes in all are the same either way.
  const auto innermost = [&](const std::vector<std::string>& axes) {
    int i = -1;
    for (const std::string& a : axes) i = std::max(i, mesh.axis_index(a));
    return i;
  };
  std::stable_sort(route.begin(), route.end(), [&](const auto& x, const auto& y) {
    return innermost(x.second) > innermost(y.second);
  });
  return route;
}

// The name and axes of the move from `cur` to `target` (not equivalent, nothing pending).
std::pair<CollectiveKind, std::vector<std::string>> move_route(const PartitionSpec& cur,
                                                               const PartitionSpec& target,
                                                               int rank) {
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
  if (refines) return {CollectiveKind::kSlice, {}};
  if (coarsens) return {CollectiveKind::kAllGather, removed};
  if (std::is_permutation(used_c.begin(), used_c.end(), used_t.begin(), used_t.end())) {
    std::vector<std::string> axes;
    for (int d = 0; d < rank; ++d) {
      const auto& ce = cdims[static_cast<std::size_t>(d)];
      for (const auto& a : tdims[static_cast<std::size_t>(d)]) {
        if (std::find(ce.begin(), ce.end(), a) == ce.end()) axes.push_back(a);
      }
    }
    return {CollectiveKind::kAllToAll, axes};
  }
  return {CollectiveKind::kGeneral, {}};
}

// `what` names the array in the error (a function: the check runs on every plan_reshard, the
// message is made only on failure).
template <class What>
void check_reshard(const Mesh& mesh, const NamedSharding& target, const Shape& shape,
                   const What& what) {
  if (!(mesh == target.mesh())) {
    throw ArrayError(fmt::format(
        "[reshard] {} is on {} with devices {}; the new sharding is on {} with devices {} (reshard "
        "moves between shardings of one mesh)",
        what(), mesh.to_string(), fmt::join(mesh.devices(), ","), target.mesh().to_string(),
        fmt::join(target.mesh().devices(), ",")));
  }
  target.spec().validate(target.mesh(), shape.rank(), "reshard");
  target.shard_shape(shape, "reshard");
}

// Where a sharding puts each device's block, read from the device's mesh coordinates without
// making every device's Block (device_blocks): per dimension, its rows, its number of blocks and
// the mesh axes that split it, major first.
class BlockStarts {
 public:
  BlockStarts(const NamedSharding& s, const Shape& shape)
      : mesh_(s.mesh()), shape_(shape), axes_(static_cast<std::size_t>(shape.rank())) {
    s.shard_shape(shape);  // validates the rank and divisibility
    const PartitionSpec& spec = s.spec();
    for (int d = 0; d < spec.size() && d < shape.rank(); ++d) {
      for (const auto& a : spec[d])
        axes_[static_cast<std::size_t>(d)].push_back(mesh_.axis_index(a));
    }
  }
  // The rows along dimension `d` of the block of the device at mesh coordinates `coords`
  // (NamedSharding::device_blocks: the block index is the coordinates on the dimension's axes
  // read as one mixed-radix number; split_block places it).
  DimSlice slice(const std::vector<std::int64_t>& coords, int d) const {
    std::int64_t idx = 0, blocks = 1;
    for (const int id : axes_[static_cast<std::size_t>(d)]) {
      const std::int64_t size = mesh_.axis_sizes()[static_cast<std::size_t>(id)];
      idx = idx * size + coords[static_cast<std::size_t>(id)];
      blocks *= size;
    }
    return split_block(shape_[d], blocks, idx);
  }
  // The elements of that device's block (its valid rows only).
  std::int64_t numel(const std::vector<std::int64_t>& coords) const {
    std::int64_t n = 1;
    for (int d = 0; d < shape_.rank(); ++d) n *= slice(coords, d).size;
    return n;
  }

 private:
  const Mesh& mesh_;
  Shape shape_;
  std::vector<std::vector<int>> axes_;
};

// Calls f(device, coords) for every device of `mesh`, in mesh order, its coordinates counted up
// in place (Mesh::coords_of_position of each position, without a vector per device).
template <class F>
void for_each_device(const Mesh& mesh, F&& f) {
  const auto& sizes = mesh.axis_sizes();
  std::vector<std::int64_t> coords(sizes.size(), 0);
  for (const int device : mesh.devices()) {
    f(device, coords);
    for (std::size_t i = sizes.size(); i-- > 0;) {
      if (++coords[i] < sizes[i]) break;
      coords[i] = 0;
    }
  }
}

// Bytes each device would receive moving from `from` to `target` (see move_to).
std::vector<std::int64_t> move_bytes(const Shape& shape, std::size_t elem,
                                     const NamedSharding& from, const NamedSharding& target) {
  const int rank = shape.rank();
  const Mesh& mesh = target.mesh();
  const BlockStarts tblocks(target, shape);
  const BlockStarts fblocks(from, shape);
  // The source's distinct blocks tile the array, one per replica group, and every device is in
  // exactly one group: what a device receives from the other groups is its target block less
  // the part its own source block already holds (tests check this against the sum over groups).
  std::vector<std::int64_t> bytes(static_cast<std::size_t>(mesh.size()), 0);
  for_each_device(mesh, [&](int d, const std::vector<std::int64_t>& coords) {
    std::int64_t whole = 1, own = 1;
    for (int k = 0; k < rank; ++k) {
      const auto [ts, tn] = tblocks.slice(coords, k);
      const auto [fs, fn] = fblocks.slice(coords, k);
      whole *= tn;
      own *= std::max<std::int64_t>(0, std::min(ts + tn, fs + fn) - std::max(ts, fs));
    }
    bytes[static_cast<std::size_t>(d)] = (whole - own) * static_cast<std::int64_t>(elem);
  });
  return bytes;
}

/// The size of every device group over `axes` (each axis counted once).
std::int64_t group_size(const Mesh& mesh, const std::vector<bool>& varies) {
  std::int64_t n = 1;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (varies[static_cast<std::size_t>(i)]) n *= mesh.axis_sizes()[static_cast<std::size_t>(i)];
  }
  return n;
}
std::int64_t group_size(const Mesh& mesh, const std::vector<std::string>& axes) {
  return group_size(mesh, varying_axes(mesh, axes));
}

/// The index of a device in device_group(mesh, device, axes) (which lists the group in mesh
/// order): its coordinates on the varying axes read as one mixed-radix number.
std::int64_t rank_in_group(const Mesh& mesh, const std::vector<std::int64_t>& coords,
                           const std::vector<bool>& varies) {
  std::int64_t r = 0;
  for (int i = 0; i < mesh.ndim(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (varies[k]) r = r * mesh.axis_sizes()[k] + coords[k];
  }
  return r;
}

}  // namespace

namespace {

// reshard(), with `clock` (when given) read after each collective into `spans`.
ReshardResult reshard_with(const Array& x, const NamedSharding& target, std::int64_t (*clock)(),
                           std::vector<detail::StepSpan>* spans) {
  check_reshard(x.mesh(), target, x.shape(), [&] { return x.to_string(); });
  const int rank = x.shape().rank();
  ReshardResult result{x, {}};
  Array& cur = result.array;
  if (spans != nullptr) spans->clear();
  std::int64_t began = clock != nullptr ? clock() : 0;
  const auto note = [&] {
    if (clock == nullptr || spans == nullptr) return;
    const std::int64_t now = clock();
    spans->emplace_back(began, now);
    began = now;
  };
  if (cur.is_pending()) {
    // Scattered onto a padded target, the sum is scattered padded (its blocks now divide: the
    // same under either policy), as plan_reshard routes it.
    if (target.uneven() == Uneven::kPad && cur.sharding().uneven() != Uneven::kPad) {
      cur = cur.relabel(cur.sharding().with_uneven(Uneven::kPad));
    }
    const auto route =
        pending_route(cur.mesh(), cur.sharding().spec(), cur.pending(), target.spec(), x.shape());
    for (const auto& [dim, order] : route) {
      CollectiveRecord rec;
      cur = reduce_scatter(cur, dim, order, &rec);
      result.steps.push_back(std::move(rec));
      note();
    }
    if (cur.is_pending()) {  // the axes no target dimension is split over, on the scattered parts
      CollectiveRecord rec;
      cur = all_reduce(cur, {}, &rec);
      result.steps.push_back(std::move(rec));
      note();
    }
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
  note();
  return result;
}

}  // namespace

ReshardResult reshard(const Array& x, const NamedSharding& target) {
  return reshard_with(x, target, nullptr, nullptr);
}

ReshardResult detail::reshard_timed(const Array& x, const NamedSharding& target,
                                    std::int64_t (*clock)(), std::vector<StepSpan>& spans) {
  return reshard_with(x, target, clock, &spans);
}

std::vector<CollectiveRecord> plan_reshard(const Shape& shape, DType dtype,
                                           const NamedSharding& from, const Pending& pending,
                                           const NamedSharding& target, int devices_per_process) {
  check_reshard(from.mesh(), target, shape,
                [&] { return fmt::format("{}{}", name(dtype), shape.to_string()); });
  byte_size(shape, dtype);  // the global bytes fit; so do a shard's and a device's traffic below
  const int rank = shape.rank();
  const std::size_t elem = size_of(dtype);
  const Mesh& mesh = from.mesh();
  const auto num =
      static_cast<std::size_t>(*std::max_element(mesh.devices().begin(), mesh.devices().end()) + 1);
  std::vector<CollectiveRecord> steps;
  // Over processes, what each step stages (the collectives' own rule, collectives_impl.hpp).
  const std::function<int(int)> process_of = [&](int d) { return d / devices_per_process; };
  const auto staging = [&](CollectiveRecord& rec, const auto& bytes_of) {
    rec.staging_bytes = devices_per_process > 0 ? bytes_of() : std::vector<std::int64_t>();
    rec.staging_bytes.resize(num, 0);
  };
  NamedSharding cur = from;
  if (!pending.empty()) {
    if (target.uneven() == Uneven::kPad) cur = cur.with_uneven(Uneven::kPad);  // as reshard()
    const auto route = pending_route(mesh, from.spec(), pending, target.spec(), shape);
    for (const auto& [scatter_dim, order] : route) {
      const NamedSharding before = cur;
      auto dims = padded_dims(cur.spec(), rank);
      auto& e = dims[static_cast<std::size_t>(scatter_dim)];
      e.insert(e.end(), order.begin(), order.end());
      cur = NamedSharding(mesh, make_spec(dims), cur.uneven());
      byte_size(cur.shard_shape(shape), dtype);  // a shard fits in int64; its rows do too
      CollectiveRecord rec{CollectiveKind::kReduceScatter, order,
                           std::vector<std::int64_t>(num, 0)};
      const std::int64_t n = group_size(mesh, order);  // every group has the same size
      const BlockStarts blocks(cur, shape);            // each device reduces its new block's rows
      for_each_device(mesh, [&](int d, const std::vector<std::int64_t>& coords) {
        rec.bytes_in[static_cast<std::size_t>(d)] =
            (n - 1) * blocks.numel(coords) * static_cast<std::int64_t>(elem);
      });
      staging(rec, [&, &axes = rec.axes] {  // (a lambda may not capture a structured binding)
        return detail::reduce_scatter_staging(shape, dtype, before, axes, process_of);
      });
      steps.push_back(std::move(rec));
    }
    // The pending axes no target dimension is split over: all-reduced after the scatters, on
    // the parts they leave (HSDP: a reduce-scatter in the shard group, then an all-reduce of
    // the shard across the replicas).
    std::vector<std::string> rest;
    for (const std::string& a : pending.axes) {
      const bool scattered = std::any_of(route.begin(), route.end(), [&](const auto& r) {
        return std::find(r.second.begin(), r.second.end(), a) != r.second.end();
      });
      if (!scattered) rest.push_back(a);
    }
    if (!rest.empty()) {
      const std::int64_t total = cur.shard_shape(shape).numel();
      CollectiveRecord rec{CollectiveKind::kAllReduce, rest, std::vector<std::int64_t>(num, 0)};
      const std::vector<bool> varies = varying_axes(mesh, rest);
      const std::int64_t n = group_size(mesh, varies);
      for_each_device(mesh, [&](int d, const std::vector<std::int64_t>& coords) {
        const std::int64_t r = rank_in_group(mesh, coords, varies);
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
      });
      staging(rec, [&] {
        return detail::all_reduce_staging(shape, dtype, cur, rest, process_of);
      });
      steps.push_back(std::move(rec));
    }
  }
  if (cur.is_equivalent_to(target, rank)) return steps;
  auto [kind, axes] = move_route(cur.spec(), target.spec(), rank);
  CollectiveRecord rec{kind, axes, move_bytes(shape, elem, cur, target)};
  rec.bytes_in.resize(num, 0);
  staging(rec, [&] { return detail::move_staging(shape, dtype, cur, target, process_of); });
  steps.push_back(std::move(rec));
  return steps;
}

}  // namespace shardplan
