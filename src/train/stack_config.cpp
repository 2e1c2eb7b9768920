// A stack's config file read as train-plan options and written back (stack_config.hpp): what
// the three dialects share. Each key of a file is looked up in its dialect's table: it sets
// options, is ignored with the reason, or is refused; a key the table lacks is refused.
#include "shardplan/stack_config.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "../formats/input_file.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/rule_file.hpp"
#include "stack_config_impl.hpp"

namespace shardplan {
namespace train::stack_config {

void Reading::fail(const Entry& e, std::string_view why) const {
  const std::string at = e.line > 0 ? fmt::format("{}:{}", source_, e.line)
                                    : fmt::format("{} (the stack's default)", source_);
  throw IoError(fmt::format("[stack-config] {}: {}: {}", detail::printable(at),
                            detail::printable(said(e)), why));
}

std::string Reading::said(const Entry& e) {
  std::string value = e.text;
  if (e.kind == Entry::Kind::kList) value = fmt::format("[{}]", fmt::join(e.list, ", "));
  std::string out = e.kind == Entry::Kind::kFlag ? e.key : fmt::format("{} = {}", e.key, value);
  if (e.line == 0) out += " (default)";
  return out;
}

std::int64_t Reading::integer(const Entry& e) const {
  if (e.kind == Entry::Kind::kInt) return e.i;
  std::int64_t v = 0;
  const char* end = e.text.data() + e.text.size();
  if (e.kind == Entry::Kind::kText && !e.text.empty()) {
    const auto [p, ec] = std::from_chars(e.text.data(), end, v);
    if (ec == std::errc() && p == end) return v;
  }
  fail(e, "expected an integer");
}

double Reading::number(const Entry& e) const {
  if (e.kind == Entry::Kind::kInt) return static_cast<double>(e.i);
  if (e.kind == Entry::Kind::kNumber) return e.d;
  if (e.kind == Entry::Kind::kText && !e.text.empty()) {
    double v = 0;
    const char* end = e.text.data() + e.text.size();
    const auto [p, ec] = std::from_chars(e.text.data(), end, v);
    if (ec == std::errc() && p == end && std::isfinite(v)) return v;
  }
  fail(e, "expected a number");
}

bool Reading::boolean(const Entry& e) const {
  if (e.kind == Entry::Kind::kBool) return e.b;
  if (e.kind == Entry::Kind::kText && (e.text == "true" || e.text == "false")) {
    return e.text == "true";
  }
  fail(e, "expected true or false");
}

const std::string& Reading::text(const Entry& e) const {
  if (e.kind != Entry::Kind::kText) fail(e, "expected a string");
  return e.text;
}

std::vector<std::string> Reading::strings(const Entry& e) const {
  if (e.kind != Entry::Kind::kList) fail(e, "expected a list of strings");
  return e.list;
}

void Reading::set(const Entry& e, std::string option, std::string value) {
  set_from(said(e), std::move(option), std::move(value));
}

void Reading::set_from(std::string keys, std::string option, std::string value) {
  out_.settings.push_back({std::move(option), std::move(value), std::move(keys)});
}

void Reading::axis(const Entry& e, std::string name) {
  const std::int64_t degree = integer(e);
  if (degree == 0 || degree < -1) fail(e, "expected a degree of at least 1, or -1 (the rest)");
  out_.mesh_keys += (out_.mesh_keys.empty() ? "" : ", ") + said(e);
  auto& axes = out_.axes;
  const auto it =
      std::find_if(axes.begin(), axes.end(), [&](const auto& a) { return a.first == name; });
  if (it != axes.end()) {
    it->second = degree;
  } else {
    axes.emplace_back(std::move(name), degree);
  }
}

const Entry* Reading::held(std::string_view name) const {
  const auto it = held_.find(name);
  return it == held_.end() ? nullptr : &it->second;
}

Entry text_entry(std::string key, std::string text) {
  return Entry{.key = std::move(key), .kind = Entry::Kind::kText, .text = std::move(text)};
}
Entry int_entry(std::string key, std::int64_t i) {
  return Entry{.key = std::move(key), .kind = Entry::Kind::kInt, .text = std::to_string(i), .i = i};
}
Entry bool_entry(std::string key, bool b) {
  return Entry{
      .key = std::move(key), .kind = Entry::Kind::kBool, .text = b ? "true" : "false", .b = b};
}

std::string_view long_dtype(DType d) {
  switch (d) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF32:
      return "float32";
    default:
      return name(d);
  }
}

std::string short_dtype(std::string_view long_name) {
  if (long_name == "bfloat16") return "bf16";
  if (long_name == "float32") return "f32";
  return {};
}

std::int64_t per_rank_batch(std::string_view stack, const TrainPlanOptions& o, std::int64_t ranks,
                            std::string_view ranks_are) {
  const std::int64_t parts = ranks * o.grad_accum;
  if (o.batch % parts != 0) {
    throw SpecError(fmt::format(
        "[stack-config] --emit-config for {}: the batch of {} does not split over {} {} x {} "
        "micro-batch{} (its config gives a whole batch per {})",
        stack, o.batch, ranks, ranks_are, o.grad_accum, o.grad_accum == 1 ? "" : "es",
        ranks_are.substr(0, ranks_are.size() - 1)));
  }
  return o.batch / parts;
}

std::map<std::string, std::int64_t> mesh_degrees(std::string_view stack, const Mesh& mesh,
                                                 const std::vector<std::string_view>& known) {
  std::map<std::string, std::int64_t> out;
  for (std::size_t i = 0; i < mesh.axis_names().size(); ++i) {
    const std::string& a = mesh.axis_names()[i];
    if (std::find(known.begin(), known.end(), a) == known.end()) {
      throw SpecError(fmt::format(
          "[stack-config] --emit-config for {}: the mesh axis '{}' has no degree in its config "
          "(its axes: {})",
          stack, detail::printable(a), fmt::join(known, ", ")));
    }
    out[a] = mesh.axis_sizes()[i];
  }
  return out;
}

void require_stack_defaults(std::string_view stack, const TrainPlanOptions& o, unsigned says) {
  TrainPlanOptions d;
  apply_stack(find_training_stack(stack), d);
  const auto on = [](const std::optional<bool>& v, std::string_view yes, std::string_view no) {
    return !v ? std::string("the family's default") : std::string(*v ? yes : no);
  };
  const auto refuse = [&](std::string_view what, const std::string& planned,
                          const std::string& stack_runs) {
    throw SpecError(fmt::format(
        "[stack-config] --emit-config for {}: {} {} has no key in its config (the stack runs "
        "{}); plan without it to write the config",
        stack, what, planned, stack_runs));
  };
  if (o.fused_loss != d.fused_loss) {
    refuse("--loss", on(o.fused_loss, "fused", "naive"), on(d.fused_loss, "fused", "naive"));
  }
  // No stack's config has a key for the loss's dtype (torchtitan's .toml casts in its code).
  if (o.loss_dtype.value_or(DType::kF32) != d.loss_dtype.value_or(DType::kF32)) {
    refuse("--loss-dtype", std::string(name(o.loss_dtype.value_or(DType::kF32))),
           fmt::format("the loss in {}", name(d.loss_dtype.value_or(DType::kF32))));
  }
  if (o.fused_attention != d.fused_attention) {
    refuse("--attention", on(o.fused_attention, "fused", "naive"),
           on(d.fused_attention, "fused", "naive"));
  }
  if (o.tp_plan != d.tp_plan) refuse("--tp-plan", "as given", "its own");
  if (o.fsdp_root != d.fsdp_root) {
    refuse(o.fsdp_root ? "--fsdp-root" : "--no-fsdp-root", "", "the other wrapping");
  }
  if (o.reshard_last_block != d.reshard_last_block) {
    refuse("--[no-]reshard-last-block", "", "its own wrapping");
  }
  if ((says & kSaysEager) == 0 && o.eager != d.eager) {
    refuse(o.eager ? "--eager" : "--compile", "", d.eager ? "eager" : "compiled");
  }
  if ((says & kSaysFloat8) == 0 && o.float8 != d.float8) {
    refuse("--float8", o.float8 ? "on" : "off", d.float8 ? "float8" : "no float8");
  }
  if ((says & kSaysReshard) == 0 && o.reshard_after_forward != d.reshard_after_forward) {
    refuse("--no-reshard-after-forward", "", "FSDP's reshard after forward");
  }
  if ((says & kSaysAsyncTp) == 0 && o.async_tp != d.async_tp) {
    refuse("--async-tp", "", "no async TP");
  }
  if ((says & kSaysSequenceParallel) == 0 && o.sequence_parallel != d.sequence_parallel) {
    refuse("--sequence-parallel", on(o.sequence_parallel, "on", "off"), "what its rules say");
  }
  if ((says & kSaysOptimizerSharding) == 0 && o.optimizer_sharding != d.optimizer_sharding) {
    refuse("--optimizer-sharding", std::string(name(o.optimizer_sharding)),
           std::string(name(d.optimizer_sharding)));
  }
  if ((says & kSaysContextKernel) == 0 && o.cp_kernel != d.cp_kernel) {
    refuse("--cp-kernel", std::string(name(o.cp_kernel)), std::string(name(d.cp_kernel)));
  }
  if ((says & kSaysDpOverlap) == 0 &&
      (o.dp_overlap != d.dp_overlap || o.dp_bucket_size != d.dp_bucket_size)) {
    refuse("--dp-overlap", std::string(name(o.dp_overlap.value_or(DpOverlap::kFsdp))),
           std::string(name(d.dp_overlap.value_or(DpOverlap::kFsdp))));
  }
  if (!o.batch_axes.empty())
    refuse("--batch-axes", fmt::format("{}", fmt::join(o.batch_axes, ",")), "its own");
  if (o.target_seq != 0) refuse("--target-seq", std::to_string(o.target_seq), "one sequence");
}

namespace {

const std::vector<const Dialect*>& dialects() {
  static const std::vector<const Dialect*> all = {&torchtitan_dialect(), &megatron_dialect(),
                                                  &maxtext_dialect()};
  return all;
}

const Dialect* dialect_of(std::string_view stack) {
  for (const Dialect* d : dialects()) {
    if (d->serves(stack)) return d;
  }
  return nullptr;
}

const Dialect& dialect_or_throw(const TrainingStack& stack) {
  if (const Dialect* d = dialect_of(stack.name)) return *d;
  std::vector<std::string_view> readable;
  for (const TrainingStack& s : training_stacks()) {
    if (dialect_of(s.name) != nullptr) readable.push_back(s.name);
  }
  throw SpecError(
      fmt::format("[stack-config] stack {} has no config format train-plan reads or "
                  "writes (those that do: {})",
                  stack.name, fmt::join(readable, ", ")));
}

/// The table's entry for `key`: its own, or its table's "name.*".
const Key* find_key(const Dialect& d, std::string_view key) {
  const std::vector<Key>& keys = d.keys();
  for (const Key& k : keys) {
    if (k.name == key) return &k;
  }
  const std::size_t dot = key.find('.');
  if (dot == std::string_view::npos) return nullptr;
  const std::string table = std::string(key.substr(0, dot)) + ".*";
  for (const Key& k : keys) {
    if (k.name == table) return &k;
  }
  return nullptr;
}

/// One key of the file (or a default): taken, ignored, or refused.
void take_key(const Dialect& d, std::string_view stack, const Entry& e, Reading& r) {
  const Key* k = find_key(d, e.key);
  const unsigned version = d.version(stack);
  if (k == nullptr || (k->versions & version) == 0) {
    r.fail(e, fmt::format("not a key {}'s config has, or one train-plan does not know "
                          "(docs/training.md \"Stack configs\"); remove it to plan the rest",
                          stack));
  }
  if (k->take != nullptr) {
    k->take(e, r);
    return;
  }
  if (k->only == kRefused) r.fail(e, fmt::format("refused: {}", k->why));
  if (!k->only.empty() && e.text != k->only) {
    r.fail(e, fmt::format("refused: train-plan plans it only at {} ({})", k->only, k->why));
  }
  r.out().ignored.push_back(fmt::format("{} ({})", Reading::said(e), k->why));
}

}  // namespace

}  // namespace train::stack_config

using train::stack_config::Dialect;
using train::stack_config::Entry;
using train::stack_config::Reading;

std::string StackConfig::mesh_text() const {
  std::vector<std::string> parts;
  for (const auto& [name, degree] : axes) parts.push_back(fmt::format("{}:{}", name, degree));
  return fmt::format("{}", fmt::join(parts, ","));
}

std::pair<std::optional<std::int64_t>, std::optional<std::int64_t>> StackConfig::batch_on(
    const Mesh& mesh, const std::vector<std::string>& batch_axes) const {
  std::int64_t ranks = 1;
  if (local_batch_per_device) {
    ranks = mesh.size();
  } else {
    for (const std::string& a : mesh.axis_names()) {
      const bool batch = batch_axes.empty() ? default_axis_role(a) == AxisRole::kBatch
                                            : std::find(batch_axes.begin(), batch_axes.end(), a) !=
                                                  batch_axes.end();
      if (batch) ranks *= mesh.axis_size(a);
    }
  }
  const std::string_view per = local_batch_per_device ? "device" : "data-parallel rank";
  std::optional<std::int64_t> micro;  // the batch of one micro-batch over all ranks
  if (local_batch) {
    const double m = *local_batch * static_cast<double>(ranks);
    if (m < 1 || m != std::floor(m) || m > 1e15) {
      throw IoError(
          fmt::format("[stack-config] {}: {}: {} sequences per {} on {} {}s is not a "
                      "whole batch",
                      detail::printable(path), batch_keys, *local_batch, per, ranks, per));
    }
    micro = static_cast<std::int64_t>(m);
  }
  std::optional<std::int64_t> batch = global_batch, accum = grad_accum;
  if (micro && global_batch) {
    if (*global_batch % *micro != 0) {
      throw IoError(
          fmt::format("[stack-config] {}: {}: the global batch {} is not a multiple of "
                      "{} (the micro-batch {} per {} x {} {}s)",
                      detail::printable(path), batch_keys, *global_batch, *micro, *local_batch, per,
                      ranks, per));
    }
    if (!accum) accum = *global_batch / *micro;
  } else if (micro) {
    batch = *micro * accum.value_or(1);
  }
  return {batch, accum};
}

std::string stack_config_format(const TrainingStack& stack) {
  const Dialect* d = train::stack_config::dialect_of(stack.name);
  return d == nullptr ? std::string() : std::string(d->format);
}

const TrainingStack& stack_for_config_file(const std::filesystem::path& file) {
  const std::string ext = file.extension().string();
  std::vector<std::string> known;
  for (const Dialect* d : train::stack_config::dialects()) {
    for (std::string_view e : d->extensions) {
      if (e == ext) return find_training_stack(d->inferred_stack);
      known.push_back(fmt::format("{} ({})", e, d->inferred_stack));
    }
  }
  throw SpecError(fmt::format(
      "[stack-config] {}: no stack for the extension '{}' (known: {}); give --stack NAME",
      detail::printable(file.string()), detail::printable(ext), fmt::join(known, ", ")));
}

StackConfig parse_stack_config(std::string_view text, std::string_view source,
                               const TrainingStack& stack) {
  const Dialect& d = train::stack_config::dialect_or_throw(stack);
  StackConfig out;
  out.path = std::string(source);
  out.stack = std::string(stack.name);
  out.format = std::string(d.format);
  Reading r(source, out);
  const std::vector<Entry> entries = d.parse(text, source);
  for (const Entry& e : entries) train::stack_config::take_key(d, stack.name, e, r);
  for (const Entry& e : d.defaults(stack.name)) {
    const bool given =
        std::any_of(entries.begin(), entries.end(), [&](const Entry& f) { return f.key == e.key; });
    if (!given) train::stack_config::take_key(d, stack.name, e, r);
  }
  d.finish(r, stack.name);
  // The stacks' mesh order (torchtitan's [dp_replicate, dp_shard, cp, tp], MaxText's mesh_axes,
  // Megatron's ranks with tp fastest); degree 1 is no axis.
  const auto rank = [](const std::string& a) {
    return a == "dp" ? 0 : a == "fsdp" ? 1 : a == "cp" ? 2 : 3;
  };
  auto& axes = out.axes;
  std::stable_sort(axes.begin(), axes.end(),
                   [&](const auto& a, const auto& b) { return rank(a.first) < rank(b.first); });
  std::erase_if(axes, [](const auto& a) { return a.second == 1; });
  if (axes.empty()) axes.emplace_back("fsdp", 1);
  return out;
}

StackConfig read_stack_config(const std::filesystem::path& file, const TrainingStack& stack) {
  train::stack_config::dialect_or_throw(stack);
  const std::string text = detail::read_input_file(file, "stack-config", std::size_t{1} << 24);
  return parse_stack_config(text, file.string(), stack);
}

std::string emit_stack_config(const TrainingStack& stack, const TrainPlanOptions& o,
                              const Mesh& mesh, const std::vector<std::string>& batch_axes,
                              bool sequence_parallel) {
  const Dialect& d = train::stack_config::dialect_or_throw(stack);
  std::int64_t data_parallel = 1;
  for (const std::string& a : mesh.axis_names()) {
    const bool batch = batch_axes.empty()
                           ? default_axis_role(a) == AxisRole::kBatch
                           : std::find(batch_axes.begin(), batch_axes.end(), a) != batch_axes.end();
    if (batch) data_parallel *= mesh.axis_size(a);
  }
  return d.emit(stack.name, o, mesh, data_parallel, sequence_parallel);
}

}  // namespace shardplan
