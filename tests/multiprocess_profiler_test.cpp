// The profiler over processes (ctest mpi.np2/np4.multiprocess_profiler_test; also one process):
// write_trace gives one file for the job, written by process 0 only, with every process's
// devices and host (pid = process); the clocks aligned, checked by an independent event (every
// process leaves a barrier at nearly the same instant) and against a skew put on purpose on
// some processes' clocks; a failure on one process ends everywhere; `trace summarize` reads the
// merged file per process and device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../src/profiler/recorder.hpp"
#include "../src/profiler/trace_summary.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/profiler.hpp"
#include "shardplan/sjit.hpp"
#include "trace_format.hpp"

namespace shardplan {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

int me() { return distributed::process_index(); }
int count() { return distributed::process_count(); }

// A directory of this process's own (each process names it by its pid).
struct ScratchDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("mp_profiler_test_" + std::to_string(::getpid()));
  ScratchDir() { std::filesystem::create_directories(path); }
  ~ScratchDir() { std::filesystem::remove_all(path); }
};

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// x [8, 64] split over its contraction dimension on data:8 (8 devices over the processes), w
// likewise: a product per device, summed over processes, then tanh.
struct Contraction {
  Executor exec{8};
  Mesh mesh = Mesh::parse("data:8", 8);
  Array x = device_put(Tensor::normal(Shape{8, 64}, DType::kF32, 1),
                       NamedSharding(mesh, P(nullptr, "data")), exec);
  Array w = device_put(Tensor::normal(Shape{64, 16}, DType::kF32, 2),
                       NamedSharding(mesh, P("data", nullptr)), exec);
  static Array f(const Array& x, const Array& w) {
    auto s = named_scope("proj");
    return tanh(matmul(x, w));
  }
  decltype(sjit(mesh, f)) step = sjit(mesh, f, SjitOptions{.out_shardings = RuleTree(P())});
};

TEST(MultiProcessProfiler, OneFileForTheJobWithEveryProcessesDevicesWrittenByProcessZero) {
  Contraction c;
  {
    profiler::ProfileSession session;
    for (int i = 0; i < 2; ++i) (void)c.step(c.x, c.w);
  }
  ScratchDir dir;
  const std::filesystem::path file = dir.path / "job.trace.json";
  profiler::write_trace(file);
  distributed::barrier();  // (write_trace returned everywhere)
  if (me() != 0) {
    EXPECT_FALSE(std::filesystem::exists(file)) << "process " << me() << " wrote";
    EXPECT_TRUE(std::filesystem::is_empty(dir.path));
    return;
  }
  const json doc = read_json(file);
  EXPECT_EQ(test::trace_format_violation(doc), "");
  EXPECT_EQ(doc["otherData"]["process_count"], count());
  if (count() > 1) {  // one process writes its own trace, as trace_json
    ASSERT_EQ(doc["otherData"]["clock_offsets"].size(), static_cast<std::size_t>(count()));
  }
  std::map<int, std::string> process_names;
  std::map<int, std::map<int, int>> products;  // pid -> tid -> dot_general kernels
  std::map<int, int> dispatches;               // pid -> host dispatches
  for (const json& e : doc["traceEvents"]) {
    const int pid = e["pid"];
    if (e["ph"] == "M" && e["name"] == "process_name") process_names[pid] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["ts"].get<double>(), 0.0) << e.dump();
    if (e["cat"] == "dispatch") {
      EXPECT_EQ(e["tid"], 1000000);
      ++dispatches[pid];
    }
    if (e["cat"] == "kernel" && e["args"]["op"] == "dot_general") {
      ++products[pid][e["tid"].get<int>()];
      EXPECT_EQ(e["args"]["scope"], "proj");
    }
  }
  // Each process's devices, and only its own, under its pid; its host's two dispatches.
  const int local = 8 / count();
  for (int p = 0; p < count(); ++p) {
    EXPECT_EQ(process_names[p], "rank " + std::to_string(p));
    std::map<int, int> want;
    for (int d = p * local; d < (p + 1) * local; ++d) want[d] = 2;
    EXPECT_EQ(products[p], want) << "process " << p;
    EXPECT_EQ(dispatches[p], 2) << "process " << p;
  }
  EXPECT_EQ(products.size(), static_cast<std::size_t>(count()));
  // `trace summarize` reads it: a row per process and device.
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const detail::TraceSummary s = detail::summarize_trace(text, file.string());
  const std::string table = detail::format_trace_summary(s, file.string(), 10);
  EXPECT_EQ(s.threads.size(), static_cast<std::size_t>(8 + count()));
  for (int p = 0; p < count(); ++p) {
    const std::string rank = count() > 1 ? "rank " + std::to_string(p) + " " : "";
    EXPECT_THAT(table, HasSubstr(rank + "host")) << table;
    for (int d = p * local; d < (p + 1) * local; ++d) {
      EXPECT_THAT(table, HasSubstr(rank + "device " + std::to_string(d))) << table;
    }
  }
  EXPECT_THAT(table, ::testing::ContainsRegex("kernel +dot_general +16 "));
}

// The times, on each process's clock, at which it left each of `rounds` barriers (recorded as
// host events "barrier_exit"), and the trace written.
json barrier_exits_trace(const std::filesystem::path& file, int rounds) {
  profiler::start();
  for (int i = 0; i < rounds; ++i) {
    distributed::barrier();
    const std::int64_t t = profiler::detail::stamp();
    profiler::detail::record(profiler::detail::Event{.cat = profiler::detail::Category::kDispatch,
                                                     .device = profiler::detail::kHostTid,
                                                     .start_ns = t,
                                                     .end_ns = t,
                                                     .name = "barrier_exit"});
  }
  profiler::stop();
  profiler::write_trace(file);
  return me() == 0 ? read_json(file) : json();
}

// Per process, its barrier exits' ts in order.
std::map<int, std::vector<double>> exits_by_process(const json& doc) {
  std::map<int, std::vector<double>> out;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "barrier_exit") {
      out[e["pid"].get<int>()].push_back(e["ts"].get<double>());
    }
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The skew put on process p's clock: none on process 0, seconds either way on the others.
std::int64_t skew_of(int p, bool skewed) {
  if (!skewed || p == 0) return 0;
  const std::int64_t s[] = {0, 2'500'000'123, -1'300'000'457, 7'000'089};
  return s[p % 4];
}

class ClockAlignment : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Skew, ClockAlignment, ::testing::Values(false, true),
                         [](const auto& param_info) { return param_info.param ? "Skewed" : "AsIs"; });

// All processes share this machine's steady_clock, so process p's true offset is exactly the
// skew put on it: the alignment error is |estimate - skew|, which must be within the reported
// bound, and under 100 us with a core per process (oversubscribed, every round trip can be
// slow: a least round trip of 231 us, an error of 109 us within its 115 us bound, was seen at 4
// processes on 2 cores beside another test). The barrier exits are a second look: with a core
// per process they leave each barrier within microseconds of one another, so after alignment
// their exits agree (the median difference to process 0 over 200 barriers) within 100 us. With
// more processes than cores (4 on 2 here) a process is often descheduled as it leaves (medians
// of 330 us were seen while the clocks agreed within 4 us), so there it is printed, not asserted.
TEST_P(ClockAlignment, BarrierExitsAgreeWithin100usAndOffsetsWithinTheirBound) {
  if (count() == 1) GTEST_SKIP() << "one process: nothing to align";
  const bool skewed = GetParam();
  profiler::detail::set_test_clock_skew(skew_of(me(), skewed));
  ScratchDir dir;
  constexpr int kRounds = 200;
  const json doc = barrier_exits_trace(dir.path / "barriers.trace.json", kRounds);
  profiler::detail::set_test_clock_skew(0);
  if (me() != 0) return;
  const json& offsets = doc["otherData"]["clock_offsets"];
  ASSERT_EQ(offsets.size(), static_cast<std::size_t>(count()));
  const auto exits = exits_by_process(doc);
  ASSERT_EQ(exits.size(), static_cast<std::size_t>(count()));
  for (int p = 0; p < count(); ++p) {
    const json& o = offsets[static_cast<std::size_t>(p)];
    const std::int64_t offset = o["offset_ns"], bound = o["error_bound_ns"];
    EXPECT_EQ(o["process"], p);
    const bool core_each = static_cast<unsigned>(count()) <= std::thread::hardware_concurrency();
    EXPECT_LE(std::llabs(offset - skew_of(p, skewed)), bound) << o.dump();
    if (core_each) {
      EXPECT_LT(std::llabs(offset - skew_of(p, skewed)), 100'000) << o.dump();
    }
    if (p == 0) {
      EXPECT_EQ(bound, 0);
    } else {
      EXPECT_GT(bound, 0);
    }
    const std::vector<double>& mine = exits.at(p);
    ASSERT_EQ(mine.size(), static_cast<std::size_t>(kRounds));
    std::vector<double> diff(mine.size());
    for (std::size_t i = 0; i < mine.size(); ++i) diff[i] = mine[i] - exits.at(0)[i];
    const double med = median(diff);
    std::printf("[alignment] np %d process %d%s: estimated offset %+.3f us (skew %+.3f us), bound "
                "%.3f us; barrier exits vs process 0: median %+.3f us\n",
                count(), p, skewed ? " skewed" : "", static_cast<double>(offset) / 1000,
                static_cast<double>(skew_of(p, skewed)) / 1000, static_cast<double>(bound) / 1000,
                med);
    if (core_each) {
      EXPECT_LT(std::fabs(med), 100.0) << "process " << p;
    }
  }
}

// Process 0 cannot write its path: every process throws, naming process 0 and the path, and
// none is left waiting (ctest's timeout would end a hang).
TEST(MultiProcessProfiler, AFailureOnProcessZeroEndsOnEveryProcess) {
  {
    profiler::ProfileSession session;
    Contraction c;
    (void)c.step(c.x, c.w);
  }
  ScratchDir dir;
  const std::filesystem::path missing = dir.path / "no_such_dir" / "t.json";
  if (count() == 1) {
    EXPECT_THROW(profiler::write_trace(missing), IoError);
    return;
  }
  try {
    profiler::write_trace(missing);
    FAIL() << "wrote";
  } catch (const DistributedError& e) {
    EXPECT_THAT(e.what(), HasSubstr("process 0 of"));
    EXPECT_THAT(e.what(), HasSubstr("no_such_dir"));
  }
  // The group is still usable: the next write succeeds.
  profiler::write_trace(dir.path / "t.json");
  EXPECT_EQ(std::filesystem::exists(dir.path / "t.json"), me() == 0);
}

TEST(MultiProcessProfiler, ClockOffsetsNeedAtLeastOneRound) {
  EXPECT_THROW(profiler::estimate_clock_offsets(0), SpecError);
  const auto offsets = profiler::estimate_clock_offsets(4);
  ASSERT_EQ(offsets.size(), static_cast<std::size_t>(count()));
  EXPECT_EQ(offsets[0].offset_ns, 0);
  EXPECT_EQ(offsets[static_cast<std::size_t>(me())].process, me());
}

}  // namespace
}  // namespace shardplan
