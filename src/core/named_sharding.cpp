#include "shardplan/named_sharding.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"

namespace shardplan {

DimSlice split_block(std::int64_t n, std::int64_t k, std::int64_t index) {
  const std::int64_t b = n / k + (n % k != 0 ? 1 : 0);
  const std::int64_t start = index * b;
  return DimSlice{start, std::clamp<std::int64_t>(n - start, 0, b)};
}

NamedSharding::NamedSharding(Mesh mesh, PartitionSpec spec, Uneven uneven) {
  spec.validate(mesh, -1);
  auto impl = std::make_shared<Impl>(Impl{std::move(mesh), std::move(spec), uneven, {}});
  for (const auto& axes : impl->spec.dims()) {
    std::vector<int> ids;
    for (const auto& a : axes) ids.push_back(impl->mesh.axis_index(a));
    impl->axis_ids.push_back(std::move(ids));
  }
  impl_ = std::move(impl);
}

std::int64_t NamedSharding::num_shards(int dim) const {
  if (dim < 0 || dim >= impl_->spec.size()) return 1;
  std::int64_t n = 1;
  for (int id : impl_->axis_ids[static_cast<std::size_t>(dim)])
    n *= impl_->mesh.axis_sizes()[static_cast<std::size_t>(id)];
  return n;
}

bool NamedSharding::is_padded(const Shape& global) const {
  for (int d = 0; d < impl_->spec.size() && d < global.rank(); ++d) {
    if (global[d] % num_shards(d) != 0) return true;
  }
  return false;
}

void NamedSharding::check_divides(const Shape& global, std::string_view where,
                                  std::string_view path, std::string_view note) const {
  for (int d = 0; d < impl_->spec.size() && d < global.rank(); ++d) {
    const std::int64_t k = num_shards(d);
    if (global[d] % k == 0) continue;
    const auto& axes = impl_->spec[d];
    std::vector<std::string> sizes;
    for (const auto& a : axes)
      sizes.push_back(fmt::format("'{}' (size {})", a, impl_->mesh.axis_size(a)));
    throw SpecError(fmt::format(
        "[{}] dim {} of {} (shape {}) is not divisible by mesh {} {}{}; {} is not a multiple "
        "of {}{}",
        where, d, path.empty() ? std::string("a tensor") : fmt::format("'{}'", path),
        global.to_string(), axes.size() == 1 ? "axis" : "axes", fmt::join(sizes, " x "),
        axes.size() == 1 ? "" : fmt::format(" = {}", k), global[d], k, note));
  }
}

Shape NamedSharding::shard_shape(const Shape& global, std::string_view path) const {
  const PartitionSpec& spec = impl_->spec;
  if (spec.size() > global.rank()) {
    // Formatted only on failure: plans call this for many tensors.
    throw SpecError(fmt::format("[plan] {} has {} entries but {} (shape {}) has rank {}",
                                spec.to_string(), spec.size(),
                                path.empty() ? std::string("a tensor") : fmt::format("'{}'", path),
                                global.to_string(), global.rank()));
  }
  if (impl_->uneven == Uneven::kRefuse) check_divides(global, "plan", path);
  Shape out = global;
  for (int d = 0; d < spec.size(); ++d) out[d] = split_block(global[d], num_shards(d), 0).size;
  return out;
}

std::int64_t NamedSharding::shard_bytes(const Shape& global, std::size_t element_size,
                                        std::string_view path) const {
  const Shape shard = shard_shape(global, path);
  std::int64_t bytes = 0;
  if (!detail::checked_nonzero_product(shard.begin(), shard.end(), detail::as_i64(element_size),
                                       &bytes)) {
    throw SpecError(fmt::format(
        "[plan] byte size of the shard {} of {} (shape {}, {} bytes per "
        "element) overflows int64",
        shard.to_string(), path.empty() ? std::string("a tensor") : fmt::format("'{}'", path),
        global.to_string(), element_size));
  }
  return shard.numel() == 0 ? 0 : bytes;
}

std::int64_t NamedSharding::block_index(const std::vector<std::int64_t>& coords, int dim) const {
  std::int64_t idx = 0;
  for (int id : impl_->axis_ids[static_cast<std::size_t>(dim)]) {
    idx = idx * impl_->mesh.axis_sizes()[static_cast<std::size_t>(id)] +
          coords[static_cast<std::size_t>(id)];
  }
  return idx;
}

std::vector<Block> NamedSharding::device_blocks(const Shape& global) const {
  shard_shape(global);  // validates the rank and divisibility
  std::vector<Block> out(static_cast<std::size_t>(impl_->mesh.size()));
  // The coordinates of each position in turn (coords_of_position's), counted up in place.
  const std::vector<std::int64_t>& sizes = impl_->mesh.axis_sizes();
  std::vector<std::int64_t> coords(sizes.size(), 0);
  for (std::int64_t pos = 0; pos < impl_->mesh.size(); ++pos) {
    Block block(static_cast<std::size_t>(global.rank()));
    for (int d = 0; d < global.rank(); ++d) {
      const bool split = d < impl_->spec.size();
      block[static_cast<std::size_t>(d)] =
          split_block(global[d], split ? num_shards(d) : 1, split ? block_index(coords, d) : 0);
    }
    out[static_cast<std::size_t>(impl_->mesh.devices()[static_cast<std::size_t>(pos)])] =
        std::move(block);
    for (std::size_t i = sizes.size(); i-- > 0;) {
      if (++coords[i] < sizes[i]) break;
      coords[i] = 0;
    }
  }
  return out;
}

std::vector<std::vector<int>> NamedSharding::replica_groups(const Shape& global) const {
  auto blocks = device_blocks(global);
  std::vector<std::vector<int>> groups;
  std::vector<const Block*> keys;
  for (std::size_t id = 0; id < blocks.size(); ++id) {
    auto it =
        std::find_if(keys.begin(), keys.end(), [&](const Block* b) { return *b == blocks[id]; });
    if (it == keys.end()) {
      keys.push_back(&blocks[id]);
      groups.push_back({static_cast<int>(id)});
    } else {
      groups[static_cast<std::size_t>(it - keys.begin())].push_back(static_cast<int>(id));
    }
  }
  return groups;
}

std::int64_t NamedSharding::replication_factor() const {
  std::int64_t blocks = 1;
  for (int d = 0; d < impl_->spec.size(); ++d) blocks *= num_shards(d);
  return impl_->mesh.size() / blocks;
}

bool NamedSharding::is_equivalent_to(const NamedSharding& other, int rank) const {
  if (!(impl_->mesh == other.impl_->mesh)) return false;
  // Equal specs have equal normal forms (without building them: every run of a program asks
  // this of each input).
  if (impl_->spec == other.impl_->spec) return true;
  auto normal = [&](const PartitionSpec& s) {
    std::vector<AxisNames> dims(static_cast<std::size_t>(std::max(rank, s.size())));
    for (int d = 0; d < s.size(); ++d) {
      for (const auto& a : s[d]) {
        if (impl_->mesh.axis_size(a) != 1) dims[static_cast<std::size_t>(d)].push_back(a);
      }
    }
    return dims;
  };
  return normal(impl_->spec) == normal(other.impl_->spec);
}

std::string NamedSharding::visualize(const Shape& global) const {
  if (global.rank() < 1 || global.rank() > 2) {
    throw SpecError(fmt::format("[visualize] only 1-D and 2-D shapes can be drawn; got shape {}",
                                global.to_string()));
  }
  shard_shape(global);  // validates divisibility
  const std::int64_t rows = global.rank() == 2 ? num_shards(0) : 1;
  const std::int64_t cols = global.rank() == 2 ? num_shards(1) : num_shards(0);
  // Devices of each block, in mesh order.
  std::vector<std::vector<int>> cell(static_cast<std::size_t>(rows * cols));
  for (std::int64_t pos = 0; pos < impl_->mesh.size(); ++pos) {
    auto coords = impl_->mesh.coords_of_position(pos);
    // Dimensions past the end of the spec are not sharded: block 0 (and no axis_ids entry).
    auto index = [&](int dim) { return dim < impl_->spec.size() ? block_index(coords, dim) : 0; };
    const std::int64_t r = global.rank() == 2 ? index(0) : 0;
    const std::int64_t c = global.rank() == 2 ? index(1) : index(0);
    cell[static_cast<std::size_t>(r * cols + c)].push_back(
        impl_->mesh.devices()[static_cast<std::size_t>(pos)]);
  }
  std::vector<std::string> labels;
  std::size_t width = 0;
  for (auto& devs : cell) {
    std::sort(devs.begin(), devs.end());
    labels.push_back(
        fmt::format("{} {}", devs.size() == 1 ? "device" : "devices", fmt::join(devs, ",")));
    width = std::max(width, labels.back().size());
  }
  width += 4;
  auto rule = [&](std::string_view left, std::string_view mid, std::string_view right) {
    std::string line(left);
    for (std::int64_t c = 0; c < cols; ++c) {
      for (std::size_t i = 0; i < width; ++i) line += "─";
      line += c + 1 < cols ? mid : right;
    }
    return line + "\n";
  };
  auto blank_or = [&](std::int64_t r, bool with_label) {
    std::string line = "│";
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::string& l = labels[static_cast<std::size_t>(r * cols + c)];
      std::string text = with_label ? l : "";
      std::size_t pad = width - text.size();
      line += std::string(pad / 2, ' ') + text + std::string(pad - pad / 2, ' ') + "│";
    }
    return line + "\n";
  };
  std::string out = rule("┌", "┬", "┐");
  for (std::int64_t r = 0; r < rows; ++r) {
    out += blank_or(r, false);
    out += blank_or(r, true);
    out += blank_or(r, false);
    out += r + 1 < rows ? rule("├", "┼", "┤") : rule("└", "┴", "┘");
  }
  return out;
}

std::string NamedSharding::to_string() const {
  return fmt::format("NamedSharding(mesh={}, spec={}{})", impl_->mesh.to_string(),
                     impl_->spec.to_string(), impl_->uneven == Uneven::kPad ? ", uneven=pad" : "");
}

std::ostream& operator<<(std::ostream& os, const NamedSharding& s) { return os << s.to_string(); }

}  // namespace shardplan
