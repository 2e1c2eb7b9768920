#pragma once
// Link figures for the partitioner's cost (docs/sjit.md, "Ranking by time"): with them, sjit
// ranks the ways to partition a step by estimated time (per collective its latency plus the
// bytes a device receives over the bandwidth of the axes it runs over, and the compute a choice
// repeats at the device's rate); without them, by the bytes a device receives.
//
//   SjitOptions o;
//   o.links = LinkFigures{.axes = {{"data", {.bytes_per_second = 50e9}},
//                                  {"model", {.bytes_per_second = 400e9}}}};
//   o.links = link_figures(find_hardware("h100-sxm"), mesh);  // hardware.hpp: train-plan's own

#include <map>
#include <string>

namespace shardplan {

/// One mesh axis's link: a collective over some axes costs the largest of their latencies plus
/// the most bytes a device receives over the smallest of their bandwidths.
struct AxisLink {
  double bytes_per_second = 0;  // > 0
  double latency_seconds = 0;   // >= 0
  friend bool operator==(const AxisLink&, const AxisLink&) = default;
};

/// Figures by mesh axis (every axis of the mesh, no other), and a device's compute rate: the
/// compute a choice repeats costs its FLOPs over it (0: not counted).
struct LinkFigures {
  std::map<std::string, AxisLink> axes;
  double flops_per_second = 0;
  friend bool operator==(const LinkFigures&, const LinkFigures&) = default;
};

}  // namespace shardplan
