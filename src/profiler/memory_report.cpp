// The memory report (profiler.hpp memory_json, memory_html, write_memory_report): program runs'
// live bytes per device over their steps, measured and planned, with the peak and what is live
// at it, as JSON or as one self-contained page (no script, no URL) drawn with the chart
// train-plan --html uses (src/report/bytes_chart.hpp).
#include "memory_report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

#include "../report/bytes_chart.hpp"
#include "../report/html_page.hpp"
#include "../formats/output_file.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan::profiler {
namespace detail {

nlohmann::json memory_run_json(const MemoryRun& run) {
  using nlohmann::json;
  json steps = json::array();
  for (const MemoryStep& s : run.steps) {
    steps.push_back(json{{"op", s.op}, {"value", s.value}, {"scope", s.scope}});
  }
  json live = json::array();
  for (const LiveBuffer& b : run.live_at_peak) {
    live.push_back(json{{"what", b.what}, {"scope", b.scope}, {"bytes", b.bytes}});
  }
  const bool at_start = run.peak_step >= run.live_bytes.size();
  json peak{{"step", at_start ? json(nullptr) : json(run.peak_step)},
            {"bytes", run.peak_bytes},
            {"device", run.peak_device >= 0 ? json(run.peak_device) : json(nullptr)},
            {"live", std::move(live)}};
  return json{{"devices", run.devices},
              {"steps", std::move(steps)},
              {"start_bytes", run.start_bytes},
              {"live_bytes", run.live_bytes},
              {"value_start_bytes", run.value_start_bytes},
              {"value_bytes", run.value_bytes},
              {"planned_start_bytes", run.planned_start_bytes},
              {"planned_bytes", run.planned_bytes},
              {"peak", std::move(peak)},
              {"took_constants", run.took_constants}};
}

SampledPeak sampled_peak(const MemoryRun& run) {
  SampledPeak p;
  const auto consider = [&](const std::vector<std::int64_t>& live, std::size_t step) {
    for (std::size_t i = 0; i < live.size() && i < run.devices.size(); ++i) {
      if (live[i] > p.bytes) p = {live[i], step, run.devices[i]};
    }
  };
  consider(run.start_bytes, run.live_bytes.size());
  for (std::size_t s = 0; s < run.live_bytes.size(); ++s) consider(run.live_bytes[s], s);
  return p;
}

bool peak_agrees_with_samples(const MemoryRun& run) {
  const auto at = std::find(run.devices.begin(), run.devices.end(), run.peak_device);
  if (at == run.devices.end()) return false;
  const auto d = static_cast<std::size_t>(at - run.devices.begin());
  const std::vector<std::int64_t>& sample =
      run.peak_step < run.live_bytes.size() ? run.live_bytes[run.peak_step] : run.start_bytes;
  return d < sample.size() && sample[d] == run.peak_bytes &&
         sampled_peak(run).bytes == run.peak_bytes;
}

}  // namespace detail

std::string memory_json(const std::vector<MemoryRun>& runs) {
  nlohmann::json list = nlohmann::json::array();
  for (const MemoryRun& r : runs) list.push_back(detail::memory_run_json(r));
  return nlohmann::json{{"runs", std::move(list)}}.dump(-1, ' ', false,
                                                       nlohmann::json::error_handler_t::replace) +
         "\n";
}

namespace {

using shardplan::detail::escape_to;
using shardplan::detail::escaped;

// Runs drawn as charts: those with the highest peaks (every run is in the table).
constexpr std::size_t kMaxCharts = 12;
// Runs listed in the table, values listed per peak.
constexpr std::size_t kMaxRuns = 500;
constexpr std::size_t kMaxLiveRows = 20;
constexpr std::size_t kDeviceColours = 8;  // series-0 .. series-7

std::int64_t planned_at(const MemoryRun& r, std::size_t step) {
  return step < r.planned_bytes.size() ? r.planned_bytes[step] : r.planned_start_bytes;
}

std::size_t planned_peak_step(const MemoryRun& r) {
  std::size_t at = r.planned_bytes.size();
  std::int64_t most = r.planned_start_bytes;
  for (std::size_t s = 0; s < r.planned_bytes.size(); ++s) {
    if (r.planned_bytes[s] > most) {
      most = r.planned_bytes[s];
      at = s;
    }
  }
  return at;
}

// "after step 3 (dot_general 'h', scope mlp)", "at the start (the arguments)".
std::string where(const MemoryRun& r, std::size_t step) {
  if (step >= r.steps.size()) return "at the start (the arguments)";
  const MemoryStep& s = r.steps[step];
  std::string text = fmt::format("after step {} ({}", step, s.op);
  if (!s.value.empty()) text += fmt::format(" '{}'", s.value);
  if (!s.scope.empty()) text += fmt::format(", scope {}", s.scope);
  return text + ")";
}

void write_summary(std::string& out, const std::vector<MemoryRun>& runs, std::size_t highest) {
  out += "<dl class=\"summary\">";
  const auto item = [&](std::string_view key, const std::string& value) {
    out += fmt::format("<div><dt>{}</dt><dd>{}</dd></div>", key, escaped(value));
  };
  item("Runs", fmt::format("{}", runs.size()));
  if (highest < runs.size()) {
    const MemoryRun& r = runs[highest];
    item("Highest peak", format_bytes(r.peak_bytes));
    item("Its run", fmt::format("{}", highest));
    item("Planned peak", format_bytes(planned_at(r, planned_peak_step(r))));
  }
  out += "</dl>\n";
}

void write_runs_table(std::string& out, const std::vector<MemoryRun>& runs) {
  out += "<section class=\"runs\">\n<h2>Runs</h2>\n<p class=\"note\">Each program run in the "
         "order it ended: the most bytes a device held (measured: each buffer once) and what the "
         "memory pass planned.</p>\n<table class=\"live\">\n<tr><th>run</th><th>steps</th>"
         "<th>devices</th><th>measured peak</th><th>where</th><th>device</th>"
         "<th>planned peak</th></tr>\n";
  for (std::size_t i = 0; i < runs.size() && i < kMaxRuns; ++i) {
    const MemoryRun& r = runs[i];
    out += fmt::format(
        "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td>"
        "<td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n",
        i, r.steps.size(), escaped(fmt::format("{}", fmt::join(r.devices, ", "))),
        format_bytes(r.peak_bytes) + (detail::peak_agrees_with_samples(r) ? "" : " (claimed)"),
        escaped(where(r, r.peak_step)), r.peak_device,
        format_bytes(planned_at(r, planned_peak_step(r))));
  }
  out += "</table>\n";
  if (runs.size() > kMaxRuns) {
    out += fmt::format("<p class=\"note\">The first {} of {} runs are listed; memory_json has "
                       "them all.</p>\n",
                       kMaxRuns, runs.size());
  }
  out += "</section>\n";
}

void write_legend(std::string& out, const MemoryRun& r) {
  static constexpr std::string_view kColours[kDeviceColours] = {
      "#4e79a7", "#f28e2b", "#59a14f", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"};
  out += "<p class=\"legend\">";
  for (std::size_t i = 0; i < r.devices.size(); ++i) {
    out += fmt::format("<span><i style=\"background:{}\"></i>device {} (measured)</span>",
                       kColours[i % kDeviceColours], r.devices[i]);
  }
  out += "<span><i style=\"background:#111827\"></i>planned (memory pass)</span>"
         "<span><i style=\"background:#e15759\"></i>peak</span></p>\n";
}

void write_run(std::string& out, const MemoryRun& r, std::size_t index) {
  const std::size_t planned_step = planned_peak_step(r);
  out += fmt::format("<section class=\"run\">\n<h2>Run {}: live bytes over {} step{}</h2>\n"
                     "<p class=\"note\">",
                     index, r.steps.size(), r.steps.size() == 1 ? "" : "s");
  const bool agrees = detail::peak_agrees_with_samples(r);
  escape_to(out, fmt::format("{} peak {} on device {} {}; planned peak {} {}.",
                             agrees ? "Measured" : "Claimed", format_bytes(r.peak_bytes),
                             r.peak_device, where(r, r.peak_step),
                             format_bytes(planned_at(r, planned_step)), where(r, planned_step)));
  if (!agrees) {
    const detail::SampledPeak s = detail::sampled_peak(r);
    escape_to(out, fmt::format(" The run's own samples contradict the claimed peak: they reach "
                               "{} on device {} {}.",
                               format_bytes(s.bytes), s.device, where(r, s.step)));
  }
  if (r.took_constants) {
    escape_to(out, " Kept constants were taken from an earlier run: they are held from the start, "
                   "above the plan until their step.");
  }
  out += "</p>\n<figure class=\"chart\">\n";
  shardplan::detail::BytesChart c;
  for (std::size_t i = 0; i < r.devices.size(); ++i) {
    shardplan::detail::BytesSeries s{fmt::format("device {}", r.devices[i]),
                                     fmt::format("series-{}", i % kDeviceColours),
                                     i < r.start_bytes.size() ? r.start_bytes[i] : 0,
                                     {}};
    for (const std::vector<std::int64_t>& step : r.live_bytes) {
      s.steps.push_back(i < step.size() ? step[i] : 0);
    }
    c.series.push_back(std::move(s));
  }
  c.series.push_back({"planned", "planned", r.planned_start_bytes, r.planned_bytes});
  c.peak_step = r.peak_step;
  c.peak_bytes = r.peak_bytes;
  c.peak_title = fmt::format("{}: {} on device {} {}", agrees ? "peak" : "claimed peak",
                             format_bytes(r.peak_bytes), r.peak_device, where(r, r.peak_step));
  c.aria_label = fmt::format("live bytes over the steps of run {}", index);
  shardplan::detail::write_bytes_chart(out, c);
  out += "</figure>\n";
  write_legend(out, r);
  out += fmt::format("<h2 style=\"margin-top:16px\">Live at the peak on device {}</h2>\n",
                     r.peak_device);
  std::vector<shardplan::detail::LiveRow> rows;
  for (const LiveBuffer& b : r.live_at_peak) rows.push_back({{b.what, b.scope}, b.bytes});
  shardplan::detail::write_live_table(out, {"value", "scope"}, {true, true}, rows, r.peak_bytes,
                                      "bytes", kMaxLiveRows);
  out += "</section>\n";
}

}  // namespace

std::string memory_html(const std::vector<MemoryRun>& runs, std::string_view title) {
  std::string out;
  shardplan::detail::write_head(out, title, shardplan::detail::bytes_chart_style());
  out += "<header>\n<h1>";
  escape_to(out, title);
  out += "</h1>\n<p class=\"sub\">Live bytes per device over each program run's steps, measured "
         "at run time and planned by the memory pass</p>\n</header>\n";
  // The runs drawn: the highest peaks (the first of equal ones), shown in run order.
  std::vector<std::size_t> order(runs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return runs[a].peak_bytes > runs[b].peak_bytes;
  });
  write_summary(out, runs, order.empty() ? runs.size() : order.front());
  order.resize(std::min(order.size(), kMaxCharts));
  std::sort(order.begin(), order.end());
  write_runs_table(out, runs);
  if (runs.size() > kMaxCharts) {
    out += fmt::format("<p class=\"note\">The {} runs with the highest peaks are drawn.</p>\n",
                       kMaxCharts);
  }
  for (const std::size_t i : order) write_run(out, runs[i], i);
  out += "<footer>shardplan memory report: a self-contained page (no scripts, nothing fetched)"
         "</footer>\n</main>\n</body>\n</html>\n";
  return out;
}

void write_memory_report(const std::filesystem::path& path, const std::vector<MemoryRun>& runs,
                         std::string_view title) {
  const std::string ext = path.extension().string();
  std::string text;
  if (ext == ".json") {
    text = memory_json(runs);
  } else if (ext == ".html") {
    text = memory_html(runs, title);
  } else {
    throw SpecError(fmt::format(
        "[profiler] write_memory_report: '{}' ends in neither .json nor .html (the report's "
        "format is chosen by the extension)",
        shardplan::detail::printable(path.string())));
  }
  shardplan::detail::OutputFile out(path, ext == ".json" ? "json" : "html");
  out.write(text);
  out.commit();
}

}  // namespace shardplan::profiler
