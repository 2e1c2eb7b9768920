// --remat-blocks: which decoder layers are checkpoints, as torchtitan's selective layer AC and
// fms-fsdp's selective_checkpointing choose them, or by layer ranges; and the period the
// choice repeats with over a model's layers (what extrapolating from small steps needs).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "model_step.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/train_plan.hpp"

namespace shardplan {
namespace {

constexpr std::int64_t kMaxLayerNumber = std::int64_t{1} << 30;

[[noreturn]] void unknown_form(std::string_view text, std::string_view why) {
  throw SpecError(fmt::format(
      "[train] --remat-blocks '{}': {} (known: all, every:K, fraction:P (a decimal or A/B in "
      "(0, 1]), layers:A-B,C...)",
      detail::printable(text), why));
}

/// A whole number of digits only, at most kMaxLayerNumber; nullopt otherwise.
std::optional<std::int64_t> whole_number(std::string_view s) {
  std::int64_t v = 0;
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v > kMaxLayerNumber) return std::nullopt;
  return v;
}

/// fms-fsdp evaluates the fraction as Python does: A/B by true division (correctly rounded),
/// a decimal as a float literal (correctly rounded; from_chars too).
std::optional<double> fraction_value(std::string_view s) {
  if (const auto slash = s.find('/'); slash != std::string_view::npos) {
    const auto a = whole_number(s.substr(0, slash)), b = whole_number(s.substr(slash + 1));
    if (!a || !b || *b == 0) return std::nullopt;
    return static_cast<double>(*a) / static_cast<double>(*b);
  }
  const bool digits = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '.';
  }) && std::count(s.begin(), s.end(), '.') <= 1 && s != ".";
  if (!digits) return std::nullopt;
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

RematBlocks parse_ranges(std::string_view text, std::string_view list) {
  RematBlocks b;
  b.kind = RematBlocks::Kind::kLayers;
  for (std::size_t comma = 0; comma != std::string_view::npos;) {
    comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    if (comma != std::string_view::npos) list = list.substr(comma + 1);
    const auto dash = item.find('-');
    const auto first = whole_number(item.substr(0, dash));
    const auto last = dash == std::string_view::npos ? first : whole_number(item.substr(dash + 1));
    if (!first || !last) unknown_form(text, fmt::format("'{}' is not a layer or a range A-B",
                                                        detail::printable(item)));
    if (*last < *first) unknown_form(text, fmt::format("the range {}-{} is empty", *first, *last));
    if (!b.ranges.empty() && *first <= b.ranges.back().second) {
      unknown_form(text, fmt::format("the range starting at {} is not after layer {} (ranges "
                                     "ascending, not overlapping)",
                                     *first, b.ranges.back().second));
    }
    b.ranges.emplace_back(*first, *last);
  }
  return b;
}

}  // namespace

bool RematBlocks::selects(std::int64_t layer) const {
  switch (kind) {
    case Kind::kAll:
      return true;
    case Kind::kEvery:
      // torchtitan counts the blocks it wraps from 1 and wraps count % k == 0.
      return (layer + 1) % every == 0;
    case Kind::kFraction: {
      // fms-fsdp's apply_fsdp_checkpointing, block by block from the first.
      double cut_off = 0.5;
      bool chosen = false;
      for (std::int64_t n = 1; n <= layer + 1; ++n) {
        chosen = static_cast<double>(n) * fraction >= cut_off;
        if (chosen) cut_off += 1;
      }
      return chosen;
    }
    case Kind::kLayers:
      return std::any_of(ranges.begin(), ranges.end(),
                         [&](const auto& r) { return r.first <= layer && layer <= r.second; });
  }
  return true;
}

RematBlocks parse_remat_blocks(std::string_view text) {
  RematBlocks b;
  if (text == "all") return b;
  if (text.starts_with("every:")) {
    const auto k = whole_number(text.substr(6));
    if (!k || *k < 1) unknown_form(text, "K is not a whole number from 1");
    if (*k > 1) {  // every:1 is every layer
      b.kind = RematBlocks::Kind::kEvery;
      b.every = *k;
    }
    return b;
  }
  if (text.starts_with("fraction:")) {
    const auto p = fraction_value(text.substr(9));
    if (!p || !(*p > 0 && *p <= 1)) unknown_form(text, "P is not a fraction in (0, 1]");
    if (*p < 1) {  // 1 checkpoints every block
      b.kind = RematBlocks::Kind::kFraction;
      b.fraction = *p;
      b.fraction_text = std::string(text.substr(9));
    }
    return b;
  }
  if (text.starts_with("layers:")) return parse_ranges(text, text.substr(7));
  unknown_form(text, "not a form");
}

std::string remat_blocks_name(const RematBlocks& b) {
  switch (b.kind) {
    case RematBlocks::Kind::kAll:
      return "all";
    case RematBlocks::Kind::kEvery:
      return fmt::format("every:{}", b.every);
    case RematBlocks::Kind::kFraction:
      return fmt::format("fraction:{}", b.fraction_text);
    case RematBlocks::Kind::kLayers:
      break;
  }
  std::string out = "layers:";
  for (const auto& [first, last] : b.ranges) {
    if (out.size() > 7) out += ',';
    out += first == last ? fmt::format("{}", first) : fmt::format("{}-{}", first, last);
  }
  return out;
}

namespace train {

std::vector<bool> checkpointed_layers(const TrainPlanOptions& o, std::int64_t layers) {
  const bool remat = effective_remat(o).has_value();
  std::vector<bool> out(static_cast<std::size_t>(std::max<std::int64_t>(layers, 0)));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = remat && o.remat_blocks.selects(static_cast<std::int64_t>(i));
  }
  return out;
}

std::int64_t checkpoint_period(const TrainPlanOptions& o, std::int64_t layers) {
  const std::vector<bool> chosen = checkpointed_layers(o, layers);
  const auto n = static_cast<std::int64_t>(chosen.size());
  for (std::int64_t p = 1; p < n; ++p) {
    bool repeats = true;
    for (std::int64_t i = 0; i + p < n && repeats; ++i) {
      repeats = chosen[static_cast<std::size_t>(i)] == chosen[static_cast<std::size_t>(i + p)];
    }
    if (repeats) return p;
  }
  return std::max<std::int64_t>(n, 1);
}

}  // namespace train
}  // namespace shardplan
