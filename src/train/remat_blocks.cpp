// --remat-blocks: which decoder layers are checkpoints, as torchtitan's selective layer AC and
// fms-fsdp's selective_checkpointing choose them, or by layer ranges; and the period the
// choice repeats with over a model's layers (what extrapolating from small steps needs).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

/// fms-fsdp's apply_fsdp_checkpointing, block by block from the first: whether each of the first
/// `n` blocks is wrapped.
std::vector<bool> fraction_choices(double p, std::int64_t n) {
  std::vector<bool> out(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  double cut_off = 0.5;
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<double>(i + 1) * p >= cut_off;
    if (out[i]) cut_off += 1;
  }
  return out;
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
    case Kind::kFraction:
      return layer >= 0 && fraction_choices(fraction, layer + 1).back();
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
  if (remat && o.remat_blocks.kind == RematBlocks::Kind::kFraction) {
    return fraction_choices(o.remat_blocks.fraction, layers);  // one pass, not one per layer
  }
  std::vector<bool> out(static_cast<std::size_t>(std::max<std::int64_t>(layers, 0)));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = remat && o.remat_blocks.selects(static_cast<std::int64_t>(i));
  }
  return out;
}

std::int64_t checkpoint_period(const TrainPlanOptions& o, std::int64_t layers) {
  // The least period of a sequence is its length less its longest proper border (a prefix that
  // is also a suffix): Knuth-Morris-Pratt's prefix function, linear in the layers.
  const std::vector<bool> s = checkpointed_layers(o, layers);
  if (s.empty()) return 1;
  std::vector<std::size_t> border(s.size(), 0);
  for (std::size_t i = 1; i < s.size(); ++i) {
    std::size_t k = border[i - 1];
    while (k > 0 && s[i] != s[k]) k = border[k - 1];
    border[i] = s[i] == s[k] ? k + 1 : 0;
  }
  return static_cast<std::int64_t>(s.size() - border.back());
}

}  // namespace train
}  // namespace shardplan
