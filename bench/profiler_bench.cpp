// The profiler's floor on this CPU: what a clock read, and a clock read plus a store, cost; and
// what recording one event costs through the recorder. The tracing overhead's budget (issue 39:
// under 3% on a 0.5 ms step of 500 events, so under 30 ns an event) is judged against these.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "recorder.hpp"
#include "shardplan/profiler.hpp"

namespace {

namespace pd = shardplan::profiler::detail;

// std::chrono::steady_clock::now() alone (clock_gettime(CLOCK_MONOTONIC) through the vDSO).
void BM_SteadyClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_SteadyClockNow);

// A bare timestamp and store: the clock read into a preallocated array (wrapping), the least an
// event with one new time can cost.
void BM_TimestampAndStore(benchmark::State& state) {
  std::vector<std::int64_t> out(4096);
  std::size_t i = 0;
  for (auto _ : state) {
    out[i] = pd::now_ns();
    i = (i + 1) & 4095;
  }
  benchmark::DoNotOptimize(out.data());
}
BENCHMARK(BM_TimestampAndStore);

// What the recorder adds to a clock read: one kernel step's events on 8 devices (a proto with a
// scope, 8 slices, one lock), per event, a session on; stamps taken as a step takes them (one per
// device, chained). Sessions restart every 4096 steps so the buffer stays bounded.
void BM_RecordKernelStepPerEvent(benchmark::State& state) {
  const auto scope = std::make_shared<const std::string>("mlp/layer0");
  std::vector<pd::Proto> protos;
  std::vector<pd::Slice> slices;
  shardplan::profiler::start();
  std::int64_t steps = 0;
  for (auto _ : state) {
    pd::Proto& p = protos.emplace_back();
    p.name = "dot_general";
    p.scope = scope;
    std::int64_t last = pd::stamp();
    p.step_start = last;
    for (int d = 0; d < 8; ++d) {
      const std::int64_t now = pd::stamp();
      slices.push_back(pd::Slice{.start_ns = last, .end_ns = now, .device = d});
      last = now;
    }
    protos.back().step_end = last;
    pd::record(protos, slices);
    if (++steps % 4096 == 0) {
      state.PauseTiming();
      shardplan::profiler::start();
      state.ResumeTiming();
    }
  }
  shardplan::profiler::stop();
  state.SetItemsProcessed(state.iterations() * 8);
  state.counters["ns_per_event"] = benchmark::Counter(
      static_cast<double>(state.iterations() * 8), benchmark::Counter::kIsRate |
                                                       benchmark::Counter::kInvert);
}
BENCHMARK(BM_RecordKernelStepPerEvent);

#if defined(__x86_64__)
void BM_Rdtsc(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(__builtin_ia32_rdtsc());
}
BENCHMARK(BM_Rdtsc);
#endif

}  // namespace

BENCHMARK_MAIN();
