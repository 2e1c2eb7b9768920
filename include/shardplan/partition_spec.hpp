#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardplan {

class Mesh;

/// The mesh axes one dimension is sharded over, major to minor; empty means not sharded.
using AxisNames = std::vector<std::string>;

/// One entry of a PartitionSpec as written in code: `nullptr` (not sharded), `"tp"`, or
/// `{"fsdp", "tp"}` (sharded over the product of both axes).
struct DimSharding {
  AxisNames axes;
  DimSharding(std::nullptr_t) {}                                          // NOLINT
  DimSharding(const char* axis) : axes{axis} {}                           // NOLINT
  DimSharding(std::string axis) : axes{std::move(axis)} {}                // NOLINT
  DimSharding(std::initializer_list<std::string> group) : axes(group) {}  // NOLINT
  DimSharding(AxisNames group) : axes(std::move(group)) {}                // NOLINT
};

/// How each dimension of a tensor maps onto mesh axes, as jax.sharding.PartitionSpec.
/// Dimensions past the end of the spec are not sharded; `PartitionSpec()` replicates.
/// A one-axis group equals the axis alone. A plain value type; copies share the immutable entries,
/// so copying a spec (as a plan does for every leaf) costs no allocation.
class PartitionSpec {
 public:
  PartitionSpec() = default;
  explicit PartitionSpec(std::vector<AxisNames> dims);
  PartitionSpec(std::initializer_list<DimSharding> dims);

  /// Number of entries (may be less than the rank of the tensor it shards).
  int size() const { return dims_ ? static_cast<int>(dims_->size()) : 0; }
  bool empty() const { return size() == 0; }
  /// The axes of dimension i; empty for i past the end.
  const AxisNames& operator[](int i) const;
  const std::vector<AxisNames>& dims() const { return dims_ ? *dims_ : no_dims(); }
  /// True when no dimension is sharded.
  bool is_replicated() const;
  /// All axes used, in order of appearance.
  std::vector<std::string> used_axes() const;

  /// Throws SpecError, naming `where` and the offending entry, for an unknown mesh axis, an axis
  /// used twice, or more entries than `rank` dimensions (rank < 0 skips the rank check).
  void validate(const Mesh& mesh, int rank, std::string_view where = {}) const;

  /// JAX form: "PartitionSpec('fsdp', None, ('x', 'y'))".
  std::string to_string() const;
  /// The rule-file SPEC form: `["fsdp", null, ["x", "y"]]`, `[]` when empty.
  std::string to_spec_string() const;

  friend bool operator==(const PartitionSpec& a, const PartitionSpec& b) {
    return a.dims_ == b.dims_ || a.dims() == b.dims();
  }
  /// True when both share the same entries (a copy of one another): a cheap sufficient test
  /// of equality.
  bool same_instance(const PartitionSpec& other) const { return dims_ == other.dims_; }

 private:
  static const std::vector<AxisNames>& no_dims();
  std::shared_ptr<const std::vector<AxisNames>> dims_;  // null when empty
};

/// Builds a PartitionSpec: `P()`, `P("fsdp", nullptr)`, `P(AxisNames{"x", "y"}, "tp")`.
template <class... A>
PartitionSpec P(A&&... entries) {
  return PartitionSpec(std::vector<AxisNames>{DimSharding(std::forward<A>(entries)).axes...});
}

std::ostream& operator<<(std::ostream& os, const PartitionSpec& spec);

}  // namespace shardplan
