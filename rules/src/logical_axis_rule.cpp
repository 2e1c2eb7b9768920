#include "shardplan/rules/logical_axis_rule.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "shardplan/error.hpp"

namespace shardplan {
namespace {

/// One dimension's assignment while mapping: not yet decided, or decided (possibly to nothing).
struct Slot {
  bool assigned = false;
  AxisNames axes;
  int entry = -1;
};

bool axes_free(const AxisNames& axes, const std::vector<Slot>& slots) {
  for (const Slot& s : slots) {
    for (const std::string& a : s.axes) {
      if (std::find(axes.begin(), axes.end(), a) != axes.end()) return false;
    }
  }
  return true;
}

// Flax's resolution: entries are visited in order; an entry applies to the first not yet decided
// dimension carrying its logical name when none of its mesh axes is used by another dimension.
// An entry mapping to null decides "not sharded". Undecided dimensions end up not sharded.
std::vector<Slot> resolve(const LogicalAxisRule::Mapping& mapping,
                          const std::vector<std::string>& names) {
  std::vector<Slot> slots(names.size());
  for (std::size_t e = 0; e < mapping.size(); ++e) {
    const auto& [logical, mesh_axes] = mapping[e];
    for (std::size_t d = 0; d < names.size(); ++d) {
      if (names[d] != logical || slots[d].assigned) continue;
      const AxisNames axes = mesh_axes.value_or(AxisNames{});
      if (axes_free(axes, slots)) {
        slots[d] = Slot{true, axes, static_cast<int>(e)};
      }
      break;
    }
  }
  return slots;
}

PartitionSpec to_spec(const std::vector<Slot>& slots) {
  std::vector<AxisNames> dims;
  dims.reserve(slots.size());
  for (const Slot& s : slots) dims.push_back(s.axes);
  // A spec that shards nothing is written P(), as the other rules do.
  if (std::all_of(dims.begin(), dims.end(), [](const AxisNames& a) { return a.empty(); })) {
    return PartitionSpec();
  }
  return PartitionSpec(std::move(dims));
}

void check_names(const std::vector<std::string>& names, std::string_view where) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) continue;
    for (std::size_t j = i + 1; j < names.size(); ++j) {
      if (names[i] == names[j]) {
        throw RuleError(fmt::format("[rule] logical axis '{}' is used by dims {} and {} of {}",
                                    names[i], i, j, where));
      }
    }
  }
}

}  // namespace

LogicalAxisRule::LogicalAxisRule(Mapping mapping, bool strict)
    : mapping_(std::move(mapping)), strict_(strict) {
  for (std::size_t i = 0; i < mapping_.size(); ++i) {
    if (mapping_[i].first.empty()) {
      throw RuleError(fmt::format("[rule] LogicalAxisRule: mapping entry {} has an empty name", i));
    }
  }
}

PartitionSpec LogicalAxisRule::to_mesh_spec(const std::vector<std::string>& logical_axes) const {
  check_names(logical_axes, fmt::format("[{}]", fmt::join(logical_axes, ", ")));
  return to_spec(resolve(mapping_, logical_axes));
}

RuleDecision LogicalAxisRule::apply(const RuleInput& in) const {
  const auto& names = in.tensor.logical_axes;
  RuleDecision d;
  if (names.empty()) {
    if (strict_ && in.tensor.shape.rank() > 0) {
      throw RuleError(fmt::format("[rule] LogicalAxisRule: '{}' (shape {}) has no logical axis names",
                                  in.path, in.tensor.shape.to_string()));
    }
    d.reason = "no logical axis names: replicated";
    d.fell_through = in.tensor.shape.rank() > 0;
    return d;
  }
  if (static_cast<int>(names.size()) != in.tensor.shape.rank()) {
    throw RuleError(fmt::format(
        "[rule] LogicalAxisRule: '{}' has shape {} (rank {}) but {} logical axis names [{}]",
        in.path, in.tensor.shape.to_string(), in.tensor.shape.rank(), names.size(),
        fmt::join(names, ", ")));
  }
  check_names(names, fmt::format("'{}'", in.path));
  const std::vector<Slot> slots = resolve(mapping_, names);
  d.spec = to_spec(slots);
  for (const Slot& s : slots) {
    if (!s.axes.empty()) {
      d.entry = s.entry;
      break;
    }
  }
  // Every entry that decided a dimension (a null one decides "not sharded") took part: reports
  // must not list it as unmatched because another dimension's entry is the one in `entry`.
  for (const Slot& s : slots) {
    if (s.assigned && s.entry != d.entry &&
        std::find(d.also_decided.begin(), d.also_decided.end(), s.entry) == d.also_decided.end()) {
      d.also_decided.push_back(s.entry);
    }
  }
  d.reason = fmt::format("logical axes [{}]", fmt::join(names, ", "));
  return d;
}

std::string LogicalAxisRule::name() const {
  return fmt::format("LogicalAxisRule({} mappings)", mapping_.size());
}

std::vector<std::string> LogicalAxisRule::entry_labels() const {
  std::vector<std::string> labels;
  labels.reserve(mapping_.size());
  for (const auto& [logical, axes] : mapping_) {
    if (!axes) {
      labels.push_back(fmt::format("{} -> null", logical));
    } else if (axes->size() == 1) {
      labels.push_back(fmt::format("{} -> {}", logical, axes->front()));
    } else {
      labels.push_back(fmt::format("{} -> [{}]", logical, fmt::join(*axes, ", ")));
    }
  }
  return labels;
}

}  // namespace shardplan
