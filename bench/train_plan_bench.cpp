// How long `shardplan train-plan` takes to size a LLaMA-3-70B-shaped training step (80 layers,
// AdamW, bf16, recomputation) on 64 to 1,024 devices: tracing, propagation, partitioning and
// memory planning of the whole step on abstract arguments; 1,000 such layers, with one and with
// 8,192 micro-batches, planned from small steps; and a comparison of 7 meshes (issue 28). The
// baseline in the same run is the weights-only plan of the same parameters (`shardplan plan`:
// rules resolved, no program).
//
//   build-release/bench/train_plan_bench
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/train_plan.hpp"

namespace {

using namespace shardplan;

// "fsdp:32,tp:8": 256.
std::int64_t devices_of(const std::string& mesh) {
  std::int64_t n = 1;
  std::size_t at = 0;
  while ((at = mesh.find(':', at)) != std::string::npos) n *= std::stoll(mesh.substr(++at));
  return n;
}

const ModelConfig& llama3_70b() {
  static const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama",
    "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8})");
  return c;
}

void BM_TrainPlanLlama70B(benchmark::State& state) {
  const std::int64_t devices = state.range(0);
  const Mesh mesh = Mesh::parse("fsdp:-1,tp:8", devices);
  const RulePtr rules = load_preset("llama_fsdp_tp").make_rule();
  TrainPlanOptions o;
  o.batch = devices / 8;  // one sequence per data-parallel rank
  o.seq = 4096;
  o.recompute = true;
  std::int64_t peak = 0;
  for (auto _ : state) {
    const TrainPlan p = plan_training(llama3_70b(), mesh, rules, o);
    peak = p.peak_bytes;
    benchmark::DoNotOptimize(peak);
  }
  state.counters["peak_GiB"] = static_cast<double>(peak) / (1 << 30);
}
BENCHMARK(BM_TrainPlanLlama70B)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);

// 1,000 layers of LLaMA-3-70B's width (cost bounds, issue 24): planned from steps of 2, 3, 4 and
// 8 layers (docs/training.md); before, every layer was traced (14 s, 2.2 GB).
void BM_TrainPlan1000Layers(benchmark::State& state) {
  ModelConfig c = llama3_70b();
  c.layers = 1000;
  const Mesh mesh = Mesh::parse("fsdp:-1,tp:8", 64);
  const RulePtr rules = load_preset("llama_fsdp_tp").make_rule();
  TrainPlanOptions o;
  o.seq = 4096;
  o.recompute = true;
  o.grad_accum = static_cast<int>(state.range(0));
  o.batch = 8 * o.grad_accum;
  std::int64_t peak = 0;
  for (auto _ : state) {
    const TrainPlan p = plan_training(c, mesh, rules, o);
    peak = p.peak_bytes;
    benchmark::DoNotOptimize(peak);
  }
  state.counters["peak_GiB"] = static_cast<double>(peak) / (1 << 30);
}
BENCHMARK(BM_TrainPlan1000Layers)->Arg(1)->Arg(8192)->Unit(benchmark::kMillisecond)->Iterations(2);

// Issue 28: `train-plan --compare` of LLaMA-3-70B over 7 meshes of 256 to 1,024 devices (batch
// 1,024 x 4,096 tokens, --recompute, the preset's activations as the CLI gives them), through
// plan_concurrently as the CLI calls it: on 1 thread (a loop of plan_training) and on 2 (the
// CLI's default on a 2-core machine). Wall and process CPU time.
void BM_TrainPlanCompare70B(benchmark::State& state) {
  const std::vector<std::string> meshes{"fsdp:32,tp:8",  "fsdp:64,tp:8",  "fsdp:128,tp:8",
                                        "fsdp:128,tp:4", "fsdp:256,tp:4", "fsdp:256,tp:2",
                                        "fsdp:512,tp:2"};
  const RuleFile file = load_preset("llama_fsdp_tp");
  TrainPlanOptions o;
  o.batch = 1024;
  o.seq = 4096;
  o.recompute = true;
  o.device_memory = parse_bytes("80GiB");
  o.activations = file;
  std::vector<Mesh> parsed;
  std::vector<RulePtr> rules;
  for (const std::string& m : meshes) {
    parsed.push_back(Mesh::parse(m, devices_of(m)));
    rules.push_back(file.make_rule());
  }
  double whole = 0;
  for (auto _ : state) {
    const std::vector<TrainPlan> plans = plan_concurrently(
        parsed.size(),
        [&](std::size_t i) { return plan_training(llama3_70b(), parsed[i], rules[i], o); },
        static_cast<int>(state.range(0)));
    whole = 0;
    for (const TrainPlan& p : plans) whole += p.extrapolated ? 0 : 1;
    benchmark::DoNotOptimize(plans.data());
  }
  state.counters["traced_whole"] = whole;  // meshes whose figures are not extrapolated
}
BENCHMARK(BM_TrainPlanCompare70B)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime()
    ->Iterations(3);

void BM_WeightsOnlyPlanLlama70B(benchmark::State& state) {
  const MeshShardingHelper helper(Mesh::parse("fsdp:-1,tp:8", state.range(0)));
  const RuleTree rules(load_preset("llama_fsdp_tp").make_rule());
  const Tree<TensorSpec> params = llama3_70b().parameters(DType::kBF16);
  for (auto _ : state) {
    const PlanReport r = helper.plan(rules, params);
    benchmark::DoNotOptimize(r.device_bytes.data());
  }
}
BENCHMARK(BM_WeightsOnlyPlanLlama70B)->Arg(64)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
