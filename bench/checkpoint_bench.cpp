// Saving and restoring a sharded 1 GiB state against dd writing (with fsync) and reading the same
// bytes on the same disk, in one run. Reads start cold: every file's pages are dropped from the
// page cache first (posix_fadvise DONTNEED after an fsync), for ours and for dd alike.
//
//   build-release/bench/checkpoint_bench            (in a directory on the disk to measure;
//   SHARDPLAN_BENCH_DIR=/some/dir to choose another)
//
// BM_ReadCheckpointInfo: reading what a checkpoint of many small tensors holds (its index, record
// and headers; what `shardplan checkpoint inspect` does), at 1k, 10k and 100k tensors, to show
// that it grows linearly:
//   build-release/bench/checkpoint_bench --benchmark_filter=ReadCheckpointInfo
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "shardplan/checkpoint.hpp"

namespace shardplan {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kBytes = std::int64_t{1} << 30;
constexpr int kArrays = 8;  // 8 arrays of 128 MiB: f32 [8192, 4096]

fs::path work_dir() {
  const char* env = std::getenv("SHARDPLAN_BENCH_DIR");
  const fs::path dir = fs::absolute(env != nullptr ? env : "checkpoint_bench_files");
  fs::create_directories(dir);
  return dir;
}

const Executor& executor() {
  static const Executor e(8);
  return e;
}

/// The state: 1 GiB over 8 devices, FSDP-style (rows split over 'data').
const Tree<Array>& state() {
  static const Tree<Array> s = [] {
    const Mesh mesh = Mesh::parse("data:8", 8);
    std::vector<Tree<Array>::DictEntry> leaves;
    for (int i = 0; i < kArrays; ++i) {
      leaves.emplace_back(fmt::format("w{}", i),
                          Array::uniform(Shape{8192, 4096}, DType::kF32,
                                         NamedSharding(mesh, P("data")), executor(), i, -1, 1));
    }
    return Tree<Array>::dict(std::move(leaves));
  }();
  return s;
}

/// Drops a file's pages from the page cache (after writing them out).
void drop_cache(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_cache_dir(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) drop_cache(e.path());
}

void set_counters(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * kBytes);
  state.counters["MBps"] = benchmark::Counter(static_cast<double>(kBytes) / 1e6,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void BM_DdWriteFsync(benchmark::State& st) {
  const fs::path file = work_dir() / "dd.bin";
  const std::string cmd = fmt::format(
      "dd if=/dev/zero of='{}' bs=1M count={} conv=fsync status=none", file.string(), kBytes >> 20);
  for (auto _ : st) {
    if (std::system(cmd.c_str()) != 0) st.SkipWithError("dd failed");
  }
  set_counters(st);
}

void BM_SaveCheckpoint(benchmark::State& st) {
  const fs::path dir = work_dir() / "ckpt";
  state();  // made before timing
  for (auto _ : st) {
    st.PauseTiming();
    fs::remove_all(dir);
    st.ResumeTiming();
    save_checkpoint(dir, state());
  }
  set_counters(st);
}

void BM_DdRead(benchmark::State& st) {
  const fs::path file = work_dir() / "dd.bin";
  if (!fs::exists(file)) {
    std::system(fmt::format("dd if=/dev/zero of='{}' bs=1M count={} conv=fsync status=none",
                            file.string(), kBytes >> 20)
                    .c_str());
  }
  const std::string cmd =
      fmt::format("dd if='{}' of=/dev/null bs=1M status=none", file.string());
  for (auto _ : st) {
    st.PauseTiming();
    drop_cache(file);
    st.ResumeTiming();
    if (std::system(cmd.c_str()) != 0) st.SkipWithError("dd failed");
  }
  set_counters(st);
}

/// Restores onto another mesh (4 x 2, rows over 'data' and columns over 'model'), with or
/// without checking the checksums first.
void BM_RestoreCheckpoint(benchmark::State& st) {
  const fs::path dir = work_dir() / "ckpt";
  if (!fs::exists(dir)) save_checkpoint(dir, state());
  static const Executor other(8);
  const Mesh mesh = Mesh::parse("data:4,model:2", 8);
  const Tree<NamedSharding> target =
      state().map([&](const Array&) { return NamedSharding(mesh, P("data", "model")); });
  const bool verify = st.range(0) != 0;
  std::int64_t peak = 0, shards = 0;
  for (auto _ : st) {
    st.PauseTiming();
    drop_cache_dir(dir);
    other.reset_peak();
    st.ResumeTiming();
    const Tree<Array> back = restore_checkpoint(dir, target, other, {.verify = verify});
    st.PauseTiming();
    for (const int d : other.local_devices()) peak = std::max(peak, other.memory(d).peak);
    shards = 0;
    for (const Array& a : back.leaves()) shards += a.shard_nbytes();
    st.ResumeTiming();
  }
  set_counters(st);
  // Device memory: the largest peak of a device during the restore, against its shards.
  st.counters["peak_MiB"] = static_cast<double>(peak) / (1 << 20);
  st.counters["shards_MiB"] = static_cast<double>(shards) / (1 << 20);
}

/// A checkpoint of `n` small tensors (layers/i/w, f32 [2, 3] each), saved once per process.
fs::path small_tensors_checkpoint(int n) {
  const fs::path dir = work_dir() / fmt::format("small_{}", n);
  fs::remove_all(dir);
  static const Executor one(1);
  const Mesh mesh = Mesh::parse("x:1", 1);
  std::vector<Tree<Array>> layers;
  layers.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    layers.push_back(Tree<Array>::dict(
        {{"w", Array::ones(Shape{2, 3}, DType::kF32, NamedSharding(mesh, P()), one)}}));
  }
  save_checkpoint(dir, Tree<Array>::dict({{"layers", Tree<Array>::list(std::move(layers))}}));
  return dir;
}

void BM_ReadCheckpointInfo(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0));
  const fs::path dir = small_tensors_checkpoint(n);
  for (auto _ : st) {
    const CheckpointInfo info = read_checkpoint_info(dir);
    if (info.tensors.size() != static_cast<std::size_t>(n)) st.SkipWithError("wrong tensor count");
    benchmark::DoNotOptimize(info);
  }
  st.counters["tensors_per_s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  fs::remove_all(dir);
}

// Alternating ours and dd's, so that both see the same disk.
BENCHMARK(BM_DdWriteFsync)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_SaveCheckpoint)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_DdRead)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_RestoreCheckpoint)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("verify")
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK(BM_ReadCheckpointInfo)
    ->Arg(1'000)
    ->Arg(10'000)
    ->Arg(100'000)
    ->ArgName("tensors")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace shardplan

BENCHMARK_MAIN();
