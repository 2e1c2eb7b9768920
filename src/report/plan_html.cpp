// The plan as one HTML page. Every picture is SVG computed here from the report; the page has
// no script and names no URL, so it renders the same offline, attached to a review, or years on.
#include "shardplan/plan_html.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <vector>

#include "html_page.hpp"
#include "../formats/output_file.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"
#include "shardplan/named_sharding.hpp"

namespace shardplan {
namespace {

using detail::byte_axis;
using detail::ByteAxis;
using detail::escape_to;
using detail::num;
using detail::write_head;

template <typename T>
std::string to_text(const T& value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

/// Sorted device ids as runs, "0–3,8,9,12–15"; after `max_runs` runs the rest is "…". More
/// than four ids evenly spaced (the devices along a minor mesh axis) read "0,2,…,30".
std::string device_runs(const std::vector<int>& ids, std::size_t max_runs) {
  if (ids.size() > 4 && ids[1] - ids[0] > 1 &&
      std::adjacent_find(ids.begin(), ids.end(),
                         [&](int a, int b) { return b - a != ids[1] - ids[0]; }) == ids.end()) {
    return fmt::format("{},{},…,{}", ids[0], ids[1], ids.back());
  }
  std::string s;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (runs == max_runs) {
      s += ",…";
      break;
    }
    if (runs != 0) s += ',';
    if (j == i) {
      s += fmt::format("{}", ids[i]);
    } else if (j == i + 1) {
      s += fmt::format("{},{}", ids[i], ids[j]);
    } else {
      s += fmt::format("{}–{}", ids[i], ids[j]);
    }
    ++runs;
    i = j + 1;
  }
  return s;
}

/// "device 3", "devices 0,4", "devices 0–511" (runs past `max_runs` elided).
std::string devices_text(const std::vector<int>& ids, std::size_t max_runs) {
  return fmt::format("{} {}", ids.size() == 1 ? "device" : "devices", device_runs(ids, max_runs));
}

// ---------------------------------------------------------------------------------------------
// The page around the pictures.

void write_summary(std::string& out, const PlanReport& report, std::string_view title) {
  out += "<header>\n<h1>";
  escape_to(out, title);
  out += "</h1>\n<p class=\"sub\">";
  escape_to(out, report.mesh.to_string());
  out += fmt::format(" · {} device{}</p>\n</header>\n", report.mesh.size(),
                     report.mesh.size() == 1 ? "" : "s");
  const auto item = [&](std::string_view key, const std::string& value) {
    out += fmt::format("<div><dt>{}</dt><dd>{}</dd></div>", key, value);
  };
  out += "<dl class=\"summary\">";
  item("Total (unsharded)", format_bytes(report.total_bytes));
  item("Max per device", format_bytes(report.max_device_bytes()));
  item("Min per device", format_bytes(report.min_device_bytes()));
  item("Tensors", fmt::format("{}", report.leaves.size()));
  out += "</dl>\n";
}

// ---------------------------------------------------------------------------------------------
// Bytes per device.

struct Bar {
  std::int64_t bytes = 0;
  std::size_t first = 0, last = 0;  // device ids
};

/// One bar per device, or past kPlanHtmlMaxBars devices one per `group` consecutive device ids,
/// showing the group's largest.
std::vector<Bar> device_bars(const std::vector<std::int64_t>& bytes, std::size_t& group) {
  group = std::max<std::size_t>(1, (bytes.size() + kPlanHtmlMaxBars - 1) / kPlanHtmlMaxBars);
  std::vector<Bar> bars;
  for (std::size_t first = 0; first < bytes.size(); first += group) {
    const std::size_t end = std::min(bytes.size(), first + group);
    const auto from = bytes.begin() + static_cast<std::ptrdiff_t>(first);
    const auto to = bytes.begin() + static_cast<std::ptrdiff_t>(end);
    bars.push_back({*std::max_element(from, to), first, end - 1});
  }
  return bars;
}

void write_device_chart(std::string& out, const PlanReport& report) {
  std::size_t group = 1;
  const std::vector<Bar> bars = device_bars(report.device_bytes, group);
  constexpr double kW = 1040, kH = 330, kLeft = 100, kRight = 16, kTop = 24, kBottom = 58;
  constexpr double kPlotW = kW - kLeft - kRight, kPlotH = kH - kTop - kBottom;
  const ByteAxis axis = byte_axis(report.max_device_bytes());
  const double top = axis.top();
  const auto y_of = [&](double bytes) { return kTop + kPlotH - kPlotH * bytes / top; };

  out += "<section class=\"devices\">\n<h2>Bytes per device</h2>\n<figure class=\"chart\">\n";
  out += fmt::format(
      "<svg class=\"bars\" viewBox=\"0 0 {} {}\" width=\"100%\" role=\"img\" "
      "aria-label=\"bytes per device\">\n",
      kW, kH);
  for (std::int64_t k = 0; k <= axis.ticks; ++k) {
    if (k > std::numeric_limits<std::int64_t>::max() / axis.step) break;
    const std::int64_t value = k * axis.step;
    const double y = y_of(static_cast<double>(value));
    out += fmt::format("<line class=\"{}\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>",
                       k == 0 ? "axis" : "grid", num(kLeft), num(kLeft + kPlotW), num(y), num(y));
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
                       num(kLeft - 8), num(y + 4), format_bytes(value));
  }
  const double slot = bars.empty() ? kPlotW : kPlotW / static_cast<double>(bars.size());
  const double width = std::max(1.0, slot * 0.72);
  const std::size_t stride = bars.size() <= 32 ? 1 : (bars.size() + 15) / 16;
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const double cx = kLeft + slot * (static_cast<double>(i) + 0.5);
    const double y = y_of(static_cast<double>(b.bytes));
    const std::string who = b.first == b.last ? fmt::format("device {}", b.first)
                                              : fmt::format("devices {}–{}", b.first, b.last);
    out += fmt::format(
        "<rect class=\"bar\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"2\">"
        "<title>{}: {}{}</title></rect>\n",
        num(cx - width / 2), num(y), num(width), num(kTop + kPlotH - y), who,
        b.first == b.last ? "" : "largest ", format_bytes(b.bytes));
    if (bars.size() <= 16 && b.bytes > 0) {
      out += fmt::format("<text class=\"value\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                         num(cx), num(y - 6), format_bytes(b.bytes));
    }
    if (i % stride == 0) {
      out +=
          fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                      num(cx), num(kTop + kPlotH + 18), b.first);
    }
  }
  out += fmt::format("<text class=\"title\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     num(kLeft + kPlotW / 2), num(kH - 12),
                     group == 1 ? std::string("device id")
                                : fmt::format("device id (first of each group of {})", group));
  out += fmt::format(
      "<text class=\"title\" transform=\"translate(18 {}) rotate(-90)\" "
      "text-anchor=\"middle\">bytes per device</text>\n",
      num(kTop + kPlotH / 2));
  out += "</svg>\n<figcaption>";
  const std::size_t n = report.device_bytes.size();
  if (group == 1) {
    out += fmt::format("Bytes each of the {} devices holds", n);
  } else {
    out += fmt::format(
        "{} devices drawn as {} bars of {} consecutive device ids{}; each bar shows the largest "
        "of its group",
        n, bars.size(), group, n % group == 0 ? "" : " (the last holds fewer)");
  }
  out +=
      fmt::format(": min {}, max {}.</figcaption>\n</figure>\n</section>\n",
                  format_bytes(report.min_device_bytes()), format_bytes(report.max_device_bytes()));
}

// ---------------------------------------------------------------------------------------------
// A tensor's blocks over the mesh.

/// Which blocks of a tensor each drawn cell covers, and the devices that hold them.
struct TensorLayout {
  std::vector<int> dims;                    // the dimensions drawn: rows, then columns (0 to 2)
  std::int64_t blocks_r = 1, blocks_c = 1;  // blocks along the drawn dimensions
  std::int64_t group_r = 1, group_c = 1;    // blocks per cell along each side
  std::int64_t rows = 1, cols = 1;          // cells drawn
  std::vector<int> hidden;                  // sharded dimensions that are not drawn
  std::vector<std::vector<int>> cells;      // devices of each cell (row-major), sorted
};

/// The dimensions to draw: all of them up to rank 2; past that the two largest sharded ones,
/// filled up with the first unsharded ones, in dimension order.
std::vector<int> drawn_dims(const Shape& shape, const NamedSharding& sharding) {
  std::vector<int> sharded, plain;
  for (int d = 0; d < shape.rank(); ++d) {
    (sharding.num_shards(d) > 1 ? sharded : plain).push_back(d);
  }
  if (shape.rank() <= 2) {
    std::vector<int> all(static_cast<std::size_t>(shape.rank()));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  std::stable_sort(sharded.begin(), sharded.end(),
                   [&](int a, int b) { return shape[a] > shape[b]; });
  std::vector<int> dims = sharded;
  dims.insert(dims.end(), plain.begin(), plain.end());
  dims.resize(2);
  std::sort(dims.begin(), dims.end());
  return dims;
}

TensorLayout layout_of(const LeafPlan& leaf, const Mesh& mesh) {
  const NamedSharding sharding(mesh, *leaf.spec);
  const Shape& shape = leaf.tensor.shape;
  TensorLayout l;
  l.dims = drawn_dims(shape, sharding);
  for (int d = 0; d < shape.rank(); ++d) {
    if (sharding.num_shards(d) > 1 && std::find(l.dims.begin(), l.dims.end(), d) == l.dims.end())
      l.hidden.push_back(d);
  }
  // A 1-D tensor is one row of blocks.
  const int dim_r = l.dims.size() == 2 ? l.dims[0] : -1;
  const int dim_c = l.dims.empty() ? -1 : l.dims.back();
  if (dim_r >= 0) l.blocks_r = sharding.num_shards(dim_r);
  if (dim_c >= 0) l.blocks_c = sharding.num_shards(dim_c);
  l.group_r = (l.blocks_r + kPlanHtmlMaxCellsPerSide - 1) / kPlanHtmlMaxCellsPerSide;
  l.group_c = (l.blocks_c + kPlanHtmlMaxCellsPerSide - 1) / kPlanHtmlMaxCellsPerSide;
  l.rows = (l.blocks_r + l.group_r - 1) / l.group_r;
  l.cols = (l.blocks_c + l.group_c - 1) / l.group_c;
  l.cells.resize(static_cast<std::size_t>(l.rows * l.cols));

  // The mesh axes of each drawn dimension, major to minor (its block index is their mixed-radix
  // number, as NamedSharding numbers blocks).
  const auto axes_of = [&](int dim) {
    std::vector<std::size_t> ids;
    if (dim >= 0 && dim < leaf.spec->size()) {
      for (const auto& a : (*leaf.spec)[dim])
        ids.push_back(static_cast<std::size_t>(mesh.axis_index(a)));
    }
    return ids;
  };
  const std::vector<std::size_t> axes_r = axes_of(dim_r), axes_c = axes_of(dim_c);
  const auto& sizes = mesh.axis_sizes();
  const auto block = [&](const std::vector<std::size_t>& axes,
                         const std::vector<std::int64_t>& coords) {
    std::int64_t idx = 0;
    for (std::size_t a : axes) idx = idx * sizes[a] + coords[a];
    return idx;
  };
  std::vector<std::int64_t> coords(sizes.size(), 0);
  for (std::int64_t pos = 0; pos < mesh.size(); ++pos) {
    const std::int64_t r = block(axes_r, coords) / l.group_r;
    const std::int64_t c = block(axes_c, coords) / l.group_c;
    l.cells[static_cast<std::size_t>(r * l.cols + c)].push_back(
        mesh.devices()[static_cast<std::size_t>(pos)]);
    for (std::size_t a = sizes.size(); a-- > 0;) {  // the next position's coordinates
      if (++coords[a] < sizes[a]) break;
      coords[a] = 0;
    }
  }
  for (auto& cell : l.cells) std::sort(cell.begin(), cell.end());
  return l;
}

// Light fills that dark text reads on, neighbours distinct (Tableau 20's light half and two
// of ColorBrewer's Set3).
constexpr std::array<std::string_view, 12> kPalette = {"#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
                                                       "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d",
                                                       "#9edae5", "#c7c7c7", "#8dd3c7", "#fdb462"};

/// A cell's fill: neighbours across and down differ unless a row has a multiple of the
/// palette's size of cells, where each row is shifted by one.
std::string_view fill_of(std::int64_t r, std::int64_t c, std::int64_t cols) {
  const auto n = static_cast<std::int64_t>(kPalette.size());
  const std::int64_t k = r * cols + c + (cols % n == 0 ? r : 0);
  return kPalette[static_cast<std::size_t>(k % n)];
}

/// `text` (UTF-8) at 12 px fits in `width` x `height`, at about 7.2 px a character.
bool fits(std::string_view text, double width, double height) {
  const auto chars = std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  });
  return height >= 14 && static_cast<double>(chars) * 7.2 + 8 <= width;
}

/// "dim 1 · 11008 · tp" (the axes the dimension is sharded over, or "not sharded").
std::string dim_label(const LeafPlan& leaf, int dim) {
  std::string axes = "not sharded";
  if (dim < leaf.spec->size() && !(*leaf.spec)[dim].empty()) {
    axes.clear();
    for (const auto& a : (*leaf.spec)[dim]) {
      if (!axes.empty()) axes += "×";
      axes += a;
    }
  }
  return fmt::format("dim {} · {} · {}", dim, leaf.tensor.shape[dim], axes);
}

/// The label of a cell centred at (cx, cy) that fits: "devices 0,4", else the ids alone; else
/// the ids turned upright in a tall narrow cell; else none (the cell's tooltip has them).
void write_cell_label(std::string& out, const std::vector<int>& devs, double cx, double cy,
                      double width, double height) {
  const std::string full = devices_text(devs, 4), ids = device_runs(devs, 4);
  std::string label, turn;
  if (fits(full, width, height)) {
    label = full;
  } else if (fits(ids, width, height)) {
    label = ids;
  } else if (fits(ids, height, width)) {
    label = ids;
    turn = fmt::format(" transform=\"rotate(-90 {} {})\"", num(cx), num(cy));
  } else {
    return;
  }
  out += fmt::format("<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\"{}>{}</text>\n",
                     num(cx), num(cy + 4), turn, label);
}

constexpr double kBoxW = 480, kBoxLeft = 34, kBoxTop = 30;

/// The box's height: its shape's aspect for 2-D (within bounds that keep cells readable), a
/// strip for 1-D and scalars.
double box_height(const LeafPlan& leaf, const TensorLayout& l) {
  if (l.dims.size() < 2) return 64;
  const auto rows = static_cast<double>(std::max<std::int64_t>(1, leaf.tensor.shape[l.dims[0]]));
  const auto cols = static_cast<double>(std::max<std::int64_t>(1, leaf.tensor.shape[l.dims[1]]));
  return std::clamp(kBoxW * rows / cols, 120.0, 360.0);
}

void write_layout_svg(std::string& out, const LeafPlan& leaf, const TensorLayout& l) {
  const double h = box_height(leaf, l);
  const double w_all = kBoxLeft + kBoxW + 4, h_all = kBoxTop + h + 4;
  out += fmt::format(
      "<svg class=\"layout\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" role=\"img\" "
      "aria-label=\"blocks of ",
      num(w_all), num(h_all), num(w_all), num(h_all));
  escape_to(out, leaf.path);
  out += "\">\n";
  const double cw = kBoxW / static_cast<double>(l.cols), ch = h / static_cast<double>(l.rows);
  for (std::int64_t r = 0; r < l.rows; ++r) {
    for (std::int64_t c = 0; c < l.cols; ++c) {
      const auto& devs = l.cells[static_cast<std::size_t>(r * l.cols + c)];
      const double x = kBoxLeft + cw * static_cast<double>(c);
      const double y = kBoxTop + ch * static_cast<double>(r);
      out += fmt::format(
          "<rect class=\"block\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\">"
          "<title>{}{}</title></rect>\n",
          num(x), num(y), num(cw), num(ch), fill_of(r, c, l.cols), devices_text(devs, 16),
          devs.size() == 1 ? std::string() : fmt::format(" ({} devices)", devs.size()));
      write_cell_label(out, devs, x + cw / 2, y + ch / 2, cw, ch);
    }
  }
  if (l.dims.empty()) {
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\">scalar</text>\n", num(kBoxLeft),
                       num(kBoxTop - 10));
  } else {
    out += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">",
                       num(kBoxLeft + kBoxW / 2), num(kBoxTop - 10));
    escape_to(out, dim_label(leaf, l.dims.back()));
    out += "</text>\n";
  }
  if (l.dims.size() == 2) {
    out += fmt::format(
        "<text class=\"tick\" transform=\"translate({} {}) rotate(-90)\" "
        "text-anchor=\"middle\">",
        num(kBoxLeft - 12), num(kBoxTop + h / 2));
    escape_to(out, dim_label(leaf, l.dims.front()));
    out += "</text>\n";
  }
  out += "</svg>\n";
}

void write_unspecified_svg(std::string& out, const LeafPlan& leaf) {
  const double w_all = kBoxLeft + kBoxW + 4, h_all = kBoxTop + 64 + 4;
  out += fmt::format(
      "<svg class=\"layout\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" "
      "aria-label=\"",
      num(w_all), num(h_all));
  escape_to(out, leaf.path);
  out += fmt::format(
      " is unspecified\">\n<rect class=\"block unspecified\" x=\"{}\" y=\"{}\" width=\"{}\" "
      "height=\"64\"><title>unspecified: the rules left it to the program</title></rect>\n"
      "<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">unspecified</text>\n</svg>\n",
      num(kBoxLeft), num(kBoxTop), num(kBoxW), num(kBoxLeft + kBoxW / 2), num(kBoxTop + 36));
}

void write_tensor(std::string& out, const PlanReport& report, const LeafPlan& leaf) {
  std::optional<TensorLayout> layout;
  out += "<figure class=\"tensor\">\n";
  if (leaf.spec) {
    layout = layout_of(leaf, report.mesh);
    write_layout_svg(out, leaf, *layout);
  } else {
    write_unspecified_svg(out, leaf);
  }
  out += "<figcaption>\n<code class=\"path\">";
  escape_to(out, leaf.path);
  out += "</code>\n<dl class=\"facts\">\n";
  const auto fact = [&](std::string_view key, std::string_view value, bool mono = false) {
    out += fmt::format("<dt>{}</dt><dd{}>", key, mono ? " class=\"mono\"" : "");
    escape_to(out, value);
    out += "</dd>\n";
  };
  fact("tensor", to_text(leaf.tensor), true);
  fact("spec", leaf.spec ? leaf.spec->to_string() : std::string("unspecified"), true);
  if (leaf.spec) {
    fact("block", leaf.shard_shape.to_string(), true);
    fact("per device", fmt::format("{} of {}", format_bytes(leaf.bytes_per_device),
                                   format_bytes(leaf.tensor.bytes())));
    const std::int64_t copies = NamedSharding(report.mesh, *leaf.spec).replication_factor();
    fact("copies", copies == 1 ? std::string("each block on one device")
                               : fmt::format("each block on {} devices", copies));
  }
  std::string decided = fmt::format("#{}", leaf.rule_index);
  if (leaf.entry >= 0) decided += fmt::format(" [{}]", leaf.entry);
  fact("decided by",
       fmt::format("{} {}: {}", decided, report.rule_of(leaf).rule, report.reason_of(leaf)));
  if (layout) {
    std::string notes;
    if (layout->group_r * layout->group_c > 1) {
      notes += fmt::format("each cell is {}×{} blocks ({}×{} in all). ", layout->group_r,
                           layout->group_c, layout->blocks_r, layout->blocks_c);
    }
    const NamedSharding sharding(report.mesh, *leaf.spec);
    for (int d : layout->hidden) {
      notes += fmt::format(
          "dim {} ({}, sharded {} ways) is not drawn: each cell holds {} blocks "
          "along it. ",
          d, leaf.tensor.shape[d], sharding.num_shards(d), sharding.num_shards(d));
    }
    if (!notes.empty()) {
      notes.pop_back();
      fact("drawn", notes);
    }
  }
  out += "</dl>\n</figcaption>\n</figure>\n";
}

void write_largest(std::string& out, const PlanReport& report, std::size_t n) {
  const std::vector<std::size_t> largest = report.largest(n);
  if (largest.empty()) return;
  out += fmt::format(
      "<section class=\"tensors\">\n<h2>The {} largest tensor{} over the mesh</h2>\n"
      "<p class=\"note\">Each rectangle is the whole tensor; each block is what one group of "
      "devices holds, labelled with their ids.</p>\n",
      largest.size(), largest.size() == 1 ? "" : "s");
  for (std::size_t i : largest) write_tensor(out, report, report.leaves[i]);
  out += "</section>\n";
}

void write_rules(std::string& out, const PlanReport& report) {
  constexpr std::size_t kMaxListed = 20;
  const std::vector<std::size_t> fell = report.fell_through();
  out += "<section class=\"rules\">\n<h2>Rules</h2>\n";
  std::vector<const UnmatchedRule*> unmatched, activation_only;
  for (const UnmatchedRule& u : report.unmatched_rules) {
    (u.activation ? activation_only : unmatched).push_back(&u);
  }
  if (unmatched.empty()) {
    out += "<p class=\"note\">Every rule entry for weights decided at least one tensor.</p>\n";
  } else {
    out += fmt::format(
        "<p class=\"note\">{} rule entr{} decided no tensor:</p>\n<ul class=\"rules\">\n",
        unmatched.size(), unmatched.size() == 1 ? "y" : "ies");
    for (const UnmatchedRule* u : unmatched) {
      out += "<li><code>";
      escape_to(out, to_text(*u));
      out += "</code></li>\n";
    }
    out += "</ul>\n";
  }
  if (!activation_only.empty()) {
    out += fmt::format("<p class=\"note\">{} entr{} for activations only (not matched against "
                       "weights): ",
                       activation_only.size(), activation_only.size() == 1 ? "y" : "ies");
    for (std::size_t i = 0; i < activation_only.size(); ++i) {
      if (i > 0) out += ", ";
      out += "<code>";
      escape_to(out, activation_only[i]->label);
      out += "</code>";
    }
    out += "</p>\n";
  }
  if (!fell.empty()) {
    out += fmt::format(
        "<p class=\"note\">{} tensor{} fell through to a default or catch-all:</p>\n"
        "<ul class=\"rules\">\n",
        fell.size(), fell.size() == 1 ? "" : "s");
    for (std::size_t k = 0; k < fell.size() && k < kMaxListed; ++k) {
      out += "<li><code>";
      escape_to(out, report.leaves[fell[k]].path);
      out += "</code></li>\n";
    }
    if (fell.size() > kMaxListed)
      out += fmt::format("<li>and {} more</li>\n", fell.size() - kMaxListed);
    out += "</ul>\n";
  }
  out += "</section>\n";
}

}  // namespace

std::string plan_html(const PlanReport& report, std::string_view title, std::size_t largest_n) {
  std::string out;
  write_head(out, title);
  write_summary(out, report, title);
  write_device_chart(out, report);
  write_largest(out, report, largest_n);
  write_rules(out, report);
  out +=
      "<footer>shardplan plan report: a self-contained page (no scripts, nothing "
      "fetched)</footer>\n</main>\n</body>\n</html>\n";
  return out;
}

void write_plan_html(const std::string& path, const PlanReport& report, std::string_view title,
                     std::size_t largest_n) {
  const std::string page = plan_html(report, title, largest_n);
  detail::OutputFile out(path, "html");
  out.write(page);
  out.commit();
}

}  // namespace shardplan
