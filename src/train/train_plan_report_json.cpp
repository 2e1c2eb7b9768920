// A training plan's JSON (TrainPlan::write_json, --json) and a comparison's
// (write_compare_json, --compare --json): the keys docs/cli.md lists and docs/schemas/ checks.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>

#include "shardplan/train_plan.hpp"
#include "step_time.hpp"

namespace shardplan {

namespace {

// One kind of async TP's pairs (JSON "tp_overlaps"; "time.tp_overlap" adds its times).
nlohmann::ordered_json overlap_json(const TpOverlap& o) {
  return {{"kind", std::string(to_string(o.kind.collective.kind))},
          {"axes", o.kind.collective.axes},
          {"count", o.count},
          {"bytes", o.kind.bytes},
          {"flops", o.kind.flops},
          {"float8", o.kind.float8}};
}

nlohmann::ordered_json time_json(const StepTime& t) {
  std::map<std::string, double> exposed_by_tier;  // by the tiers' names, ordered as they sort
  for (const auto& [tier, s] : t.exposed_by_tier) exposed_by_tier[std::string(name(tier))] = s;
  nlohmann::ordered_json comms = nlohmann::ordered_json::array();
  for (const CommTime& c : t.comms) {
    comms.push_back({{"kind", std::string(to_string(c.collective.kind))},
                     {"axes", c.collective.axes},
                     {"of_weights", c.collective.of_argument},
                     {"tier", std::string(name(c.tier))},
                     {"role", std::string(name(c.role))},
                     {"bytes", c.bytes},
                     {"nics", c.nics},
                     {"seconds", c.seconds},
                     {"overlapped", c.overlapped}});
  }
  nlohmann::ordered_json j{{"hardware", t.hardware},
          {"matmul_seconds", t.matmul_seconds},
          {"attention_seconds", t.attention_seconds},
          {"matmul_fp8_seconds", t.matmul_fp8_seconds},
          {"memory_seconds", t.memory_seconds},
          {"copy_out_seconds", t.copy_out_seconds},
          {"compute_seconds", t.compute_seconds()},
          {"communication", std::move(comms)},
          {"exposed_seconds", t.exposed_seconds},
          {"exposed_by_tier", exposed_by_tier},
          {"exposed_tensor_seconds", t.exposed_tensor_seconds},
          {"step_seconds", t.step_seconds},
          {"tokens_per_second_per_device", t.tokens_per_second_per_device},
          {"model_flops_per_token", t.model_flops_per_token},
          {"mfu", t.mfu}};
  j["dp_overlap"] = t.dp_overlap;
  if (t.dp_overlap == "buckets" || t.dp_overlap == "grad-buckets") {
    j["dp_buckets"] = {{"bucket_size", t.dp_bucket_size},
                       {"elements", t.dp_bucket_elements},
                       {"reduce_seconds", t.dp_reduce_seconds},
                       {"reduce_exposed_seconds", t.dp_reduce_exposed_seconds},
                       {"gather_seconds", t.dp_gather_seconds},
                       {"gather_exposed_seconds", t.dp_gather_exposed_seconds}};
  }
  if (t.dispatch_seconds > 0) {
    j["launched_ops"] = t.launched_ops;
    j["dispatch_seconds_per_op"] = t.dispatch_seconds_per_op;
    j["dispatch_seconds"] = t.dispatch_seconds;
    j["dispatch_exposed_seconds"] = t.dispatch_exposed_seconds;
  }
  if (!t.tp_overlaps.empty()) {
    nlohmann::ordered_json pairs = nlohmann::ordered_json::array();
    for (const TpOverlapTime& o : t.tp_overlaps) {
      nlohmann::ordered_json x = overlap_json(o.pair);
      x["tier"] = std::string(name(o.tier));
      x["group"] = o.group;
      x["comm_seconds"] = o.comm_seconds;
      x["matmul_seconds"] = o.matmul_seconds;
      x["exposed_seconds"] = o.exposed_seconds;
      pairs.push_back(std::move(x));
    }
    j["tp_overlap"] = std::move(pairs);
    j["tp_overlap_hidden_seconds"] = t.tp_overlap_hidden_seconds;
  }
  return j;
}

/// The plan's per-device figures (JSON "per_device").
nlohmann::ordered_json per_device_json(const TrainPlan& p) {
  return {{"parameter_bytes", p.parameter_bytes},
          {"gradient_bytes", p.gradient_bytes},
          {"optimizer_bytes", p.optimizer_bytes},
          {"batch_bytes", p.batch_bytes},
          {"transient_bytes", p.transient_bytes},
          {"peak_held_bytes", p.peak_held_bytes},
          {"peak_gathered_bytes", p.peak_gathered_bytes},
          {"peak_computed_bytes", p.peak_computed_bytes},
          {"peak_bytes", p.peak_bytes},
          // null when not computed (an extrapolated plan without reserved_whole):
          // 0 would read as a figure
          {"reserved_bytes", p.reserved_bytes > 0 ? nlohmann::ordered_json(p.reserved_bytes)
                                                  : nlohmann::ordered_json(nullptr)},
          {"reserved_bytes_expandable",
           p.reserved_bytes_expandable > 0 ? nlohmann::ordered_json(p.reserved_bytes_expandable)
                                           : nlohmann::ordered_json(nullptr)},
          {"flops", p.flops},
          {"matmul_flops", p.matmul_flops},
          {"attention_flops", p.attention_flops},
          {"matmul_fp8_flops", p.matmul_fp8_flops},
          {"memory_traffic_bytes", p.memory_traffic}};
}

// The stack the options came from (--stack) and its config file's keys (--from-config).
nlohmann::ordered_json stack_json(const StackUse& stack) {
  nlohmann::ordered_json j = {{"name", stack.name},
                              {"validated", stack.validated},
                              {"applied", stack.applied},
                              {"overridden", stack.overridden},
                              {"not_modelled", stack.not_modelled}};
  if (!stack.config.empty()) {
    j["config"] = {{"file", stack.config},
                   {"applied", stack.config_applied},
                   {"overridden", stack.config_overridden},
                   {"ignored", stack.config_ignored}};
  }
  return j;
}

// An object keyed by the kinds' names, in their order (the order of the names). The kinds of the
// schema's required keys are always there (0 where the step runs none); the others where it
// runs them.
nlohmann::ordered_json received_json(const TrainPlan& p) {
  std::map<CollectiveKind, std::int64_t> by_kind{{CollectiveKind::kAllGather, 0},
                                                 {CollectiveKind::kAllReduce, 0},
                                                 {CollectiveKind::kAllToAll, 0},
                                                 {CollectiveKind::kReduceScatter, 0}};
  for (const auto& [kind, bytes] : p.bytes_by_collective) by_kind[kind] = bytes;
  nlohmann::ordered_json received = nlohmann::ordered_json::object();
  for (const auto& [kind, bytes] : by_kind) received[std::string(to_string(kind))] = bytes;
  return received;
}

nlohmann::ordered_json to_json(const TrainPlan& p) {
  nlohmann::ordered_json j;
  if (!p.error.empty()) {
    j["mesh"] = p.mesh;
    j["rules"] = p.rules;
    j["error"] = p.error;
    j["fits"] = nullptr;
    return j;
  }
  j["model"] = p.model;
  j["mesh"] = p.mesh;
  j["devices"] = p.devices;
  j["rules"] = p.rules;
  if (!p.rules_note.empty()) j["rules_note"] = p.rules_note;
  j["not_modelled"] = p.not_modelled;
  j["parameter_count"] = p.parameter_count;
  j["active_parameter_count"] = p.active_parameter_count;
  j["batch"] = p.batch;
  j["seq"] = p.seq;
  if (p.target_seq > 0) j["target_seq"] = p.target_seq;
  j["batch_axes"] = p.batch_axes;
  j["grad_accum"] = p.grad_accum;
  j["recompute"] = p.recompute;
  j["remat"] = p.remat;
  j["reshard_after_forward"] = p.reshard_after_forward;
  j["kept_gathered_for_recompute"] = p.kept_gathered_for_recompute;
  j["remat_blocks"] = p.remat_blocks;
  j["remat_layers"] = p.remat_layers;
  j["last_block_kept_gathered"] = p.last_block_kept_gathered;
  j["float8"] = p.float8;
  j["float8_recipe"] = p.float8 ? nlohmann::ordered_json(p.float8_recipe) : nlohmann::ordered_json();
  j["float8_all_gather"] =
      p.float8 ? nlohmann::ordered_json(p.float8_all_gather) : nlohmann::ordered_json();
  j["loss"] = p.fused_loss ? "fused" : "naive";
  j["loss_dtype"] = name(p.loss_dtype);
  j["attention"] = p.fused_attention ? "fused" : "naive";
  j["eager"] = p.eager;
  j["optimizer_kernel"] = p.optimizer_kernel;
  j["optimizer_sharding"] = p.optimizer_sharding;
  j["fsdp_root"] = p.fsdp_root;
  j["tp_plan"] = p.tp_modules ? "modules" : "partitioner";
  if (!p.tp_overlaps.empty()) {
    j["tp_overlaps"] = nlohmann::ordered_json::array();
    for (const TpOverlap& o : p.tp_overlaps) j["tp_overlaps"].push_back(overlap_json(o));
  }
  if (p.stack) j["stack"] = stack_json(*p.stack);
  j["sequence_parallel"] = p.sequence_parallel;
  j["sequence_axes"] = p.sequence_axes;
  j["context_axes"] = p.context_axes;
  const bool ring = !p.context_axes.empty() && p.context_kernel == ContextKernel::kRing;
  j["context_rotate"] = !ring ? nlohmann::ordered_json(nullptr)
                              : nlohmann::ordered_json(p.context_gathered ? "allgather" : "permute");
  j["context_kernel"] = p.context_axes.empty()
                            ? nlohmann::ordered_json(nullptr)
                            : nlohmann::ordered_json(std::string(name(p.context_kernel)));
  j["optimizer"] = p.optimizer;
  j["param_dtype"] = std::string(name(p.param_dtype));
  j["grad_dtype"] = std::string(name(p.grad_dtype));
  j["optimizer_dtype"] = std::string(name(p.optimizer_dtype));
  j["master_dtype"] = std::string(name(p.master_dtype));
  j["reduce_dtype"] = std::string(name(p.reduce_dtype));
  j["per_device"] = per_device_json(p);
  j["bytes_received_per_device"] = received_json(p);
  j["bytes_moved_per_device"] = p.bytes_moved();
  j["total_flops"] = p.total_flops;
  if (const auto f = p.fits()) {
    j["device_memory"] = p.device_memory;
    j["headroom"] = p.headroom;
    j["usable_bytes"] = p.usable_bytes();
    j["fits"] = *f;
  } else {
    j["fits"] = nullptr;
  }
  if (p.time) j["time"] = time_json(*p.time);
  j["seconds_to_plan"] = p.seconds_to_plan;
  j["extrapolated"] = p.extrapolated;
  j["traced"] = p.traced;
  return j;
}

/// Mesh axes and file names come from the user and need not be UTF-8: invalid bytes become
/// U+FFFD rather than an exception from the writer.
std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

void TrainPlan::write_json(std::ostream& os) const { os << dump(to_json(*this)); }

void write_compare_json(std::ostream& os, const std::vector<TrainPlan>& plans) {
  nlohmann::ordered_json j;
  j["plans"] = nlohmann::ordered_json::array();
  for (const TrainPlan& p : plans) j["plans"].push_back(to_json(p));
  const auto index = [](std::optional<std::size_t> i) {
    return i ? nlohmann::ordered_json(*i) : nlohmann::ordered_json(nullptr);
  };
  j["cheapest_fitting"] = index(cheapest_fitting(plans));
  const bool timed =
      std::any_of(plans.begin(), plans.end(), [](const TrainPlan& p) { return p.time.has_value(); });
  if (timed) {
    const auto best = fastest_fitting(plans);
    j["fastest_fitting"] = index(best);
    nlohmann::ordered_json why = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < plans.size(); ++i) {
      why.push_back(best && *best == i ? "fastest"
                    : best             ? why_slower(plans[i], plans[*best])
                                       : why_slower(plans[i], plans[i]));
    }
    j["why_not_fastest"] = std::move(why);
  }
  os << dump(j);
}

}  // namespace shardplan
