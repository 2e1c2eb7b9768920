#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardplan {

/// A named device mesh: axis names and sizes, and the device ids laid out over it in row-major
/// (mesh) order. A plain value type; valid once constructed.
///
///   Mesh mesh = Mesh::parse("fsdp:-1,tp:2", 8);   // fsdp=4, tp=2, devices 0..7
class Mesh {
 public:
  /// The most devices a mesh may have: 2^20 = 1,048,576 (the largest TPU and GPU clusters have
  /// tens of thousands). A mesh stores a few bytes per device, and plans and drawings walk them.
  static constexpr std::int64_t kMaxDevices = std::int64_t{1} << 20;

  /// Axes as (name, size) pairs; at most one size may be -1, inferred from `device_count`.
  /// Devices are 0..n-1 in mesh order. Throws SpecError on duplicate or empty names, two -1s,
  /// zero or negative sizes, sizes whose product is not `device_count`, or more than
  /// kMaxDevices devices (in the count or in one axis).
  Mesh(std::vector<std::pair<std::string, std::int64_t>> axes, std::int64_t device_count);
  /// As above with explicit device ids in mesh order: a permutation of 0..n-1.
  Mesh(std::vector<std::pair<std::string, std::int64_t>> axes, std::vector<int> devices);

  /// Parses "fsdp:-1,tp:2", or "1,-1,2" with `names` giving one name per entry.
  /// Throws SpecError naming the text on malformed entries, and as the constructor does.
  static Mesh parse(std::string_view text, std::int64_t device_count,
                    const std::vector<std::string>& names = {});

  int ndim() const { return static_cast<int>(state_->names.size()); }
  /// Number of devices.
  std::int64_t size() const { return static_cast<std::int64_t>(state_->devices.size()); }
  const std::vector<std::string>& axis_names() const { return state_->names; }
  const std::vector<std::int64_t>& axis_sizes() const { return state_->sizes; }
  /// Device ids in mesh order.
  const std::vector<int>& devices() const { return state_->devices; }

  /// Index of an axis, or nullopt.
  std::optional<int> find_axis(std::string_view name) const;
  bool has_axis(std::string_view name) const { return find_axis(name).has_value(); }
  /// Index of an axis. Throws SpecError naming the axis and the mesh's axes.
  int axis_index(std::string_view name) const;
  /// Size of an axis. Throws SpecError as axis_index.
  std::int64_t axis_size(std::string_view name) const {
    return state_->sizes[static_cast<std::size_t>(axis_index(name))];
  }

  /// The mesh coordinates of the device at mesh position `position` (0..size-1).
  std::vector<std::int64_t> coords_of_position(std::int64_t position) const;
  /// The mesh position of device `id`.
  std::int64_t position_of_device(int id) const {
    return state_->positions[static_cast<std::size_t>(id)];
  }

  /// "Mesh('fsdp': 4, 'tp': 2)".
  std::string to_string() const;
  /// "fsdp:4,tp:2", the form parse reads.
  std::string to_spec_string() const;

  friend bool operator==(const Mesh& a, const Mesh& b) {
    return a.state_ == b.state_ ||
           (a.state_->names == b.state_->names && a.state_->sizes == b.state_->sizes &&
            a.state_->devices == b.state_->devices);
  }

 private:
  // Everything, shared by copies (a mesh is immutable; plans copy it into every sharding, and
  // compiling a one-op program copies it a dozen times: a copy is one reference count).
  struct State {
    std::vector<std::string> names;
    std::vector<std::int64_t> sizes;
    std::vector<int> devices;
    std::vector<std::int64_t> positions;  // device id -> mesh position
  };
  // Fills `state` with the checked axes.
  static void init(State& state, std::vector<std::pair<std::string, std::int64_t>> axes,
                   std::int64_t device_count);

  std::shared_ptr<const State> state_;
};

std::ostream& operator<<(std::ostream& os, const Mesh& mesh);

}  // namespace shardplan
