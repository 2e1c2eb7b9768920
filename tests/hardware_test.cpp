// The hardware table and hardware files: every built-in entry complete and sourced, figures as
// the datasheets give them, files read whole or refused naming the figure.
#include "shardplan/hardware.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "shardplan/error.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

// A complete file, figures as round numbers.
constexpr const char* kFile = R"(name: lab-gpu
description: a card of our own
bf16_flops: 1.0e15
fp8_flops: 2.0e15
memory_bandwidth: 3.0e12
memory_bytes: 85899345920
node_size: 4
intra_node_bandwidth: 4.0e11
inter_node_bandwidth: 5.0e10
matmul_efficiency: 0.8
fp8_matmul_efficiency: 0.7
attention_efficiency: 0.5
memory_efficiency: 0.9
intra_node_efficiency: 0.75
inter_node_efficiency: 0.95
sources:
  bf16_flops: our measurement
)";

TEST(Hardware, EveryBuiltInEntryIsCompleteAndSaysWhereItsFiguresComeFrom) {
  std::set<std::string> names;
  for (const Hardware& h : builtin_hardware()) {
    SCOPED_TRACE(h.name);
    EXPECT_TRUE(names.insert(h.name).second) << "named twice";
    EXPECT_FALSE(h.description.empty());
    for (const double v : {h.bf16_flops, h.memory_bandwidth, h.intra_node_bandwidth,
                           h.inter_node_bandwidth}) {
      EXPECT_GT(v, 0);
    }
    EXPECT_GE(h.fp8_flops, 0);
    // Float8 units have both figures, and their own source; no float8 units neither.
    EXPECT_EQ(h.fp8_flops > 0, h.fp8_matmul_efficiency > 0);
    EXPECT_LE(h.fp8_matmul_efficiency, 1);
    if (h.fp8_flops > 0) {
      bool found = false;
      for (const auto& [what, source] : h.sources) found = found || what == "fp8_matmul_efficiency";
      EXPECT_TRUE(found);
    }
    EXPECT_GT(h.memory_bytes, 0);
    EXPECT_GT(h.node_size, 0);
    for (const double f : {h.matmul_efficiency, h.attention_efficiency, h.memory_efficiency,
                           h.intra_node_efficiency, h.inter_node_efficiency}) {
      EXPECT_GT(f, 0);
      EXPECT_LE(f, 1);
    }
    // Each efficiency has its own source line; the peaks share the datasheet's.
    for (const char* figure : {"matmul_efficiency", "attention_efficiency", "memory_efficiency",
                               "intra_node_efficiency", "inter_node_efficiency"}) {
      bool found = false;
      for (const auto& [what, source] : h.sources) found = found || (what == figure && !source.empty());
      EXPECT_TRUE(found) << figure;
    }
    EXPECT_EQ(find_hardware(h.name).name, h.name);
  }
  EXPECT_TRUE(names.count("h100-sxm") && names.count("a100-80g"));
}

// The H100 SXM's figures as NVIDIA's datasheet gives them (dense: half the sparse figures),
// and the per-direction NVLink bandwidth (900 GB/s is both directions).
TEST(Hardware, TheH100FiguresAreTheDatasheets) {
  const Hardware h = find_hardware("h100-sxm");
  EXPECT_DOUBLE_EQ(h.bf16_flops, 989.4e12);  // the whitepaper's dense figure (1,978.9 sparse)
  EXPECT_DOUBLE_EQ(h.fp8_flops, 3957.8e12 / 2);
  EXPECT_DOUBLE_EQ(h.memory_bandwidth, 3.35e12);
  EXPECT_EQ(h.memory_bytes, std::int64_t{80} << 30);
  EXPECT_EQ(h.node_size, 8);
  EXPECT_DOUBLE_EQ(h.intra_node_bandwidth, 900e9 / 2);
  EXPECT_DOUBLE_EQ(h.inter_node_bandwidth, 400e9 / 8);  // 400 Gb/s
  EXPECT_DOUBLE_EQ(find_hardware("a100-80g").fp8_flops, 0);  // no float8 units
}

// AWS's A100 80GB instance is the DGX A100 but for its network: four 100 Gb/s EFA NICs for the
// node's eight GPUs (6.25 GB/s a GPU, where the DGX has a 200 Gb/s HDR NIC each: 25 GB/s), at
// NCCL's 40 of 50 GB/s on EFA.
TEST(Hardware, TheP4deIsTheDgxA100WithFourEfaNicsANode) {
  const Hardware p = find_hardware("a100-80g-p4de"), dgx = find_hardware("a100-80g");
  EXPECT_DOUBLE_EQ(p.inter_node_bandwidth, 400e9 / 8 / 8);
  EXPECT_DOUBLE_EQ(dgx.inter_node_bandwidth, 200e9 / 8);
  EXPECT_DOUBLE_EQ(p.inter_node_efficiency, 0.80);
  EXPECT_EQ(p.node_size, 8);
  for (const auto& [a, b] :
       {std::pair{p.bf16_flops, dgx.bf16_flops}, {p.fp8_flops, dgx.fp8_flops},
        {p.memory_bandwidth, dgx.memory_bandwidth}, {p.intra_node_bandwidth, dgx.intra_node_bandwidth},
        {p.matmul_efficiency, dgx.matmul_efficiency}, {p.attention_efficiency, dgx.attention_efficiency},
        {p.memory_efficiency, dgx.memory_efficiency},
        {p.intra_node_efficiency, dgx.intra_node_efficiency}}) {
    EXPECT_DOUBLE_EQ(a, b);
  }
  EXPECT_EQ(p.memory_bytes, dgx.memory_bytes);
  // The network's figures name their own sources, not the DGX's.
  std::map<std::string, std::string> sources(p.sources.begin(), p.sources.end());
  EXPECT_THAT(sources.at("inter_node_bandwidth"), ::testing::HasSubstr("p4de"));
  EXPECT_THAT(sources.at("inter_node_efficiency"), ::testing::HasSubstr("EFA"));
}

TEST(Hardware, AnUnknownNameListsTheBuiltInOnes) {
  try {
    find_hardware("h100");
    FAIL() << "no error";
  } catch (const SpecError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("unknown hardware 'h100'"));
    for (const Hardware& h : builtin_hardware()) EXPECT_THAT(e.what(), ::testing::HasSubstr(h.name));
  }
}

TEST(Hardware, AFileGivesEveryFigure) {
  const Hardware h = parse_hardware(kFile, "lab.yaml");
  EXPECT_EQ(h.name, "lab-gpu");
  EXPECT_EQ(h.description, "a card of our own");
  EXPECT_DOUBLE_EQ(h.bf16_flops, 1e15);
  EXPECT_DOUBLE_EQ(h.fp8_flops, 2e15);
  EXPECT_DOUBLE_EQ(h.memory_bandwidth, 3e12);
  EXPECT_EQ(h.memory_bytes, std::int64_t{80} << 30);
  EXPECT_EQ(h.node_size, 4);
  EXPECT_DOUBLE_EQ(h.intra_node_bandwidth, 4e11);
  EXPECT_DOUBLE_EQ(h.inter_node_bandwidth, 5e10);
  EXPECT_DOUBLE_EQ(h.matmul_efficiency, 0.8);
  EXPECT_DOUBLE_EQ(h.fp8_matmul_efficiency, 0.7);
  EXPECT_DOUBLE_EQ(h.attention_efficiency, 0.5);
  EXPECT_DOUBLE_EQ(h.memory_efficiency, 0.9);
  EXPECT_DOUBLE_EQ(h.intra_node_efficiency, 0.75);
  EXPECT_DOUBLE_EQ(h.inter_node_efficiency, 0.95);
  ASSERT_EQ(h.sources.size(), 1u);
  EXPECT_EQ(h.sources[0].second, "our measurement");
}

// Nothing is assumed: a figure left out, of the wrong type, out of range, or a file that is not
// a mapping is an error naming the file and the figure.
TEST(Hardware, AFileMissingOrMistypingAFigureIsAnErrorNamingIt) {
  const std::string full = kFile;
  const auto without = [&](const std::string& key) {
    std::string s = full;
    const std::size_t at = s.find(key + ":");
    return s.erase(at, s.find('\n', at) - at + 1);
  };
  const auto replaced = [&](const std::string& key, const std::string& value) {
    std::string s = full;
    const std::size_t at = s.find(key + ":") + key.size() + 2;
    return s.replace(at, s.find('\n', at) - at, value);
  };
  const auto expect_error = [](const std::string& text, const std::string& words) {
    SCOPED_TRACE(text);
    try {
      parse_hardware(text, "lab.yaml");
      ADD_FAILURE() << "no error";
    } catch (const IoError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("lab.yaml"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr(words));
    }
  };
  for (const std::string_view figure : Hardware::figure_names()) {
    expect_error(without(std::string(figure)), fmt::format("no figure '{}'", figure));
  }
  expect_error(without("name"), "no 'name'");
  expect_error(replaced("bf16_flops", "fast"), "lab.yaml:3: 'bf16_flops' is 'fast', not a number");
  expect_error(replaced("memory_bandwidth", "-3e12"), "'memory_bandwidth' is -3e12");
  expect_error(replaced("fp8_flops", "-1"), "'fp8_flops' is -1");
  expect_error(replaced("matmul_efficiency", "1.2"), "a fraction in [0.01, 1]");
  expect_error(replaced("attention_efficiency", "0"), "a fraction in [0.01, 1]");
  expect_error(replaced("node_size", "7.5"), "'node_size' is 7.5: it must be a whole number");
  expect_error(replaced("inter_node_bandwidth", ".nan"), "'inter_node_bandwidth' is .nan");
  expect_error(replaced("bf16_flops", "[1, 2]"), "'bf16_flops' is a list, not a number");
  expect_error("- a list", "a mapping of figures");
  expect_error("name: [unclosed", "not YAML");
  expect_error(replaced("fp8_matmul_efficiency", "1.5"), "0, or a fraction in [0.01, 1]");
  // No float8 units: both float8 figures 0; one without the other is an error naming both.
  expect_error(replaced("fp8_flops", "0"), "fp8_flops is 0 but fp8_matmul_efficiency is 0.7");
  std::string none = replaced("fp8_flops", "0");
  none.replace(none.find("fp8_matmul_efficiency: 0.7"), 26, "fp8_matmul_efficiency: 0");
  const Hardware no_fp8 = parse_hardware(none, "lab.yaml");
  EXPECT_DOUBLE_EQ(no_fp8.fp8_flops, 0);
  EXPECT_DOUBLE_EQ(no_fp8.fp8_matmul_efficiency, 0);
}

TEST(Hardware, AFileIsReadByItsName) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("shardplan_hardware_{}", ::getpid());
  fs::create_directories(dir);
  const fs::path path = dir / "lab.yaml";
  std::ofstream(path) << kFile;
  EXPECT_EQ(find_hardware(path.string()).name, "lab-gpu");
  EXPECT_THROW_WITH(find_hardware((dir / "none.yaml").string()), IoError, "none.yaml");
  // A FIFO is refused, not waited on.
  const fs::path fifo = dir / "fifo.yaml";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW_WITH(find_hardware(fifo.string()), IoError, "fifo.yaml");
  fs::remove_all(dir);
}

// The reader contract (docs/cli.md "Input files"), as rule files follow it: a key given twice or
// unknown, a value of the wrong type (a list of sources, a quoted number) and a figure outside
// its physical range are errors naming the file, the line and the key (issue 39: a figure given
// twice kept the first, an unknown key was ignored, a list under sources: was "internal error:
// yaml-cpp ... bad conversion", and bf16_flops: 1e-300 planned "step inf s").
TEST(Hardware, AFileFollowsTheReaderContract) {
  const std::string full = kFile;
  const auto replaced = [&](const std::string& key, const std::string& value) {
    std::string s = full;
    const std::size_t at = s.find(key + ":") + key.size() + 2;
    return s.replace(at, s.find('\n', at) - at, value);
  };
  const auto expect_error = [](const std::string& text, const std::string& words) {
    SCOPED_TRACE(text);
    EXPECT_THROW_WITH(parse_hardware(text, "lab.yaml"), IoError, std::string("[hardware] lab.yaml:"),
                      words);
  };
  expect_error(full + "bf16_flops: 2.0e15\n", "'bf16_flops' is given twice");
  expect_error(full + "name: other\n", "'name' is given twice");
  expect_error(full + "bf16_flop: 1e15\n", "unknown key 'bf16_flop' (a hardware file has: name, ");
  expect_error(full + "  bf16_flops: again\n", "'sources' gives 'bf16_flops' twice");
  expect_error(replaced("sources", "[a, b]"), "'sources' is a list: it must be a mapping");
  expect_error(full + "  fp8_flops: [a, b]\n", "the source of 'fp8_flops' is a list, not text");
  expect_error(replaced("name", "[a]"), "'name' is a list, not text");
  expect_error(replaced("bf16_flops", "\"1e15\""), "'bf16_flops' is quoted text, not a number");
  expect_error(replaced("bf16_flops", ""), "'bf16_flops' is empty, not a number");
  // Each figure's range, at and past its ends (the ends themselves are accepted).
  const std::vector<std::tuple<std::string, std::string, std::string, std::string>> ranges = {
      {"bf16_flops", "1e-300", "1e9", "1e18"},       {"bf16_flops", "1.1e18", "1e9", "1e18"},
      {"fp8_flops", "1e8", "1e9", "1e18"},           {"memory_bandwidth", "9e8", "1e9", "1e15"},
      {"memory_bandwidth", "2e15", "1e9", "1e15"},   {"memory_bytes", "1048575", "1048576", "1125899906842624"},
      {"memory_bytes", "1125899906842625", "1048576", "1125899906842624"},
      {"node_size", "0", "1", "65536"},              {"node_size", "65537", "1", "65536"},
      {"intra_node_bandwidth", "9e7", "1e8", "1e14"}, {"inter_node_bandwidth", "2e14", "1e8", "1e14"},
      {"matmul_efficiency", "0.009", "0.01", "1"},   {"inter_node_efficiency", "80", "0.01", "1"},
  };
  for (const auto& [key, bad, low, high] : ranges) {
    expect_error(replaced(key, bad), fmt::format("'{}' is {}: it must be", key, bad));
    EXPECT_NO_THROW(parse_hardware(replaced(key, low), "lab.yaml")) << key << " " << low;
    EXPECT_NO_THROW(parse_hardware(replaced(key, high), "lab.yaml")) << key << " " << high;
  }
  // Nesting past what yaml-cpp recurses through safely is refused before it parses.
  expect_error(replaced("sources", std::string(5000, '[') + std::string(5000, ']')),
               "nesting deeper than 128 levels");
}

// Every built-in entry, written as a file, is read back: the built-in figures are inside the
// ranges a file is held to.
TEST(Hardware, EveryBuiltInEntryIsInsideTheFileRanges) {
  for (const Hardware& h : builtin_hardware()) {
    SCOPED_TRACE(h.name);
    std::string text = fmt::format("name: {}\n", h.name);
    const std::vector<std::pair<std::string, double>> figures = {
        {"bf16_flops", h.bf16_flops},
        {"fp8_flops", h.fp8_flops},
        {"memory_bandwidth", h.memory_bandwidth},
        {"memory_bytes", static_cast<double>(h.memory_bytes)},
        {"node_size", static_cast<double>(h.node_size)},
        {"intra_node_bandwidth", h.intra_node_bandwidth},
        {"inter_node_bandwidth", h.inter_node_bandwidth},
        {"matmul_efficiency", h.matmul_efficiency},
        {"fp8_matmul_efficiency", h.fp8_matmul_efficiency},
        {"attention_efficiency", h.attention_efficiency},
        {"memory_efficiency", h.memory_efficiency},
        {"intra_node_efficiency", h.intra_node_efficiency},
        {"inter_node_efficiency", h.inter_node_efficiency}};
    for (const auto& [key, v] : figures) text += fmt::format("{}: {}\n", key, v);
    const Hardware back = parse_hardware(text, h.name + ".yaml");
    EXPECT_DOUBLE_EQ(back.bf16_flops, h.bf16_flops);
    EXPECT_EQ(back.memory_bytes, h.memory_bytes);
  }
}

}  // namespace
}  // namespace shardplan

namespace shardplan {
namespace {

// The partitioner's per-axis figures, by hand from the H100 entry (8 GPUs a node, NVLink 450
// GB/s x 0.82, a 50 GB/s NIC per GPU x 0.96): on fsdp:4,tp:8 the tp groups are the nodes (the
// node's links); each fsdp group has one device in each of 4 nodes (one NIC); on fsdp:2,tp:16
// the tp groups span two nodes with 8 devices in each (8 NICs, bound by the node's links).
TEST(Hardware, LinkFiguresPriceEachAxisAsTheTimeModelPricesARingOverIt) {
  const Hardware h = find_hardware("h100-sxm");
  const LinkFigures a = link_figures(h, Mesh::parse("fsdp:4,tp:8", 32));
  ASSERT_EQ(a.axes.size(), 2U);
  EXPECT_DOUBLE_EQ(a.axes.at("tp").bytes_per_second, 450e9 * 0.82);
  EXPECT_DOUBLE_EQ(a.axes.at("fsdp").bytes_per_second, 50e9 * 0.96);
  EXPECT_EQ(a.axes.at("tp").latency_seconds, 0);
  EXPECT_DOUBLE_EQ(a.flops_per_second, 989.4e12 * 0.80);
  const LinkFigures b = link_figures(h, Mesh::parse("fsdp:2,tp:16", 32));
  EXPECT_DOUBLE_EQ(b.axes.at("tp").bytes_per_second, std::min(450e9 * 0.82, 8 * 50e9 * 0.96));
  EXPECT_DOUBLE_EQ(b.axes.at("fsdp").bytes_per_second, 50e9 * 0.96);
}

}  // namespace
}  // namespace shardplan
