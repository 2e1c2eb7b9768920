#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/mesh.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/shape.hpp"

namespace shardplan {

/// The part of one dimension a device holds: [start, start + size).
struct DimSlice {
  std::int64_t start = 0;
  std::int64_t size = 0;
  friend bool operator==(const DimSlice&, const DimSlice&) = default;
  /// "[start:start+size]", the Python slice it stands for.
  friend std::ostream& operator<<(std::ostream& os, const DimSlice& s) {
    return os << "[" << s.start << ":" << s.start + s.size << "]";
  }
};

/// A device's block of a global array: one DimSlice per dimension (the rows it holds that are
/// part of the array; a padded block's buffer is larger, see Uneven).
using Block = std::vector<DimSlice>;

/// What a sharding does with a dimension of n that its mesh axes (k blocks) do not divide.
enum class Uneven {
  /// A SpecError naming the path, shape, dimension and axes (the default: the planner, sjit
  /// and shard_map take only shardings that divide).
  kRefuse,
  /// JAX's split: blocks of b = ceil(n/k) rows; block i holds the valid rows
  /// [i*b, min(n, (i+1)*b)) at the front of a buffer of b rows, zeros after them, so the last
  /// blocks hold fewer rows (possibly none). The runtime (device_put, to_host, reshard, the
  /// collectives) and checkpoints take these; docs/runtime.md "Padded shards".
  kPad,
};

/// Block `index` of a dimension of `n` cut into `k` blocks of ceil(n/k) (JAX's split; the
/// blocks of a dimension that divides are its n/k equal parts): start index * ceil(n/k), the
/// valid rows up to n (none when it starts past n).
DimSlice split_block(std::int64_t n, std::int64_t k, std::int64_t index);

/// A mesh plus a PartitionSpec, as jax.sharding.NamedSharding: says which block of a global array
/// each device holds. A plain value type; copies share the immutable state.
class NamedSharding {
 public:
  /// Throws SpecError for an unknown axis or an axis used twice (the rank is checked later).
  /// `uneven` says whether a dimension the axes do not divide is refused or padded.
  NamedSharding(Mesh mesh, PartitionSpec spec, Uneven uneven = Uneven::kRefuse);

  const Mesh& mesh() const { return impl_->mesh; }
  const PartitionSpec& spec() const { return impl_->spec; }
  Uneven uneven() const { return impl_->uneven; }
  /// The same mesh and spec with another Uneven policy.
  NamedSharding with_uneven(Uneven uneven) const { return {mesh(), spec(), uneven}; }

  /// Number of blocks dimension `dim` is cut into (the product of its axes' sizes).
  std::int64_t num_shards(int dim) const;
  /// True when some sharded dimension of `global` does not divide (its blocks are padded).
  bool is_padded(const Shape& global) const;
  /// Throws SpecError when a dimension of `global` does not divide, whatever uneven() says (for
  /// layers that do not take padded shards yet): "[where] dim 1 of 'path' (shape [4096, 11006])
  /// is not divisible by mesh axis 'tp' (size 8); 11006 is not a multiple of 8", then `note`.
  void check_divides(const Shape& global, std::string_view where, std::string_view path = {},
                     std::string_view note = {}) const;
  /// The shape of each device's block (its buffer): global / k per dimension, ceil(global / k)
  /// when padded. Throws SpecError when the spec has more entries than the shape's rank, or a
  /// dimension does not divide and uneven() is kRefuse; the message names `path`, the shape,
  /// the dimension, the axes and their sizes.
  Shape shard_shape(const Shape& global, std::string_view path = {}) const;
  /// Bytes each device holds of a tensor of this shape with `element_size`-byte elements.
  /// Throws as shard_shape, and SpecError naming `path` and the shapes when they pass int64.
  std::int64_t shard_bytes(const Shape& global, std::size_t element_size,
                           std::string_view path = {}) const;
  /// The block of each device (its valid rows, split_block), indexed by device id. Throws as
  /// shard_shape.
  std::vector<Block> device_blocks(const Shape& global) const;
  /// Groups of device ids that hold the same block (replicas), each sorted, ordered by the
  /// first device of the group. Throws as shard_shape.
  std::vector<std::vector<int>> replica_groups(const Shape& global) const;
  /// Number of devices holding each block (the mesh size over the number of distinct blocks).
  std::int64_t replication_factor() const;
  /// True when both place every element of a rank-`rank` array on the same devices (same mesh,
  /// and the same specs once padded to `rank` and with size-1 axes dropped; the Uneven policy
  /// is not compared).
  bool is_equivalent_to(const NamedSharding& other, int rank) const;
  /// A picture of the blocks of a 1-D or 2-D array, each labelled with its devices, like
  /// jax.debug.visualize_array_sharding. Throws SpecError for other ranks.
  std::string visualize(const Shape& global) const;

  /// "NamedSharding(mesh=Mesh('x': 4, 'y': 2), spec=PartitionSpec('x', 'y'))", with
  /// ", uneven=pad" before the ")" for a padding sharding.
  std::string to_string() const;

  friend bool operator==(const NamedSharding& a, const NamedSharding& b) {
    return a.impl_ == b.impl_ ||
           (a.mesh() == b.mesh() && a.spec() == b.spec() && a.uneven() == b.uneven());
  }

 private:
  // For the device at mesh position `pos`, the index of its block along dimension `dim`.
  std::int64_t block_index(const std::vector<std::int64_t>& coords, int dim) const;

  struct Impl {
    Mesh mesh;
    PartitionSpec spec;
    Uneven uneven;
    std::vector<std::vector<int>> axis_ids;  // per spec entry, the mesh axis indices
  };
  std::shared_ptr<const Impl> impl_;
};

std::ostream& operator<<(std::ostream& os, const NamedSharding& sharding);

}  // namespace shardplan
