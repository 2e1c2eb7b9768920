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
#include "../formats/input_file.hpp"
#include "../formats/yaml_input.hpp"

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

// ---- Hardware files -------------------------------------------------------------------------

/// The physical range of each figure of a hardware file (docs/cli.md, "Hardware files"): a value
/// outside it is a unit slip (TFLOP/s for FLOP/s, Gb/s for bytes/s, a percentage for a
/// fraction), not a device, and would give a step time as wrong (1e-300 FLOP/s gave "step inf s"
/// and was named the fastest by --compare).
struct FigureRange {
  std::string_view key;
  double low, high;
  bool zero_allowed;  // fp8 figures: 0 is "no float8 matrix units"
  bool whole;         // a count: memory_bytes, node_size
  std::string_view range;  // the range as docs/cli.md gives it, with its unit
  void (*set)(Hardware&, double);
};

constexpr double kFlopsLow = 1e9, kFlopsHigh = 1e18;  // a CPU core .. 400x a B200's dense bf16
constexpr double kBandwidthLow = 1e8;                  // 0.8 Gb/s: slower is no training link
constexpr std::string_view kFraction = "a fraction in [0.01, 1] (a share of the peak: 0.8, not 80)";
constexpr std::string_view kLink = "1e8 to 1e14 bytes/s per device, one direction";

#define SHARDPLAN_SET(field) [](Hardware& h, double v) { h.field = static_cast<decltype(h.field)>(v); }
constexpr FigureRange kRanges[] = {
    {"bf16_flops", kFlopsLow, kFlopsHigh, false, false, "1e9 to 1e18 FLOP/s per device",
     SHARDPLAN_SET(bf16_flops)},
    {"fp8_flops", kFlopsLow, kFlopsHigh, true, false, "0, or 1e9 to 1e18 FLOP/s per device",
     SHARDPLAN_SET(fp8_flops)},
    {"memory_bandwidth", 1e9, 1e15, false, false, "1e9 to 1e15 bytes/s (1 GB/s to 1 PB/s)",
     SHARDPLAN_SET(memory_bandwidth)},
    {"memory_bytes", 0x1p20, 0x1p50, false, true,
     "a whole number of bytes, 2^20 to 2^50 (1 MiB to 1 PiB)", SHARDPLAN_SET(memory_bytes)},
    {"node_size", 1, 65536, false, true, "a whole number of devices, 1 to 65536",
     SHARDPLAN_SET(node_size)},
    {"intra_node_bandwidth", kBandwidthLow, 1e14, false, false, kLink,
     SHARDPLAN_SET(intra_node_bandwidth)},
    {"inter_node_bandwidth", kBandwidthLow, 1e14, false, false, kLink,
     SHARDPLAN_SET(inter_node_bandwidth)},
    {"matmul_efficiency", 0.01, 1, false, false, kFraction, SHARDPLAN_SET(matmul_efficiency)},
    {"attention_efficiency", 0.01, 1, false, false, kFraction, SHARDPLAN_SET(attention_efficiency)},
    {"memory_efficiency", 0.01, 1, false, false, kFraction, SHARDPLAN_SET(memory_efficiency)},
    {"intra_node_efficiency", 0.01, 1, false, false, kFraction,
     SHARDPLAN_SET(intra_node_efficiency)},
    {"inter_node_efficiency", 0.01, 1, false, false, kFraction,
     SHARDPLAN_SET(inter_node_efficiency)},
    {"fp8_matmul_efficiency", 0.01, 1, true, false, "0, or a fraction in [0.01, 1]",
     SHARDPLAN_SET(fp8_matmul_efficiency)},
};
#undef SHARDPLAN_SET

/// A hardware file read by the reader contract every YAML and JSON input follows (docs/cli.md,
/// "Input files"): each key known and given once, each value of its type, each figure in its
/// range; errors IoError "[hardware] FILE:LINE: ..." naming the key.
class HardwareReader {
 public:
  explicit HardwareReader(std::string_view source) : source_(source) {}

  Hardware read(std::string_view yaml) const {
    detail::check_yaml_depth(yaml, "hardware", source_);
    YAML::Node root;
    try {
      root = YAML::Load(std::string(yaml));
    } catch (const YAML::ParserException& e) {
      throw IoError(fmt::format("[hardware] {}:{}: not YAML: {}", detail::printable(source_),
                                e.mark.line + 1, e.msg));
    } catch (const YAML::Exception& e) {
      throw IoError(fmt::format("[hardware] {}: not YAML: {}", detail::printable(source_), e.what()));
    }
    if (!root.IsMap()) fail(root, "a hardware file is a mapping of figures (docs/cli.md)");
    check_keys(root);
    Hardware h;
    h.name = text(root, "name", true);
    if (h.name.empty()) fail(root, "'name' is empty");
    h.description = text(root, "description", false);
    for (const FigureRange& r : kRanges) r.set(h, figure(root, r));
    if ((h.fp8_flops == 0) != (h.fp8_matmul_efficiency == 0)) {
      fail(root, fmt::format("fp8_flops is {} but fp8_matmul_efficiency is {}: both are 0 (no "
                             "float8 matrix units) or both positive",
                             h.fp8_flops, h.fp8_matmul_efficiency));
    }
    if (const YAML::Node n = root["sources"]) h.sources = sources(n);
    return h;
  }

 private:
  [[noreturn]] void fail(const YAML::Node& at, const std::string& what) const {
    const YAML::Mark m = at.Mark();
    if (m.line >= 0) {
      throw IoError(fmt::format("[hardware] {}:{}: {}", detail::printable(source_), m.line + 1,
                                detail::printable(what)));
    }
    throw IoError(fmt::format("[hardware] {}: {}", detail::printable(source_), detail::printable(what)));
  }

  static std::string describe(const YAML::Node& n) {
    switch (n.Type()) {
      case YAML::NodeType::Null: return "empty";
      case YAML::NodeType::Scalar: return fmt::format("'{}'", n.Scalar());
      case YAML::NodeType::Sequence: return "a list";
      case YAML::NodeType::Map: return "a mapping";
      default: return "nothing";
    }
  }

  /// The top level's keys: each once, each one of name, description, sources and the figures.
  void check_keys(const YAML::Node& root) const {
    std::vector<std::string> known{"name", "description", "sources"};
    for (const std::string_view f : Hardware::figure_names()) known.emplace_back(f);
    std::vector<std::string> seen;
    for (const auto& kv : root) {
      if (!kv.first.IsScalar()) fail(kv.first, fmt::format("a key is {}, not a name", describe(kv.first)));
      const std::string& key = kv.first.Scalar();
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
        fail(kv.first, fmt::format("'{}' is given twice", key));
      }
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        fail(kv.first, fmt::format("unknown key '{}' (a hardware file has: {})", key,
                                   fmt::join(known, ", ")));
      }
      seen.push_back(key);
    }
  }

  std::string text(const YAML::Node& root, const char* key, bool required) const {
    const YAML::Node n = root[key];
    if (!n) {
      if (required) fail(root, fmt::format("no '{}'", key));
      return {};
    }
    if (!n.IsScalar()) fail(n, fmt::format("'{}' is {}, not text", key, describe(n)));
    return n.Scalar();
  }

  /// A figure: a plain (unquoted) number inside its range.
  double figure(const YAML::Node& root, const FigureRange& r) const {
    const std::string key(r.key);
    const YAML::Node n = root[key];
    if (!n) {
      fail(root, fmt::format("no figure '{}' (a hardware file gives all of: {})", key,
                             fmt::join(Hardware::figure_names(), ", ")));
    }
    double v = 0;
    if (!n.IsScalar() || n.Tag() != "?" || !YAML::convert<double>::decode(n, v)) {
      fail(n, fmt::format("'{}' is {}, not a number", key,
                          n.IsScalar() && n.Tag() != "?" ? "quoted text" : describe(n)));
    }
    const bool in_range = (r.zero_allowed && v == 0) ||
                          (std::isfinite(v) && v >= r.low && v <= r.high &&
                           (!r.whole || v == std::floor(v)));
    if (!in_range) fail(n, fmt::format("'{}' is {}: it must be {}", key, n.Scalar(), r.range));
    return v;
  }

  /// `sources:`, a mapping of figure (or several, comma-separated) -> where it comes from.
  std::vector<std::pair<std::string, std::string>> sources(const YAML::Node& n) const {
    if (!n.IsMap()) {
      fail(n, fmt::format("'sources' is {}: it must be a mapping of figure -> where it comes "
                          "from (text)",
                          describe(n)));
    }
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& kv : n) {
      if (!kv.first.IsScalar()) fail(kv.first, fmt::format("a key of 'sources' is {}, not a name", describe(kv.first)));
      const std::string& key = kv.first.Scalar();
      for (const auto& [seen, text] : out) {
        if (seen == key) fail(kv.first, fmt::format("'sources' gives '{}' twice", key));
      }
      if (!kv.second.IsScalar()) {
        fail(kv.second, fmt::format("the source of '{}' is {}, not text", key, describe(kv.second)));
      }
      out.emplace_back(key, kv.second.Scalar());
    }
    return out;
  }

  std::string_view source_;
};

}  // namespace

const std::vector<std::string_view>& Hardware::figure_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> out;
    for (const FigureRange& r : kRanges) out.push_back(r.key);
    return out;
  }();
  return names;
}

const std::vector<Hardware>& builtin_hardware() {
  static const std::vector<Hardware> table{h100_sxm(), h200(), a100(true), a100(false),
                                           a100_p4de()};
  return table;
}

Hardware parse_hardware(std::string_view yaml, std::string_view source) {
  return HardwareReader(source).read(yaml);
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
