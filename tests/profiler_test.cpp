// The profiler: named scopes, what a traced run records (kernels per device, collectives with the
// bytes the program's cost says, reshards, dispatches, live-bytes counters), the trace JSON
// checked against the trace event format's required fields per phase, and its errors;
// CommDebugMode and MemoryDebugMode by hand; the check every test run gets.
#include "shardplan/profiler.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
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

TEST(NamedScope, NestsWithSlashesAndCloses) {
  EXPECT_EQ(current_named_scope(), "");
  {
    auto a = named_scope("layer0");
    {
      auto b = named_scope("attn");
      EXPECT_EQ(current_named_scope(), "layer0/attn");
    }
    EXPECT_EQ(current_named_scope(), "layer0");
  }
  EXPECT_EQ(current_named_scope(), "");
}

TEST(NamedScope, ANameThatIsNotUtf8IsASpecErrorNamingItEscaped) {
  try {
    auto s = named_scope(
        "bad\xff"
        "name");
    FAIL() << "accepted";
  } catch (const SpecError& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad\\xffname"));
    EXPECT_THAT(e.what(), HasSubstr("not valid UTF-8"));
  }
  EXPECT_THROW(named_scope(""), SpecError);
  EXPECT_EQ(current_named_scope(), "");  // nothing left open
}

TEST(Profiler, OffRecordsNothing) {
  ContractionProgram p;
  profiler::start();
  profiler::stop();
  (void)p.f(p.x, p.w);
  EXPECT_FALSE(profiler::is_on());
  EXPECT_EQ(profiler::event_count(), 0u);
}

TEST(Profiler, TraceFollowsTheEventFormat) {
  ContractionProgram p;
  {
    profiler::ProfileSession session;
    (void)p.f(p.x, p.w);
  }
  const json doc = json::parse(profiler::trace_json());
  EXPECT_EQ(trace_format_violation(doc), "");
  // The process and every thread named.
  std::set<int> named;
  bool process_named = false;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name") process_named = e["args"]["name"] == "rank 0";
    if (e["name"] == "thread_name") named.insert(e["tid"].get<int>());
  }
  EXPECT_TRUE(process_named);
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "X") {
      EXPECT_TRUE(named.count(e["tid"].get<int>())) << e.dump();
    }
  }
  // The checker itself refuses what the format forbids.
  EXPECT_NE(trace_format_violation(
                json::parse(R"({"traceEvents":[{"ph":"X","name":"a","pid":0,"tid":0,"ts":1}]})")),
            "");
  EXPECT_NE(
      trace_format_violation(json::parse(
          R"({"traceEvents":[{"ph":"X","name":"a","pid":"0","tid":0,"ts":1,"dur":1,"cat":"k"}]})")),
      "");
  EXPECT_NE(trace_format_violation(json::parse(R"({"events":[]})")), "");
}

TEST(Profiler, EachDeviceHasItsKernelsWithTheirScopes) {
  ContractionProgram p;
  {
    profiler::ProfileSession session;
    (void)p.f(p.x, p.w);
  }
  const json doc = json::parse(profiler::trace_json());
  for (int d = 0; d < 4; ++d) {
    int products = 0, tanhs = 0;
    for (const json& e : events_of(doc, "kernel")) {
      if (e["tid"] != d) continue;
      const std::string op = e["args"]["op"];
      if (op == "dot_general") {
        ++products;
        EXPECT_EQ(scope_of(e), "proj");
      }
      if (op.find("tanh") != std::string::npos) {
        ++tanhs;
        EXPECT_EQ(scope_of(e), "act");
      }
    }
    EXPECT_EQ(products, 1) << "device " << d;
    EXPECT_EQ(tanhs, 1) << "device " << d;
  }
  // One dispatch on the host for the one call.
  const std::vector<json> dispatch = events_of(doc, "dispatch");
  ASSERT_EQ(dispatch.size(), 1u);
  EXPECT_EQ(dispatch[0]["tid"], 1000000);
}

// A compiled program is named by the scope of each call (the caller's, then the function's
// own), not by the scope it was first traced under: the second call hits the cache.
TEST(Profiler, ACachedProgramTakesTheScopeOfEachCall) {
  ContractionProgram p;
  const auto products_scopes = [&] {
    std::set<std::string> scopes;
    for (const json& e : events_of(json::parse(profiler::trace_json()), "kernel")) {
      if (e["args"]["op"] == "dot_general") scopes.insert(scope_of(e));
    }
    return scopes;
  };
  {
    profiler::ProfileSession session;
    auto train = named_scope("train");
    (void)p.f(p.x, p.w);
  }
  EXPECT_EQ(products_scopes(), std::set<std::string>{"train/proj"});
  {
    profiler::ProfileSession session;
    auto eval = named_scope("eval");
    (void)p.f(p.x, p.w);
  }
  EXPECT_EQ(products_scopes(), std::set<std::string>{"eval/proj"});
  {
    profiler::ProfileSession session;
    (void)p.f(p.x, p.w);
  }
  EXPECT_EQ(products_scopes(), std::set<std::string>{"proj"});
}

// Ops traced inside nested scopes carry the whole path ("mlp/down"), under value_and_grad as
// without it: the forward ops value_and_grad replays keep their scope, as its backward ops do.
TEST(Profiler, ForwardOpsUnderValueAndGradKeepTheirNestedScope) {
  ContractionProgram p;
  const auto layer = [](const Array& x, const Array& w) {
    auto mlp = named_scope("mlp");
    auto down = named_scope("down");
    return tanh(matmul(x, w));
  };
  const auto scopes_of_ops = [&](auto& f) {
    {
      profiler::ProfileSession session;
      (void)f(p.x, p.w);
    }
    std::map<std::string, std::set<std::string>> scopes;  // op -> scopes of its kernels
    for (const json& e : events_of(json::parse(profiler::trace_json()), "kernel")) {
      scopes[e["args"]["op"].get<std::string>()].insert(scope_of(e));
    }
    return scopes;
  };
  const SjitOptions no_fusion{.fuse = false};  // each op its own kernel, named by its op
  auto forward = sjit(p.mesh, [&](const Array& x, const Array& w) { return layer(x, w); },
                            no_fusion);
  auto with_grad = sjit(p.mesh, [&](const Array& x, const Array& w) {
    return value_and_grad([&](const Array& v) { return sum(layer(x, v)); })(w).second;
  }, no_fusion);
  const std::set<std::string> nested{"mlp/down"};
  const auto plain = scopes_of_ops(forward);
  EXPECT_EQ(plain.at("dot_general"), nested);
  EXPECT_EQ(plain.at("tanh"), nested);
  const auto differentiated = scopes_of_ops(with_grad);
  EXPECT_EQ(differentiated.at("tanh"), nested);         // forward only
  EXPECT_EQ(differentiated.at("dot_general"), nested);  // forward and backward
}

TEST(Profiler, CollectiveBytesByKindAreWhatTheCostSays) {
  ContractionProgram p;
  const ProgramCost cost = p.f.lower(p.x, p.w).cost();
  ASSERT_FALSE(cost.bytes_by_kind.empty());
  {
    profiler::ProfileSession session;
    (void)p.f(p.x, p.w);
  }
  const json doc = json::parse(profiler::trace_json());
  std::map<int, std::map<std::string, std::int64_t>> bytes;  // device -> kind -> bytes
  for (const json& e : events_of(doc, "collective")) {
    bytes[e["tid"].get<int>()][e["args"]["kind"].get<std::string>()] +=
        e["args"]["bytes"].get<std::int64_t>();
    // Its group: the other three devices of data:4.
    std::vector<int> peers = e["args"]["peers"];
    std::vector<int> want;
    for (int d = 0; d < 4; ++d) {
      if (d != e["tid"].get<int>()) want.push_back(d);
    }
    EXPECT_EQ(peers, want);
    // A reshard is named by the value it moves: the products summed ("proj"), tanh's result
    // gathered ("act").
    const std::string kind = e["args"]["kind"];
    const bool sums = kind == "reduce_scatter" || kind == "all_reduce";
    EXPECT_EQ(scope_of(e), sums ? "proj" : "act") << e.dump();
    EXPECT_EQ(e["args"]["op"], sums ? "dot_general" : "tanh") << e.dump();
  }
  ASSERT_EQ(bytes.size(), 4u);
  for (const auto& [device, by_kind] : bytes) {
    std::map<std::string, std::int64_t> want;
    for (const auto& [kind, b] : cost.bytes_by_kind) want[std::string(to_string(kind))] = b;
    EXPECT_EQ(by_kind, want) << "device " << device;
  }
}

// Per device, events either follow one another or one holds the other (a reshard its
// collectives); kernels never overlap anything. Steps run inline and on the pool.
class ProfilerSizes : public ::testing::TestWithParam<std::int64_t> {};
INSTANTIATE_TEST_SUITE_P(Rows, ProfilerSizes, ::testing::Values(8, 512));
TEST_P(ProfilerSizes, EventsOnADeviceDoNotOverlap) {
  ContractionProgram p(GetParam());
  {
    profiler::ProfileSession session;
    for (int i = 0; i < 3; ++i) (void)p.f(p.x, p.w);
  }
  const json doc = json::parse(profiler::trace_json());
  std::map<int, std::vector<json>> by_device;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "X") by_device[e["tid"].get<int>()].push_back(e);
  }
  constexpr double kEps = 0.0015;  // the written microseconds are rounded to the nanosecond
  for (const auto& [device, events] : by_device) {
    for (std::size_t i = 0; i < events.size(); ++i) {
      for (std::size_t j = i + 1; j < events.size(); ++j) {
        const double a0 = events[i]["ts"], a1 = a0 + events[i]["dur"].get<double>();
        const double b0 = events[j]["ts"], b1 = b0 + events[j]["dur"].get<double>();
        const bool disjoint = a1 <= b0 + kEps || b1 <= a0 + kEps;
        const bool nested =
            (a0 <= b0 + kEps && b1 <= a1 + kEps) || (b0 <= a0 + kEps && a1 <= b1 + kEps);
        const bool kernel = events[i]["cat"] == "kernel" || events[j]["cat"] == "kernel";
        EXPECT_TRUE(disjoint || (nested && !kernel))
            << "device " << device << ": " << events[i].dump() << " and " << events[j].dump();
      }
    }
  }
  EXPECT_EQ(events_of(doc, "dispatch").size(), 3u);
  std::map<int, int> products;
  for (const json& e : events_of(doc, "kernel")) {
    if (e["args"]["op"] == "dot_general") ++products[e["tid"].get<int>()];
  }
  EXPECT_EQ(products, (std::map<int, int>{{0, 3}, {1, 3}, {2, 3}, {3, 3}}));
}

TEST(Profiler, BackwardOpsCarryTheirForwardScope) {
  ContractionProgram p;
  const auto loss = [](const Array& x, const Array& w) {
    return value_and_grad([&](const Array& wv) {
             auto s = named_scope("proj");
             return sum(matmul(x, wv));
           })(w)
        .second;
  };
  auto g = sjit(p.mesh, loss);
  {
    profiler::ProfileSession session;
    (void)g(p.x, p.w);
  }
  const json doc = json::parse(profiler::trace_json());
  int products = 0;
  for (const json& e : events_of(doc, "kernel")) {
    if (e["args"]["op"] != "dot_general") continue;
    ++products;
    EXPECT_EQ(scope_of(e), "proj") << e.dump();
  }
  EXPECT_GE(products, 4);  // the backward product on each device
}

TEST(Profiler, EagerOpsTakeTheScopeOpenWhenTheyRun) {
  ContractionProgram p;
  {
    profiler::ProfileSession session;
    auto s = named_scope("eager");
    (void)tanh(p.x);
  }
  const json doc = json::parse(profiler::trace_json());
  const std::vector<json> kernels = events_of(doc, "kernel");
  ASSERT_EQ(kernels.size(), 4u);
  for (const json& e : kernels) EXPECT_EQ(scope_of(e), "eager");
}

TEST(Profiler, AnUnwritablePathIsAnIoErrorNamingIt) {
  ContractionProgram p;
  {
    profiler::ProfileSession session;
    (void)p.f(p.x, p.w);
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "profiler_test_dir";
  std::filesystem::create_directories(dir);
  const std::filesystem::path missing = dir / "no_such_dir" / "t.json";
  try {
    profiler::write_trace(missing);
    FAIL() << "wrote";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(missing.string()));
  }
  EXPECT_THROW(profiler::write_trace(dir), IoError);  // a directory is not replaced
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  // Written whole, and the same JSON trace_json gives.
  const std::filesystem::path file = dir / "t.json";
  profiler::write_trace(file);
  std::ifstream in(file);
  const json doc = json::parse(in);
  EXPECT_EQ(trace_format_violation(doc), "");
  EXPECT_EQ(doc, json::parse(profiler::trace_json()));
  std::filesystem::remove_all(dir);
}

// Host threads running programs at once each record into their own buffer; the trace holds all.
// (Run under the tsan preset after touching the recorder.)
TEST(Profiler, ThreadsRecordingAtOnceAreAllInTheTrace) {
  ContractionProgram a, b;
  {
    profiler::ProfileSession session;
    std::thread ta([&] {
      for (int i = 0; i < 3; ++i) (void)a.f(a.x, a.w);
    });
    std::thread tb([&] {
      for (int i = 0; i < 3; ++i) (void)b.f(b.x, b.w);
    });
    ta.join();
    tb.join();
  }
  const json doc = json::parse(profiler::trace_json());
  EXPECT_EQ(events_of(doc, "dispatch").size(), 6u);
  int products = 0;
  for (const json& e : events_of(doc, "kernel")) products += e["args"]["op"] == "dot_general";
  EXPECT_EQ(products, 2 * 3 * 4);
}

TEST(Profiler, StartDropsTheEarlierSession) {
  ContractionProgram p;
  profiler::start();
  (void)p.f(p.x, p.w);
  profiler::stop();
  const std::size_t one = profiler::event_count();
  EXPECT_GT(one, 0u);
  profiler::start();
  (void)p.f(p.x, p.w);
  (void)p.f(p.x, p.w);
  profiler::stop();
  EXPECT_EQ(profiler::event_count(), 2 * one);
  profiler::start();
  profiler::stop();
  EXPECT_EQ(profiler::event_count(), 0u);
}

// The command reads what the profiler writes: every device's row, the product and the summed
// collective listed.
TEST(Profiler, TraceSummarizeReadsTheWrittenTrace) {
  ContractionProgram p;
  {
    profiler::ProfileSession session;
    for (int i = 0; i < 2; ++i) (void)p.f(p.x, p.w);
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "profiler_test_cli";
  std::filesystem::create_directories(dir);
  profiler::write_trace(dir / "t.json");
  const std::string cmd = "'" + std::string(SHARDPLAN_CLI) + "' trace summarize '" +
                          (dir / "t.json").string() + "' > '" + (dir / "out.txt").string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(dir / "out.txt");
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(out, ::testing::ContainsRegex("kernel +dot_general +8 "));
  EXPECT_THAT(out, ::testing::ContainsRegex("collective +reduce_scatter +8 "));
  for (const char* thread : {"device 0", "device 1", "device 2", "device 3", "host"}) {
    EXPECT_THAT(out, HasSubstr(thread));
  }
  std::filesystem::remove_all(dir);
}

// Events are stamped with the cheapest clock (the time-stamp counter where the kernel's clock
// runs on it) and given steady_clock nanoseconds when collected: checked on both clocks against
// steady_clock read around the steps, and against a 30 ms sleep between two calls (a wrong rate
// would stretch or shrink it). Two collects give the same times.
class ProfilerClock : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Stamps, ProfilerClock, ::testing::Values(false, true),
                         [](const auto& param_info) { return param_info.param ? "Tsc" : "SteadyClock"; });

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TEST_P(ProfilerClock, EventTimesAreSteadyClockNanoseconds) {
  const bool tsc = GetParam();
  if (tsc && !profiler::detail::tsc_usable()) {
    GTEST_SKIP() << "this machine's clock does not run on the time-stamp counter";
  }
  profiler::detail::set_test_tsc_allowed(tsc);
  ContractionProgram p(512);  // steps on the pool: waits too
  (void)p.f(p.x, p.w);        // compiled before the session
  const std::int64_t before = steady_ns();
  profiler::start();
  EXPECT_EQ(profiler::detail::g_stamp_tsc.load(), tsc);
  (void)p.f(p.x, p.w);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  (void)p.f(p.x, p.w);
  profiler::stop();
  const std::int64_t after = steady_ns();
  profiler::detail::set_test_tsc_allowed(true);
  std::int64_t origin = 0;
  const std::vector<profiler::detail::Event> events = profiler::detail::collect(&origin);
  EXPECT_LE(before, origin);
  std::vector<std::int64_t> dispatch_ends;
  for (const auto& e : events) {
    EXPECT_LE(before, e.start_ns) << profiler::detail::category_name(e.cat);
    EXPECT_LE(e.start_ns, e.end_ns) << profiler::detail::category_name(e.cat);
    EXPECT_LE(e.end_ns, after) << profiler::detail::category_name(e.cat);
    if (e.cat == profiler::detail::Category::kDispatch) dispatch_ends.push_back(e.end_ns);
  }
  ASSERT_EQ(dispatch_ends.size(), 2u);
  // The second dispatch ended at least the sleep after the first, and not far beyond it (the
  // first call's steps and the second's dispatch: under a few ms here, 20 allowed).
  EXPECT_GE(dispatch_ends[1] - dispatch_ends[0], 30'000'000);
  EXPECT_LT(dispatch_ends[1] - dispatch_ends[0], 50'000'000);
  // A later collect gives every event the same times.
  const std::vector<profiler::detail::Event> again = profiler::detail::collect(nullptr);
  ASSERT_EQ(again.size(), events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(again[i].start_ns, events[i].start_ns) << i;
    EXPECT_EQ(again[i].end_ns, events[i].end_ns) << i;
  }
}

// A collective's groups are kept per thread by the mesh's devices, axis sizes and axes: meshes
// over the same four devices that differ in shape or in device order get their own groups, one
// run after another on this thread (a cache keyed on less would name the first mesh's peers).
TEST(Profiler, CollectivePeersFollowEachMeshOverTheSameDevices) {
  Executor exec{4};
  const Tensor host = Tensor::normal(Shape{8, 4}, DType::kF32, 3);
  // The peers of device 0 in a gather of a value split over axis 'a' of `mesh`.
  const auto peers_of_0 = [&](const Mesh& mesh) {
    const Array x = device_put(host, NamedSharding(mesh, P("a")), exec);
    auto gather = sjit(mesh, [](const Array& a) { return with_sharding_constraint(a, P()); });
    (void)gather(x);
    {
      profiler::ProfileSession session;
      (void)gather(x);
    }
    const json doc = json::parse(profiler::trace_json());
    for (const json& e : events_of(doc, "collective")) {
      if (e["tid"] == 0) return e["args"]["peers"].get<std::vector<int>>();
    }
    return std::vector<int>{-1};
  };
  EXPECT_EQ(peers_of_0(Mesh::parse("a:4", 4)), (std::vector<int>{1, 2, 3}));
  // a:2,b:2: device 0 is (0, 0); along 'a' its group is device 2, (1, 0).
  EXPECT_EQ(peers_of_0(Mesh::parse("a:2,b:2", 4)), (std::vector<int>{2}));
  // The same shape over the devices in another order: 0 is (0, 0), 1 is (1, 0).
  EXPECT_EQ(peers_of_0(Mesh({{"a", 2}, {"b", 2}}, std::vector<int>{0, 2, 1, 3})),
            (std::vector<int>{1}));
  EXPECT_EQ(peers_of_0(Mesh::parse("a:4", 4)), (std::vector<int>{1, 2, 3}));
}

// A slice keeps its span as 32-bit offsets from its step's start: a span of 2^32 stamps or more
// (over 4 s of steady_clock stamps) is kept in coarser units, to within one unit (a few ns).
TEST(Profiler, AnEventOverFourSecondsLongKeepsItsSpan) {
  profiler::detail::set_test_tsc_allowed(false);  // stamps are ns: the span is known exactly
  profiler::start();
  const std::int64_t t = profiler::detail::stamp();
  constexpr std::int64_t kLong = 10'000'000'007;  // 10 s: 2^33.2 ns
  profiler::detail::record(profiler::detail::Event{.cat = profiler::detail::Category::kDispatch,
                                                   .device = profiler::detail::kHostTid,
                                                   .start_ns = t,
                                                   .end_ns = t + kLong,
                                                   .name = "long"});
  profiler::detail::record(profiler::detail::Event{.cat = profiler::detail::Category::kDispatch,
                                                   .device = profiler::detail::kHostTid,
                                                   .start_ns = t + 5,
                                                   .end_ns = t + 12,
                                                   .name = "short"});
  profiler::stop();
  profiler::detail::set_test_tsc_allowed(true);
  const std::vector<profiler::detail::Event> events = profiler::detail::collect(nullptr);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].op(), "long");
  EXPECT_EQ(events[0].start_ns, t);
  EXPECT_LE(std::llabs(events[0].end_ns - (t + kLong)), 4);  // units of 2^2 ns
  EXPECT_EQ(events[1].start_ns, t + 5);  // exact below 2^32
  EXPECT_EQ(events[1].end_ns, t + 12);
}

// What the recorder derives from a step's span rather than have every device write it (a wait
// before and after each kernel run on the pool; the reshard around each device's collectives):
// each wait touches its device's kernel of the same op and lasts 1 us or more; each device has
// one reshard event per reshard, and its collectives lie inside it.
TEST(Profiler, WaitsTouchTheirKernelAndCollectivesLieInsideTheirReshard) {
  ContractionProgram p(512);
  (void)p.f(p.x, p.w);
  {
    profiler::ProfileSession session;
    (void)p.f(p.x, p.w);
  }
  const json doc = json::parse(profiler::trace_json());
  const std::vector<json> kernels = events_of(doc, "kernel");
  const auto near = [](double a, double b) { return std::abs(a - b) < 0.002; };  // us, rounded
  const std::vector<json> waits = events_of(doc, "wait");
  // 4 devices on the pool's threads (2 here): some wait for a thread.
  EXPECT_FALSE(waits.empty());
  for (const json& w : waits) {
    EXPECT_GE(w["dur"].get<double>(), 1.0) << w.dump();
    const double start = w["ts"], end = start + w["dur"].get<double>();
    const bool touches = std::any_of(kernels.begin(), kernels.end(), [&](const json& k) {
      const double ks = k["ts"], ke = ks + k["dur"].get<double>();
      return k["tid"] == w["tid"] && k["args"]["op"] == w["args"]["op"] &&
             (near(end, ks) || near(start, ke));
    });
    EXPECT_TRUE(touches) << w.dump();
  }
  const std::vector<json> reshards = events_of(doc, "reshard");
  const std::vector<json> collectives = events_of(doc, "collective");
  ASSERT_FALSE(collectives.empty());
  for (int d = 0; d < 4; ++d) {
    std::vector<json> mine;
    std::copy_if(reshards.begin(), reshards.end(), std::back_inserter(mine),
                 [&](const json& r) { return r["tid"] == d; });
    // proj's summed product is reduce-scattered, then tanh's result gathered: two reshards.
    EXPECT_EQ(mine.size(), 2u) << "device " << d;
    for (const json& c : collectives) {
      if (c["tid"] != d) continue;
      const double cs = c["ts"], ce = cs + c["dur"].get<double>();
      const bool inside = std::any_of(mine.begin(), mine.end(), [&](const json& r) {
        const double rs = r["ts"], re = rs + r["dur"].get<double>();
        return r["args"]["op"] == c["args"]["op"] && rs <= cs + 0.002 && ce <= re + 0.002;
      });
      EXPECT_TRUE(inside) << c.dump();
    }
  }
}

}  // namespace
}  // namespace shardplan
