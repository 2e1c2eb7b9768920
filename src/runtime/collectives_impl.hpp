#pragma once
// What the collectives share (private to src/runtime): axis lists for messages, specs from
// per-dimension entries, the buffers a collective allocates, its record, the agreement over
// processes before any shard crosses, the shards a collective reads (ShardSource), and the data
// movement under all_gather, all_to_all and reshard (move_to). The collectives themselves:
// collectives.cpp (all_gather, all_to_all, permute, move_to), collectives_reduce.cpp
// (all_reduce, reduce_scatter), reshard.cpp (reshard, plan_reshard), collectives_common.cpp
// (these helpers, CollectiveRecord).

#include <fmt/format.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardplan/collectives.hpp"
#include "shardplan/detail/agreement.hpp"
#include "shardplan/distributed.hpp"

namespace shardplan::detail {

/// "'x', 'y'", or "no axes".
std::string quoted(const std::vector<std::string>& axes);

/// The spec's per-dimension entries, padded with unsharded ones to `rank`.
std::vector<AxisNames> padded_dims(const PartitionSpec& spec, int rank);

/// A spec from per-dimension entries, without trailing unsharded ones (P('x'), not
/// P('x', None)).
PartitionSpec make_spec(std::vector<AxisNames> dims);

/// A buffer a collective allocates (an output shard, a buffer it receives into).
std::shared_ptr<Buffer> allocate_on(const Executor& e, int d, std::int64_t bytes);

/// A buffer of `bytes` on each of this process's devices of `mesh` (null for the others).
std::vector<std::shared_ptr<Buffer>> allocate_like(const Array& x, const Mesh& mesh,
                                                   std::int64_t bytes);

/// A record of `kind` over `axes` with no bytes received yet, one entry per device of x's
/// executor.
CollectiveRecord make_record(CollectiveKind kind, std::vector<std::string> axes, const Array& x);

/// True when some device of the array's mesh is held by another process.
bool spans_processes(const Array& x);

/// Over processes, a collective first prepares what may fail on one process only (its output
/// and the buffers it receives into: an out-of-memory), then every process agrees that every
/// process prepared (distributed::detail::agree: one all-gather of a number each) before any
/// shard crosses. So a failure on one process is a DistributedError naming it on every process,
/// not the others waiting in the exchange. A program that holds the failure of an earlier step
/// joins this agreement in place of the collective (Program::run). In one process `prepare`
/// runs as it is and its errors keep their type.
template <class Prepare>
void prepare_then_agree(const Array& x, CollectiveKind kind, const Prepare& prepare) {
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
  distributed::detail::agree(
      failed, failed ? fmt::format("[{}] of {}", to_string(kind), x.to_string()) : "");
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
              const Place& place = {});

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

/// The data movement under all_gather, all_to_all and reshard: each device builds its block of
/// `target` from the source blocks that overlap it, reading its own buffer where it holds the
/// part and the nearest replica otherwise; only bytes read from other devices count (in `rec`).
Array move_to(const Array& x, const NamedSharding& target, CollectiveRecord& rec);

/// Start of chunk r of `total` elements cut into n nearly equal chunks: floor(r * total / n),
/// written so that r * total is never formed (it can pass int64 for a large shard).
inline std::int64_t chunk_start(std::int64_t r, std::int64_t total, std::int64_t n) {
  return r * (total / n) + r * (total % n) / n;
}

}  // namespace shardplan::detail
