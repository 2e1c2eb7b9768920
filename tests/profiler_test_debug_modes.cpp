// CommDebugMode and MemoryDebugMode by hand, the trace's live-bytes counter, and the check every
// test run gets (tests/support/check_runs.cpp) failing on a run that differs from its cost.
#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardplan/profiler.hpp"
#include "shardplan/sjit.hpp"
#include "../src/profiler/recorder.hpp"
#include "profiler_test.hpp"
#include "support/check_runs.hpp"
#include "trace_format.hpp"

namespace shardplan {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using test::trace_format_violation;
using namespace test;

// x [8, 64] f32 on data:4 by columns: each device's block [8, 16], 512 B; w [64, 16] by rows:
// [16, 16], 1 KiB. Each device's product is a pending [8, 16] (512 B), summed over the 4 devices
// by a reduce-scatter (scope "proj"): each device keeps rows [2, 16] (128 B) and receives the 3
// others' parts of them, 3 x 128 = 384 B (1,536 B over the 4 devices). tanh's [2, 16] result is
// gathered for the replicated output (scope "act"): each device receives the 3 blocks it lacks,
// 384 B (1,536 B in all). Two calls count each twice.
TEST(CommDebugMode, CountsEachCollectiveByKindAndScopeByHand) {
  ContractionProgram p;
  profiler::start();  // an empty session: what earlier tests recorded is dropped
  profiler::stop();
  profiler::CommDebugMode comm;
  (void)p.f(p.x, p.w);
  (void)p.f(p.x, p.w);
  const profiler::CommCounts c = comm.counts();
  const profiler::CollectiveCount twice{.count = 2, .bytes = 768, .total_bytes = 3072};
  using K = CollectiveKind;
  EXPECT_EQ(c.by_kind, (std::map<K, profiler::CollectiveCount>{{K::kAllGather, twice},
                                                               {K::kReduceScatter, twice}}))
      << c.to_string() << p.f.lower(p.x, p.w).text();
  EXPECT_EQ(c.by_scope.size(), 2u) << c.to_string();
  EXPECT_EQ(c.by_scope.at("proj"), (std::map<K, profiler::CollectiveCount>{{K::kReduceScatter, twice}}));
  EXPECT_EQ(c.by_scope.at("act"), (std::map<K, profiler::CollectiveCount>{{K::kAllGather, twice}}));
  EXPECT_EQ(c.total_count(), 4);
  // The cost of one call, per kind, is what one call counted.
  for (const auto& [kind, bytes] : p.f.lower(p.x, p.w).cost().bytes_by_kind) {
    EXPECT_EQ(2 * bytes, c.by_kind.at(kind).bytes) << to_string(kind);
  }
  EXPECT_THAT(c.to_string(), HasSubstr("proj"));
  EXPECT_EQ(profiler::event_count(), 0u);  // no trace was recorded
  comm.reset();
  EXPECT_EQ(comm.counts(), profiler::CommCounts{});
}

TEST(CommDebugMode, CountsOnlyWhileAlive) {
  ContractionProgram p;
  {
    profiler::CommDebugMode comm;
    (void)p.f(p.x, p.w);
    EXPECT_EQ(comm.counts().total_count(), 2);
  }
  profiler::CommDebugMode later;
  EXPECT_EQ(later.counts().total_count(), 0);
  {
    profiler::CommDebugMode inner;  // two alive: each counts
    (void)p.f(p.x, p.w);
    EXPECT_EQ(inner.counts().total_count(), 2);
  }
  EXPECT_EQ(later.counts().total_count(), 2);
}

// The same program's bytes per device after each step, by hand (blocks as in the test above):
// the arguments 512 + 1,024 = 1,536 B; the products (+512) 2,048; the reduce-scatter's rows
// (+128) 2,176, then the products freed: 1,664; tanh (+128) 1,792, the rows freed: 1,664; the
// gathered output (+512) 2,176, tanh freed. The first peak, 2,176 B, is the reduce-scatter's.
TEST(MemoryDebugMode, MeasuresTheBytesHeldAfterEachStepByHand) {
  ContractionProgram p;
  profiler::MemoryDebugMode memory;
  (void)p.f(p.x, p.w);
  const std::vector<profiler::MemoryRun> runs = memory.runs();
  ASSERT_EQ(runs.size(), 1u);
  const profiler::MemoryRun& r = runs[0];
  EXPECT_EQ(r.devices, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(r.start_bytes, std::vector<std::int64_t>(4, 1536));
  std::vector<std::int64_t> device0;
  for (const auto& per_device : r.live_bytes) device0.push_back(per_device[0]);
  EXPECT_EQ(device0, (std::vector<std::int64_t>{2048, 2176, 1792, 2176}))
      << p.f.lower(p.x, p.w).text();
  EXPECT_EQ(r.peak_step, 1u);
  EXPECT_EQ(r.peak_bytes, 2176);
  EXPECT_EQ(r.peak_device, 0);
  EXPECT_FALSE(r.took_constants);
  ASSERT_EQ(r.live_at_peak.size(), 4u);
  EXPECT_EQ(r.live_at_peak[0], (profiler::LiveBuffer{"input 1", "", 1024}));
  EXPECT_EQ(r.live_at_peak[1], (profiler::LiveBuffer{"input 0", "", 512}));
  EXPECT_EQ(r.live_at_peak[2], (profiler::LiveBuffer{"dot_general", "proj", 512}));
  EXPECT_EQ(r.live_at_peak[3], (profiler::LiveBuffer{"dot_general resharded", "proj", 128}));
  // What the memory pass planned.
  const ProgramCost cost = p.f.lower(p.x, p.w).cost();
  EXPECT_EQ(cost.peak_bytes[0], r.peak_bytes);
  EXPECT_EQ(cost.timeline.live_bytes, device0);
}

// With the profiler on and ProfileOptions::memory, each device's bytes go to the trace as a
// counter: the start, then after each step (the figures of MemoryDebugMode's test above). Without
// the option (the default), the trace has no counter and no memory peak.
TEST(Profiler, EachDeviceHasALiveBytesCounter) {
  ContractionProgram p;
  {
    profiler::ProfileSession session;
    (void)p.f(p.x, p.w);
  }
  {
    const json plain = json::parse(profiler::trace_json());
    ASSERT_FALSE(plain["traceEvents"].empty());
    for (const json& e : plain["traceEvents"]) {
      EXPECT_NE(e["ph"], "C") << e;
      EXPECT_NE(e["ph"], "i") << e;
    }
  }
  {
    profiler::ProfileSession session({.memory = true});
    (void)p.f(p.x, p.w);
  }
  const json doc = json::parse(profiler::trace_json());
  EXPECT_EQ(trace_format_violation(doc), "");
  std::map<int, std::vector<std::int64_t>> samples;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "C") continue;
    const int d = e["tid"];
    EXPECT_EQ(e["name"], "live bytes, device " + std::to_string(d));
    samples[d].push_back(e["args"]["bytes"].get<std::int64_t>());
  }
  ASSERT_EQ(samples.size(), 4u);
  for (const auto& [d, v] : samples) {
    EXPECT_EQ(v, (std::vector<std::int64_t>{1536, 2048, 2176, 1792, 2176})) << "device " << d;
  }
}

// The check every test run gets (tests/support/check_runs.cpp) fails, naming the step, the device
// and both figures, when a run differs from its cost: here the run's record altered by one byte.
ContractionProgram* g_checked = nullptr;
void one_byte_more_held(const detail::Program& program, const detail::RunRecord& record) {
  detail::RunRecord altered = record;
  altered.live_bytes[0][0] += 1;
  detail::test::check_run(program, altered);
}
void one_byte_more_received(const detail::Program& program, const detail::RunRecord& record) {
  detail::RunRecord altered = record;
  altered.collectives.at(0).rec.bytes_in.at(0) += 1;
  detail::test::check_run(program, altered);
}
void run_checked() { (void)g_checked->f(g_checked->x, g_checked->w); }

TEST(RunChecks, ARunThatDiffersFromItsCostFailsNamingTheStep) {
  ContractionProgram p;
  g_checked = &p;
  run_checked();  // compiled, and checked as it is
  detail::set_run_observer(&one_byte_more_held);
  EXPECT_NONFATAL_FAILURE(run_checked(),
                          "device 0 held 2049 bytes after step 0 (kernel %2 = "
                          "dot_general); the memory pass plans 2048");
  // One byte more received by device 0: its step differs, and so does the kind's sum.
  detail::set_run_observer(&one_byte_more_received);
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    run_checked();
  }
  ASSERT_EQ(failures.size(), 2);
  EXPECT_THAT(failures.GetTestPartResult(0).message(),
              HasSubstr("the run's collectives differ from the cost at step 1 (reshard %2 = "
                        "dot_general)\n  ran:  reduce_scatter over 'data': 385 B max"));
  EXPECT_THAT(failures.GetTestPartResult(1).message(),
              HasSubstr("the run received 385 bytes by reduce_scatter (the most a device received "
                        "per collective, summed); its cost says 384"));
  detail::set_run_observer(&detail::test::check_run);
  g_checked = nullptr;
}

// One array passed as both arguments of a * b (x f32[16, 64] over i:4, 1 KiB per device): the
// plan counts each argument, the run holds x once; the check credits the shared buffer while
// both arguments are held, and still fails, naming the credit, on a byte more. (Neither can be
// donated: sjit refuses an array donated and also passed undonated.)
std::function<void()> g_shared_run;
void one_byte_more_held_after_step_0(const detail::Program& program,
                                     const detail::RunRecord& record) {
  detail::RunRecord altered = record;
  altered.live_bytes[0][0] += 1;
  detail::test::check_run(program, altered);
}

TEST(RunChecks, ArgumentsHoldingOneBufferAreCreditedAndStillChecked) {
  Executor exec{4};
  const Mesh mesh = Mesh::parse("i:4", 4);
  const Array x = device_put(Tensor::normal(Shape{16, 64}, DType::kF32, 1),
                             NamedSharding(mesh, P("i")), exec);
  auto f = sjit(mesh, [](const Array& a, const Array& b) { return a * b; },
                SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("i")), RuleTree(P("i"))})});
  g_shared_run = [&] { (void)f(x, x); };
  g_shared_run();  // checked as it is: planned 2048, 3072; held 1024, 2048
  detail::set_run_observer(&one_byte_more_held_after_step_0);
  EXPECT_NONFATAL_FAILURE(g_shared_run(),
                          "device 0 held 2049 bytes after step 0 (kernel %2 = mul); the memory "
                          "pass plans 3072, less 1024 bytes its arguments share");
  detail::set_run_observer(&detail::test::check_run);
  g_shared_run = nullptr;
}

}  // namespace
}  // namespace shardplan
