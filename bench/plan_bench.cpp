// Planning speed on a DeepSeek-V3-sized tree (~91k tensors) with a 20-rule table.
//   plan_bench                         run the benchmarks
//   plan_bench --dump-workload FILE    write {"patterns": [...], "paths": [...]} for the Python
//                                      reference (scripts/plan_reference.py)
//   plan_bench --dump-e2e DIR          write DIR/model.json (the model description),
//                                      DIR/rules.yaml (the 20-rule table as a rule file) and
//                                      DIR/rules.json (the same table for the Python reference),
//                                      the end-to-end workload of scripts/bench_cli.sh
#include <benchmark/benchmark.h>

#include <boost/regex.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "deepseek_v3.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/plan_report.hpp"

namespace {

using namespace shardplan;

struct Workload {
  Tree<TensorSpec> tree;           // as tree_from_names builds it: equal subtrees shared
  Tree<TensorSpec> unshared_tree;  // the same tree with every node stored on its own
  std::vector<std::pair<std::string, TensorSpec>> leaves;
  std::shared_ptr<const TreePathShardingRule> rule;
  Mesh mesh;
};

const Workload& workload() {
  static const Workload w = [] {
    auto named = bench::deepseek_v3_tensors();
    Tree<TensorSpec> tree = tree_from_names(named);
    auto leaves = tree.flatten();
    Tree<TensorSpec> unshared = tree.map([](const TensorSpec& t) { return t; });
    return Workload{std::move(tree), std::move(unshared), std::move(leaves),
                    std::make_shared<TreePathShardingRule>(bench::deepseek_v3_rules()),
                    Mesh::parse(bench::kDeepseekMesh, 64)};
  }();
  return w;
}

void BM_Plan(benchmark::State& state) {
  const Workload& w = workload();
  const MeshShardingHelper helper(w.mesh);
  const RuleTree rules{RulePtr(w.rule)};
  for (auto _ : state) {
    PlanReport r = helper.plan(rules, w.tree);
    benchmark::DoNotOptimize(r);
  }
  state.counters["tensors"] = static_cast<double>(w.leaves.size());
  state.counters["ns_per_tensor"] = benchmark::Counter(
      static_cast<double>(w.leaves.size()),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Plan)->Unit(benchmark::kMillisecond)->MinTime(1.0);

void BM_Match(benchmark::State& state) {
  const Workload& w = workload();
  const MeshShardingHelper helper(w.mesh);
  const RuleTree rules{RulePtr(w.rule)};
  for (auto _ : state) {
    auto m = helper.match(rules, w.tree);
    benchmark::DoNotOptimize(m);
  }
}
BENCHMARK(BM_Match)->Unit(benchmark::kMillisecond)->MinTime(1.0);

void BM_Resolve(benchmark::State& state) {
  const Workload& w = workload();
  const MeshShardingHelper helper(w.mesh);
  const RuleTree rules{RulePtr(w.rule)};
  for (auto _ : state) {
    auto a = helper.resolve(rules, w.tree);
    benchmark::DoNotOptimize(a);
  }
}
BENCHMARK(BM_Resolve)->Unit(benchmark::kMillisecond)->MinTime(1.0);

// resolve() on a tree whose equal subtrees are stored apart (built in code, node by node):
// repeated subtrees are then found equal by comparing them node by node.
void BM_ResolveUnshared(benchmark::State& state) {
  const Workload& w = workload();
  const MeshShardingHelper helper(w.mesh);
  const RuleTree rules{RulePtr(w.rule)};
  for (auto _ : state) {
    auto a = helper.resolve(rules, w.unshared_tree);
    benchmark::DoNotOptimize(a);
  }
}
BENCHMARK(BM_ResolveUnshared)->Unit(benchmark::kMillisecond)->MinTime(1.0);

// Tree::share_equal_subtrees on the unshared tree: what tree_from_names adds to share them.
void BM_ShareEqualSubtrees(benchmark::State& state) {
  const Workload& w = workload();
  for (auto _ : state) {
    auto t = w.unshared_tree.share_equal_subtrees();
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_ShareEqualSubtrees)->Unit(benchmark::kMillisecond);

// Only visiting every node of the tree (counting leaves): the floor under any planner that walks
// this tree.
void BM_WalkOnly(benchmark::State& state) {
  const Workload& w = workload();
  for (auto _ : state) {
    auto n = w.unshared_tree.num_leaves();
    benchmark::DoNotOptimize(n);
  }
}
BENCHMARK(BM_WalkOnly)->Unit(benchmark::kMillisecond)->MinTime(1.0);

// The rule alone, leaf by leaf over the flattened paths: regex time without the planner.
void BM_RuleApplyOnly(benchmark::State& state) {
  const Workload& w = workload();
  for (auto _ : state) {
    int hits = 0;
    for (const auto& [path, spec] : w.leaves) {
      hits += w.rule->apply(RuleInput{path, spec, w.mesh}).entry;
    }
    benchmark::DoNotOptimize(hits);
  }
}
BENCHMARK(BM_RuleApplyOnly)->Unit(benchmark::kMillisecond)->MinTime(1.0);

// The same loop with Boost.Regex alone (what the rule does without its DFA): the baseline the
// DFA is measured against.
void BM_BoostRegexOnly(benchmark::State& state) {
  const Workload& w = workload();
  std::vector<boost::regex> rs;
  for (const auto& e : bench::deepseek_v3_rules()) rs.emplace_back(e.pattern, boost::regex::perl);
  for (auto _ : state) {
    long hits = 0;
    for (const auto& [path, spec] : w.leaves) {
      for (std::size_t i = 0; i < rs.size(); ++i) {
        if (boost::regex_search(path.data(), path.data() + path.size(), rs[i])) {
          hits += static_cast<long>(i);
          break;
        }
      }
    }
    benchmark::DoNotOptimize(hits);
  }
}
BENCHMARK(BM_BoostRegexOnly)->Unit(benchmark::kMillisecond)->MinTime(1.0);

// 1,000 tensors whose names hold a 10,000-character key, planned with the DeepSeek table:
// ASCII keys (arg 0) against keys in Greek and CJK (arg 1, 2-3 bytes per character). Patterns
// are matched on code points, so both go through the same DFA.
Tree<TensorSpec> long_name_tree(bool non_ascii) {
  const std::string unit = non_ascii
                               ? "\xce\xb6\xcf\x89\xce\xae\xe5\xb1\x82\xe6\x9d\x83"  // ζωή层权
                               : "zoelay";
  std::vector<std::pair<std::string, TensorSpec>> named;
  for (int i = 0; i < 1000; ++i) {
    std::string key = std::to_string(i) + "_";
    for (std::size_t chars = key.size(); chars < 10000; chars += non_ascii ? 5 : 6) key += unit;
    named.push_back({"model/layers/" + std::to_string(i % 61) + "/" + key + "/mlp/up_proj/weight",
                     TensorSpec{Shape{1024, 512}, DType::kBF16}});
  }
  return tree_from_names(named);
}

void BM_PlanLongNames(benchmark::State& state) {
  const Workload& w = workload();
  const Tree<TensorSpec> tree = long_name_tree(state.range(0) == 1);
  const MeshShardingHelper helper(w.mesh);
  const RuleTree rules{RulePtr(w.rule)};
  for (auto _ : state) {
    PlanReport r = helper.plan(rules, tree);
    benchmark::DoNotOptimize(r);
  }
  state.SetLabel(state.range(0) == 1 ? "non-ASCII names" : "ASCII names");
}
BENCHMARK(BM_PlanLongNames)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// The matching alone on the same paths: TreePathShardingRule::apply on each flattened path.
void BM_ApplyLongNames(benchmark::State& state) {
  const Workload& w = workload();
  const auto leaves = long_name_tree(state.range(0) == 1).flatten();
  for (auto _ : state) {
    int hits = 0;
    for (const auto& [path, spec] : leaves)
      hits += w.rule->apply(RuleInput{path, spec, w.mesh}).entry;
    benchmark::DoNotOptimize(hits);
  }
  state.SetLabel(state.range(0) == 1 ? "non-ASCII names" : "ASCII names");
}
BENCHMARK(BM_ApplyLongNames)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// Compiling the 20-rule table (parsing, the DFA over code points) once.
void BM_BuildRule(benchmark::State& state) {
  const auto entries = bench::deepseek_v3_rules();
  for (auto _ : state) {
    TreePathShardingRule rule(entries);
    benchmark::DoNotOptimize(rule);
  }
}
BENCHMARK(BM_BuildRule)->Unit(benchmark::kMillisecond);

// Building the tree from checkpoint names (what `shardplan plan --model` does before planning).
void BM_TreeFromNames(benchmark::State& state) {
  const auto named = bench::deepseek_v3_tensors();
  for (auto _ : state) {
    auto t = tree_from_names(named);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_TreeFromNames)->Unit(benchmark::kMillisecond);

// The steps of `shardplan plan --model model.json --json` on this model, one by one (the whole
// command is timed against the Python reference by scripts/bench_cli.sh).
const std::string& model_json_text() {
  static const std::string text = [] {
    std::string t = "{";
    for (const auto& [name, spec] : bench::deepseek_v3_tensors()) {
      nlohmann::json v{{"shape", spec.shape.dims()},
                       {"dtype", std::string(safetensors_name(spec.dtype))}};
      t += (t.size() > 1 ? ",\n" : "\n") + nlohmann::json(name).dump() + ": " + v.dump();
    }
    return t + "\n}\n";
  }();
  return text;
}

void BM_ParseModelDescription(benchmark::State& state) {
  const std::string& text = model_json_text();
  for (auto _ : state) {
    auto named = parse_model_description(text);
    benchmark::DoNotOptimize(named);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_ParseModelDescription)->Unit(benchmark::kMillisecond);

void BM_ReportJson(benchmark::State& state) {
  const Workload& w = workload();
  const MeshShardingHelper helper(w.mesh);
  const RuleTree rules{RulePtr(w.rule)};
  const PlanReport r = helper.plan(rules, w.tree);
  for (auto _ : state) {
    std::ostringstream os;
    r.write_json(os);
    benchmark::DoNotOptimize(os);
  }
}
BENCHMARK(BM_ReportJson)->Unit(benchmark::kMillisecond);

int dump_workload(const char* file) {
  const Workload& w = workload();
  nlohmann::json j;
  for (const auto& e : bench::deepseek_v3_rules()) j["patterns"].push_back(e.pattern);
  for (const auto& [path, spec] : w.leaves) j["paths"].push_back(path);
  std::ofstream(file) << j.dump();
  // The decisions' checksum, to compare with the Python reference's (same paths, same order).
  long sum = 0;
  for (const auto& [path, spec] : w.leaves) {
    const auto d = w.rule->apply(RuleInput{path, spec, w.mesh});
    sum += d.entry >= 0 ? d.entry : 0;
  }
  std::printf("cpp checksum %ld\n", sum);
  return 0;
}

std::string yaml_axis_group(const AxisNames& d) {
  if (d.empty()) return "null";
  if (d.size() == 1) return d[0];
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + d[i];
  return s + "]";
}

int dump_e2e(const std::string& dir) {
  std::ofstream(dir + "/model.json") << model_json_text();
  std::string yaml = fmt::format("mesh: \"{}\"\nstrict: true\nrules:\n", bench::kDeepseekMesh);
  nlohmann::json rules;
  rules["mesh"] = bench::kDeepseekMesh;
  rules["rules"] = nlohmann::json::array();
  for (const auto& e : bench::deepseek_v3_rules()) {
    std::string spec = "[";
    nlohmann::json dims = nlohmann::json::array();
    for (std::size_t i = 0; i < e.spec.dims().size(); ++i) {
      const AxisNames& d = e.spec.dims()[i];
      spec += (i ? ", " : "") + yaml_axis_group(d);
      dims.push_back(d);
    }
    spec += "]";
    yaml += fmt::format("  - {{match: {}, spec: {}}}\n", nlohmann::json(e.pattern).dump(), spec);
    rules["rules"].push_back({{"match", e.pattern}, {"spec", dims}});
  }
  std::ofstream(dir + "/rules.yaml") << yaml;
  std::ofstream(dir + "/rules.json") << rules.dump(1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--dump-workload") == 0) return dump_workload(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "--dump-e2e") == 0) return dump_e2e(argv[2]);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
