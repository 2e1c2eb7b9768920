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

#include "../html_page.hpp"
#include "../output_file.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan {
namespace {

using detail::escape_to;
using detail::escaped;
using detail::num;

// The page's own classes beside the shared style (phases, the parts of a stacked bar).
constexpr std::string_view kExtraStyle = R"(
svg .phase-forward { fill: #e8f0fb; }
svg .phase-backward { fill: #fdf0e1; }
svg .phase-update { fill: #e7f5ea; }
svg .phase-label { font-size: 12px; fill: #4b5563; }
svg .live { fill: none; stroke: #4e79a7; stroke-width: 1.6; }
svg .peak { fill: #e15759; }
svg .peak-line { stroke: #e15759; stroke-width: 1; stroke-dasharray: 4 3; }
svg .usable { stroke: #b91c1c; stroke-width: 1.5; stroke-dasharray: 6 4; }
svg .part-0 { fill: #4e79a7; } svg .part-1 { fill: #f28e2b; } svg .part-2 { fill: #59a14f; }
svg .part-3 { fill: #76b7b2; } svg .part-4 { fill: #edc948; } svg .part-5 { fill: #b07aa1; }
svg .hidden-comm { fill: #d1d5db; }
table.live { border-collapse: collapse; width: 100%; font-size: 13px; margin-top: 12px; }
table.live th { text-align: left; color: #6b7280; font-weight: 600; border-bottom: 1px solid #e3e6ea;
  padding: 4px 8px; }
table.live td { border-bottom: 1px solid #f0f1f3; padding: 3px 8px; vertical-align: top; }
table.live td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 13px; color: #374151;
  margin: 6px 0 0; }
.legend i { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  margin-right: 6px; vertical-align: -1px; }
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

/// A point of the live-bytes chart: x in steps (the arguments alone at 0, step s at s + 1).
struct Point {
  double x = 0;
  std::int64_t bytes = 0;
};

/// Per step, or past kTrainPlanHtmlMaxPoints steps per bucket of `bucket` consecutive steps,
/// the most any of them holds (the peak stays on the line).
std::vector<Point> chart_points(const MemoryTimeline& m, std::size_t& bucket) {
  const std::size_t n = m.live_bytes.size();
  bucket = std::max<std::size_t>(1, (n + kTrainPlanHtmlMaxPoints - 1) / kTrainPlanHtmlMaxPoints);
  std::vector<Point> points{{0, m.start_bytes}};
  for (std::size_t first = 0; first < n; first += bucket) {
    const std::size_t end = std::min(n, first + bucket);
    const auto from = m.live_bytes.begin() + static_cast<std::ptrdiff_t>(first);
    const auto to = m.live_bytes.begin() + static_cast<std::ptrdiff_t>(end);
    points.push_back({static_cast<double>(end), *std::max_element(from, to)});
  }
  return points;
}

std::int64_t timeline_peak(const MemoryTimeline& m) {
  return m.peak_step < m.live_bytes.size() ? m.live_bytes[m.peak_step] : m.start_bytes;
}

/// The chart's frame: the plot's box and its scales.
struct Frame {
  static constexpr double kW = 1040, kH = 340, kLeft = 100, kRight = 20, kTop = 28, kBottom = 50;
  static constexpr double kPlotW = kW - kLeft - kRight, kPlotH = kH - kTop - kBottom;
  double steps = 1, top = 1;
  double x(double step) const { return kLeft + kPlotW * step / steps; }
  double y(double bytes) const { return kTop + kPlotH - kPlotH * bytes / top; }
};

void write_phases(std::string& out, const MemoryTimeline& m, const Frame& f) {
  const double n = static_cast<double>(m.live_bytes.size());
  for (std::size_t i = 0; i < m.phases.size(); ++i) {
    const double a = static_cast<double>(m.phases[i].step);
    const double b = i + 1 < m.phases.size() ? static_cast<double>(m.phases[i + 1].step) : n;
    const std::string_view phase = name(m.phases[i].phase);
    out += fmt::format(
        "<rect class=\"phase-{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"><title>{}: steps "
        "{}–{}</title></rect>\n",
        phase, num(f.x(a)), num(Frame::kTop), num(f.x(b) - f.x(a)), num(Frame::kPlotH), phase,
        m.phases[i].step, static_cast<std::size_t>(b) - 1);
    if (f.x(b) - f.x(a) >= 56) {
      out += fmt::format("<text class=\"phase-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}"
                         "</text>\n",
                         num((f.x(a) + f.x(b)) / 2), num(Frame::kTop - 8), phase);
    }
  }
}

void write_axes(std::string& out, const Frame& f, const detail::ByteAxis& axis, std::size_t n) {
  for (std::int64_t k = 0; k <= axis.ticks; ++k) {
    const std::int64_t value = k * axis.step;
    const double y = f.y(static_cast<double>(value));
    out += fmt::format("<line class=\"{}\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>",
                       k == 0 ? "axis" : "grid", num(Frame::kLeft),
                       num(Frame::kLeft + Frame::kPlotW), num(y), num(y));
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
                       num(Frame::kLeft - 8), num(y + 4), format_bytes(value));
  }
  for (int k = 0; k <= 4; ++k) {
    const auto step = static_cast<std::size_t>(static_cast<double>(n) * k / 4);
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       num(f.x(static_cast<double>(step))), num(Frame::kTop + Frame::kPlotH + 18),
                       step);
  }
  out += fmt::format(
      "<text class=\"title\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">program step</text>\n"
      "<text class=\"title\" transform=\"translate(18 {}) rotate(-90)\" text-anchor=\"middle\">"
      "live bytes per device</text>\n",
      num(Frame::kLeft + Frame::kPlotW / 2), num(Frame::kH - 10),
      num(Frame::kTop + Frame::kPlotH / 2));
}

void write_live_chart(std::string& out, const MemoryTimeline& m) {
  std::size_t bucket = 1;
  const std::vector<Point> points = chart_points(m, bucket);
  const std::int64_t peak = timeline_peak(m);
  const detail::ByteAxis axis = detail::byte_axis(peak);
  Frame f;
  f.steps = std::max(1.0, static_cast<double>(m.live_bytes.size()));
  f.top = axis.top();
  out += fmt::format("<svg class=\"timeline\" viewBox=\"0 0 {} {}\" width=\"100%\" role=\"img\" "
                     "aria-label=\"live bytes over the step\">\n",
                     Frame::kW, Frame::kH);
  write_phases(out, m, f);
  write_axes(out, f, axis, m.live_bytes.size());
  out += "<polyline class=\"live\" points=\"";
  for (const Point& p : points) {
    out += fmt::format("{},{} ", num(f.x(p.x)), num(f.y(static_cast<double>(p.bytes))));
  }
  out += "\"/>\n";
  const double px = m.peak_step < m.live_bytes.size() ? static_cast<double>(m.peak_step + 1) : 0;
  const double py = f.y(static_cast<double>(peak));
  out += fmt::format(
      "<line class=\"peak-line\" x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\"/>"
      "<circle class=\"peak\" cx=\"{0}\" cy=\"{1}\" r=\"5\"><title>peak: {3} at step {4}</title>"
      "</circle>\n<text class=\"label\" x=\"{5}\" y=\"{6}\" text-anchor=\"{7}\">peak {3}</text>\n",
      num(f.x(px)), num(py), num(Frame::kTop + Frame::kPlotH), format_bytes(peak), m.peak_step,
      num(f.x(px) + (px > f.steps * 0.8 ? -9 : 9)), num(std::max(py - 6, 12.0)),
      px > f.steps * 0.8 ? "end" : "start");
  out += "</svg>\n";
  if (bucket > 1) {
    out += fmt::format("<figcaption>Each point is the most any of {} consecutive steps holds."
                       "</figcaption>\n",
                       bucket);
  }
}

void write_live_table(std::string& out, const MemoryTimeline& m) {
  const std::int64_t peak = timeline_peak(m);
  out += "<table class=\"live\">\n<tr><th>#</th><th>value</th><th>type</th><th>made in</th>"
         "<th>bytes per device</th><th>of the peak</th></tr>\n";
  std::int64_t shown = 0;
  for (std::size_t i = 0; i < m.live_at_peak.size(); ++i) {
    const LiveValue& v = m.live_at_peak[i];
    shown += v.bytes;
    const std::string made = v.phase ? std::string(name(*v.phase))
                             : v.input >= 0 ? std::string("argument")
                                            : std::string("—");
    out += fmt::format(
        "<tr><td class=\"n\">{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td>"
        "<td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1f}%</td></tr>\n",
        i + 1, escaped(v.what), escaped(v.type), made, format_bytes(v.bytes),
        peak > 0 ? 100.0 * static_cast<double>(v.bytes) / static_cast<double>(peak) : 0.0);
  }
  if (peak > shown) {
    out += fmt::format("<tr><td></td><td>every other value live at the peak</td><td></td><td>"
                       "</td><td class=\"n\">{}</td><td class=\"n\">{:.1f}%</td></tr>\n",
                       format_bytes(peak - shown),
                       100.0 * static_cast<double>(peak - shown) / static_cast<double>(peak));
  }
  out += "</table>\n";
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
        {"memory-bound kernels", t.memory_seconds},
        {"exposed communication, node's links", t.exposed_by_tier.count("node") != 0
                                                    ? t.exposed_by_tier.at("node")
                                                    : 0.0},
        {"exposed communication, network", t.exposed_by_tier.count("network") != 0
                                               ? t.exposed_by_tier.at("network")
                                               : 0.0}}},
      {"hidden under compute", {{"communication hidden under compute", hidden}}, true}};
  write_hbars(out, bars, std::max(t.step_seconds, hidden) * 1.02, 0, "", seconds_value,
              "step time");
  write_legend(out, {"matmul", "float8 matmul", "attention", "memory-bound kernels",
                     "exposed communication (node's links)", "exposed communication (network)"});
  out += "</figure>\n<table class=\"live\">\n<tr><th>collective</th><th>tier</th><th>role</th>"
         "<th>bytes per device</th><th>time</th><th></th></tr>\n";
  for (const CommTime& c : t.comms) {
    out += fmt::format(
        "<tr><td class=\"mono\">{}{} over [{}]</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>"
        "<td class=\"n\">{}</td><td>{}</td></tr>\n",
        to_string(c.collective.kind), c.collective.of_argument ? " of weights" : "",
        escaped(fmt::format("{}", fmt::join(c.collective.axes, ", "))),
        c.tier == "node" ? "node's links" : "network", escaped(c.role), format_bytes(c.bytes),
        seconds_text(c.seconds), c.overlapped ? "overlapped with compute" : "exposed");
  }
  out += fmt::format(
      "</table>\n<p class=\"note\" style=\"margin-top:10px\">Compute {}, exposed communication {} "
      "(of it tensor parallel {}), step {}; {:.0f} tokens/s per device, MFU {:.1f}%.</p>\n"
      "</section>\n",
      seconds_text(t.compute_seconds()), seconds_text(t.exposed_seconds),
      seconds_text(t.exposed_tensor_seconds), seconds_text(t.step_seconds),
      t.tokens_per_second_per_device, t.mfu * 100);
}

}  // namespace

std::string train_plan_html(const TrainPlan& plan) {
  const std::string title = fmt::format("shardplan train-plan: {} on {}", plan.model, plan.mesh);
  std::string out;
  detail::write_head(out, title, kExtraStyle);
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
