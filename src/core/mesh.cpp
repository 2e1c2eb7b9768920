#include "shardplan/mesh.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>

#include "shardplan/error.hpp"

namespace shardplan {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    std::size_t pos = s.find(sep, start);
    out.push_back(trim(s.substr(start, pos - start)));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

}  // namespace

Mesh::Mesh(std::vector<std::pair<std::string, std::int64_t>> axes, std::int64_t device_count) {
  auto state = std::make_shared<State>();
  init(*state, std::move(axes), device_count);
  state->devices.resize(static_cast<std::size_t>(device_count));
  for (std::size_t i = 0; i < state->devices.size(); ++i) state->devices[i] = static_cast<int>(i);
  state->positions.assign(state->devices.begin(), state->devices.end());
  state_ = std::move(state);
}

Mesh::Mesh(std::vector<std::pair<std::string, std::int64_t>> axes, std::vector<int> devices) {
  auto state = std::make_shared<State>();
  init(*state, std::move(axes), static_cast<std::int64_t>(devices.size()));
  std::vector<std::int64_t>& positions = state->positions;
  positions.assign(devices.size(), -1);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    int d = devices[i];
    if (d < 0 || static_cast<std::size_t>(d) >= devices.size() ||
        positions[static_cast<std::size_t>(d)] != -1) {
      throw SpecError(fmt::format(
          "[mesh] device ids must be a permutation of 0..{}; got [{}] (id {} at position {})",
          devices.size() - 1, fmt::join(devices, ", "), d, i));
    }
    positions[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(i);
  }
  state->devices = std::move(devices);
  state_ = std::move(state);
}

void Mesh::init(State& state, std::vector<std::pair<std::string, std::int64_t>> axes,
                std::int64_t device_count) {
  if (device_count < 1) {
    throw SpecError(fmt::format("[mesh] device count must be at least 1, got {}", device_count));
  }
  if (device_count > kMaxDevices) {
    throw SpecError(fmt::format("[mesh] device count {} is more than the limit of {} devices",
                                device_count, kMaxDevices));
  }
  if (axes.empty()) throw SpecError("[mesh] a mesh needs at least one axis");
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const auto& [name, size] = axes[i];
    if (name.empty()) throw SpecError(fmt::format("[mesh] axis {} has an empty name", i));
    for (std::size_t j = 0; j < i; ++j) {
      if (axes[j].first == name) {
        throw SpecError(
            fmt::format("[mesh] duplicate axis name '{}' (axes {} and {})", name, j, i));
      }
    }
    if (size == -1) {
      if (infer >= 0) {
        throw SpecError(fmt::format("[mesh] only one axis may be -1; '{}' and '{}' both are",
                                    axes[static_cast<std::size_t>(infer)].first, name));
      }
      infer = static_cast<int>(i);
    } else if (size <= 0) {
      throw SpecError(fmt::format(
          "[mesh] axis '{}' has size {}; sizes must be positive (or -1 to infer)", name, size));
    } else if (size > kMaxDevices) {
      throw SpecError(fmt::format("[mesh] axis '{}' has size {}, more than the limit of {} devices",
                                  name, size, kMaxDevices));
    } else if (__builtin_mul_overflow(known, size, &known)) {
      // Checked so that absurd sizes are an error rather than a wrapped (undefined) product.
      throw SpecError(fmt::format("[mesh] axis sizes overflow at axis '{}' (size {})", name, size));
    }
  }
  auto describe = [&] {
    std::vector<std::string> parts;
    for (const auto& [n, s] : axes) parts.push_back(fmt::format("{}:{}", n, s));
    return fmt::format("{}", fmt::join(parts, ","));
  };
  if (infer >= 0) {
    if (device_count % known != 0) {
      throw SpecError(fmt::format(
          "[mesh] cannot infer axis '{}' of mesh {}: {} devices are not divisible by {}",
          axes[static_cast<std::size_t>(infer)].first, describe(), device_count, known));
    }
    axes[static_cast<std::size_t>(infer)].second = device_count / known;
  } else if (known > kMaxDevices) {
    throw SpecError(fmt::format(
        "[mesh] axis sizes of mesh {} multiply to {} devices, more than the limit of {} (and not "
        "the device count {})",
        describe(), known, kMaxDevices, device_count));
  } else if (known != device_count) {
    throw SpecError(
        fmt::format("[mesh] axis sizes of mesh {} multiply to {}, not the device count {}",
                    describe(), known, device_count));
  }
  for (auto& [name, size] : axes) {
    state.names.push_back(std::move(name));
    state.sizes.push_back(size);
  }
}

Mesh Mesh::parse(std::string_view text, std::int64_t device_count,
                 const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, std::int64_t>> axes;
  auto parts = split(text, ',');
  if (!names.empty() && names.size() != parts.size()) {
    throw SpecError(fmt::format("[mesh] '{}' has {} entries but {} axis names were given", text,
                                parts.size(), names.size()));
  }
  for (std::size_t i = 0; i < parts.size(); ++i) {
    std::string_view part = parts[i];
    std::string name;
    std::string_view num = part;
    if (auto colon = part.find(':'); colon != std::string_view::npos) {
      name = std::string(trim(part.substr(0, colon)));
      num = trim(part.substr(colon + 1));
      if (!names.empty() && name != names[i]) {
        throw SpecError(fmt::format("[mesh] entry {} of '{}' is named '{}' but names[{}] is '{}'",
                                    i, text, name, i, names[i]));
      }
    } else if (!names.empty()) {
      name = names[i];
    } else {
      std::string hint;
      if (text.find('=') != std::string_view::npos && text.find(':') == std::string_view::npos) {
        std::string fixed(text);
        std::replace(fixed.begin(), fixed.end(), '=', ':');
        hint = fmt::format(" (did you mean '{}'?)", fixed);
      }
      throw SpecError(fmt::format(
          "[mesh] entry '{}' of '{}' has no axis name; write 'name:size' or pass axis names{}",
          part, text, hint));
    }
    std::int64_t size = 0;
    auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), size);
    if (ec == std::errc::result_out_of_range && ptr == num.data() + num.size()) {
      throw SpecError(
          fmt::format("[mesh] size {} of axis '{}' in '{}' is more than the limit of {} "
                      "devices",
                      num, name, text, kMaxDevices));
    }
    if (num.empty() || ec != std::errc() || ptr != num.data() + num.size()) {
      throw SpecError(
          fmt::format("[mesh] size '{}' of axis '{}' in '{}' is not an integer", num, name, text));
    }
    axes.emplace_back(std::move(name), size);
  }
  return Mesh(std::move(axes), device_count);
}

std::optional<int> Mesh::find_axis(std::string_view name) const {
  for (std::size_t i = 0; i < state_->names.size(); ++i) {
    if (state_->names[i] == name) return static_cast<int>(i);
  }
  return std::nullopt;
}

int Mesh::axis_index(std::string_view name) const {
  if (auto i = find_axis(name)) return *i;
  throw SpecError(fmt::format("[mesh] unknown mesh axis '{}'; the mesh has axes [{}]", name,
                              fmt::join(state_->names, ", ")));
}

std::vector<std::int64_t> Mesh::coords_of_position(std::int64_t position) const {
  std::vector<std::int64_t> coords(state_->sizes.size());
  for (std::size_t i = state_->sizes.size(); i-- > 0;) {
    coords[i] = position % state_->sizes[i];
    position /= state_->sizes[i];
  }
  return coords;
}

std::string Mesh::to_string() const {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < state_->names.size(); ++i)
    parts.push_back(fmt::format("'{}': {}", state_->names[i], state_->sizes[i]));
  return fmt::format("Mesh({})", fmt::join(parts, ", "));
}

std::string Mesh::to_spec_string() const {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < state_->names.size(); ++i)
    parts.push_back(fmt::format("{}:{}", state_->names[i], state_->sizes[i]));
  return fmt::format("{}", fmt::join(parts, ","));
}

std::ostream& operator<<(std::ostream& os, const Mesh& mesh) { return os << mesh.to_string(); }

}  // namespace shardplan
