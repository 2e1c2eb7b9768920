// PlanReport: bytes per device, rule records, unmatched rules, JSON and table.

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/rules/fsdp_sharding_rule.hpp"
#include "shardplan/rules/logical_axis_rule.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using namespace shardplan::test;  // NOLINT: test fixtures
using Data = Tree<TensorSpec>;

TEST(PlanReport, BytesPerDeviceEqualTheSumOfEachDevicesBlocks) {
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params", RulePtr(std::make_shared<FSDPShardingRule>(
                     FSDPShardingRule::Options{.axis = "x", .min_size = 1}))},
      {"opt_state", P(AxisNames{"x", "y"}, nullptr)},
  });
  const auto data = small_model();
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, data);
  const auto shardings = MeshShardingHelper(xy_mesh()).match(rules, data);
  std::vector<std::int64_t> expected(8, 0);
  std::int64_t total = 0;
  const auto specs = data.leaves();
  const auto sh = shardings.leaves();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    total += specs[i].bytes();
    const auto blocks = sh[i]->device_blocks(specs[i].shape);
    for (int dev = 0; dev < 8; ++dev) {
      std::int64_t n = 1;
      for (const DimSlice& s : blocks[static_cast<std::size_t>(dev)]) n *= s.size;
      expected[static_cast<std::size_t>(dev)] +=
          n * static_cast<std::int64_t>(size_of(specs[i].dtype));
    }
  }
  EXPECT_EQ(report.device_bytes, expected);
  EXPECT_EQ(report.total_bytes, total);
  EXPECT_EQ(report.min_device_bytes(), expected[0]);
  EXPECT_EQ(report.max_device_bytes(), expected[0]);
}

TEST(PlanReport, RecordsRuleIndexEntryUnmatchedEntriesAndLargest) {
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params", RulePtr(std::make_shared<FirstDimUnderH>())},
      {"opt_state", Replicated{}},
  });
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  const LeafPlan* w = report.find("params/h/0/w_out");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->rule_index, 1);
  EXPECT_EQ(report.rule_of(*w).rule_path, "params");
  EXPECT_EQ(report.rule_of(*w).rule, "FirstDimUnderH");
  EXPECT_EQ(report.reason_of(*w), "under h");
  EXPECT_EQ(w->entry, 0);
  EXPECT_EQ(w->shard_shape, Shape({64, 64}));
  EXPECT_EQ(w->bytes_per_device, 64 * 64 * 2);
  ASSERT_EQ(report.unmatched_rules.size(), 1u);
  EXPECT_EQ(report.unmatched_rules[0].label, "never");
  EXPECT_EQ(report.unmatched_rules[0].entry, 2);
  const auto big = report.largest(2);
  ASSERT_EQ(big.size(), 2u);
  EXPECT_EQ(report.leaves[big[0]].path, "opt_state/mu");  // ties (1024x64) in path order
  EXPECT_EQ(report.leaves[big[1]].path, "params/embed");
  EXPECT_EQ(report.find("nope"), nullptr);
}

TEST(PlanReport, LogicalAxisMappingsThatDecidedADimensionAreNotUnmatched) {
  // Each dimension is decided by one mapping entry; a tensor's first sharded dimension is not
  // the only one that counts, and "embed -> null" decides too (not sharded).
  const RuleTree rules(RulePtr(std::make_shared<LogicalAxisRule>(
      LogicalAxisRule::Mapping{{"batch", AxisNames{"data"}},  // 0: x dim 0
                               {"mlp", AxisNames{"tp"}},      // 1: w dim 1, v dim 0
                               {"embed", std::nullopt},       // 2: w dim 0, x dim 1
                               {"heads", AxisNames{"tp"}},    // 3: no tensor has heads
                               {"vocab", AxisNames{"tp"}},    // 4: tp is taken in v: skipped
                               {"vocab", AxisNames{"data"}}}  // 5: v dim 1
      )));
  const Data data = Data::dict({{"v", TensorSpec{Shape{8, 16}, DType::kF32, {"mlp", "vocab"}}},
                                {"w", TensorSpec{Shape{8, 16}, DType::kF32, {"embed", "mlp"}}},
                                {"x", TensorSpec{Shape{8, 16}, DType::kF32, {"batch", "embed"}}}});
  const PlanReport report = MeshShardingHelper(Mesh::parse("data:4,tp:2", 8)).plan(rules, data);
  EXPECT_EQ(report.find("v")->spec, P("tp", "data"));
  EXPECT_EQ(report.find("w")->spec, P(nullptr, "tp"));
  EXPECT_EQ(report.find("x")->spec, P("data", nullptr));
  std::vector<std::pair<int, std::string>> unmatched;
  for (const UnmatchedRule& u : report.unmatched_rules) unmatched.emplace_back(u.entry, u.label);
  EXPECT_EQ(unmatched,
            (std::vector<std::pair<int, std::string>>{{3, "heads -> tp"}, {4, "vocab -> tp"}}));
}

TEST(PlanReport, RuleCoveringNoLeafIsUnmatched) {
  const RuleTree rules = RuleTree::dict(
      {{"a", P("x")},
       {"b", Data::dict({}).map([](const TensorSpec&) { return RuleLeaf(Replicated{}); })}});
  const Data data = Data::dict({{"a", bf16({8})}, {"b", Data::dict({})}});
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, data);
  EXPECT_TRUE(report.unmatched_rules.empty());  // "b" is an empty dict on both sides: no rule leaf
  const RuleTree rules2 = RuleTree::dict({{"a", P("x")}, {"b", Replicated{}}});
  const PlanReport report2 = MeshShardingHelper(xy_mesh()).plan(rules2, data);
  ASSERT_EQ(report2.unmatched_rules.size(), 1u);
  EXPECT_EQ(report2.unmatched_rules[0].rule_path, "b");
}

TEST(PlanReport, JsonHasTheDocumentedFields) {
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params", RulePtr(std::make_shared<FirstDimUnderH>())},
      {"opt_state", P(AxisNames{"x", "y"}, nullptr)},
  });
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  const auto j = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(j["mesh"]["axes"], (nlohmann::json{"x", "y"}));
  EXPECT_EQ(j["mesh"]["shape"], (nlohmann::json{4, 2}));
  ASSERT_EQ(j["leaves"].size(), 7u);
  for (const auto& leaf : j["leaves"]) {
    for (const char* f :
         {"path", "shape", "dtype", "spec", "shard_shape", "bytes_per_device", "rule"}) {
      EXPECT_TRUE(leaf.contains(f)) << f;
    }
  }
  const auto& mu = j["leaves"][0];
  EXPECT_EQ(mu["path"], "opt_state/mu");
  EXPECT_EQ(mu["spec"], nlohmann::json::parse(R"([["x", "y"], null])"));
  EXPECT_EQ(mu["shard_shape"], (nlohmann::json{128, 64}));
  EXPECT_EQ(mu["dtype"], "BF16");
  ASSERT_EQ(j["devices"].size(), 8u);
  EXPECT_EQ(j["devices"][3]["id"], 3);
  EXPECT_EQ(j["devices"][3]["bytes"], report.device_bytes[3]);
  EXPECT_EQ(j["total_bytes"], report.total_bytes);
  EXPECT_EQ(j["unmatched_rules"].size(), 1u);
}

TEST(PlanReport, TableListsEveryLeafAndTheSummary) {
  const RuleTree rules(RulePtr(
      std::make_shared<FSDPShardingRule>(FSDPShardingRule::Options{.axis = "x", .min_size = 1})));
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  const std::string t = report.table();
  for (const auto& l : report.leaves) EXPECT_THAT(t, ::testing::HasSubstr(l.path));
  EXPECT_THAT(t, ::testing::HasSubstr("bytes per device"));
  EXPECT_THAT(t, ::testing::HasSubstr("largest tensors"));
  EXPECT_THAT(t, ::testing::HasSubstr("FSDPShardingRule(axis=x, min_size=1)"));
}

TEST(PlanReport, UnspecifiedLeavesKeepTheGlobalShapeAndHoldNoBytes) {
  const RuleTree rules =
      RuleTree::dict({{"step", Unspecified{}}, {"params", Replicated{}}, {"opt_state", P("x")}});
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  const LeafPlan* step = report.find("step");
  ASSERT_NE(step, nullptr);
  EXPECT_FALSE(step->spec.has_value());
  EXPECT_EQ(step->shard_shape, Shape{});
  EXPECT_EQ(step->bytes_per_device, 0);
  const auto j = nlohmann::json::parse(report.to_json());
  const auto& last = j["leaves"].back();
  EXPECT_EQ(last["path"], "step");
  EXPECT_TRUE(last["spec"].is_null());
  EXPECT_EQ(last["bytes_per_device"], 0);
  EXPECT_EQ(j["leaves"][0]["rule"], "PartitionSpec");
  EXPECT_EQ(j["leaves"][0]["spec"], nlohmann::json::parse(R"(["x"])"));
}

TEST(PlanReport, DeviceBytesSumTheLeavesBytesPerDevice) {
  const RuleTree rules = RuleTree::dict(
      {{"step", Replicated{}}, {"params", P(nullptr, "y")}, {"opt_state", P("x", "y")}});
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  // Every spec here divides evenly, so each device holds the sum of the shard bytes.
  std::int64_t per_device = 0;
  for (const auto& l : report.leaves) {
    std::int64_t parts = 1;
    for (int d = 0; d < l.tensor.shape.rank(); ++d) {
      for (const auto& a : (*l.spec)[d]) parts *= xy_mesh().axis_size(a);
    }
    EXPECT_EQ(l.bytes_per_device, l.tensor.bytes() / parts) << l.path;
    per_device += l.bytes_per_device;
  }
  EXPECT_EQ(report.device_bytes, std::vector<std::int64_t>(8, per_device));
}

TEST(PlanReport, ValueTypeComparesAndPrints) {
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params", RulePtr(std::make_shared<FirstDimUnderH>())},
      {"opt_state", Replicated{}},
  });
  const PlanReport a = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  EXPECT_EQ(a, MeshShardingHelper(xy_mesh()).plan(rules, small_model()));
  std::ostringstream os;
  os << *a.find("params/h/0/w_in") << "\n" << a.rules[1] << "\n" << a.unmatched_rules[0];
  EXPECT_EQ(os.str(),
            "params/h/0/w_in bf16[64, 256] [\"x\"] -> [16, 256], 8192 bytes/device, rule #1 [0]\n"
            "#1 at 'params': FirstDimUnderH\n"
            "#1 FirstDimUnderH [2]: 'never'");
  std::ostringstream table;
  table << a;
  EXPECT_EQ(table.str(), a.table());
}

TEST(PlanReport, FormatBytesUsesBinaryUnits) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3LL << 30), "3.00 GiB");
}

/// The report as nlohmann builds it (keys sorted), the independent expectation for the writer.
nlohmann::json report_dom(const PlanReport& r) {
  nlohmann::json j;
  j["mesh"] = {
      {"axes", r.mesh.axis_names()}, {"shape", r.mesh.axis_sizes()}, {"devices", r.mesh.devices()}};
  nlohmann::json leaves = nlohmann::json::array();
  for (const auto& l : r.leaves) {
    nlohmann::json spec = nullptr;
    if (l.spec) {
      spec = nlohmann::json::array();
      for (const auto& d : l.spec->dims()) {
        spec.push_back(d.empty()       ? nlohmann::json(nullptr)
                       : d.size() == 1 ? nlohmann::json(d[0])
                                       : nlohmann::json(d));
      }
    }
    leaves.push_back({{"path", l.path},
                      {"shape", l.tensor.shape.dims()},
                      {"dtype", std::string(safetensors_name(l.tensor.dtype))},
                      {"spec", spec},
                      {"shard_shape", l.shard_shape.dims()},
                      {"bytes", l.tensor.bytes()},
                      {"bytes_per_device", l.bytes_per_device},
                      {"rule", r.rule_of(l).rule},
                      {"rule_index", l.rule_index},
                      {"rule_path", r.rule_of(l).rule_path},
                      {"entry", l.entry},
                      {"reason", r.reason_of(l)},
                      {"fell_through", l.fell_through}});
  }
  j["leaves"] = leaves;
  j["devices"] = nlohmann::json::array();
  for (std::size_t i = 0; i < r.device_bytes.size(); ++i) {
    j["devices"].push_back({{"id", i}, {"bytes", r.device_bytes[i]}});
  }
  j["total_bytes"] = r.total_bytes;
  j["bytes_per_device"] = {{"min", r.min_device_bytes()}, {"max", r.max_device_bytes()}};
  j["unmatched_rules"] = nlohmann::json::array();
  for (const auto& u : r.unmatched_rules) {
    j["unmatched_rules"].push_back({{"rule_index", u.rule_index},
                                    {"rule_path", u.rule_path},
                                    {"rule", u.rule},
                                    {"entry", u.entry},
                                    {"label", u.label},
                                    {"activation", u.activation}});
  }
  j["fell_through"] = nlohmann::json::array();
  for (auto i : r.fell_through()) j["fell_through"].push_back(r.leaves[i].path);
  return j;
}

TEST(PlanReport, JsonTextIsWhatNlohmannWouldPrint) {
  const RuleTree rules = RuleTree::dict({
      {"step", Replicated{}},
      {"params",
       RulePtr(std::make_shared<TreePathShardingRule>(std::vector<TreePathShardingRule::Entry>{
           {"embed", P("x")}, {"never \"quoted\"\t\\\\", P()}, {".*", P()}}))},
      {"opt_state", P(AxisNames{"x", "y"}, nullptr)},
  });
  const PlanReport report = MeshShardingHelper(xy_mesh()).plan(rules, small_model());
  ASSERT_FALSE(report.unmatched_rules.empty());
  for (int indent : {2, -1, 0, 4}) {
    EXPECT_EQ(report.to_json(indent), report_dom(report).dump(indent)) << indent;
    std::ostringstream os;
    report.write_json(os, indent);
    EXPECT_EQ(os.str(), report.to_json(indent)) << indent;
  }
}

TEST(PlanReport, LargeReportsWrittenInParallelChunksReadAsNlohmannWouldPrintThem) {
  // More leaves than one chunk of the parallel writer (1,024), with names of every length
  // around the 8-byte steps of the string scanner and bytes to escape at every offset, so
  // that chunk boundaries and the word-at-a-time path are both crossed.
  std::vector<Data::DictEntry> entries;
  const std::string specials[] = {"\"",
                                  "\\",
                                  "\n",
                                  "\t",
                                  std::string(1, '\x01'),
                                  "\x7f",
                                  "\xc3\xa9",
                                  "\xe2\x82\xac",
                                  "\xf0\x9f\x98\x80",
                                  "a"};
  for (int i = 0; i < 5000; ++i) {
    std::string name =
        fmt::format("w{:05}_", i) + std::string(static_cast<std::size_t>(i % 23), 'x');
    const std::size_t at = static_cast<std::size_t>(i * 7) % (name.size() + 1);
    name.insert(at, specials[i % 10]);
    entries.emplace_back(name, bf16({4, 2 * (i % 5 + 1)}));
  }
  const RuleTree rules(RulePtr(std::make_shared<TreePathShardingRule>(
      std::vector<TreePathShardingRule::Entry>{{"w0[0-2]", P("x")}, {".*", P(nullptr, "y")}})));
  const PlanReport report =
      MeshShardingHelper(xy_mesh()).plan(rules, Data::dict(std::move(entries)));
  ASSERT_EQ(report.leaves.size(), 5000u);
  for (int indent : {2, -1}) {
    const std::string text = report.to_json(indent);
    EXPECT_EQ(text, report_dom(report).dump(indent)) << indent;
    std::ostringstream os;
    report.write_json(os, indent);
    EXPECT_EQ(os.str(), text) << indent;
  }
}

TEST(PlanReport, JsonReplacesBytesThatAreNotUtf8) {
  // A tree built in C++ may have keys with any bytes (patterns must be UTF-8, as Python's str);
  // the JSON stays valid, each bad byte one U+FFFD.
  const std::string key = "w\xff\xc3(\xe2\x82)?\x01\xc3\xa9";
  const RuleTree rules(RulePtr(std::make_shared<TreePathShardingRule>(
      std::vector<TreePathShardingRule::Entry>{{"never", P()}, {".*", P()}})));
  const PlanReport report =
      MeshShardingHelper(xy_mesh()).plan(rules, Data::dict({{key, bf16({4})}}));
  const std::string text = report.to_json();
  const auto j = nlohmann::json::parse(text);  // throws on invalid UTF-8
  // ff, a lone c3, then e2 82 cut short are each replaced; U+0001 is escaped; é is kept.
  const std::string want = "w\xef\xbf\xbd\xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd)?\x01\xc3\xa9";
  ASSERT_EQ(j["leaves"].size(), 1u);
  EXPECT_EQ(j["leaves"][0]["path"], want);
  EXPECT_EQ(j["leaves"][0]["reason"], "matched '.*'");
  EXPECT_THAT(text, ::testing::HasSubstr("\\u0001"));
}

}  // namespace
}  // namespace shardplan
