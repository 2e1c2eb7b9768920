// The built-in hardware table and hardware YAML files (include/shardplan/hardware.hpp). Every
// figure carries its source; docs/training.md ("Step time") explains the efficiencies.
#include "shardplan/hardware.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>

#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "../input_file.hpp"

namespace shardplan {
namespace {

constexpr double kT = 1e12;
constexpr double kG = 1e9;
constexpr std::int64_t kGiB = std::int64_t{1} << 30;

// Sources shared by several entries.
constexpr const char* kMamf =
    "stas00/ml-engineering compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS' "
    "table (bf16 matmul, best shape found)";
constexpr const char* kMamfFp8 =
    "the same 'Maximum Achievable Matmul FLOPS' measurement for float8 (ml-engineering's table, "
    "fp8 rows): H100/H200 SXM 1,453.4 of 1,979 TFLOP/s";
constexpr const char* kFa3 =
    "FlashAttention-3 paper (Shah et al., arXiv 2407.08608): FlashAttention-2, the kernel behind "
    "PyTorch's SDPA flash backend, reaches 35% of the H100's peak";
constexpr const char* kHbm =
    "no first-party STREAM figure found: 0.9 is the middle of the 0.85-0.92 reported for "
    "sustained copy/triad kernels on H100";
constexpr const char* kNvlinkH100 =
    "NVIDIA/nccl-tests issue 212 (NVIDIA): 450 GB/s line rate, about 370 GB/s bus bandwidth for "
    "all-gather / reduce-scatter (0.82)";
constexpr const char* kNdr =
    "NVIDIA/nccl-tests issues 267, 290 (NVIDIA): 46-49 GB/s per 400 Gb/s NIC (0.96 of 50 GB/s)";

Hardware h100_sxm() {
  Hardware h;
  h.name = "h100-sxm";
  h.description = "NVIDIA H100 SXM5 80GB (HGX/DGX: 8 per node, NVLink 4, 400 Gb/s InfiniBand per GPU)";
  h.bf16_flops = 989.4 * kT;
  h.fp8_flops = 1978.9 * kT;
  h.memory_bandwidth = 3350 * kG;
  h.memory_bytes = 80 * kGiB;
  h.node_size = 8;
  h.intra_node_bandwidth = 450 * kG;
  h.inter_node_bandwidth = 50 * kG;
  h.matmul_efficiency = 0.80;
  h.fp8_matmul_efficiency = 0.73;
  h.attention_efficiency = 0.35;
  h.memory_efficiency = 0.90;
  h.intra_node_efficiency = 0.82;
  h.inter_node_efficiency = 0.96;
  h.sources = {
      {"bf16_flops, fp8_flops, memory", "NVIDIA H100 datasheet (1,979 / 3,958 TFLOPS with "
                                        "sparsity: half dense), 80 GB HBM3, 3.35 TB/s"},
      {"node_size, intra_node_bandwidth", "NVIDIA HGX H100: 8 GPUs, NVLink 900 GB/s both "
                                          "directions (450 GB/s each way)"},
      {"inter_node_bandwidth", "NVIDIA DGX H100: 8 ConnectX-7 400 Gb/s, one per GPU"},
      {"matmul_efficiency", fmt::format("{}: H100 SXM 792 of 989 TFLOP/s", kMamf)},
      {"fp8_matmul_efficiency", kMamfFp8},
      {"attention_efficiency", kFa3},
      {"memory_efficiency", kHbm},
      {"intra_node_efficiency", kNvlinkH100},
      {"inter_node_efficiency", kNdr},
  };
  return h;
}

Hardware h200() {
  Hardware h = h100_sxm();
  h.name = "h200";
  h.description = "NVIDIA H200 SXM 141GB (HGX: 8 per node, NVLink 4, 400 Gb/s per GPU)";
  h.memory_bandwidth = 4800 * kG;
  h.memory_bytes = 141 * std::int64_t{1000000000};
  h.matmul_efficiency = 0.80;
  h.sources[0] = {"bf16_flops, fp8_flops, memory",
                  "NVIDIA H200 product page: the H100 SXM's tensor rates, 141 GB HBM3e, 4.8 TB/s"};
  h.sources[3] = {"matmul_efficiency", fmt::format("{}: H100/H200 SXM 794.5 of 989", kMamf)};
  return h;
}

Hardware a100(bool eighty) {
  Hardware h;
  h.name = eighty ? "a100-80g" : "a100-40g";
  h.description = eighty ? "NVIDIA A100 SXM4 80GB (DGX A100: 8 per node, NVLink 3, 200 Gb/s HDR per GPU)"
                         : "NVIDIA A100 SXM4 40GB (DGX A100: 8 per node, NVLink 3, 200 Gb/s HDR per GPU)";
  h.bf16_flops = 312 * kT;
  h.fp8_flops = 0;
  h.fp8_matmul_efficiency = 0;
  h.memory_bandwidth = (eighty ? 2039 : 1555) * kG;
  h.memory_bytes = (eighty ? 80 : 40) * kGiB;
  h.node_size = 8;
  h.intra_node_bandwidth = 300 * kG;
  h.inter_node_bandwidth = 25 * kG;
  h.matmul_efficiency = 0.86;
  h.attention_efficiency = 0.50;
  h.memory_efficiency = 0.90;
  h.intra_node_efficiency = 0.80;
  h.inter_node_efficiency = 0.96;
  h.sources = {
      {"bf16_flops, memory", eighty ? "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 80 GB HBM2e, "
                                      "2,039 GB/s; no float8"
                                    : "NVIDIA A100 datasheet: 312 TFLOPS bf16 dense, 40 GB HBM2, "
                                      "1,555 GB/s; no float8"},
      {"node_size, intra_node_bandwidth", "NVIDIA DGX A100: 8 GPUs, NVLink 600 GB/s both directions"},
      {"inter_node_bandwidth", "NVIDIA DGX A100: 8 HDR 200 Gb/s InfiniBand, one per GPU"},
      {"matmul_efficiency", fmt::format("{}: A100 SXM 267.9 of 312 TFLOP/s", kMamf)},
      {"attention_efficiency", "FlashAttention-2 paper (Dao, arXiv 2307.08691): 50-73% of the "
                               "A100's peak (the low end: the backward pass is the slower)"},
      {"memory_efficiency", kHbm},
      {"intra_node_efficiency", "NVIDIA/nccl issue 412 (NVIDIA): about 160 of 200 GB/s per "
                                "direction on NVLink 3 (A800)"},
      {"inter_node_efficiency", "NVIDIA/nccl issue 412: 24 GB/s per HDR 200 Gb/s NIC"},
  };
  return h;
}

// AWS's A100 80GB instance: the DGX A100's GPUs and NVSwitch, with four 100 Gb/s EFA NICs for
// the eight GPUs (400 Gb/s a node, 6.25 GB/s a GPU) where the DGX has one 200 Gb/s HDR NIC each.
Hardware a100_p4de() {
  Hardware h = a100(true);
  h.name = "a100-80g-p4de";
  h.description = "AWS p4de.24xlarge: 8 NVIDIA A100 SXM4 80GB, NVSwitch (NVLink 3), 400 Gb/s EFA a "
                  "node (4 x 100 Gb/s for 8 GPUs)";
  h.inter_node_bandwidth = 400 * kG / 8 / 8;
  h.inter_node_efficiency = 0.80;
  for (auto& [what, source] : h.sources) {
    if (what == "inter_node_bandwidth") {
      source = "AWS EC2 P4 instances: p4de.24xlarge, 8 A100 80GB, 400 Gbps EFA networking a node";
    } else if (what == "inter_node_efficiency") {
      source = "NVIDIA/nccl issue 527 (NVIDIA, on AWS p4d's 4 x 100 Gb/s EFA): up to 40 GB/s "
               "all-reduce bus bandwidth, 0.80 of 50 GB/s";
    }
  }
  return h;
}

void require(bool ok, std::string_view source, std::string_view what) {
  if (!ok) throw IoError(fmt::format("[hardware] {}: {}", detail::printable(source), what));
}

}  // namespace

const std::vector<std::string_view>& Hardware::figure_names() {
  static const std::vector<std::string_view> names{
      "bf16_flops",           "fp8_flops",           "memory_bandwidth",      "memory_bytes",
      "node_size",            "intra_node_bandwidth", "inter_node_bandwidth", "matmul_efficiency",
      "attention_efficiency", "memory_efficiency",   "intra_node_efficiency", "inter_node_efficiency",
      "fp8_matmul_efficiency"};
  return names;
}

const std::vector<Hardware>& builtin_hardware() {
  static const std::vector<Hardware> table{h100_sxm(), h200(), a100(true), a100(false),
                                           a100_p4de()};
  return table;
}

Hardware parse_hardware(std::string_view yaml, std::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    require(false, source, fmt::format("not YAML: {}", e.what()));
  }
  require(root.IsMap(), source, "a hardware file is a mapping of figures (docs/training.md)");
  const auto text = [&](const char* key) -> std::string {
    const YAML::Node n = root[key];
    if (!n) return {};
    require(n.IsScalar(), source, fmt::format("'{}' must be text", key));
    return n.as<std::string>();
  };
  Hardware h;
  h.name = text("name");
  require(!h.name.empty(), source, "no 'name'");
  h.description = text("description");
  double* const doubles[] = {&h.bf16_flops,           &h.fp8_flops,          &h.memory_bandwidth,
                             nullptr,                 nullptr,               &h.intra_node_bandwidth,
                             &h.inter_node_bandwidth, &h.matmul_efficiency,  &h.attention_efficiency,
                             &h.memory_efficiency,    &h.intra_node_efficiency,
                             &h.inter_node_efficiency, &h.fp8_matmul_efficiency};
  const std::vector<std::string_view>& names = Hardware::figure_names();
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string key(names[i]);
    const YAML::Node n = root[key];
    require(n.IsDefined() && n.IsScalar(), source,
            fmt::format("no figure '{}' (a hardware file gives all of: {})", key, fmt::join(names, ", ")));
    double v = 0;
    try {
      v = n.as<double>();
    } catch (const YAML::Exception&) {
      require(false, source, fmt::format("'{}' is not a number: '{}'", key, detail::printable(n.Scalar())));
    }
    const bool fraction = key.ends_with("efficiency");
    // No float8 matrix units: both float8 figures 0 (checked together below).
    const bool may_be_zero = key == "fp8_flops" || key == "fp8_matmul_efficiency";
    require(std::isfinite(v) && (v > 0 || (may_be_zero && v == 0)) && (!fraction || v <= 1), source,
            fmt::format("'{}' is {}: it must be {}", key, n.Scalar(),
                        fraction ? (may_be_zero ? "0 or a fraction in (0, 1]" : "a fraction in (0, 1]")
                                 : may_be_zero ? "a number >= 0" : "a positive number"));
    if (key == "memory_bytes" || key == "node_size") {
      require(v < 0x1p62 && v == std::floor(v), source, fmt::format("'{}' must be a whole number", key));
      (key == "memory_bytes" ? h.memory_bytes : h.node_size) = static_cast<std::int64_t>(v);
    } else {
      *doubles[i] = v;
    }
  }
  require((h.fp8_flops == 0) == (h.fp8_matmul_efficiency == 0), source,
          fmt::format("fp8_flops is {} but fp8_matmul_efficiency is {}: both are 0 (no float8 "
                      "matrix units) or both positive",
                      h.fp8_flops, h.fp8_matmul_efficiency));
  if (const YAML::Node s = root["sources"]; s && s.IsMap()) {
    for (const auto& kv : s) h.sources.emplace_back(kv.first.as<std::string>(), kv.second.as<std::string>());
  }
  return h;
}

Hardware find_hardware(std::string_view name) {
  if (name.ends_with(".yaml") || name.ends_with(".yml")) {
    const std::string path(name);
    return parse_hardware(detail::read_input_file(path, "hardware file"), path);
  }
  std::vector<std::string> known;
  for (const Hardware& h : builtin_hardware()) {
    if (h.name == name) return h;
    known.push_back(h.name);
  }
  throw SpecError(fmt::format("[hardware] unknown hardware '{}' (built in: {}; or a .yaml file)",
                              detail::printable(name), fmt::join(known, ", ")));
}

}  // namespace shardplan
