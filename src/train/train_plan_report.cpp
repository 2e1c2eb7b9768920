// TrainPlan's text and JSON, and the comparison of plans (train_plan.cpp plans them).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>

#include "shardplan/detail/printable.hpp"
#include "shardplan/format_bytes.hpp"
#include "shardplan/train_plan.hpp"
#include "stack_remat.hpp"
#include "step_time.hpp"

namespace shardplan {
namespace {

std::string flops_text(double f) {
  if (f <= 0) return "0";
  return fmt::format("{:.3g}", f);
}

}  // namespace

std::int64_t TrainPlan::bytes_moved() const {
  std::int64_t total = 0;
  for (const auto& [kind, bytes] : bytes_by_collective) total += bytes;
  return total;
}

std::int64_t TrainPlan::usable_bytes() const {
  if (device_memory <= 0) return 0;
  return static_cast<std::int64_t>(static_cast<double>(device_memory) * (1 - headroom));
}

std::optional<bool> TrainPlan::fits() const {
  if (device_memory <= 0) return std::nullopt;
  return peak_bytes <= usable_bytes();
}

namespace {

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

std::string axes_text(const std::vector<std::string>& axes) {
  return detail::printable(fmt::format("[{}]", fmt::join(axes, ", ")));
}

/// The time split of TrainPlan::table().
// How the data-parallel collectives were timed, when not as FSDP's pipeline (the default).
std::string dp_overlap_line(const StepTime& t) {
  if (t.dp_overlap == "fsdp") return {};
  if (t.dp_overlap == "off") {
    return fmt::format("  {:<40} {:>12}  (every data-parallel collective exposed)\n",
                       "data-parallel overlap", "off");
  }
  std::string out = fmt::format(
      "  {:<40} {:>12}  ({} bucket{} closing at {} elements, the last {}: gradient reductions "
      "{}, {} exposed",
      "data-parallel overlap", t.dp_overlap, t.dp_bucket_elements.size(),
      t.dp_bucket_elements.size() == 1 ? "" : "s", t.dp_bucket_size,
      t.dp_bucket_elements.empty() ? 0 : t.dp_bucket_elements.back(),
      seconds_text(t.dp_reduce_seconds), seconds_text(t.dp_reduce_exposed_seconds));
  if (t.dp_gather_seconds > 0) {
    out += fmt::format("; parameter gathers {}, {} exposed", seconds_text(t.dp_gather_seconds),
                       seconds_text(t.dp_gather_exposed_seconds));
  }
  return out + ")\n";
}

std::string time_table(const StepTime& t) {
  std::string out = fmt::format("step time on {}\n", detail::printable(t.hardware));
  const std::string fp8 = t.matmul_fp8_seconds > 0
                              ? fmt::format("float8 matmul {}, ", seconds_text(t.matmul_fp8_seconds))
                              : std::string();
  const std::string copy_out =
      t.copy_out_seconds > 0
          ? fmt::format(", FSDP's copy-out of gathered weights {}", seconds_text(t.copy_out_seconds))
          : std::string();
  out += fmt::format("  {:<40} {:>12}  (matmul {}, {}attention {}, memory-bound kernels {}{})\n",
                     "compute", seconds_text(t.compute_seconds()), seconds_text(t.matmul_seconds),
                     fp8, seconds_text(t.attention_seconds), seconds_text(t.memory_seconds),
                     copy_out);
  for (const CommTime& c : t.comms) {
    out += fmt::format("  {:<40} {:>12}  ({} over the {}, {})\n",
                       fmt::format("{}{} over {}", to_string(c.collective.kind),
                                   c.collective.of_argument ? " of weights" : "",
                                   axes_text(c.collective.axes)),
                       seconds_text(c.seconds), format_bytes(c.bytes),
                       train::link_text(c),
                       c.overlapped ? fmt::format("{}: overlapped with compute", name(c.role))
                                    : fmt::format("{}: exposed", name(c.role)));
  }
  for (const TpOverlapTime& o : t.tp_overlaps) {
    const TpOverlapKind& k = o.pair.kind;
    out += fmt::format(
        "  {:<40} {:>12}  ({} x {} with {:.3g} FLOP of {}products, {} chunks: transfer {}, "
        "products {}, exposed {} each)\n",
        fmt::format("async TP: {} over {}", to_string(k.collective.kind),
                    axes_text(k.collective.axes)),
        seconds_text(static_cast<double>(o.pair.count) * o.exposed_seconds), o.pair.count,
        format_bytes(k.bytes), static_cast<double>(k.flops), k.float8 ? "float8 " : "", o.group,
        seconds_text(o.comm_seconds), seconds_text(o.matmul_seconds),
        seconds_text(o.exposed_seconds));
  }
  if (!t.tp_overlaps.empty()) {
    out += fmt::format("  {:<40} {:>12}  (of the tensor-parallel collectives above)\n",
                       "async TP: hidden under products", seconds_text(t.tp_overlap_hidden_seconds));
  }
  out += dp_overlap_line(t);
  out += fmt::format("  {:<40} {:>12}  (node {}, network {}; tensor parallel {})\n",
                     "exposed communication", seconds_text(t.exposed_seconds),
                     seconds_text(t.exposed_by_tier.at(LinkTier::kNode)),
                     seconds_text(t.exposed_by_tier.at(LinkTier::kNetwork)),
                     seconds_text(t.exposed_tensor_seconds));
  if (t.dispatch_seconds > 0) {
    out += fmt::format("  {:<40} {:>12}  ({} ops x {} dispatched eagerly through DTensor; {})\n",
                       "eager dispatch (host)", seconds_text(t.dispatch_seconds), t.launched_ops,
                       seconds_text(t.dispatch_seconds_per_op),
                       t.dispatch_exposed_seconds > 0
                           ? fmt::format("the device waits {} for the host",
                                         seconds_text(t.dispatch_exposed_seconds))
                           : std::string("under the device's time"));
  }
  out += fmt::format("  {:<40} {:>12}\n", "step", seconds_text(t.step_seconds));
  out += fmt::format("  {:<40} {:>12.0f}\n", "tokens/s per device", t.tokens_per_second_per_device);
  out += fmt::format("  {:<40} {:>11.1f}%  ({:.3g} model FLOPs per token, bf16 peak)\n", "MFU",
                     t.mfu * 100, t.model_flops_per_token);
  return out;
}

}  // namespace

namespace {

/// --from-config's ignored keys ("KEY = VALUE (why)") by reason: "a, b (why); c (why 2)".
std::string ignored_keys(const std::vector<std::string>& ignored) {
  std::vector<std::pair<std::string, std::vector<std::string>>> by_why;
  for (const std::string& k : ignored) {
    const std::size_t open = k.rfind(" (");  // a reason has no parenthesis of its own
    const std::string key = k.substr(0, std::min(k.find(" = "), open));
    const std::string why = open == std::string::npos ? std::string() : k.substr(open + 1);
    auto it =
        std::find_if(by_why.begin(), by_why.end(), [&](const auto& w) { return w.first == why; });
    if (it == by_why.end()) it = by_why.insert(by_why.end(), {why, {}});
    it->second.push_back(key);
  }
  std::vector<std::string> parts;
  for (const auto& [why, keys] : by_why) {
    parts.push_back(fmt::format("{} {}", fmt::join(keys, ", "), why));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

/// The stack the options came from, what of it the options overrode and what of it is not
/// planned (docs/training.md "Training stacks"); empty without one.
std::string stack_line(const std::optional<StackUse>& stack) {
  if (!stack) return {};
  std::string out = fmt::format(
      "stack {}{}", stack->name,
      stack->validated ? "" : " (unvalidated: fewer than 2 published runs planned through it)");
  if (!stack->overridden.empty()) {
    out += fmt::format("; overridden: {}", fmt::join(stack->overridden, ", "));
  }
  if (!stack->config.empty()) {
    out += fmt::format("; from {}: {} setting{} planned", stack->config,
                       stack->config_applied.size(), stack->config_applied.size() == 1 ? "" : "s");
    if (!stack->config_overridden.empty()) {
      out += fmt::format(", overridden {}", fmt::join(stack->config_overridden, ", "));
    }
    if (!stack->config_ignored.empty()) out += ", ignored " + ignored_keys(stack->config_ignored);
  }
  if (!stack->not_modelled.empty()) {
    out += fmt::format("; not modelled: {} (--explain)", fmt::join(stack->not_modelled, ", "));
  }
  return out + "\n";
}

/// What the step line adds after sequence parallelism: float8, eager, the tensor-parallel plan,
/// FSDP's root module and last block, context parallelism.
std::string step_extras(const TrainPlan& p) {
  std::string out;
  if (p.float8) {
    const bool tensorwise = p.float8_recipe == name(Float8Scaling::kTensorwise);
    const std::string gather =
        p.float8_all_gather == "none"
            ? std::string()
            : fmt::format(", weights all-gathered in {}", p.float8_all_gather);
    out += fmt::format(", linear layers float8 ({} scaling{}, inputs kept in {}{}; the head and "
                       "attention in {})",
                       p.float8_recipe,
                       p.float8_recipe == name(Float8Scaling::kRowwiseWithGwHp)
                           ? fmt::format(" (weight gradients in {})", name(p.param_dtype))
                           : "",
                       tensorwise ? "8 bits" : name(p.param_dtype), gather, name(p.param_dtype));
  }
  if (p.eager) out += ", eager (no torch.compile: each elementwise op writes its result)";
  if (p.optimizer_kernel == "fused") {
    out += ", optimizer kernel fused (each parameter, gradient and moment read and written once)";
  } else if (p.optimizer_kernel == "foreach") {
    out += ", optimizer kernel foreach (torch's passes over all the parameters, each reading and "
           "writing whole arrays; the square roots held for the update)";
  }
  if (p.optimizer_sharding == "zero1") {
    out += ", optimizer sharding zero1 (parameters replicated over the data axes, master weights "
           "and state sharded; gradients reduce-scattered, parameters all-gathered)";
  }
  if (p.tp_modules) {
    out += ", tensor-parallel plan modules (layer weights used in their model-axis split)";
  }
  if (!p.tp_overlaps.empty()) {
    std::int64_t gathers = 0, scatters = 0;
    for (const TpOverlap& o : p.tp_overlaps) {
      (o.kind.collective.kind == CollectiveKind::kAllGather ? gathers : scatters) += o.count;
    }
    out += fmt::format(", async TP ({} all-gathers and {} reduce-scatters run under their "
                       "products)",
                       gathers, scatters);
  }
  if (p.fsdp_root) {
    out += fmt::format(", FSDP root module (embedding and head gathered from the forward's start "
                       "to the backward's end{})",
                       p.last_block_kept_gathered ? "; the last block kept gathered" : "");
  } else if (p.last_block_kept_gathered) {
    out += ", the last block kept gathered (not resharded after forward)";
  }
  if (!p.context_axes.empty()) {
    const std::string kernel =
        p.context_kernel == ContextKernel::kAllGatherKv ? "keys and values all-gathered"
        : p.context_kernel == ContextKernel::kUlysses
            ? "Ulysses: q, k, v and the output by all-to-all over the heads"
            : fmt::format("ring attention{}",
                          p.context_gathered ? ", key/value blocks all-gathered" : "");
    out += fmt::format(", context parallel over {} ({}, load-balanced order)",
                       detail::printable(fmt::format("{}", fmt::join(p.context_axes, ", "))),
                       kernel);
  }
  return out;
}

}  // namespace

std::string TrainPlan::remat_text() const {
  std::vector<std::string> notes;
  if (remat.find(':') != std::string::npos && !remat.starts_with("names:")) {
    // A stack's name (--remat STACK:NAME): what its list saves.
    const auto& policy = train::stack_remat_name(remat).policy;
    if (policy && !policy->names().empty()) {
      notes.push_back(fmt::format("saves those of {} the layer gives",
                                  fmt::join(policy->names(), ", ")));
    }
  }
  if (remat_blocks != "all") {
    notes.push_back(fmt::format("on blocks {}: {} layer{}", remat_blocks, remat_layers,
                                remat_layers == 1 ? "" : "s"));
  }
  if (reshard_after_forward) {
    notes.emplace_back(remat_layers > 0 ? "the other layers' weights gathered again for the "
                                          "backward pass"
                                        : "weights gathered again for the backward pass");
  } else if (kept_gathered_for_recompute) {
    notes.emplace_back("weights kept gathered from the forward pass for the recomputation");
  }
  return notes.empty() ? remat : fmt::format("{} ({})", remat, fmt::join(notes, "; "));
}

std::string TrainPlan::table() const {
  std::string out;
  out += fmt::format("{} on {} ({} devices), rules {}{}\n", model, detail::printable(mesh), devices,
                     detail::printable(rules),
                     rules_note.empty() ? "" : fmt::format(" ({})", rules_note));
  if (!not_modelled.empty()) {
    out += fmt::format("not modelled: {}\n", fmt::join(not_modelled, "; "));
  }
  out += stack_line(stack);
  const std::string tokens = target_seq > 0
                                 ? fmt::format("{} encoder + {} decoder", seq, target_seq)
                                 : fmt::format("{}", seq);
  out += fmt::format(
      "step: batch {} x {} tokens over [{}] ({} micro-batch{}), {}, parameters {}, gradients {}, "
      "optimizer state {}, remat {}, attention {}, loss {}, sequence parallel {}",
      batch, tokens, fmt::join(batch_axes, ", "), grad_accum, grad_accum == 1 ? "" : "es",
      optimizer,
      master_dtype == param_dtype ? std::string(name(param_dtype))
      : optimizer_sharding == "zero1"
          ? fmt::format("{} held (the {} master weights with the optimizer state)",
                        name(param_dtype), name(master_dtype))
          : fmt::format("{} held, cast to {} for use (gathered in it)", name(master_dtype),
                        name(param_dtype)),
      reduce_dtype == param_dtype
          ? std::string(name(grad_dtype))
          : fmt::format("{} (reduced in {})", name(grad_dtype), name(reduce_dtype)),
      name(optimizer_dtype),
      remat_text(),
      fused_attention ? "fused" : "naive",
      // The dtype it ran in, read from the program, said where it is not the default's f32.
      fmt::format("{}{}", fused_loss ? "fused" : "naive",
                  loss_dtype == DType::kF32 ? std::string()
                                            : fmt::format(" in {}", name(loss_dtype))),
      sequence_parallel ? fmt::format("on (over {})", detail::printable(fmt::format(
                                                          "{}", fmt::join(sequence_axes, ", "))))
                        : "off");
  out += step_extras(*this);
  out += "\n\nper device\n";
  const auto row = [&](std::string_view what, std::int64_t bytes) {
    out += fmt::format("  {:<40} {:>12}\n", what, format_bytes(bytes));
  };
  row("parameters", parameter_bytes);
  row("gradients", gradient_bytes);
  row("optimizer state", optimizer_bytes);
  row("batch (tokens, targets)", batch_bytes);
  row("peak", peak_bytes);
  out += "  of which, at the peak\n";
  row("  parameters, state, batch still held", peak_held_bytes);
  row("  parameters gathered for use", peak_gathered_bytes);
  row("  activations, gradients, temporaries", peak_computed_bytes);
  if (reserved_bytes > 0) {
    out += fmt::format("  {:<40} {:>12}  (expandable segments: {})\n",
                       "reserved (caching allocator model)", format_bytes(reserved_bytes),
                       format_bytes(reserved_bytes_expandable));
  }
  if (const auto f = fits()) {
    out += fmt::format(
        "  {:<40} {:>12}  ({} with {:.0f}% headroom): {}\n", "device memory",
        format_bytes(device_memory), format_bytes(usable_bytes()), headroom * 100,
        *f ? "fits"
           : fmt::format("does NOT fit, {} short", format_bytes(peak_bytes - usable_bytes())));
  }
  out += fmt::format("  {:<40} {:>12}\n", "FLOPs per step", flops_text(flops));
  out += "bytes received per device per step\n";
  if (bytes_moved() == 0) out += "  (nothing)\n";
  for (const auto& [kind, bytes] : bytes_by_collective) {
    if (bytes == 0) continue;  // a kind the program uses without moving data (a local slice)
    out += fmt::format("  {:<40} {:>12}\n", to_string(kind), format_bytes(bytes));
  }
  if (bytes_by_collective.size() > 1) {
    out += fmt::format("  {:<40} {:>12}\n", "total", format_bytes(bytes_moved()));
  }
  if (time) out += time_table(*time);
  out += fmt::format("FLOPs per step, all devices: {}; planned in {:.2f} s{}\n",
                     flops_text(total_flops), seconds_to_plan,
                     extrapolated ? fmt::format(", extrapolated from {}", traced) : "");
  return out;
}

std::optional<std::size_t> cheapest_fitting(const std::vector<TrainPlan>& plans) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    if (!plans[i].error.empty() || plans[i].fits() == false) continue;
    if (!best) {
      best = i;
      continue;
    }
    const TrainPlan& a = plans[i];
    const TrainPlan& b = plans[*best];
    if (a.bytes_moved() < b.bytes_moved() ||
        (a.bytes_moved() == b.bytes_moved() && a.peak_bytes < b.peak_bytes)) {
      best = i;
    }
  }
  return best;
}

std::optional<std::size_t> fastest_fitting(const std::vector<TrainPlan>& plans) {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const TrainPlan& a = plans[i];
    if (!a.error.empty() || a.fits() == false || !a.time) continue;
    if (!best) {
      best = i;
      continue;
    }
    const TrainPlan& b = plans[*best];
    const double ta = a.time->tokens_per_second_per_device;
    const double tb = b.time->tokens_per_second_per_device;
    if (ta > tb || (ta == tb && a.peak_bytes < b.peak_bytes)) best = i;
  }
  return best;
}

std::string why_slower(const TrainPlan& p, const TrainPlan& best) {
  if (!p.error.empty()) return "cannot be planned";
  if (p.fits() == false) {
    return fmt::format("does not fit: peak {} > {} usable", format_bytes(p.peak_bytes),
                       format_bytes(p.usable_bytes()));
  }
  if (!p.time || !best.time || &p == &best) return "";
  // Device-seconds per step, part by part: the part by which it exceeds the best's most.
  const auto parts = [](const TrainPlan& q) {
    const StepTime& t = *q.time;
    const auto d = static_cast<double>(q.devices);
    return std::vector<std::pair<std::string, double>>{
        {"more compute per token", t.compute_seconds() * d},
        {"exposed communication on the node's links", t.exposed_by_tier.at(LinkTier::kNode) * d},
        {"exposed communication over the network", t.exposed_by_tier.at(LinkTier::kNetwork) * d}};
  };
  const auto mine = parts(p), theirs = parts(best);
  std::size_t worst = 0;
  for (std::size_t k = 1; k < mine.size(); ++k) {
    if (mine[k].second - theirs[k].second > mine[worst].second - theirs[worst].second) worst = k;
  }
  const double extra = mine[worst].second - theirs[worst].second;
  if (!(extra > 0)) return "as fast";
  return fmt::format("{} (+{:.3g} device-s per step)", mine[worst].first, extra);
}

namespace {

// The comparison's "not modelled" line (one model: said once), or nothing.
std::string not_modelled_line(const std::vector<TrainPlan>& plans) {
  std::string out;
  for (const TrainPlan& p : plans) {
    if (!p.not_modelled.empty()) {
      out = fmt::format("not modelled: {}\n", fmt::join(p.not_modelled, "; "));
      break;
    }
  }
  // Every plan of a comparison has the same options, so the same stack.
  return plans.empty() ? out : out + stack_line(plans.front().stack);
}

constexpr const char* kNoneFits =
    "none of these fits: try more devices, --recompute, gradient accumulation or a smaller "
    "batch\n";

/// compare_table() when the plans have a time: ranked by it.
std::string time_compare_table(const std::vector<TrainPlan>& plans) {
  const TrainPlan* any = nullptr;
  for (const TrainPlan& p : plans) {
    if (p.time && any == nullptr) any = &p;
  }
  std::string out = fmt::format(
      "ranked by tokens/s per device on {} for one global batch of {} x {} tokens (the least "
      "device-time per step; meshes of other sizes compare by it and by device-hours per step)\n",
      detail::printable(any->time->hardware), any->batch, any->seq);
  out += fmt::format("{:<3} {:<30} {:<22} {:>11} {:>4} {:>10} {:>9} {:>6} {:>10}  {}\n", "#",
                     "mesh", "rules", "peak/dev", "fits", "step", "tok/s/dev", "MFU", "dev-h/step",
                     "why not the fastest");
  const auto best = fastest_fitting(plans);
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const TrainPlan& p = plans[i];
    if (!p.error.empty()) {
      out += fmt::format("{:<3} {:<30} {:<22} cannot be planned: {}\n", i, detail::printable(p.mesh),
                         detail::printable(p.rules), detail::printable(p.error));
      continue;
    }
    if (!p.time) {  // planned without hardware beside plans with it (the library allows it)
      out += fmt::format("{:<3} {:<30} {:<22} {:>11}  no time: planned without hardware\n", i,
                         detail::printable(p.mesh), detail::printable(p.rules),
                         format_bytes(p.peak_bytes));
      continue;
    }
    const StepTime& t = *p.time;
    const auto f = p.fits();
    out += fmt::format("{:<3} {:<30} {:<22} {:>11} {:>4} {:>9.3f}s {:>9.0f} {:>5.1f}% {:>10.4f}  {}\n",
                       i, detail::printable(p.mesh), detail::printable(p.rules),
                       format_bytes(p.peak_bytes), f ? (*f ? "yes" : "NO") : "-", t.step_seconds,
                       t.tokens_per_second_per_device, t.mfu * 100,
                       t.step_seconds * static_cast<double>(p.devices) / 3600,
                       best && *best == i ? "fastest" : best ? why_slower(p, plans[*best])
                                                              : why_slower(p, p));
  }
  out += not_modelled_line(plans);
  if (best) {
    const TrainPlan& p = plans[*best];
    out += fmt::format(
        "fastest that fits: #{} {} with rules {} ({:.3f} s per step, {:.0f} tokens/s per device, "
        "peak {})\n",
        *best, detail::printable(p.mesh), detail::printable(p.rules), p.time->step_seconds,
        p.time->tokens_per_second_per_device, format_bytes(p.peak_bytes));
  } else {
    out += kNoneFits;
  }
  return out;
}

}  // namespace

std::string compare_table(const std::vector<TrainPlan>& plans) {
  if (std::any_of(plans.begin(), plans.end(), [](const TrainPlan& p) { return p.time.has_value(); })) {
    return time_compare_table(plans);
  }
  std::string out = fmt::format("{:<3} {:<34} {:<26} {:>12} {:>6} {:>14} {:>10}\n", "#", "mesh",
                                "rules", "peak/device", "fits", "moved/device", "FLOPs/dev");
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const TrainPlan& p = plans[i];
    if (!p.error.empty()) {
      out +=
          fmt::format("{:<3} {:<34} {:<26} cannot be planned: {}\n", i, detail::printable(p.mesh),
                      detail::printable(p.rules), detail::printable(p.error));
      continue;
    }
    const auto f = p.fits();
    out += fmt::format("{:<3} {:<34} {:<26} {:>12} {:>6} {:>14} {:>10}\n", i,
                       detail::printable(p.mesh), detail::printable(p.rules),
                       format_bytes(p.peak_bytes), f ? (*f ? "yes" : "NO") : "-",
                       format_bytes(p.bytes_moved()), flops_text(p.flops));
  }
  out += not_modelled_line(plans);
  if (const auto best = cheapest_fitting(plans)) {
    const TrainPlan& p = plans[*best];
    out += fmt::format(
        "cheapest that fits: #{} {} with rules {} ({} moved per device per step, peak {})\n", *best,
        detail::printable(p.mesh), detail::printable(p.rules), format_bytes(p.bytes_moved()),
        format_bytes(p.peak_bytes));
  } else {
    out += kNoneFits;
  }
  return out;
}

}  // namespace shardplan
