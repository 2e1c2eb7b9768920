#include "shardplan/plan_report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <ostream>
#include <string_view>

#include "shardplan/detail/printable.hpp"

namespace shardplan {

std::int64_t PlanReport::min_device_bytes() const {
  return device_bytes.empty() ? 0 : *std::min_element(device_bytes.begin(), device_bytes.end());
}
std::int64_t PlanReport::max_device_bytes() const {
  return device_bytes.empty() ? 0 : *std::max_element(device_bytes.begin(), device_bytes.end());
}

std::vector<std::size_t> PlanReport::largest(std::size_t n) const {
  std::vector<std::size_t> idx(leaves.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  n = std::min(n, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n), idx.end(),
                    [&](std::size_t a, std::size_t b) {
                      auto ba = leaves[a].tensor.bytes(), bb = leaves[b].tensor.bytes();
                      return ba != bb ? ba > bb : a < b;
                    });
  idx.resize(n);
  return idx;
}

std::vector<std::size_t> PlanReport::fell_through() const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (leaves[i].fell_through) out.push_back(i);
  }
  return out;
}

const LeafPlan* PlanReport::find(std::string_view path) const {
  for (const auto& l : leaves) {
    if (l.path == path) return &l;
  }
  return nullptr;
}

const RuleInfo& PlanReport::rule_of(const LeafPlan& leaf) const {
  static const RuleInfo kNone{-1, "", "None", {}};
  if (leaf.rule_index < 0 || static_cast<std::size_t>(leaf.rule_index) >= rules.size())
    return kNone;
  return rules[static_cast<std::size_t>(leaf.rule_index)];
}

std::string PlanReport::reason_of(const LeafPlan& leaf) const {
  if (!leaf.reason.empty()) return leaf.reason;
  const RuleInfo& r = rule_of(leaf);
  if (leaf.entry >= 0 && static_cast<std::size_t>(leaf.entry) < r.labels.size()) {
    return fmt::format("matched '{}'", r.labels[static_cast<std::size_t>(leaf.entry)]);
  }
  return r.rule;
}

namespace {

std::string rule_column(const PlanReport& report, const LeafPlan& l) {
  // The rule itself is named once in the legend under the table; a row says which rule (#i),
  // which of its entries ([e]) and why.
  std::string s = fmt::format("#{}", l.rule_index);
  if (l.entry >= 0) s += fmt::format("[{}]", l.entry);
  s += ' ';
  s += report.reason_of(l);  // (not " " + ...: GCC 12 warns falsely on that in Release)
  return s;
}

}  // namespace

std::string PlanReport::table(std::size_t largest_n) const {
  std::vector<std::array<std::string, 7>> rows;
  rows.push_back({"path", "shape", "dtype", "spec", "shard", "bytes/device", "rule"});
  for (const auto& l : leaves) {
    // Names come from files: control characters are escaped before they reach a terminal.
    rows.push_back({detail::printable(l.path), l.tensor.shape.to_string(),
                    std::string(name(l.tensor.dtype)),
                    detail::printable(l.spec ? l.spec->to_spec_string() : "unspecified"),
                    l.shard_shape.to_string(), format_bytes(l.bytes_per_device),
                    detail::printable(rule_column(*this, l))});
  }
  std::array<std::size_t, 7> w{};
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < 7; ++c) w[c] = std::max(w[c], r[c].size());
  }
  std::string out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    std::string line;
    for (std::size_t c = 0; c < 7; ++c) {
      if (c == 5) {
        line += fmt::format("{:>{}}", r[c], w[c]);
      } else if (c == 6) {
        line += r[c];
      } else {
        line += fmt::format("{:<{}}", r[c], w[c]);
      }
      if (c < 6) line += "  ";
    }
    out += line + "\n";
    if (i == 0) {
      std::size_t total = 12;
      for (auto x : w) total += x;
      out += std::string(std::min<std::size_t>(total, 160), '-') + "\n";
    }
  }
  out += "\n";
  out += summary(largest_n);
  return out;
}

std::string PlanReport::summary(std::size_t largest_n) const {
  std::string out = "rules:\n";
  for (const RuleInfo& r : rules) {
    out += fmt::format("  #{} at '{}': {}\n", r.rule_index, detail::printable(r.rule_path),
                       detail::printable(r.rule));
  }
  out += fmt::format("mesh {} ({} devices), {} tensors, {} in total\n",
                     detail::printable(mesh.to_spec_string()), mesh.size(), leaves.size(),
                     format_bytes(total_bytes));
  out += fmt::format("bytes per device: min {}, max {} ({:.2f}% of the total)\n",
                     format_bytes(min_device_bytes()), format_bytes(max_device_bytes()),
                     total_bytes ? 100.0 * static_cast<double>(max_device_bytes()) /
                                       static_cast<double>(total_bytes)
                                 : 0.0);
  auto big = largest(largest_n);
  if (!big.empty()) {
    out += "largest tensors:\n";
    for (auto i : big) {
      const auto& l = leaves[i];
      out += fmt::format("  {}  {}  {} -> {} per device\n", detail::printable(l.path),
                         l.tensor.shape.to_string(), format_bytes(l.tensor.bytes()),
                         format_bytes(l.bytes_per_device));
    }
  }
  // Entries for activations only are not matched against weights: listing them among the
  // unmatched would bury the entries that are (a typo in a pattern).
  std::vector<std::string> activation_labels;
  std::string unmatched;
  for (const auto& u : unmatched_rules) {
    if (u.activation) {
      activation_labels.push_back(detail::printable(u.label));
    } else {
      unmatched += fmt::format("  #{} {}{}: {}\n", u.rule_index, detail::printable(u.rule),
                               u.entry >= 0 ? fmt::format(" [{}]", u.entry) : "",
                               detail::printable(u.label));
    }
  }
  out += unmatched.empty() ? "unmatched rules: none\n" : "unmatched rules:\n" + unmatched;
  if (!activation_labels.empty()) {
    out += fmt::format("for activations only (not matched against weights): {}\n",
                       fmt::join(activation_labels, ", "));
  }
  auto fell = fell_through();
  out += fmt::format("fell through to a default or catch-all: {}\n", fell.size());
  for (std::size_t k = 0; k < std::min<std::size_t>(fell.size(), 10); ++k) {
    out += fmt::format("  {} ({})\n", detail::printable(leaves[fell[k]].path),
                       reason_of(leaves[fell[k]]));
  }
  if (fell.size() > 10) out += fmt::format("  ... and {} more\n", fell.size() - 10);
  return out;
}

std::ostream& operator<<(std::ostream& os, const PlanReport& report) {
  return os << report.table();
}

std::ostream& operator<<(std::ostream& os, const LeafPlan& l) {
  os << detail::printable(l.path) << " " << l.tensor << " "
     << (l.spec ? l.spec->to_spec_string() : "unspecified") << " -> " << l.shard_shape << ", "
     << l.bytes_per_device << " bytes/device, rule #" << l.rule_index;
  if (l.entry >= 0) os << " [" << l.entry << "]";
  if (l.fell_through) os << " (fell through)";
  return os;
}

std::ostream& operator<<(std::ostream& os, const RuleInfo& r) {
  return os << "#" << r.rule_index << " at '" << r.rule_path << "': " << r.rule;
}

std::ostream& operator<<(std::ostream& os, const UnmatchedRule& u) {
  os << "#" << u.rule_index << " " << u.rule;
  if (u.entry >= 0) os << " [" << u.entry << "]";
  return os << ": '" << u.label << "'";
}

}  // namespace shardplan
