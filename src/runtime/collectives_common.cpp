// The collectives' shared helpers (collectives_impl.hpp) and CollectiveRecord.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
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
  return CollectiveRecord{
      kind, std::move(axes),
      std::vector<std::int64_t>(static_cast<std::size_t>(x.executor().num_devices()), 0)};
}

bool spans_processes(const Array& x) { return !x.executor().holds_all(x.mesh().devices()); }

ShardSource::ShardSource(const Array& x, const std::function<std::vector<int>(int)>& reads,
                         const Place& place)
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

std::string CollectiveRecord::to_string() const {
  return fmt::format("{} over {}{}: {} max per device, {} in all", shardplan::to_string(kind),
                     quoted(axes),
                     kind == CollectiveKind::kAllReduce ? " (reduce-scatter, then all-gather)" : "",
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

}  // namespace shardplan
