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

/// A shard of another process that a process's devices read, and where it is received: on the
/// first of them in mesh order (`reader`), straight into that device's output (`placed`) when
/// it is the only reader there and the output can take it, else into a copy staged there.
struct RemoteRead {
  int shard = -1;
  int reader = -1;
  bool placed = false;
};

/// The one decision of what crosses processes, for the run (ShardSource) and the plan
/// (plan_reshard's staging_bytes): by process, the shards of other processes its devices read
/// (`reads(d)`: the devices whose shards device d reads), sorted by device, each with its
/// reader; `placeable(m, d)` (may be null: never) says whether shard m can be received into
/// device d's output.
std::vector<std::vector<RemoteRead>> remote_reads(const Mesh& mesh,
                                                  const std::function<int(int)>& process_of,
                                                  const std::function<std::vector<int>(int)>& reads,
                                                  const std::function<bool(int, int)>& placeable);

/// By device id (`devices` entries): the bytes of the copies `reads` stages, `shard_bytes` each.
std::vector<std::int64_t> staged_copies(const std::vector<std::vector<RemoteRead>>& reads,
                                        std::int64_t shard_bytes, std::size_t devices);

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
  /// The bytes of the copies go to `staged` (CollectiveRecord::staging_bytes), by device id.
  using Place = std::function<std::byte*(int m, int d)>;
  ShardSource(const Array& x, const std::function<std::vector<int>(int)>& reads,
              const Place& place, std::vector<std::int64_t>* staged);

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

/// By device id, the bytes each device stages over processes (`process_of`) in:
/// move_to from `from` to `target` (the copies of other processes' source shards);
std::vector<std::int64_t> move_staging(const Shape& shape, DType dtype, const NamedSharding& from,
                                       const NamedSharding& target,
                                       const std::function<int(int)>& process_of);
/// reduce_scatter over `axes` of an array sharded `from` (a copy of each other process's member
/// shard of the group);
std::vector<std::int64_t> reduce_scatter_staging(const Shape& shape, DType dtype,
                                                 const NamedSharding& from,
                                                 const std::vector<std::string>& axes,
                                                 const std::function<int(int)>& process_of);
/// all_reduce over `axes` (the chunks of other processes' members but the first, received in
/// the output).
std::vector<std::int64_t> all_reduce_staging(const Shape& shape, DType dtype,
                                             const NamedSharding& from,
                                             const std::vector<std::string>& axes,
                                             const std::function<int(int)>& process_of);

/// The data movement under all_gather, all_to_all and reshard: each device builds its block of
/// `target` from the source blocks that overlap it, reading its own buffer where it holds the
/// part and the nearest replica otherwise; only bytes read from other devices count (in `rec`).
Array move_to(const Array& x, const NamedSharding& target, CollectiveRecord& rec);

/// True when splitting a dimension of `n` rows cut into `outer` blocks further into `inner`
/// parts each (minor axes appended) keeps every new block inside the old one it refines: always
/// when the dimension divides, not always when padded (10 rows over 2 are blocks of 5, over 2 x
/// 4 blocks of 2, and block 3 [6:8] is not inside block 0 [0:5]).
bool split_nests(std::int64_t n, std::int64_t outer, std::int64_t inner);

/// Start of chunk r of `total` elements cut into n nearly equal chunks: floor(r * total / n),
/// written so that r * total is never formed (it can pass int64 for a large shard).
inline std::int64_t chunk_start(std::int64_t r, std::int64_t total, std::int64_t n) {
  return r * (total / n) + r * (total % n) / n;
}

}  // namespace shardplan::detail
