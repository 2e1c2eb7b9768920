// The memory report (profiler.hpp memory_json, memory_html, write_memory_report) and its source
// in a trace ("memory peak" instant events, read back by `trace memory`'s reader): a two-device
// program's bytes per step worked out by hand, the page's figures and peak marker, names that
// are not UTF-8, bad paths and extensions, traces that are not traces or carry no runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../src/formats/json_impl.hpp"
#include "../profiler/memory_report.hpp"
#include "../profiler/trace_summary.hpp"
#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/profiler.hpp"
#include "shardplan/remat.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"
#include "trace_format.hpp"

namespace shardplan {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// On data:2, x f32[8, 8] split by rows (128 B a device) and w f32[8, 2] replicated (64 B): the
// product [8, 2] by rows (32 B), its tanh (32 B) named "h", both in scope "mlp"; the row sums
// f32[8] (16 B) in scope "head". Per device, by hand: the arguments 192 B; after the product
// 224; after tanh 256 (the product is freed after that sample: 224); after the sums 240 (tanh
// freed: 208). The peak, 256 B after step 1, holds x 128, w 64, the product 32, tanh 32.
Array two_device_step(const Array& x, const Array& w) {
  Array h;
  {
    auto s = named_scope("mlp");
    h = checkpoint_name(tanh(matmul(x, w)), "h");
  }
  auto s = named_scope("head");
  return sum(h, {1});
}

struct TwoDeviceProgram {
  Executor exec{2};
  Mesh mesh = Mesh::parse("data:2", 2);
  Array x = device_put(Tensor::normal(Shape{8, 8}, DType::kF32, 1),
                       NamedSharding(mesh, P("data", nullptr)), exec);
  Array w = device_put(Tensor::normal(Shape{8, 2}, DType::kF32, 2), NamedSharding(mesh, P()), exec);
  decltype(sjit(mesh, two_device_step)) f = sjit(mesh, two_device_step);
};

std::vector<profiler::LiveBuffer> by_bytes_then_name(std::vector<profiler::LiveBuffer> v) {
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.what < b.what;
  });
  return v;
}

const std::vector<profiler::LiveBuffer> kLiveAtPeak = {{"input 0", "", 128},
                                                       {"input 1", "", 64},
                                                       {"dot_general", "mlp", 32},
                                                       {"tanh", "mlp", 32}};

profiler::MemoryRun measured_run() {
  TwoDeviceProgram p;
  profiler::MemoryDebugMode memory;
  (void)p.f(p.x, p.w);
  const std::vector<profiler::MemoryRun> runs = memory.runs();
  EXPECT_EQ(runs.size(), 1u);
  return runs.empty() ? profiler::MemoryRun{} : runs[0];
}

TEST(MemoryReport, ARunCarriesItsStepsAndThePlanBesideTheBytesByHand) {
  const profiler::MemoryRun r = measured_run();
  EXPECT_EQ(r.devices, (std::vector<int>{0, 1}));
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_EQ(r.steps[0], (profiler::MemoryStep{"dot_general", "", "mlp"}));
  EXPECT_EQ(r.steps[1], (profiler::MemoryStep{"tanh", "h", "mlp"}));
  EXPECT_EQ(r.steps[2].scope, "head");
  EXPECT_EQ(r.start_bytes, (std::vector<std::int64_t>{192, 192}));
  using Row = std::vector<std::int64_t>;
  EXPECT_EQ(r.live_bytes, (std::vector<Row>{{224, 224}, {256, 256}, {240, 240}}));
  EXPECT_EQ(r.planned_start_bytes, 192);
  EXPECT_EQ(r.planned_bytes, (Row{224, 256, 240}));
  EXPECT_EQ(r.peak_step, 1u);
  EXPECT_EQ(r.peak_bytes, 256);
  EXPECT_EQ(r.peak_device, 0);
  EXPECT_EQ(by_bytes_then_name(r.live_at_peak), kLiveAtPeak);
}

// The steps' labels are made once per program (Program::report_memo) relative to the traced
// function; the caller's scope is joined per run: one cached program run under two outer scopes
// (and none) is labelled by each.
TEST(MemoryReport, ACachedProgramsStepsTakeEachCallersScope) {
  TwoDeviceProgram p;
  profiler::MemoryDebugMode memory;
  {
    auto s = named_scope("train");
    (void)p.f(p.x, p.w);
  }
  {
    auto s = named_scope("eval");
    (void)p.f(p.x, p.w);
  }
  (void)p.f(p.x, p.w);
  const std::vector<profiler::MemoryRun> runs = memory.runs();
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].steps[1], (profiler::MemoryStep{"tanh", "h", "train/mlp"}));
  EXPECT_EQ(runs[0].steps[2].scope, "train/head");
  EXPECT_EQ(runs[1].steps[1], (profiler::MemoryStep{"tanh", "h", "eval/mlp"}));
  EXPECT_EQ(runs[2].steps[1], (profiler::MemoryStep{"tanh", "h", "mlp"}));
  EXPECT_EQ(by_bytes_then_name(runs[2].live_at_peak), kLiveAtPeak);
}

TEST(MemoryReport, JsonHasTheFiguresByHand) {
  const profiler::MemoryRun r = measured_run();
  const json doc = json::parse(profiler::memory_json({r, r}));
  ASSERT_EQ(doc["runs"].size(), 2u);
  const json& run = doc["runs"][0];
  EXPECT_EQ(run["devices"], json::array({0, 1}));
  EXPECT_EQ(run["start_bytes"], json::array({192, 192}));
  EXPECT_EQ(run["live_bytes"], json::parse("[[224, 224], [256, 256], [240, 240]]"));
  EXPECT_EQ(run["planned_start_bytes"], 192);
  EXPECT_EQ(run["planned_bytes"], json::array({224, 256, 240}));
  EXPECT_EQ(run["steps"][1], json::parse(R"({"op": "tanh", "value": "h", "scope": "mlp"})"));
  EXPECT_EQ(run["peak"]["step"], 1);
  EXPECT_EQ(run["peak"]["bytes"], 256);
  EXPECT_EQ(run["peak"]["device"], 0);
  ASSERT_EQ(run["peak"]["live"].size(), 4u);
  EXPECT_EQ(run["peak"]["live"][0], json::parse(R"({"what": "input 0", "scope": "", "bytes": 128})"));
  EXPECT_EQ(run["took_constants"], false);
  // A peak at the start (the arguments alone) has no step.
  profiler::MemoryRun start = r;
  start.peak_step = start.live_bytes.size();
  EXPECT_TRUE(json::parse(profiler::memory_json({start}))["runs"][0]["peak"]["step"].is_null());
}

// The page: each device's measured line and the planned one, the peak marked with its bytes and
// step, the table of what is live at it; well-formed enough to nest, self-contained.
TEST(MemoryReport, HtmlDrawsEachDeviceThePlanAndThePeak) {
  const profiler::MemoryRun r = measured_run();
  const std::string html = profiler::memory_html({r}, "step <1>");
  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>"));
  EXPECT_TRUE(html.ends_with("</html>\n"));
  EXPECT_THAT(html, HasSubstr("<title>step &lt;1&gt;</title>"));
  for (const char* ref : {"http", "src=", "href", "<script", "<link", "<img", "url("}) {
    EXPECT_THAT(html, Not(HasSubstr(ref))) << ref;
  }
  for (const char* part :
       {"<polyline class=\"series-0\"", "<polyline class=\"series-1\"", "<polyline class=\"planned\"",
        "<circle class=\"peak\"", ">peak 256 B</text>", "device 1 (measured)",
        "peak: 256 B on device 0 after step 1 (tanh &#39;h&#39;, scope mlp)",
        "Measured peak 256 B on device 0 after step 1 (tanh &#39;h&#39;, scope mlp); planned peak "
        "256 B after step 1",
        "<td class=\"mono\">input 0</td><td class=\"mono\"></td><td class=\"n\">128 B</td>"
        "<td class=\"n\">50.0%</td>",
        "<td class=\"mono\">tanh</td><td class=\"mono\">mlp</td><td class=\"n\">32 B</td>",
        "<dt>Highest peak</dt><dd>256 B</dd>", "<dt>Planned peak</dt><dd>256 B</dd>"}) {
    EXPECT_THAT(html, HasSubstr(part)) << part;
  }
  EXPECT_THAT(html, Not(HasSubstr("every other value")));  // the four add up to the peak
  // Four points a line (the start and three steps); the peak's circle at step 1's x.
  const std::string planned = html.substr(html.find("<polyline class=\"planned\""));
  const std::string points = planned.substr(0, planned.find("/>"));
  EXPECT_EQ(std::count(points.begin(), points.end(), ','), 4);
}

// A run that took kept constants from an earlier one holds them above its plan: both say so.
TEST(MemoryReport, ARunThatTookKeptConstantsSaysSo) {
  profiler::MemoryRun r = measured_run();
  EXPECT_THAT(profiler::memory_html({r}, "t"), Not(HasSubstr("Kept constants")));
  r.took_constants = true;
  EXPECT_THAT(profiler::memory_html({r}, "t"),
              HasSubstr("Kept constants were taken from an earlier run"));
  EXPECT_THAT(profiler::detail::format_memory_runs({r}, "t.json", 10),
              HasSubstr("(kept constants taken from an earlier run: held from the start, above "
                        "the plan)"));
}

TEST(MemoryReport, NamesThatAreNotUtf8AreReplacedAndEscaped) {
  profiler::MemoryRun r = measured_run();
  r.live_at_peak[0].what = "bad\xff<v>";
  r.steps[1].scope = "s\xfe&";
  const std::string html = profiler::memory_html({r}, "t");
  EXPECT_THAT(html, HasSubstr("bad\xEF\xBF\xBD&lt;v&gt;"));
  EXPECT_THAT(html, HasSubstr("scope s\xEF\xBF\xBD&amp;"));
  EXPECT_THAT(html, Not(HasSubstr("\xff")));
  const json doc = json::parse(profiler::memory_json({r}));  // valid UTF-8, the byte replaced
  EXPECT_EQ(doc["runs"][0]["steps"][1]["scope"], "s\xEF\xBF\xBD&");
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(MemoryReport, WriteChoosesTheFormatByTheExtensionAndNamesABadPath) {
  const test::TempDir dir;
  const profiler::MemoryRun r = measured_run();
  profiler::write_memory_report(dir.path() / "m.json", {r});
  EXPECT_EQ(read_file(dir.path() / "m.json"), profiler::memory_json({r}));
  profiler::write_memory_report(dir.path() / "m.html", {r}, "mine");
  EXPECT_EQ(read_file(dir.path() / "m.html"), profiler::memory_html({r}, "mine"));
  const std::string txt = (dir.path() / "m.txt").string();
  EXPECT_THROW_WITH(profiler::write_memory_report(txt, {r}), SpecError, txt,
                    std::string("neither .json nor .html"));
  EXPECT_FALSE(std::filesystem::exists(txt));
  const std::string missing = (dir.path() / "no_dir" / "m.html").string();
  EXPECT_THROW_WITH(profiler::write_memory_report(missing, {r}), IoError, missing,
                    std::string("No such file or directory"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "no_dir"));
}

// With the profiler on, the trace carries the run: each counter has the planned bytes beside
// the measured ones, and an instant event at the peak, on the peak's device, holds the whole
// run; read back, it is the run MemoryDebugMode measured.
TEST(MemoryReport, TheTraceCarriesTheRunAndReadsBackEqual) {
  TwoDeviceProgram p;
  (void)p.f(p.x, p.w);  // compiled before the session: only the run is traced
  std::vector<profiler::MemoryRun> measured;
  {
    profiler::MemoryDebugMode memory;
    profiler::ProfileSession session({.memory = true});
    (void)p.f(p.x, p.w);
    measured = memory.runs();
  }
  const std::string text = profiler::trace_json();
  const json doc = json::parse(text);
  EXPECT_EQ(test::trace_format_violation(doc), "");
  std::vector<std::int64_t> planned;
  std::vector<json> peaks;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "C" && e["tid"] == 1) planned.push_back(e["args"]["planned"]);
    if (e["ph"] == "i") peaks.push_back(e);
  }
  EXPECT_EQ(planned, (std::vector<std::int64_t>{192, 224, 256, 240}));
  ASSERT_EQ(peaks.size(), 1u);
  EXPECT_EQ(peaks[0]["name"], "memory peak");
  EXPECT_EQ(peaks[0]["tid"], 0);
  EXPECT_EQ(peaks[0]["s"], "t");
  EXPECT_EQ(peaks[0]["args"]["peak"]["bytes"], 256);
  // At the time of step 1's sample: the second counter sample of device 0.
  std::vector<double> times;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "C" && e["tid"] == 0) times.push_back(e["ts"]);
  }
  ASSERT_EQ(times.size(), 4u);
  EXPECT_EQ(peaks[0]["ts"].get<double>(), times[2]);
  const std::vector<profiler::MemoryRun> read = profiler::detail::read_trace_memory(text, "t.json");
  ASSERT_EQ(measured.size(), 1u);
  EXPECT_EQ(read, measured);
}

TEST(MemoryReport, ATraceWithoutRunsOrWithABrokenRunIsAnErrorNamingIt) {
  const auto fails = [](const std::string& text, const std::string& what) {
    EXPECT_THROW_WITH(profiler::detail::read_trace_memory(text, "x.trace.json"), IoError,
                      std::string("[trace] x.trace.json: "), what);
  };
  fails("not json", "not a trace: not valid JSON");
  fails(R"({"events": []})", "not a trace: the top-level object has no 'traceEvents'");
  fails(R"({"traceEvents": 3})", "the events are number, not an array");
  fails(R"([{"ph": "C", "name": "live bytes, device 0", "pid": 0, "tid": 0, "ts": 1,
            "args": {"bytes": 5}}])",
        "no memory runs: it has no 'memory peak' instant events (the profiler writes one per "
        "program run with ProfileOptions::memory on; this trace has 1 live-bytes counter "
        "samples)");
  // A run whose sizes disagree, or with a field missing or of the wrong type: named.
  json run = json::parse(profiler::memory_json({measured_run()}))["runs"][0];
  const auto with = [](json args) {
    return json{{"traceEvents",
                 json::array({json{{"ph", "i"}, {"name", "memory peak"}, {"pid", 0}, {"tid", 0},
                                   {"ts", 1}, {"args", std::move(args)}}})}}
        .dump();
  };
  EXPECT_EQ(profiler::detail::read_trace_memory(with(run), "x").size(), 1u);
  json short_row = run;
  short_row["live_bytes"][2] = json::array({1});
  fails(with(short_row), "event 0 'args' 'live_bytes' [2]: has 1 entries, not one per device (2)");
  json no_planned = run;
  no_planned.erase("planned_bytes");
  fails(with(no_planned), "event 0 'args': has no 'planned_bytes'");
  json negative = run;
  negative["start_bytes"][0] = -1;
  fails(with(negative), "event 0 'args' 'start_bytes' [0]: is -1, not a byte count");
  json far_peak = run;
  far_peak["peak"]["step"] = 3;
  fails(with(far_peak), "event 0 'args' 'peak' 'step': is 3, not null or a step below 3");
  json other_device = run;
  other_device["peak"]["device"] = 5;
  fails(with(other_device), "event 0 'args' 'peak' 'device': 5 is not one of the run's devices [0, 1]");
  json no_what = run;
  no_what["peak"]["live"][1].erase("what");
  fails(with(no_what), "event 0 'args' 'peak' 'live' [1]: has no 'what'");
  fails(R"([{"ph": "i", "ph": "i"}])", "event 0: has the key 'ph' twice");
  // Issue 39: a null peak device printed "device -1"; a device listed twice was accepted; 25
  // values of 2^63-1 live at the peak added up to a negative figure on the page.
  json null_device = run;
  null_device["peak"]["device"] = nullptr;
  fails(with(null_device), "event 0 'args' 'peak' 'device': is null, not a device id");
  json twice = run;
  twice["devices"] = json::array({1, 1});
  fails(with(twice), "event 0 'args' 'devices' [1]: device 1 is listed twice");
  // The run's objects are shardplan's own: a key memory_run_json does not write is refused.
  json extra = run;
  extra["peak"]["bytez"] = 1;
  fails(with(extra), "event 0 'args' 'peak': has the unknown key 'bytez' (expected step, bytes, "
                     "device, live)");
  json extra_step = run;
  extra_step["steps"][0]["ops"] = "x";
  fails(with(extra_step), "event 0 'args' 'steps' [0]: has the unknown key 'ops'");
  json none = run;
  none["devices"] = json::array();
  fails(with(none), "event 0 'args' 'devices': is empty");
  json huge = run;
  huge["peak"]["live"] = json::array();
  for (int i = 0; i < 25; ++i) {
    huge["peak"]["live"].push_back(json{{"what", "v"}, {"scope", ""}, {"bytes", INT64_MAX}});
  }
  fails(with(huge), "event 0 'args' 'peak' 'live' [1] 'bytes': the values live at the peak add "
                    "up past 9223372036854775807 bytes");
}

// A run's peak is the largest of its own samples (the profiler finds it so). A trace claiming
// another (256 B where its samples reach 5,000 B) is read, and its peak shown as claimed beside
// the sampled one, in the text and on the page (issue 39: printed as "measured").
TEST(MemoryReport, APeakItsOwnSamplesContradictIsShownAsClaimed) {
  const profiler::MemoryRun measured = measured_run();
  EXPECT_TRUE(profiler::detail::peak_agrees_with_samples(measured));
  const profiler::detail::SampledPeak s = profiler::detail::sampled_peak(measured);
  EXPECT_EQ(s.bytes, 256);  // by hand: after step 1, first on device 0
  EXPECT_EQ(s.step, 1u);
  EXPECT_EQ(s.device, 0);
  profiler::MemoryRun edited = measured;
  edited.live_bytes[2][1] = 5000;  // device 1 after step 2
  EXPECT_FALSE(profiler::detail::peak_agrees_with_samples(edited));
  const std::string text = profiler::detail::format_memory_runs({edited}, "t.json", 10);
  EXPECT_THAT(text, HasSubstr("  claimed peak  256 B on device 0 after step 1 (tanh 'h', scope "
                              "mlp): its own samples contradict it\n"
                              "  sampled peak  4.88 KiB on device 1 after step 2 (reduce_sum, "
                              "scope head)\n"));
  EXPECT_THAT(text, Not(HasSubstr("measured peak")));
  const std::string page = profiler::memory_html({edited}, "t");
  EXPECT_THAT(page, HasSubstr("Claimed peak 256 B on device 0"));
  EXPECT_THAT(page, HasSubstr("they reach 4.88 KiB on device 1 after step 2"));
  // A claimed peak at a sample that is a largest one, but not the first, agrees.
  profiler::MemoryRun tie = measured;
  tie.peak_device = 1;
  EXPECT_TRUE(profiler::detail::peak_agrees_with_samples(tie));
  // A peak claimed at a sample that holds less, with the same largest figure elsewhere, does not.
  profiler::MemoryRun moved = measured;
  moved.peak_step = 0;
  EXPECT_FALSE(profiler::detail::peak_agrees_with_samples(moved));
}

// The page adds up what is live at the peak in 64 bits without wrapping: 25 values of 2^63-1
// (a run made in the program, not read from a trace) gave a negative "every other value" row.
TEST(MemoryReport, ThePagesSumOfLiveValuesDoesNotWrap) {
  profiler::MemoryRun r = measured_run();
  r.peak_bytes = INT64_MAX;
  r.live_at_peak.assign(25, profiler::LiveBuffer{"v", "", INT64_MAX});
  const std::string page = profiler::memory_html({r}, "t");
  EXPECT_THAT(page, Not(HasSubstr("every other value live at the peak")));
  EXPECT_THAT(page, Not(HasSubstr(">-")));
}

// The trace readers walk the events one at a time (for_each_trace_event), holding one event's
// parse, not the whole file's (issue 39: 774 MB for a 78 MB trace). They accept and refuse what a
// whole-document parse does: each text here is read both ways, and the events seen (by their
// source text) and the verdicts agree.
TEST(MemoryReport, TheEventsAreReadOneByOneAsTheWholeDocumentGivesThem) {
  const std::vector<std::string> texts = {
      R"([])",
      R"([{"ph": "X"}, {"ph": "i", "name": "a \"]}[{\\"}, 3, "s", null, [1, [2]]])",
      R"( {"displayTimeUnit": "ms", "traceEvents": [ {"a": {"b": [1, 2]}} ], "other": {"x": "]"}} )",
      R"({"other": [1, {"y": null}], "traceEvents": []})",
      R"([{"ph": "X"},])",               // a trailing comma
      R"([{"ph": "X"} {"ph": "X"}])",    // no comma
      R"([{"ph": "X"}] extra)",          // text after the value
      R"([{"ph": "X"})",                 // not closed
      R"([{"ph": "X]})",                 // a string not closed
      R"({"traceEvents": [], "traceEvents": []})",
      R"({"traceEvents": [1], "bad": [1,]})",
      R"({"traceEvents": 3})",
      R"({"x": 1})",
      R"({"traceEvents": [tru]})",
      R"([1e5, -0, 1.5e-3, 12abc])",
      R"(["\u00e9", "\ud800"])",      // a lone surrogate is not UTF-8
      "",
      "  ",
      R"("a trace?")",
      std::string(300, '[') + std::string(300, ']'),
      "[" + std::string(254, '[') + std::string(254, ']') + "]",
      "[" + std::string(256, '[') + std::string(256, ']') + "]",
  };
  for (const std::string& text : texts) {
    SCOPED_TRACE(text.substr(0, 80));
    // The whole document: valid or not, and its events.
    bool whole_ok = true;
    std::vector<std::string> whole;
    try {
      const detail::json::Document doc(text);
      detail::json::Value events = doc.root();
      if (events.is_object()) {
        for (auto it = events.begin(); it != events.end(); ++it) {
          if (it.key() == "traceEvents") events = it.value();
        }
      }
      if (!events.is_array()) throw std::runtime_error("no events");
      for (const detail::json::Value e : events) whole.push_back(e.source_text(1000));
    } catch (const std::exception&) {
      whole_ok = false;
    }
    std::vector<std::string> walked;
    bool walked_ok = true;
    try {
      detail::for_each_trace_event(text, "t.json", [&](const detail::json::Value& e, std::size_t i) {
        EXPECT_EQ(i, walked.size());
        walked.push_back(e.source_text(1000));
      });
    } catch (const IoError& e) {
      walked_ok = false;
      EXPECT_THAT(e.what(), HasSubstr("[trace] t.json: "));
    }
    const bool duplicate = text.find(R"("traceEvents": [], "traceEvents")") != std::string::npos;
    EXPECT_EQ(walked_ok, whole_ok && !duplicate);
    if (whole_ok && walked_ok) {
      EXPECT_EQ(walked, whole);
    }
  }
  EXPECT_THROW_WITH(detail::for_each_trace_event(R"([{"ph": "X"},])", "t.json",
                                                 [](const detail::json::Value&, std::size_t) {}),
                    IoError, std::string("not a trace: not valid JSON (at byte 13)"));
  EXPECT_THROW_WITH(detail::for_each_trace_event(R"({"traceEvents": [], "traceEvents": []})", "t.json",
                                                 [](const detail::json::Value&, std::size_t) {}),
                    IoError, std::string("the top-level object has the key 'traceEvents' twice"));
}

}  // namespace
}  // namespace shardplan
