// The collectives' shared helpers (collectives_impl.hpp) and CollectiveRecord.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

#include "collectives_impl.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan {
namespace detail {

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

PartitionSpec make_spec(std::vector<AxisNames> dims) {
  while (!dims.empty() && dims.back().empty()) dims.pop_back();
  return PartitionSpec(std::move(dims));
}

bool split_nests(std::int64_t n, std::int64_t outer, std::int64_t inner) {
  for (std::int64_t j = 0; j < outer * inner; ++j) {
    const DimSlice part = split_block(n, outer * inner, j);
    const DimSlice whole = split_block(n, outer, j / inner);
    if (part.size > 0 &&
        (part.start < whole.start || part.start + part.size > whole.start + whole.size)) {
      return false;
    }
  }
  return true;
}

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

CollectiveRecord make_record(CollectiveKind kind, std::vector<std::string> axes, const Array& x) {
  const auto n = static_cast<std::size_t>(x.executor().num_devices());
  return CollectiveRecord{kind, std::move(axes), std::vector<std::int64_t>(n, 0),
                          std::vector<std::int64_t>(n, 0)};
}

bool spans_processes(const Array& x) { return !x.executor().holds_all(x.mesh().devices()); }

std::vector<std::vector<RemoteRead>> remote_reads(
    const Mesh& mesh, const std::function<int(int)>& process_of,
    const std::function<std::vector<int>(int)>& reads,
    const std::function<bool(int, int)>& placeable) {
  int processes = 0;
  for (const int d : mesh.devices()) processes = std::max(processes, process_of(d) + 1);
  // By process: each shard of another process its devices read, with its first reader there
  // (mesh order) and how many of its devices read it.
  std::vector<std::map<int, std::pair<int, int>>> read(static_cast<std::size_t>(processes));
  for (const int d : mesh.devices()) {
    const int p = process_of(d);
    for (const int m : reads(d)) {
      if (process_of(m) == p) continue;
      auto [it, fresh] = read[static_cast<std::size_t>(p)].try_emplace(m, d, 0);
      ++it->second.second;
    }
  }
  std::vector<std::vector<RemoteRead>> out(static_cast<std::size_t>(processes));
  for (std::size_t p = 0; p < read.size(); ++p) {
    for (const auto& [m, first] : read[p]) {
      const auto [reader, readers] = first;
      out[p].push_back(
          RemoteRead{m, reader, readers == 1 && placeable != nullptr && placeable(m, reader)});
    }
  }
  return out;
}

std::vector<std::int64_t> staged_copies(const std::vector<std::vector<RemoteRead>>& reads,
                                        std::int64_t shard_bytes, std::size_t devices) {
  std::vector<std::int64_t> staged(devices, 0);
  for (const auto& of_process : reads) {
    for (const RemoteRead& r : of_process) {
      if (!r.placed) staged[static_cast<std::size_t>(r.reader)] += shard_bytes;
    }
  }
  return staged;
}

ShardSource::ShardSource(const Array& x, const std::function<std::vector<int>(int)>& reads,
                         const Place& place, std::vector<std::int64_t>* staged)
    : x_(x) {
  if (!spans_processes(x)) return;
  const Executor& e = x.executor();
  const int me = distributed::process_index();
  const std::int64_t bytes = x.shard_nbytes();
  const auto process_of = [&](int d) { return e.process_of(d); };
  // Where another process's reader receives changes nothing here (it sends the same): only this
  // process's outputs are asked.
  const auto all = remote_reads(
      x.mesh(), process_of, reads,
      place ? std::function<bool(int, int)>(
                  [&](int m, int d) { return e.is_local(d) && place(m, d) != nullptr; })
            : nullptr);
  remote_.resize(static_cast<std::size_t>(e.num_devices()));
  placed_.assign(static_cast<std::size_t>(e.num_devices()), 0);
  if (bytes == 0) return;
  for (const RemoteRead& r : all[static_cast<std::size_t>(me)]) {
    std::byte* into = nullptr;
    if (r.placed) {
      into = place(r.shard, r.reader);
      placed_[static_cast<std::size_t>(r.shard)] = 1;
    } else {
      auto& copy = remote_[static_cast<std::size_t>(r.shard)];
      copy = allocate_on(e, r.reader, bytes);
      if (staged != nullptr) {
        if (staged->size() <= static_cast<std::size_t>(r.reader)) {
          staged->resize(static_cast<std::size_t>(r.reader) + 1, 0);
        }
        (*staged)[static_cast<std::size_t>(r.reader)] += bytes;
      }
      into = copy->data();
    }
    receives_.push_back({e.process_of(r.shard), into, static_cast<std::size_t>(bytes)});
  }
  for (std::size_t p = 0; p < all.size(); ++p) {
    if (static_cast<int>(p) == me) continue;
    for (const RemoteRead& r : all[p]) {
      if (e.process_of(r.shard) != me) continue;
      sends_.push_back({static_cast<int>(p), const_cast<std::byte*>(x.shard(r.shard).data()),
                        static_cast<std::size_t>(bytes)});
    }
  }
}

}  // namespace detail

using detail::quoted;

namespace {

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

std::int64_t CollectiveRecord::max_staging_bytes() const {
  return staging_bytes.empty() ? 0 : *std::max_element(staging_bytes.begin(), staging_bytes.end());
}

std::string CollectiveRecord::to_string() const {
  const std::int64_t staged = max_staging_bytes();
  return fmt::format("{} over {}{}: {} max per device, {} in all{}", shardplan::to_string(kind),
                     quoted(axes),
                     kind == CollectiveKind::kAllReduce ? " (reduce-scatter, then all-gather)" : "",
                     format_bytes(max_bytes_in()), format_bytes(total_bytes_in()),
                     staged > 0 ? fmt::format(", {} staged at most", format_bytes(staged))
                                : std::string());
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

}  // namespace shardplan
