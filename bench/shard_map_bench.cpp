// shard_map's costs, each paired with its baseline in the same iteration (alternating which runs
// first; the counters are medians):
//  - BM_ShardMapElementwiseVsAutomatic: an elementwise function of x [4096, 1024] f32 on 8
//    devices (rows split), shard_map'd inside sjit against the same function partitioned
//    automatically by sjit. ms_shard_map / ms_automatic.
//  - BM_RingAttentionVsComputeAlone: ring attention (causal, load-balanced) forward and backward
//    over cp:8, T = 4096, 8 heads of 64 (4 kv heads), against the same ring with every block left
//    where it is (no ppermute: the computation alone). x_of_compute is the ratio.
#include <benchmark/benchmark.h>

#include "paired.hpp"
#include "../src/program/ops/ring_attention.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sjit.hpp"

namespace {

using namespace shardplan;

template <class A, class B>
void paired(benchmark::State& state, A& a, B& b, const char* name_a, const char* name_b) {
  a();  // compile and warm up both
  b();
  std::vector<double> ms_a, ms_b, ratio;
  bool a_first = true;
  for (auto _ : state) {
    double ta = 0, tb = 0;
    if (a_first) {
      ta = bench::ms_of(a);
      tb = bench::ms_of(b);
    } else {
      tb = bench::ms_of(b);
      ta = bench::ms_of(a);
    }
    a_first = !a_first;
    ms_a.push_back(ta);
    ms_b.push_back(tb);
    ratio.push_back(ta / tb);
  }
  state.counters[name_a] = bench::median(ms_a);
  state.counters[name_b] = bench::median(ms_b);
  state.counters["ratio"] = bench::median(ratio);
}

Array elementwise(const Array& x) { return tanh(x) * 2.0 + x * x - 1.0; }

void BM_ShardMapElementwiseVsAutomatic(benchmark::State& state) {
  Executor exec{8};
  const Mesh mesh = Mesh::parse("d:8", 8);
  const Array x = device_put(Tensor::normal(Shape{4096, 1024}, DType::kF32, 1),
                             NamedSharding(mesh, P("d")), exec);
  auto manual = sjit(mesh, [&](const Array& a) {
    return shard_map(elementwise, mesh, {P("d")}, {P("d")})(a);
  });
  auto automatic = sjit(mesh, elementwise);
  std::function<void()> run_manual = [&] { benchmark::DoNotOptimize(manual(x).shard(0)); };
  std::function<void()> run_automatic = [&] { benchmark::DoNotOptimize(automatic(x).shard(0)); };
  paired(state, run_manual, run_automatic, "ms_shard_map", "ms_automatic");
}
BENCHMARK(BM_ShardMapElementwiseVsAutomatic)->Unit(benchmark::kMillisecond)->Iterations(40);

constexpr std::int64_t kT = 4096, kHeads = 8, kKvHeads = 4, kHeadSize = 64;

auto ring_step(const Mesh& mesh, bool communicate) {
  return [&mesh, communicate](const Array& q, const Array& k, const Array& v, const Array& w) {
    const Tree<Array> p = Tree<Array>::dict({{"q", q}, {"k", k}, {"v", v}});
    const PartitionSpec spec = P(nullptr, "cp");
    return value_and_grad([&](const Tree<Array>& t) {
             const Array o = shard_map(
                 [communicate](const Array& a, const Array& b, const Array& c) {
                   return detail::ring_attention_impl(a, b, c, "cp", true, std::nullopt,
                                                      communicate);
                 },
                 mesh, {spec, spec, spec}, {spec})(t.at("q").leaf(), t.at("k").leaf(),
                                                   t.at("v").leaf());
             return sum(o * w);
           })(p)
        .second;
  };
}

void BM_RingAttentionVsComputeAlone(benchmark::State& state) {
  Executor exec{8};
  const Mesh mesh = Mesh::parse("cp:8", 8);
  const auto put = [&](std::int64_t heads, std::uint64_t seed) {
    return device_put(Tensor::normal(Shape{1, kT, heads, kHeadSize}, DType::kF32, seed),
                      NamedSharding(mesh, P(nullptr, "cp")), exec);
  };
  const Array q = put(kHeads, 1), k = put(kKvHeads, 2), v = put(kKvHeads, 3), w = put(kHeads, 4);
  auto ring = sjit(mesh, ring_step(mesh, true));
  auto alone = sjit(mesh, ring_step(mesh, false));
  std::function<void()> run_ring = [&] { benchmark::DoNotOptimize(ring(q, k, v, w)); };
  std::function<void()> run_alone = [&] { benchmark::DoNotOptimize(alone(q, k, v, w)); };
  paired(state, run_ring, run_alone, "ms_ring", "ms_compute_alone");
  state.counters["permute_bytes_per_device"] = static_cast<double>(
      ring.lower(q, k, v, w).cost().bytes_by_kind.at(CollectiveKind::kPermute));
}
BENCHMARK(BM_RingAttentionVsComputeAlone)->Unit(benchmark::kMillisecond)->Iterations(8);

}  // namespace

BENCHMARK_MAIN();
