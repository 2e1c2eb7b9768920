// train_plan_html: a training plan as one page, and the timeline it draws (TrainPlan::timeline)
// checked against the plan's own figures: the whole step's live bytes peak at the planned peak,
// the phases come in order and cover every step.
#include "shardplan/train_plan_html.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"
#include "shardplan/hardware.hpp"
#include "shardplan/rule_file.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kTinyLlama = R"({"model_type": "llama", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2})";
// Forty layers: planned from small steps, never traced whole.
constexpr const char* kLlama40Layers = R"({"model_type": "llama", "vocab_size": 256,
  "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 40,
  "num_attention_heads": 4, "num_key_value_heads": 2})";

TrainPlan tiny_plan(bool with_hardware) {
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 16;
  if (with_hardware) o.hardware = find_hardware("h100-sxm");
  return plan_training(ModelConfig::parse(kTinyLlama), Mesh::parse("fsdp:4,tp:2", 8),
                       load_preset("llama_fsdp_tp").make_rule(), o);
}

void expect_phases_in_order(const MemoryTimeline& m) {
  ASSERT_FALSE(m.phases.empty());
  EXPECT_EQ(m.phases.front().step, 0u);
  EXPECT_EQ(m.phases.front().phase, StepPhase::kForward);
  EXPECT_EQ(m.phases.back().phase, StepPhase::kUpdate);
  for (std::size_t i = 1; i < m.phases.size(); ++i) {
    EXPECT_LT(m.phases[i - 1].step, m.phases[i].step);
    EXPECT_NE(m.phases[i - 1].phase, m.phases[i].phase);
  }
  EXPECT_LT(m.phases.back().step, m.live_bytes.size());
}

// One micro-batch: forward, backward, update, once each; the chart's highest point is the
// plan's peak (traced whole, nothing extrapolated), and the values listed fit under it.
TEST(TrainPlanTimeline, WholeStepPeaksAtThePlannedPeak) {
  const TrainPlan p = tiny_plan(false);
  ASSERT_FALSE(p.extrapolated);
  ASSERT_TRUE(p.timeline.has_value());
  const MemoryTimeline& m = p.timeline->memory;
  EXPECT_EQ(p.timeline->traced, "the whole step");
  ASSERT_LT(m.peak_step, m.live_bytes.size());
  EXPECT_EQ(*std::max_element(m.live_bytes.begin(), m.live_bytes.end()), p.peak_bytes);
  EXPECT_EQ(m.live_bytes[m.peak_step], p.peak_bytes);
  EXPECT_GE(p.peak_bytes, m.start_bytes);
  expect_phases_in_order(m);
  ASSERT_EQ(m.phases.size(), 3u);
  EXPECT_EQ(m.phases[1].phase, StepPhase::kBackward);
  // Largest first, at most 20, adding up to no more than the peak; the state named by path.
  ASSERT_FALSE(m.live_at_peak.empty());
  EXPECT_LE(m.live_at_peak.size(), MemoryTimeline::kMaxLiveAtPeak);
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < m.live_at_peak.size(); ++i) {
    sum += m.live_at_peak[i].bytes;
    if (i > 0) {
      EXPECT_GE(m.live_at_peak[i - 1].bytes, m.live_at_peak[i].bytes);
    }
  }
  EXPECT_LE(sum, p.peak_bytes);
}

// Where the state outweighs the activations (wide, four tokens a sequence), the largest values
// at the peak are Adam's moments and the parameters, named by their checkpoint paths.
TEST(TrainPlanTimeline, TheStateLiveAtThePeakIsNamedByPath) {
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 4;
  const TrainPlan p = plan_training(ModelConfig::parse(R"({"model_type": "llama",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2})"), Mesh::parse("fsdp:4", 4),
                                    load_preset("llama_fsdp").make_rule(), o);
  ASSERT_TRUE(p.timeline.has_value());
  const std::vector<LiveValue>& live = p.timeline->memory.live_at_peak;
  ASSERT_FALSE(live.empty());
  // The largest held as passed: a moment of the embedding or the head ([1024, 256] f32 over 4
  // devices). (A weight gathered for its use may be live at the peak too, named by its path:
  // the head's [1024, 256] bf16 whole, 512 KiB, where the peak is the head's.)
  const auto held_first = std::find_if(live.begin(), live.end(), [](const LiveValue& v) {
    return v.input >= 0 && !v.resharded;
  });
  ASSERT_NE(held_first, live.end());
  EXPECT_EQ(held_first->bytes, 1024 * 256 * 4 / 4);
  EXPECT_TRUE(held_first->what.starts_with("optimizer state mu/") ||
              held_first->what.starts_with("optimizer state nu/"))
      << held_first->what;
  EXPECT_EQ(held_first->type, "f32[1024, 256]");
  std::int64_t held = 0;
  for (const LiveValue& v : live) {
    if (v.input < 0) continue;
    EXPECT_TRUE(v.what.starts_with("parameter model/") || v.what.starts_with("parameter lm_head/") ||
                v.what.starts_with("optimizer state ") || v.what == "tokens" ||
                v.what == "targets")
        << v.what;
    if (!v.resharded) held += v.bytes;
  }
  EXPECT_LE(held, p.peak_held_bytes);
}

// Micro-batches: forward and backward once per micro-batch, then one update.
TEST(TrainPlanTimeline, EachMicroBatchHasItsForwardAndBackward) {
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 16;
  o.grad_accum = 2;
  const TrainPlan p = plan_training(ModelConfig::parse(kTinyLlama), Mesh::parse("fsdp:4,tp:2", 8),
                                    load_preset("llama_fsdp_tp").make_rule(), o);
  ASSERT_TRUE(p.timeline.has_value());
  const MemoryTimeline& m = p.timeline->memory;
  expect_phases_in_order(m);
  std::vector<StepPhase> phases;
  for (const PhaseStart& s : m.phases) phases.push_back(s.phase);
  EXPECT_EQ(phases, (std::vector<StepPhase>{StepPhase::kForward, StepPhase::kBackward,
                                            StepPhase::kForward, StepPhase::kBackward,
                                            StepPhase::kUpdate}));
  EXPECT_EQ(*std::max_element(m.live_bytes.begin(), m.live_bytes.end()), p.peak_bytes);
}

// Extrapolated: the timeline is the largest sample's (8 layers), below the 40 layers' peak.
TEST(TrainPlanTimeline, AnExtrapolatedPlanShowsItsLargestSample) {
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 32;
  const TrainPlan p = plan_training(ModelConfig::parse(kLlama40Layers), Mesh::parse("fsdp:4", 4),
                                    load_preset("llama_fsdp").make_rule(), o);
  ASSERT_TRUE(p.extrapolated);
  ASSERT_TRUE(p.timeline.has_value());
  EXPECT_EQ(p.timeline->traced, "the 8-layer sample step");
  const MemoryTimeline& m = p.timeline->memory;
  expect_phases_in_order(m);
  EXPECT_LT(*std::max_element(m.live_bytes.begin(), m.live_bytes.end()), p.peak_bytes);
  const std::string html = train_plan_html(p);
  EXPECT_THAT(html, HasSubstr("the 8-layer sample step"));
  EXPECT_THAT(html, HasSubstr(fmt::format("The whole step&#39;s peak, extrapolated: {}.",
                                          format_bytes(p.peak_bytes))));
}

/// The elements opened and not closed (or closed without being opened): empty when the page is
/// well-formed as far as nesting goes (void elements and self-closed tags excepted).
std::vector<std::string> unbalanced_tags(const std::string& html) {
  static const std::regex tag(R"re(<(/?)([a-zA-Z][a-zA-Z0-9]*)[^>]*?(/?)>)re");
  const std::vector<std::string> void_elements = {"meta", "br", "line", "circle", "rect", "polyline"};
  std::vector<std::string> open, bad;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), tag); it != std::sregex_iterator();
       ++it) {
    const std::string name = (*it)[2].str();
    const bool closing = (*it)[1].length() > 0, self_closed = (*it)[3].length() > 0;
    if (self_closed) continue;
    if (closing) {
      if (open.empty() || open.back() != name) {
        bad.push_back("</" + name + ">");
        continue;
      }
      open.pop_back();
    } else if (std::find(void_elements.begin(), void_elements.end(), name) == void_elements.end() ||
               name == "rect" || name == "circle") {
      open.push_back(name);  // rect and circle carry a <title> here: always closed
    }
  }
  bad.insert(bad.end(), open.begin(), open.end());
  return bad;
}

// The page: the header's figures, the memory bars, the chart with its phases and peak, the
// table of what is live at it, the time split; well-formed and self-contained.
TEST(TrainPlanHtml, PageCarriesThePeakTheChartAndTheStepTime) {
  const TrainPlan p = tiny_plan(true);
  ASSERT_TRUE(p.time.has_value());
  const std::string html = train_plan_html(p);
  EXPECT_THAT(unbalanced_tags(html), ::testing::IsEmpty());
  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>"));
  EXPECT_TRUE(html.ends_with("</html>\n"));
  for (const char* ref : {"http", "src=", "href", "<script", "<link", "<img", "<iframe", "url(",
                          "@import", "xlink"}) {
    EXPECT_THAT(html, Not(HasSubstr(ref))) << ref;
  }
  EXPECT_THAT(html, HasSubstr(fmt::format("<title>shardplan train-plan: {} on Mesh(&#39;fsdp&#39;: "
                                          "4, &#39;tp&#39;: 2)</title>",
                                          p.model)));
  const std::string peak = format_bytes(p.peak_bytes);
  EXPECT_THAT(html, HasSubstr(fmt::format("<dt>Peak per device</dt><dd>{}</dd>", peak)));
  EXPECT_THAT(html, HasSubstr(fmt::format(">peak {}</text>", peak)));  // the chart's marker
  const double ms = p.time->step_seconds * 1e3;
  const std::string step = ms >= 1 ? fmt::format("{:.1f} ms", ms)
                                   : fmt::format("{:.1f} µs", p.time->step_seconds * 1e6);
  EXPECT_THAT(html, HasSubstr(fmt::format("<dt>Step time</dt><dd>{}</dd>", step)));
  for (const char* part : {"class=\"phase-forward\"", "class=\"phase-backward\"",
                           "class=\"phase-update\"", "<polyline class=\"live\"",
                           "<circle class=\"peak\"", "Live at the peak", "Memory per device",
                           "Step time on h100-sxm", "hidden under compute", "optimizer state"}) {
    EXPECT_THAT(html, HasSubstr(part)) << part;
  }
  // A point for the arguments alone, then one per bucket of steps (this step has more steps
  // than points).
  const std::regex poly(R"re(<polyline class="live" points="([^"]*)")re");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(html, match, poly));
  const std::string points = match[1].str();
  const std::size_t n = p.timeline->memory.live_bytes.size();
  const std::size_t bucket = (n + kTrainPlanHtmlMaxPoints - 1) / kTrainPlanHtmlMaxPoints;
  EXPECT_EQ(static_cast<std::size_t>(std::count(points.begin(), points.end(), ',')),
            1 + (n + bucket - 1) / bucket);
  EXPECT_LE(static_cast<std::size_t>(std::count(points.begin(), points.end(), ',')),
            kTrainPlanHtmlMaxPoints + 1);
  // The note names the peak's step and the pass it is in.
  const MemoryTimeline& m = p.timeline->memory;
  std::string pass;
  for (const PhaseStart& ps : m.phases) {
    if (ps.step <= m.peak_step) pass = std::string(name(ps.phase));
  }
  EXPECT_THAT(html, HasSubstr(fmt::format("Its peak: {} at step {}, in the {} pass",
                                          format_bytes(m.live_bytes[m.peak_step]), m.peak_step,
                                          pass)));
  // Without hardware: no time section.
  EXPECT_THAT(train_plan_html(tiny_plan(false)), Not(HasSubstr("Step time on")));
}

// Over two nodes of 8 the FSDP rings run through 8 NICs a node: the page, the text and the JSON
// say so (docs/training.md, "Step time").
TEST(TrainPlanHtml, ANetworkCollectiveNamesTheNicsItRunsThrough) {
  TrainPlanOptions o;
  o.batch = 16;
  o.seq = 16;
  o.hardware = find_hardware("h100-sxm");
  const TrainPlan p = plan_training(ModelConfig::parse(kTinyLlama), Mesh::parse("fsdp:16", 16),
                                    load_preset("llama_fsdp").make_rule(), o);
  ASSERT_TRUE(p.time.has_value());
  bool network = false;
  for (const CommTime& c : p.time->comms) {
    if (c.tier != LinkTier::kNetwork) continue;
    network = true;
    const bool ring = c.collective.kind == CollectiveKind::kAllGather ||
                      c.collective.kind == CollectiveKind::kReduceScatter ||
                      c.collective.kind == CollectiveKind::kAllReduce;
    EXPECT_EQ(c.nics, ring ? 8 : 1) << to_string(c.collective.kind);
  }
  ASSERT_TRUE(network);
  EXPECT_THAT(train_plan_html(p), HasSubstr("<td>network (8 NICs a node)</td>"));
  EXPECT_THAT(p.table(), HasSubstr("over the network (8 NICs a node), data: overlapped"));
  std::ostringstream json;
  p.write_json(json);
  EXPECT_THAT(json.str(), HasSubstr("\"nics\": 8"));
}

TEST(TrainPlanHtml, WriteRenamesACompletePageAndNamesAPathItCannotWrite) {
  const test::TempDir dir;
  const TrainPlan p = tiny_plan(false);
  const std::string path = (dir.path() / "train.html").string();
  write_train_plan_html(path, p);
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), train_plan_html(p));
  const std::string missing = (dir.path() / "no_such_dir" / "train.html").string();
  EXPECT_THROW_WITH(write_train_plan_html(missing, p), IoError, std::string("[html]"), missing,
                    std::string("No such file or directory"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "no_such_dir"));
}

}  // namespace
}  // namespace shardplan
