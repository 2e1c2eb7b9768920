// A training plan as one HTML page (train_plan_html.hpp). Every picture is SVG computed here from
// the plan; the page has no script and names no URL, as plan_html.cpp's.
#include "shardplan/train_plan_html.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "../report/bytes_chart.hpp"
#include "../report/html_page.hpp"
#include "../formats/output_file.hpp"
#include "step_time.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan {
namespace {

using detail::escape_to;
using detail::escaped;
using detail::num;

// The page's own classes beside the shared style and the chart's (the parts of a stacked bar).
constexpr std::string_view kExtraStyle = R"(
svg .usable { stroke: #b91c1c; stroke-width: 1.5; stroke-dasharray: 6 4; }
svg .part-0 { fill: #4e79a7; } svg .part-1 { fill: #f28e2b; } svg .part-2 { fill: #59a14f; }
svg .part-3 { fill: #76b7b2; } svg .part-4 { fill: #edc948; } svg .part-5 { fill: #b07aa1; }
svg .hidden-comm { fill: #d1d5db; }
)";

constexpr std::array<std::string_view, 6> kPartColours = {"#4e79a7", "#f28e2b", "#59a14f",
                                                          "#76b7b2", "#edc948", "#b07aa1"};

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.1f} µs", s * 1e6);
}

std::string flops_text(double f) { return fmt::format("{:.3g}", f); }

void write_header(std::string& out, const TrainPlan& p, const std::string& title) {
  out += "<header>\n<h1>";
  escape_to(out, title);
  out += "</h1>\n<p class=\"sub\">";
  escape_to(out, fmt::format("{} · {} devices · rules {}{}", p.mesh, p.devices, p.rules,
                             p.rules_note.empty() ? "" : fmt::format(" ({})", p.rules_note)));
  out += "<br>";
  const std::string tokens = p.target_seq > 0
                                 ? fmt::format("{} encoder + {} decoder", p.seq, p.target_seq)
                                 : fmt::format("{}", p.seq);
  escape_to(out, fmt::format("step: batch {} × {} tokens over [{}], {} micro-batch{}, {}, "
                             "parameters {}, gradients {}, optimizer state {}, remat {}",
                             p.batch, tokens, fmt::join(p.batch_axes, ", "), p.grad_accum,
                             p.grad_accum == 1 ? "" : "es", p.optimizer, name(p.master_dtype),
                             name(p.grad_dtype), name(p.optimizer_dtype), p.remat));
  if (p.extrapolated) escape_to(out, fmt::format(" · extrapolated from {}", p.traced));
  out += "</p>\n</header>\n<dl class=\"summary\">";
  const auto item = [&](std::string_view key, const std::string& value) {
    out += fmt::format("<div><dt>{}</dt><dd>{}</dd></div>", key, escaped(value));
  };
  item("Peak per device", format_bytes(p.peak_bytes));
  if (p.reserved_bytes > 0) {
    item("Reserved (caching allocator model)",
         fmt::format("{} (expandable segments: {})", format_bytes(p.reserved_bytes),
                     format_bytes(p.reserved_bytes_expandable)));
  }
  if (const auto f = p.fits()) {
    item("Usable memory", format_bytes(p.usable_bytes()));
    item("Fits", *f ? "yes" : fmt::format("no, {} short", format_bytes(p.peak_bytes -
                                                                         p.usable_bytes())));
  }
  item("FLOPs per device", flops_text(p.flops));
  if (p.time) {
    item("Step time", seconds_text(p.time->step_seconds));
    item("Tokens/s per device", fmt::format("{:.0f}", p.time->tokens_per_second_per_device));
    item("MFU", fmt::format("{:.1f}%", p.time->mfu * 100));
  }
  out += "</dl>\n";
}

/// One horizontal bar of a chart: its label and parts (bytes or seconds, one colour each).
struct HBar {
  std::string label;
  std::vector<std::pair<std::string, double>> parts;
  bool hidden = false;  // drawn grey: communication under compute
};

/// Horizontal bars on one scale, `max` at the right end; a vertical dashed line at `marker` > 0.
void write_hbars(std::string& out, const std::vector<HBar>& bars, double max, double marker,
                 std::string_view marker_label, std::string (*value_text)(double),
                 std::string_view aria) {
  constexpr double kW = 1040, kLeft = 230, kRight = 130, kRowH = 34, kTop = 10;
  const double plot_w = kW - kLeft - kRight;
  const double h = kTop + kRowH * static_cast<double>(bars.size()) + 22;
  const auto x_of = [&](double v) { return kLeft + (max > 0 ? plot_w * v / max : 0); };
  out += fmt::format(
      "<svg viewBox=\"0 0 {} {}\" width=\"100%\" role=\"img\" aria-label=\"{}\">\n", kW, num(h),
      aria);
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const HBar& b = bars[i];
    const double y = kTop + kRowH * static_cast<double>(i);
    out += fmt::format("<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
                       num(kLeft - 10), num(y + 19), escaped(b.label));
    double at = 0;
    for (std::size_t k = 0; k < b.parts.size(); ++k) {
      const auto& [what, v] = b.parts[k];
      if (v <= 0) continue;
      out += fmt::format(
          "<rect class=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"22\"><title>{}: {}</title>"
          "</rect>\n",
          b.hidden ? std::string("hidden-comm") : fmt::format("part-{}", k % kPartColours.size()),
          num(x_of(at)), num(y + 4), num(std::max(0.5, x_of(at + v) - x_of(at))), escaped(what),
          escaped(value_text(v)));
      at += v;
    }
    out += fmt::format("<text class=\"value\" x=\"{}\" y=\"{}\">{}</text>\n", num(x_of(at) + 6),
                       num(y + 19), escaped(value_text(at)));
  }
  if (marker > 0) {
    const double x = x_of(marker);
    out += fmt::format(
        "<line class=\"usable\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>"
        "<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
        num(x), num(x), num(kTop), num(h - 18), num(x), num(h - 4), escaped(marker_label));
  }
  out += "</svg>\n";
}

void write_legend(std::string& out, const std::vector<std::string>& names) {
  out += "<p class=\"legend\">";
  for (std::size_t k = 0; k < names.size(); ++k) {
    out += fmt::format("<span><i style=\"background:{}\"></i>{}</span>",
                       kPartColours[k % kPartColours.size()], escaped(names[k]));
  }
  out += "</p>\n";
}

std::string bytes_value(double v) { return format_bytes(static_cast<std::int64_t>(v)); }

void write_memory(std::string& out, const TrainPlan& p) {
  out += "<section class=\"memory\">\n<h2>Memory per device</h2>\n<p class=\"note\">What one "
         "device holds of the state, and the step's peak: everything live at once, split into "
         "what is still held of the arguments, the parameters gathered for use, and what the "
         "step computed.</p>\n<figure class=\"chart\">\n";
  const auto b = [](std::int64_t v) { return static_cast<double>(v); };
  const std::vector<HBar> bars = {
      {"parameters", {{"parameters", b(p.parameter_bytes)}}},
      {"gradients", {{"gradients", b(p.gradient_bytes)}}},
      {"optimizer state", {{"optimizer state", b(p.optimizer_bytes)}}},
      {"batch (tokens, targets)", {{"batch", b(p.batch_bytes)}}},
      {"peak",
       {{"parameters, state, batch still held", b(p.peak_held_bytes)},
        {"parameters gathered for use", b(p.peak_gathered_bytes)},
        {"activations, gradients, temporaries", b(p.peak_computed_bytes)}}}};
  const std::int64_t usable = p.usable_bytes();
  const double max = b(std::max({p.peak_bytes, p.parameter_bytes, p.optimizer_bytes, usable}));
  write_hbars(out, bars, max * 1.02, b(usable),
              usable > 0 ? fmt::format("usable {}", format_bytes(usable)) : "", bytes_value,
              "memory per device");
  write_legend(out, {"held (parameters, state, batch)", "gathered for use",
                     "activations, gradients, temporaries"});
  out += "<figcaption>The peak's bar is split as above; the state's bars are one colour "
         "each.</figcaption>\n</figure>\n</section>\n";
}

std::int64_t timeline_peak(const MemoryTimeline& m) {
  return m.peak_step < m.live_bytes.size() ? m.live_bytes[m.peak_step] : m.start_bytes;
}

// The planned live bytes with the passes shaded and the peak marked (the shared chart).
void write_live_chart(std::string& out, const MemoryTimeline& m) {
  detail::BytesChart c;
  c.series.push_back(detail::BytesSeries{"planned live bytes", "live", m.start_bytes, m.live_bytes});
  for (std::size_t i = 0; i < m.phases.size(); ++i) {
    const std::size_t to = i + 1 < m.phases.size() ? m.phases[i + 1].step : m.live_bytes.size();
    const std::string phase(name(m.phases[i].phase));
    c.bands.push_back(detail::StepBand{m.phases[i].step, to, "phase-" + phase, phase});
  }
  c.peak_step = m.peak_step;
  c.peak_bytes = timeline_peak(m);
  c.peak_title = fmt::format("peak: {} at step {}", format_bytes(c.peak_bytes), m.peak_step);
  c.max_points = kTrainPlanHtmlMaxPoints;
  c.aria_label = "live bytes over the step";
  detail::write_bytes_chart(out, c);
}

void write_live_table(std::string& out, const MemoryTimeline& m) {
  std::vector<detail::LiveRow> rows;
  for (const LiveValue& v : m.live_at_peak) {
    const std::string made = v.phase ? std::string(name(*v.phase))
                             : v.input >= 0 ? std::string("argument")
                                            : std::string("—");
    rows.push_back(detail::LiveRow{{v.what, v.type, made}, v.bytes});
  }
  detail::write_live_table(out, {"value", "type", "made in"}, {true, true, false}, rows,
                           timeline_peak(m), "bytes per device", rows.size());
}

void write_timeline(std::string& out, const TrainPlan& p) {
  if (!p.timeline) return;
  const MemoryTimeline& m = p.timeline->memory;
  const std::int64_t peak = timeline_peak(m);
  out += "<section class=\"timeline\">\n<h2>Live bytes over the step</h2>\n<p class=\"note\">";
  escape_to(out, fmt::format("{} ({} program steps), as the memory plan counts it: the bytes a "
                             "device holds once each step's result is allocated. Its peak: {} at "
                             "step {}",
                             p.timeline->traced, m.live_bytes.size(), format_bytes(peak),
                             m.peak_step));
  // The pass the peak is in: the last to begin at or before its step.
  const PhaseStart* at_peak = nullptr;
  for (const PhaseStart& ps : m.phases) {
    if (ps.step <= m.peak_step && m.peak_step < m.live_bytes.size()) at_peak = &ps;
  }
  if (at_peak != nullptr) escape_to(out, fmt::format(", in the {} pass", name(at_peak->phase)));
  escape_to(out, p.extrapolated
                     ? fmt::format(". The whole step's peak, extrapolated: {}.",
                                   format_bytes(p.peak_bytes))
                     : ".");
  out += "</p>\n<figure class=\"chart\">\n";
  write_live_chart(out, m);
  out += "</figure>\n<p class=\"legend\"><span><i style=\"background:#e8f0fb\"></i>forward</span>"
         "<span><i style=\"background:#fdf0e1\"></i>backward</span><span><i style=\"background:"
         "#e7f5ea\"></i>update</span><span><i style=\"background:#e15759\"></i>peak</span></p>\n";
  out += fmt::format("<h2 style=\"margin-top:16px\">Live at the peak: the {} largest values</h2>\n",
                     m.live_at_peak.size());
  write_live_table(out, m);
  out += "</section>\n";
}

std::string seconds_value(double v) { return seconds_text(v); }

void write_time(std::string& out, const StepTime& t) {
  double overlapped = 0;
  for (const CommTime& c : t.comms) overlapped += c.overlapped ? c.seconds : 0;
  const double hidden =
      std::max(0.0, overlapped - (t.exposed_seconds - t.exposed_tensor_seconds));
  out += "<section class=\"time\">\n<h2>Step time on ";
  escape_to(out, t.hardware);
  out += "</h2>\n<p class=\"note\">The busiest device's compute at the hardware's achievable "
         "rates, then the communication left exposed, per link tier; FSDP's and the ring's "
         "transfers run under compute (grey: the part hidden), tensor parallelism's are "
         "exposed.</p>\n<figure class=\"chart\">\n";
  const std::vector<HBar> bars = {
      {"step",
       {{"matmul", t.matmul_seconds},
        {"float8 matmul", t.matmul_fp8_seconds},
        {"attention", t.attention_seconds},
        {"memory-bound kernels and FSDP's copy-out", t.memory_seconds + t.copy_out_seconds},
        {"exposed communication, node's links", t.exposed_by_tier.count(LinkTier::kNode) != 0
                                                    ? t.exposed_by_tier.at(LinkTier::kNode)
                                                    : 0.0},
        {"exposed communication, network", t.exposed_by_tier.count(LinkTier::kNetwork) != 0
                                               ? t.exposed_by_tier.at(LinkTier::kNetwork)
                                               : 0.0}}},
      {"hidden under compute", {{"communication hidden under compute", hidden}}, true}};
  write_hbars(out, bars, std::max(t.step_seconds, hidden) * 1.02, 0, "", seconds_value,
              "step time");
  write_legend(out, {"matmul", "float8 matmul", "attention",
                     "memory-bound kernels and FSDP's copy-out",
                     "exposed communication (node's links)", "exposed communication (network)"});
  out += "</figure>\n<table class=\"live\">\n<tr><th>collective</th><th>tier</th><th>role</th>"
         "<th>bytes per device</th><th>time</th><th></th></tr>\n";
  for (const CommTime& c : t.comms) {
    out += fmt::format(
        "<tr><td class=\"mono\">{}{} over [{}]</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>"
        "<td class=\"n\">{}</td><td>{}</td></tr>\n",
        to_string(c.collective.kind), c.collective.of_argument ? " of weights" : "",
        escaped(fmt::format("{}", fmt::join(c.collective.axes, ", "))),
        train::link_text(c), escaped(std::string(name(c.role))), format_bytes(c.bytes),
        seconds_text(c.seconds), c.overlapped ? "overlapped with compute" : "exposed");
  }
  out += fmt::format(
      "</table>\n<p class=\"note\" style=\"margin-top:10px\">Compute {}, exposed communication {} "
      "(of it tensor parallel {}){}, step {}; {:.0f} tokens/s per device, MFU {:.1f}%.</p>\n"
      "</section>\n",
      seconds_text(t.compute_seconds()), seconds_text(t.exposed_seconds),
      seconds_text(t.exposed_tensor_seconds),
      t.dispatch_seconds > 0
          ? fmt::format(", eager dispatch on the host {} ({} ops through DTensor; the device "
                        "waits {} for it)",
                        seconds_text(t.dispatch_seconds), t.launched_ops,
                        seconds_text(t.dispatch_exposed_seconds))
          : std::string(),
      seconds_text(t.step_seconds), t.tokens_per_second_per_device, t.mfu * 100);
}

}  // namespace

std::string train_plan_html(const TrainPlan& plan) {
  const std::string title = fmt::format("shardplan train-plan: {} on {}", plan.model, plan.mesh);
  std::string out;
  detail::write_head(out, title, std::string(kExtraStyle) + std::string(detail::bytes_chart_style()));
  write_header(out, plan, title);
  write_memory(out, plan);
  write_timeline(out, plan);
  if (plan.time) write_time(out, *plan.time);
  out += fmt::format(
      "<footer>shardplan train-plan report, planned in {:.2f} s: a self-contained page (no "
      "scripts, nothing fetched)</footer>\n</main>\n</body>\n</html>\n",
      plan.seconds_to_plan);
  return out;
}

void write_train_plan_html(const std::string& path, const TrainPlan& plan) {
  const std::string page = train_plan_html(plan);
  detail::OutputFile out(path, "html");
  out.write(page);
  out.commit();
}

}  // namespace shardplan
