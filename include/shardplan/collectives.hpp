#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/collective_kind.hpp"

namespace shardplan {

/// What one collective (or one step of a reshard) did: its kind, the mesh axes it ran over, and
/// the bytes each device received from other devices (a device's own data costs nothing).
struct CollectiveRecord {
  CollectiveKind kind = CollectiveKind::kGeneral;
  std::vector<std::string> axes;
  /// By device id. When the mesh spans processes, each process counts its own devices only
  /// (the others' entries are 0): plan_reshard gives every device's figure without running.
  std::vector<std::int64_t> bytes_in;
  /// By device id: the bytes a device holds beside its output while the collective runs, to
  /// receive what other processes send it (a copy of a shard, a chunk of an all-reduce) when it
  /// cannot land in the output itself; freed when the collective returns. 0 when the mesh is in
  /// one process (every shard is read where it is). Counted, as bytes_in, for this process's
  /// devices by a run, and for every device by plan_reshard given the processes.
  std::vector<std::int64_t> staging_bytes;
  std::int64_t max_bytes_in() const;
  /// The most bytes a device stages (staging_bytes), 0 when none.
  std::int64_t max_staging_bytes() const;
  std::int64_t total_bytes_in() const;
  /// "all_gather over 'x': 384 B max per device, 1.50 KiB in all".
  std::string to_string() const;
};
std::ostream& operator<<(std::ostream& os, const CollectiveRecord& r);

/// The collectives, on arrays, over mesh axes (each runs in the device groups that differ only
/// along those axes). Each keeps the global value (but permute, which moves blocks) and, when
/// `record` is given, fills it. Errors (SpecError/ArrayError) name the array, the axes and why.

/// Gathers the dimensions `axes` shard: the result's spec no longer names them.
Array all_gather(const Array& x, const std::vector<std::string>& axes,
                 CollectiveRecord* record = nullptr);
/// Reduces a pending array over `axes` (all its pending axes when empty) with its pending op;
/// every device of a group ends with the reduced block. Reduce-scatter then all-gather inside
/// each group, each chunk reduced in group order, so results are bitwise the same every run.
Array all_reduce(const Array& x, const std::vector<std::string>& axes = {},
                 CollectiveRecord* record = nullptr);
/// Reduces a pending array over `axes` (all pending axes when empty) and leaves each device only
/// its part: dimension `dim` becomes sharded over those axes too (as minor axes of its entry).
Array reduce_scatter(const Array& x, int dim, const std::vector<std::string>& axes = {},
                     CollectiveRecord* record = nullptr);
/// Moves the sharding over `axes` from dimension `from_dim` (where they must be the minor axes of
/// its entry) to dimension `to_dim` (appended as its minor axes).
Array all_to_all(const Array& x, const std::vector<std::string>& axes, int from_dim, int to_dim,
                 CollectiveRecord* record = nullptr);
/// Collective permute along one mesh axis: for each (source, destination) pair of coordinates
/// along `axis`, the devices at the destination receive the blocks of the devices at the source
/// (other coordinates equal); devices no pair sends to hold zeros, as in lax.ppermute.
Array permute(const Array& x, const std::string& axis,
              const std::vector<std::pair<int, int>>& pairs, CollectiveRecord* record = nullptr);

/// What reshard did: the array, and the collectives it ran, in order.
struct ReshardResult {
  Array array;
  std::vector<CollectiveRecord> steps;
  std::int64_t max_bytes_in() const;
};

/// The array with another sharding of the same mesh, by the cheapest route: nothing when
/// equivalent; a local slice when only splitting further (no data moves); all-gather when only
/// merging; all-to-all when a split moves from one dimension to another; reduce-scatter or
/// all-reduce first for a pending array; otherwise one general step in which each device
/// fetches only the parts of its new block it does not hold. Throws ArrayError for another mesh
/// or device order, SpecError for a shape the new sharding cannot split.
ReshardResult reshard(const Array& x, const NamedSharding& target);

/// What reshard() would run for an array of this shape, dtype, sharding and pending state,
/// without running it: its steps and the bytes each device would receive (for costing programs
/// too large to run here). With `devices_per_process` > 0 the mesh's devices are held by
/// processes of that many consecutive device ids each (an Executor over processes:
/// Executor::process_of), and each step also gives the bytes each device stages
/// (CollectiveRecord::staging_bytes), as reshard() allocates them there; 0: one process holds
/// every device, nothing is staged. Throws as reshard.
std::vector<CollectiveRecord> plan_reshard(const Shape& shape, DType dtype,
                                           const NamedSharding& from, const Pending& pending,
                                           const NamedSharding& target,
                                           int devices_per_process = 0);

/// Throws ArrayError naming both when `a` and `b` are on different executors, meshes or device
/// orders (what an operation on both requires), `where` naming the operation.
void check_same_placement(const Array& a, const Array& b, std::string_view where);

}  // namespace shardplan
