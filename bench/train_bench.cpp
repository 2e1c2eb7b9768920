// Training steps under sjit: the guide's MLP (784-1024-1024-1024-10, batch 4096: forward, backward,
// SGD update) on 8 devices beside
// 1 device and beside the same step written by hand with Eigen, and the tokens per second of the
// LLaMA-style example model with the FSDP+TP preset against pure data parallelism.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <thread>

#include "../examples/llama_model.hpp"
#include "../examples/mlp.hpp"
#include "gemm.hpp"
#include "mlp_train_step.hpp"
#include "paired.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/optim.hpp"
#include "shardplan/profiler.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/sjit.hpp"

namespace {

using namespace shardplan;

// The same MLP and batch as the sjit step (bench/mlp_train_step.hpp), for the Eigen baseline.
constexpr std::int64_t kBatch = bench::kMlpBatch;
const std::vector<std::int64_t>& kSizes = bench::kMlpSizes;

const Executor& exec(int n) {
  static const Executor e8(8), e2(2), e1(1);
  return n == 8 ? e8 : n == 2 ? e2 : e1;
}

// Eight 1-device executors of their own (copies of one Executor would share its devices).
const std::vector<Executor>& eight_executors() {
  static const std::vector<Executor> e = [] {
    std::vector<Executor> made;
    for (int i = 0; i < 8; ++i) made.emplace_back(1);
    return made;
  }();
  return e;
}

void mlp_train(benchmark::State& state, int devices) {
  const Mesh mesh = Mesh::parse(fmt::format("data:{}", devices), devices);
  bench::run_mlp_train_steps(state, exec(devices), mesh, /*warm_up=*/false);
}
void BM_MlpTrainStep8Devices(benchmark::State& s) { mlp_train(s, 8); }
// One device per core: what 8 virtual devices on 2 cores cost over 2 (8 gradient replicas to
// all-reduce and update instead of 2).
void BM_MlpTrainStep2Devices(benchmark::State& s) { mlp_train(s, 2); }
void BM_MlpTrainStep1Device(benchmark::State& s) { mlp_train(s, 1); }
BENCHMARK(BM_MlpTrainStep2Devices)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_MlpTrainStep8Devices)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_MlpTrainStep1Device)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
// The same step with the update sharded by hand (bench/mlp_train_step.hpp: reduce-scatter,
// update a slice, all-gather), which the partitioner now also makes of the plain step.
void BM_MlpTrainStep8DevicesShardedUpdate(benchmark::State& state) {
  bench::run_mlp_train_steps(state, exec(8), Mesh::parse("data:8", 8), /*warm_up=*/false,
                             /*sharded_update=*/true);
}
BENCHMARK(BM_MlpTrainStep8DevicesShardedUpdate)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);

// The ceilings for 8 devices on 2 cores, as functions running one step of each:
// - halves: two independent 1-device steps, each on half the batch, on two threads at once
//   (nothing shared but the machine): the most any split of the step over the two cores could
//   gain here;
// - eighths: eight independent 1-device steps, each on an eighth of the batch with its own copy
//   of the weights, four after one another on each of two threads (nothing shared, nothing
//   communicated): what splitting the step 8 ways rather than 2 costs by itself (smaller GEMMs,
//   8 weight copies to read and update).
// `parts` 2 or 8; each part has its executor of its own.
std::function<void()> side_by_side(std::size_t parts) {
  static const Executor a(1), b(1);
  const Mesh mesh = Mesh::parse("data:1", 1);
  auto steps = std::make_shared<std::vector<std::function<void()>>>();
  for (std::size_t i = 0; i < parts; ++i) {
    const Executor& e = parts == 2 ? (i == 0 ? a : b) : eight_executors()[i];
    steps->push_back(
        bench::make_mlp_train_step(e, mesh, kBatch / static_cast<std::int64_t>(parts)));
  }
  return [steps, parts] {
    const auto run = [&](std::size_t first) {
      for (std::size_t i = first; i < first + parts / 2; ++i) (*steps)[i]();
    };
    std::thread other(run, parts / 2);
    run(0);
    other.join();
  };
}

void BM_MlpTrainStepTwoHalvesSideBySide(benchmark::State& state) {
  const std::function<void()> step = side_by_side(2);
  for (auto _ : state) step();
}
BENCHMARK(BM_MlpTrainStepTwoHalvesSideBySide)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);
void BM_MlpTrainStepEighthsSideBySide(benchmark::State& state) {
  const std::function<void()> step = side_by_side(8);
  for (auto _ : state) step();
}
BENCHMARK(BM_MlpTrainStepEighthsSideBySide)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);

// The speed-ups of issue 14 measured in pairs: each iteration times one step of each contender
// back to back (1 device, 2 and 8 devices, the two ceilings), so a machine that slows down for a
// while slows all of them alike. Counters: each contender's median step (ms) and the median
// over iterations of its speed-up over the 1-device step of the same iteration (x_...).
void BM_MlpTrainStepSpeedups(benchmark::State& state) {
  const std::vector<std::pair<const char*, std::function<void()>>> runs = {
      {"1", bench::make_mlp_train_step(exec(1), Mesh::parse("data:1", 1))},
      {"2", bench::make_mlp_train_step(exec(2), Mesh::parse("data:2", 2))},
      {"8", bench::make_mlp_train_step(exec(8), Mesh::parse("data:8", 8))},
      {"halves", side_by_side(2)},
      {"eighths", side_by_side(8)}};
  for (const auto& r : runs) r.second();  // warm up: compile, allocate
  std::vector<std::vector<double>> ms(runs.size()), speedup(runs.size());
  for (auto _ : state) {
    std::vector<double> t;
    for (const auto& r : runs) t.push_back(bench::ms_of(r.second));
    for (std::size_t i = 0; i < runs.size(); ++i) {
      ms[i].push_back(t[i]);
      speedup[i].push_back(t[0] / t[i]);
    }
  }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    state.counters[fmt::format("ms_{}", runs[i].first)] = bench::median(ms[i]);
    if (i > 0) state.counters[fmt::format("x_{}", runs[i].first)] = bench::median(speedup[i]);
  }
}
BENCHMARK(BM_MlpTrainStepSpeedups)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(15);

// Fusion on and off (SjitOptions::fuse), measured in pairs as above: each iteration times the
// 8-device step fused, then unfused. Counters: each one's median step (ms), and the median of
// the unfused step's time over the fused one's (x_fused).
void BM_MlpTrainStepFusionOnOff(benchmark::State& state) {
  const Mesh mesh = Mesh::parse("data:8", 8);
  std::function<void()> fused = bench::make_mlp_train_step(exec(8), mesh, bench::kMlpBatch, false);
  std::function<void()> unfused =
      bench::make_mlp_train_step(exec(8), mesh, bench::kMlpBatch, false, /*fuse=*/false);
  fused();  // warm up: compile, allocate
  unfused();
  std::vector<double> ms_fused, ms_unfused, ratio;
  for (auto _ : state) {
    ms_fused.push_back(bench::ms_of(fused));
    ms_unfused.push_back(bench::ms_of(unfused));
    ratio.push_back(ms_unfused.back() / ms_fused.back());
  }
  state.counters["ms_fused"] = bench::median(ms_fused);
  state.counters["ms_unfused"] = bench::median(ms_unfused);
  state.counters["x_fused"] = bench::median(ratio);
}
BENCHMARK(BM_MlpTrainStepFusionOnOff)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(15);

using M = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using V = Eigen::Matrix<float, 1, Eigen::Dynamic>;

// op(a) * op(b) with the GEMM the library's kernels use (the best variant this CPU runs).
M product(const M& a, bool trans_a, const M& b, bool trans_b) {
  const Eigen::Index m = trans_a ? a.cols() : a.rows(), k = trans_a ? a.rows() : a.cols();
  const Eigen::Index n = trans_b ? b.rows() : b.cols();
  M y(m, n);
  shardplan::detail::gemm(trans_a, trans_b, m, n, k, a.data(), b.data(), y.data());
  return y;
}

// The same step by hand on one thread, with the same kernels: the library's GEMM for the
// products, Eigen for the rest (forward, softmax cross-entropy, backward, SGD).
void BM_MlpTrainStepEigen(benchmark::State& state) {
  std::vector<M> w;
  std::vector<V> b;
  for (std::size_t i = 0; i + 1 < kSizes.size(); ++i) {
    w.push_back(M::Random(kSizes[i], kSizes[i + 1]) * 0.03f);
    b.push_back(V::Zero(kSizes[i + 1]));
  }
  const M x = M::Random(kBatch, kSizes[0]);
  std::vector<int> y(kBatch);
  for (std::int64_t i = 0; i < kBatch; ++i)
    y[static_cast<std::size_t>(i)] = static_cast<int>(i % 10);
  const float lr = 0.01f;
  std::vector<M> acts(kSizes.size());
  for (auto _ : state) {
    acts[0] = x;
    for (std::size_t i = 0; i < w.size(); ++i) {
      M z = product(acts[i], false, w[i], false);
      z.rowwise() += b[i];
      acts[i + 1] = i + 1 < w.size() ? M(z.cwiseMax(0.0f)) : z;
    }
    // Softmax cross-entropy gradient: (softmax - one_hot) / batch.
    M d = acts.back();
    for (Eigen::Index r = 0; r < d.rows(); ++r) {
      const float mx = d.row(r).maxCoeff();
      d.row(r) = (d.row(r).array() - mx).exp().matrix();
      d.row(r) /= d.row(r).sum();
      d(r, y[static_cast<std::size_t>(r)]) -= 1.0f;
    }
    d /= static_cast<float>(kBatch);
    for (std::size_t i = w.size(); i-- > 0;) {
      const M dw = product(acts[i], true, d, false);
      const V db = d.colwise().sum();
      if (i > 0)
        d = (product(d, false, w[i], true).array() * (acts[i].array() > 0).cast<float>()).matrix();
      w[i] -= lr * dw;
      b[i] -= lr * db;
    }
    benchmark::DoNotOptimize(w[0].data());
  }
}
BENCHMARK(BM_MlpTrainStepEigen)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

// A training step of the LLaMA-style model (examples/llama_model.hpp, AdamW) on 8 devices:
// FSDP+TP with the preset (fsdp:4,tp:2; its activations split the norm and residual regions
// along the sequence over tp unless `sequence_parallel` is false) or data parallel (data:8).
// `run` runs one step (updating its own parameters); `cost` is the program's static cost.
struct LlamaStep {
  std::function<void()> run;
  std::function<void()> compile;  // traces and compiles the step anew (a new sjit, no cache)
  ProgramCost cost;
};
LlamaStep make_llama_step(const llama::Config& cfg, bool fsdp_tp, bool fuse = true,
                          bool sequence_parallel = true) {
  const Mesh mesh = fsdp_tp ? Mesh::parse("fsdp:4,tp:2", 8) : Mesh::parse("data:8", 8);
  const RuleTree rules =
      fsdp_tp ? RuleTree(load_preset("llama_fsdp_tp").make_rule()) : RuleTree(Replicated{});
  SjitOptions io;
  io.out_shardings = rules;
  io.executor = exec(8);
  auto params = std::make_shared<Tree<Array>>(sjit(
      mesh, [&](std::uint64_t seed) { return llama::init(cfg, seed); }, io)(std::uint64_t{1}));
  const Optimizer opt = Optimizer::adamw(constant_schedule(1e-3), 0.01);
  auto st = std::make_shared<Tree<Array>>(opt.init(*params));
  SjitOptions so;
  so.donate_argnums = {0, 1};
  so.fuse = fuse;
  if (fsdp_tp) {
    RuleFile::LogicalMapping bind;
    if (!sequence_parallel) bind.emplace_back("activation_norm_length", std::nullopt);
    so.annotation_shardings = load_preset("llama_fsdp_tp").activation_shardings(mesh, bind);
  } else {
    so.allow_unknown_annotations = true;
  }
  using StepFn = std::function<Tree<Array>(const Tree<Array>&, const Tree<Array>&, const Array&,
                                            const Array&)>;
  const StepFn fn = [cfg, opt](const Tree<Array>& p, const Tree<Array>& s, const Array& x,
                               const Array& y) {
    const auto [loss, g] =
        value_and_grad([&](const Tree<Array>& pp, const Array& xx, const Array& yy) {
          return llama::loss_fn(pp, xx, yy, cfg);
        })(p, x, y);
    auto [np, ns] = opt.update(g, s, p);
    return Tree<Array>::dict({{"params", np}, {"state", ns}});
  };
  auto step = std::make_shared<Sjit<StepFn>>(sjit(mesh, fn, so));
  const NamedSharding batch(mesh, P(mesh.axis_names()[0]));
  const Array x = device_put(
      Tensor::generate(Shape{cfg.batch, cfg.seq}, DType::kI32, Generator::uniform(3, 0, 127)),
      batch, exec(8));
  const Array y = device_put(
      Tensor::generate(Shape{cfg.batch, cfg.seq}, DType::kI32, Generator::uniform(4, 0, 127)),
      batch, exec(8));
  LlamaStep out;
  out.cost = step->lower(*params, *st, x, y).cost();
  out.compile = [mesh, fn, so, params, st, x, y] {
    benchmark::DoNotOptimize(sjit(mesh, fn, so).lower(*params, *st, x, y).cost().peak_bytes);
  };
  out.run = [step, params, st, x, y] {
    const Tree<Array> r = (*step)(*params, *st, x, y);
    *params = r.at("params");
    *st = r.at("state");
  };
  return out;
}

// The static cost as counters: bytes received, MFLOP and peak per device.
void cost_counters(benchmark::State& state, const ProgramCost& cost, const std::string& suffix) {
  double bytes = 0;
  for (const auto& [kind, b] : cost.bytes_by_kind) bytes += static_cast<double>(b);
  state.counters["bytes_per_device" + suffix] = bytes;
  state.counters["mflop_per_device" + suffix] = cost.flops[0] / 1e6;
  state.counters["peak_kib" + suffix] = static_cast<double>(cost.peak_bytes[0]) / 1024;
}

// The benchmarks' LLaMA-style model: vocabulary 128, dim 256, 4 heads, ffn 512, 2 layers.
llama::Config bench_llama(std::int64_t seq, std::int64_t batch) {
  llama::Config cfg;
  cfg.vocab = 128;
  cfg.dim = 256;
  cfg.heads = 4;
  cfg.ffn = 512;
  cfg.layers = 2;
  cfg.seq = seq;
  cfg.batch = batch;
  return cfg;
}

// Tokens per second of the LLaMA-style model (sequences of 64, batch 32).
void llama_tokens(benchmark::State& state, bool fsdp_tp, bool fuse = true,
                  bool sequence_parallel = true) {
  const llama::Config cfg = bench_llama(64, 32);
  const LlamaStep step = make_llama_step(cfg, fsdp_tp, fuse, sequence_parallel);
  cost_counters(state, step.cost, "");
  for (auto _ : state) step.run();
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(cfg.batch * cfg.seq) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}
void BM_LlamaStepFsdpTp(benchmark::State& s) { llama_tokens(s, true); }
void BM_LlamaStepDataParallel(benchmark::State& s) { llama_tokens(s, false); }
// The FSDP+TP step unfused (SjitOptions::fuse false): run beside BM_LlamaStepFsdpTp to compare.
void BM_LlamaStepFsdpTpUnfused(benchmark::State& s) { llama_tokens(s, true, false); }
// The FSDP+TP step without sequence parallelism: run beside BM_LlamaStepFsdpTp to compare.
void BM_LlamaStepFsdpTpNoSequenceParallel(benchmark::State& s) {
  llama_tokens(s, true, true, false);
}
BENCHMARK(BM_LlamaStepFsdpTp)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_LlamaStepFsdpTpUnfused)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK(BM_LlamaStepFsdpTpNoSequenceParallel)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);
BENCHMARK(BM_LlamaStepDataParallel)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

// The time to trace and compile the FSDP+TP step (propagation, partitioning, fusion, memory plan)
// with a new sjit each iteration: what a change to the compiler's passes is measured by.
void BM_LlamaStepCompile(benchmark::State& state) {
  const LlamaStep step = make_llama_step(bench_llama(64, 32), true);
  for (auto _ : state) step.compile();
}
BENCHMARK(BM_LlamaStepCompile)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);

// The profiler off and on (include/shardplan/profiler.hpp), in pairs: each iteration times the
// step with recording off and with it on (a session started just before, as a user would around
// the steps to look at; writing the trace is not timed), the order alternating. Counters: each
// one's median step (ms), and the median of on over off (x_on: the overhead is x_on - 1), and
// the events one traced step records.
void tracing_off_on(benchmark::State& state, const std::function<void()>& step,
                    const profiler::ProfileOptions& options = {}, int steps_per_sample = 1) {
  try {
    profiler::start();  // throws in a build without the profiler (-DSHARDPLAN_PROFILER=OFF)
    profiler::stop();
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    for (auto _ : state) {
    }
    return;
  }
  step();  // warm up: compile, allocate
  step();
  std::vector<double> ms_off, ms_on, ratio;
  bool on_first = false;
  const auto steps = [&] {
    for (int i = 0; i < steps_per_sample; ++i) step();
  };
  const auto traced = [&] {
    profiler::start(options);
    const double ms = bench::ms_of(steps);
    profiler::stop();
    return ms;
  };
  for (auto _ : state) {
    double off = 0, on = 0;
    if (on_first) {
      on = traced();
      off = bench::ms_of(steps);
    } else {
      off = bench::ms_of(steps);
      on = traced();
    }
    on_first = !on_first;
    ms_off.push_back(off);
    ms_on.push_back(on);
    ratio.push_back(on / off);
  }
  state.counters["ms_off"] = bench::median(ms_off) / steps_per_sample;
  state.counters["ms_on"] = bench::median(ms_on) / steps_per_sample;
  state.counters["x_on"] = bench::median(ratio);
  const double events = static_cast<double>(profiler::event_count()) / steps_per_sample;
  state.counters["events_per_step"] = events;
  // What an event costs: the step's time traced less untraced, over its events.
  state.counters["ns_per_event"] =
      (bench::median(ms_on) - bench::median(ms_off)) * 1e6 / steps_per_sample / events;
}
// Small steps, where the per-event cost decides the overhead (the MLP 64-128-128-10; 20 steps a
// sample, 100 pairs): `devices` 8 and batch 256 (~0.4 ms, ~650 events: denser than issue 39's
// case of ~500 events in ~0.5 ms); 6 and 576 (~0.6 ms, ~420 events).
void BM_SmallMlpStepTracingOffOn(benchmark::State& state) {
  const auto devices = static_cast<int>(state.range(0));
  const Executor& ex = devices == 8 ? exec(8) : *new Executor(devices);  // kept for the process
  tracing_off_on(state,
                 bench::make_mlp_train_step(ex, Mesh::parse(fmt::format("data:{}", devices), devices),
                                            state.range(1), false, true, {64, 128, 128, 10}),
                 {}, 20);
}
BENCHMARK(BM_SmallMlpStepTracingOffOn)
    ->Args({8, 256})
    ->Args({6, 576})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(100);
void BM_MlpTrainStepTracingOffOn(benchmark::State& state) {
  tracing_off_on(state, bench::make_mlp_train_step(exec(8), Mesh::parse("data:8", 8),
                                                   bench::kMlpBatch, false));
}
BENCHMARK(BM_MlpTrainStepTracingOffOn)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(30);
void BM_LlamaStepTracingOffOn(benchmark::State& state) {
  tracing_off_on(state, make_llama_step(bench_llama(64, 32), /*fsdp_tp=*/true).run);
}
BENCHMARK(BM_LlamaStepTracingOffOn)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(30);
// The same with the memory in the trace (ProfileOptions::memory: live bytes and peaks per run).
void BM_LlamaStepTracingWithMemoryOffOn(benchmark::State& state) {
  tracing_off_on(state, make_llama_step(bench_llama(64, 32), /*fsdp_tp=*/true).run, {.memory = true});
}
BENCHMARK(BM_LlamaStepTracingWithMemoryOffOn)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(30);

}  // namespace

BENCHMARK_MAIN();

// Issue 26's step at 4,096 tokens per sequence (the same model, 4 sequences, fsdp:4,tp:2), in
// pairs: each iteration times the step as it was before the issue (attention as scores, mask
// and softmax; the logits whole; no sequence parallelism) and as it is now (fused attention,
// the fused loss, sequence parallelism), back to back. Counters: each one's median step (ms),
// tokens/s, the ratio of the old step's time over the new one's (x_now), and both programs'
// static costs (peak_kib_before, peak_kib_now, ...).
void BM_LlamaStep4kTokensBeforeAndNow(benchmark::State& state) {
  const llama::Config now = bench_llama(4096, 4);
  llama::Config before = now;
  before.fused_attention = false;
  before.fused_loss = false;
  const LlamaStep old_step = make_llama_step(before, true, true, /*sequence_parallel=*/false);
  const LlamaStep new_step = make_llama_step(now, true, true, /*sequence_parallel=*/true);
  cost_counters(state, old_step.cost, "_before");
  cost_counters(state, new_step.cost, "_now");
  old_step.run();  // warm up: compile, allocate
  new_step.run();
  std::vector<double> ms_before, ms_now, ratio;
  for (auto _ : state) {
    ms_before.push_back(bench::ms_of(old_step.run));
    ms_now.push_back(bench::ms_of(new_step.run));
    ratio.push_back(ms_before.back() / ms_now.back());
  }
  const double tokens = static_cast<double>(now.batch * now.seq);
  state.counters["ms_before"] = bench::median(ms_before);
  state.counters["ms_now"] = bench::median(ms_now);
  state.counters["tokens_per_s_before"] = tokens * 1e3 / bench::median(ms_before);
  state.counters["tokens_per_s_now"] = tokens * 1e3 / bench::median(ms_now);
  state.counters["x_now"] = bench::median(ratio);
  state.counters["peak_ratio"] = static_cast<double>(old_step.cost.peak_bytes[0]) /
                                 static_cast<double>(new_step.cost.peak_bytes[0]);
}
BENCHMARK(BM_LlamaStep4kTokensBeforeAndNow)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);
