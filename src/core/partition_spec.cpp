#include "shardplan/partition_spec.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"

namespace shardplan {

PartitionSpec::PartitionSpec(std::vector<AxisNames> dims) {
  if (!dims.empty()) dims_ = std::make_shared<const std::vector<AxisNames>>(std::move(dims));
}

PartitionSpec::PartitionSpec(std::initializer_list<DimSharding> dims) {
  std::vector<AxisNames> v;
  v.reserve(dims.size());
  for (const auto& d : dims) v.push_back(d.axes);
  if (!v.empty()) dims_ = std::make_shared<const std::vector<AxisNames>>(std::move(v));
}

const std::vector<AxisNames>& PartitionSpec::no_dims() {
  static const std::vector<AxisNames> kEmpty;
  return kEmpty;
}

const AxisNames& PartitionSpec::operator[](int i) const {
  static const AxisNames kNone;
  return i >= 0 && i < size() ? dims()[static_cast<std::size_t>(i)] : kNone;
}

bool PartitionSpec::is_replicated() const {
  for (const auto& d : dims()) {
    if (!d.empty()) return false;
  }
  return true;
}

std::vector<std::string> PartitionSpec::used_axes() const {
  std::vector<std::string> out;
  for (const auto& d : dims()) out.insert(out.end(), d.begin(), d.end());
  return out;
}

void PartitionSpec::validate(const Mesh& mesh, int rank, std::string_view where) const {
  // Nothing is allocated unless it throws: every sharding made is validated.
  const auto at = [&] {
    return where.empty() ? std::string() : fmt::format(" for '{}'", where);
  };
  if (rank >= 0 && size() > rank) {
    throw SpecError(fmt::format("[spec] {}{} has {} entries but the tensor has rank {}", to_string(),
                                at(), size(), rank));
  }
  const std::vector<AxisNames>& entries = dims();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    for (std::size_t j = 0; j < entries[i].size(); ++j) {
      const std::string& axis = entries[i][j];
      if (!mesh.has_axis(axis)) {
        throw SpecError(fmt::format("[spec] {}{}: unknown mesh axis '{}' in dim {}; the mesh has axes [{}]",
                                    to_string(), at(), axis, i, fmt::join(mesh.axis_names(), ", ")));
      }
      // Seen before: in an earlier entry, or earlier in this one.
      bool seen = std::find(entries[i].begin(), entries[i].begin() + static_cast<std::ptrdiff_t>(j),
                            axis) != entries[i].begin() + static_cast<std::ptrdiff_t>(j);
      for (std::size_t e = 0; e < i && !seen; ++e) {
        seen = std::find(entries[e].begin(), entries[e].end(), axis) != entries[e].end();
      }
      if (seen) {
        throw SpecError(fmt::format("[spec] {}{}: mesh axis '{}' is used more than once (again in dim {})",
                                    to_string(), at(), axis, i));
      }
    }
  }
}

std::string PartitionSpec::to_string() const {
  std::vector<std::string> parts;
  for (const auto& d : dims()) {
    if (d.empty()) {
      parts.emplace_back("None");
    } else if (d.size() == 1) {
      parts.push_back(fmt::format("'{}'", d[0]));
    } else {
      std::vector<std::string> q;
      for (const auto& a : d) q.push_back(fmt::format("'{}'", a));
      parts.push_back(fmt::format("({})", fmt::join(q, ", ")));
    }
  }
  return fmt::format("PartitionSpec({})", fmt::join(parts, ", "));
}

std::string PartitionSpec::to_spec_string() const {
  std::vector<std::string> parts;
  for (const auto& d : dims()) {
    if (d.empty()) {
      parts.emplace_back("null");
    } else if (d.size() == 1) {
      parts.push_back(fmt::format("\"{}\"", d[0]));
    } else {
      std::vector<std::string> q;
      for (const auto& a : d) q.push_back(fmt::format("\"{}\"", a));
      parts.push_back(fmt::format("[{}]", fmt::join(q, ", ")));
    }
  }
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

std::ostream& operator<<(std::ostream& os, const PartitionSpec& spec) { return os << spec.to_string(); }

}  // namespace shardplan
