#pragma once
// Accelerators as train-plan's time model sees them (docs/training.md, "Step time"): peak rates
// from datasheets, the fraction of each that real kernels and collectives reach (each from a
// published measurement), and how devices are wired (a node of fast links, a network between
// nodes). A built-in table, or a YAML file with the same figures.
//
//   const Hardware h = find_hardware("h100-sxm");      // or find_hardware("cluster.yaml")
//   o.hardware = h;                                    // TrainPlanOptions

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardplan/links.hpp"
#include "shardplan/mesh.hpp"

namespace shardplan {

struct Hardware {
  std::string name;         // "h100-sxm"
  std::string description;  // "NVIDIA H100 SXM5 80GB, 8 per node (NVLink 4), 400 Gb/s per GPU"
  double bf16_flops = 0;    // dense (not sparse) peak of the matrix units, FLOP/s
  double fp8_flops = 0;     // dense float8 peak; 0: no float8 matrix units
  double memory_bandwidth = 0;  // HBM, bytes/s
  std::int64_t memory_bytes = 0;   // HBM capacity of one device
  std::int64_t node_size = 0;      // devices joined by the fast links (NVLink)
  double intra_node_bandwidth = 0;  // bytes/s one device sends inside its node, one direction
  double inter_node_bandwidth = 0;  // bytes/s one device sends to other nodes (its NIC)
  // The fractions of those peaks reached in practice, one measurement each: large bf16 products,
  // large float8 products,
  // the fused attention kernel (forward and backward together), streaming kernels, collectives
  // inside a node and between nodes (large messages: NCCL's bus bandwidth).
  double matmul_efficiency = 0;
  double fp8_matmul_efficiency = 0;  // large float8 products; 0 with no float8 matrix units
  double attention_efficiency = 0;
  double memory_efficiency = 0;
  double intra_node_efficiency = 0;
  double inter_node_efficiency = 0;
  /// Where each figure comes from: (figure, source).
  std::vector<std::pair<std::string, std::string>> sources;

  /// The figures' names as in a YAML file, in order (docs/training.md lists them).
  static const std::vector<std::string_view>& figure_names();
};

/// The built-in entries: h100-sxm, h200, a100-80g, a100-40g (DGX A100), a100-80g-p4de (AWS).
const std::vector<Hardware>& builtin_hardware();

/// A built-in entry by name, or, for a name ending in .yaml / .yml, that file read. Throws
/// SpecError for an unknown name (listing the built-in ones) and IoError for a file that cannot
/// be read, is not YAML, or lacks a figure or gives one that is not a positive number (naming the
/// file and the figure).
Hardware find_hardware(std::string_view name_or_file);

/// The partitioner's link figures (SjitOptions::links) for `mesh` on `hw`, as train-plan's time
/// model prices a ring collective over one axis (docs/training.md "Step time"): an axis whose
/// groups lie inside nodes of hw.node_size consecutive devices runs at the node's links' rate,
/// one that crosses nodes at its groups' NICs' (at most the node's links'); each times its
/// measured efficiency. Latency 0 (the time model has none); compute at the large products'
/// rate (bf16_flops x matmul_efficiency).
LinkFigures link_figures(const Hardware& hw, const Mesh& mesh);

/// A hardware entry from YAML text (every figure of figure_names(), `name`, optional
/// `description` and `sources:` {figure: text}). Throws IoError naming `source` and the figure.
Hardware parse_hardware(std::string_view yaml, std::string_view source);

}  // namespace shardplan
