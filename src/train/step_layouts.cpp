// How the step uses and holds each parameter: as FSDP gathers it (root module, float8 gathered
// in bf16), as the tensor-parallel modules use it (TpPlan::kModules), as ZeRO-1 holds it, and the
// settings of FSDP's wrapping that apply (step_layouts.hpp, step_trace.hpp).
#include "step_layouts.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "families/config_parts.hpp"
#include "model_family.hpp"
#include "resolve_options.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "step_trace.hpp"

namespace shardplan::train {

bool has_axis(const AxisNames& axes, const std::string& a) {
  return std::find(axes.begin(), axes.end(), a) != axes.end();
}

/// The data (batch and context) axes of more than one device `spec` splits over.
AxisNames data_axes_of(const PartitionSpec& spec, const Layout& layout, const Mesh& mesh) {
  AxisNames out;
  for (const AxisNames& d : spec.dims()) {
    for (const std::string& a : d) {
      if ((has_axis(layout.batch, a) || has_axis(layout.context, a)) && mesh.axis_size(a) > 1) {
        out.push_back(a);
      }
    }
  }
  return out;
}


namespace {
// Calls f(path, t) for each parameter outside the layers (the embedding, the norms, the head).
template <class F>
void for_each_outside(const ModelConfig& config, const Tree<TensorSpec>& params, F&& f) {
  const std::string layers = config.layers_path() + "/";
  for (const auto& [path, t] : params.flatten()) {
    if (path.rfind(layers, 0) != 0) f(path, t);
  }
}

// Calls f(i, key, path, t) for each parameter of layer i (key: its path in the layer,
// "self_attn/q_proj/weight").
template <class F>
void for_each_in_layers(const ModelConfig& config, const Tree<TensorSpec>& params, F&& f) {
  const std::string layers = config.layers_path() + "/";
  for (const auto& [path, t] : params.flatten()) {
    if (path.rfind(layers, 0) != 0) continue;
    const std::string rest = path.substr(layers.size());  // "0/self_attn/q_proj/weight"
    const std::size_t slash = rest.find('/');
    f(static_cast<std::size_t>(std::stoul(rest.substr(0, slash))), rest.substr(slash + 1), path,
      t);
  }
}

// The spec the rules give a parameter with only the mesh axes `keep(axis)` accepts.
template <class Keep>
PartitionSpec rules_spec_keeping(const std::string& path, const TensorSpec& t, const Mesh& mesh,
                                 const RulePtr& rules, Keep&& keep) {
  std::vector<AxisNames> dims;
  for (const AxisNames& d : rules->apply(RuleInput{path, t, mesh}).spec.dims()) {
    AxisNames kept;
    for (const std::string& a : d) {
      if (keep(a)) kept.push_back(a);
    }
    dims.push_back(std::move(kept));
  }
  return PartitionSpec(std::move(dims));
}

// A parameter's spec (the rules') without the batch and context axes: as FSDP gathers it.
PartitionSpec gathered_spec(const std::string& path, const TensorSpec& t, const Mesh& mesh,
                            const RulePtr& rules, const Layout& layout) {
  return rules_spec_keeping(path, t, mesh, rules, [&](const std::string& a) {
    return !has_axis(layout.batch, a) && !has_axis(layout.context, a);
  });
}

// A parameter's spec (the rules') with only the model axes kept: how the column-, row- and
// vocabulary-parallel modules use it (gathered over the data axes, never over the model axes).
// None when no model axis of more than one device splits it.
std::optional<PartitionSpec> model_split(const std::string& path, const TensorSpec& t,
                                         const Mesh& mesh, const RulePtr& rules,
                                         const Layout& layout) {
  bool split = false;
  PartitionSpec spec = rules_spec_keeping(path, t, mesh, rules, [&](const std::string& a) {
    if (!has_axis(layout.model, a)) return false;
    split = split || mesh.axis_size(a) > 1;
    return true;
  });
  if (!split) return std::nullopt;
  return spec;
}

// Grows `per_layer` to hold layer i.
template <class T>
T& at_layer(std::vector<T>& per_layer, std::size_t i) {
  if (per_layer.size() <= i) per_layer.resize(i + 1);
  return per_layer[i];
}
}  // namespace

// FSDP2's root module's parameters (all but the layers') as FSDP gathers them (gathered_spec).
std::map<std::string, PartitionSpec> root_in_use(const ModelConfig& config, const Mesh& mesh,
                                                 const RulePtr& rules,
                                                 const Tree<TensorSpec>& params,
                                                 const Layout& layout) {
  std::map<std::string, PartitionSpec> out;
  for_each_outside(config, params, [&](const std::string& path, const TensorSpec& t) {
    out.emplace(path, gathered_spec(path, t, mesh, rules, layout));
  });
  return out;
}

// Float8 gathered in bf16: per layer, each weight of rank 2 (a Linear's) that `in_use` does not
// lay out, as FSDP gathers it (gathered_spec), by its path in the layer.
std::vector<std::map<std::string, PartitionSpec>> layer_gathered(
    const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
    const Tree<TensorSpec>& params, const Layout& layout,
    const std::vector<std::map<std::string, PartitionSpec>>& in_use) {
  std::vector<std::map<std::string, PartitionSpec>> out;
  for_each_in_layers(config, params, [&](std::size_t i, const std::string& key,
                                          const std::string& path, const TensorSpec& t) {
    if (t.shape.rank() != 2) return;
    auto& layer = at_layer(out, i);
    if (i < in_use.size() && in_use[i].count(key) != 0) return;
    layer.emplace(key, gathered_spec(path, t, mesh, rules, layout));
  });
  return out;
}

RuleTree data_replicated(const Tree<TensorSpec>& params, const Mesh& mesh, const RulePtr& rules,
                         const Layout& layout) {
  return params.map_with_path([&](const std::string& path, const TensorSpec& t) -> RuleLeaf {
    if (auto spec = model_split(path, t, mesh, rules, layout)) return std::move(*spec);
    return Replicated{};
  });
}

// TpPlan::kModules: each layer weight the rules split over a model axis, as the column- and
// row-parallel modules use it (model_split), by its path in the layer; per layer (a rule may
// match one layer's weights only).
std::vector<std::map<std::string, PartitionSpec>> layer_in_use(const ModelConfig& config,
                                                               const Mesh& mesh,
                                                               const RulePtr& rules,
                                                               const Tree<TensorSpec>& params,
                                                               const Layout& layout) {
  std::vector<std::map<std::string, PartitionSpec>> out;
  for_each_in_layers(config, params, [&](std::size_t i, const std::string& key,
                                          const std::string& path, const TensorSpec& t) {
    auto& layer = at_layer(out, i);
    if (auto spec = model_split(path, t, mesh, rules, layout)) layer.emplace(key, std::move(*spec));
  });
  return out;
}

// TpPlan::kModules: the parameters outside the layers the rules split over a model axis (the
// embedding, the head), by path, as the vocabulary-parallel modules use them (model_split).
std::map<std::string, PartitionSpec> outside_in_use(const ModelConfig& config, const Mesh& mesh,
                                                    const RulePtr& rules,
                                                    const Tree<TensorSpec>& params,
                                                    const Layout& layout) {
  std::map<std::string, PartitionSpec> out;
  for_each_outside(config, params, [&](const std::string& path, const TensorSpec& t) {
    if (auto spec = model_split(path, t, mesh, rules, layout)) out.emplace(path, std::move(*spec));
  });
  return out;
}

// ZeRO-1 holds the parameters whole over the data axes: nothing is gathered for use, so FSDP's
// wrapping and resharding settings do not apply.
namespace {
bool zero1_of(const TrainPlanOptions& o) { return o.optimizer_sharding == OptimizerSharding::kZero1; }
}  // namespace

bool fsdp_root_applies(const TrainPlanOptions& o, const Layout& layout) {
  return !zero1_of(o) && o.fsdp_root && layout.batch_ways * layout.context_ways > 1;
}

bool keeps_last_gathered(const TrainPlanOptions& o, const Layout& layout) {
  return !zero1_of(o) && !o.reshard_last_block.value_or(!o.fsdp_root) &&
         layout.batch_ways * layout.context_ways > 1;
}

bool reshards_after_forward(const TrainPlanOptions& o, const Layout& layout, std::int64_t layers) {
  const std::vector<bool> c = checkpointed_layers(o, layers);
  return !zero1_of(o) && o.reshard_after_forward && layout.batch_ways > 1 &&
         (c.empty() || std::find(c.begin(), c.end(), false) != c.end());
}

bool keeps_gathered_for_recompute(const TrainPlanOptions& o, const Layout& layout,
                                  std::int64_t layers) {
  const std::vector<bool> c = checkpointed_layers(o, layers);
  return !zero1_of(o) && !o.reshard_after_forward && layout.batch_ways > 1 &&
         std::find(c.begin(), c.end(), true) != c.end();
}

RuleTree held_parameter_rule(const Tree<TensorSpec>& params, const Mesh& mesh,
                             const RulePtr& rules, const TrainPlanOptions& o,
                             const Layout& layout) {
  return zero1_of(o) ? data_replicated(params, mesh, rules, layout) : RuleTree(rules);
}

void check_optimizer_sharding(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                              const TrainPlanOptions& o, const Layout& layout) {
  if (o.optimizer_sharding != OptimizerSharding::kZero1) return;
  if (o.optimizer == OptimizerKind::kSgd && !o.master_dtype) {
    refuse(Refusal::kZero1NothingToShard,
           "SGD keeps no optimizer state and, without --master-dtype, no master weights: plan it "
           "with --optimizer-sharding rules");
  }
  for (const auto& [path, t] : config.parameters(o.param_dtype).flatten()) {
    if (!data_axes_of(rules->apply(RuleInput{path, t, mesh}).spec, layout, mesh).empty()) return;
  }
  AxisNames data = layout.batch;
  data.insert(data.end(), layout.context.begin(), layout.context.end());
  const std::string axes =
      data.empty() ? std::string("the mesh has no batch or context axis")
                   : fmt::format("the batch and context axes are [{}]", fmt::join(data, ", "));
  refuse(Refusal::kZero1NothingToShard,
         fmt::format("{} split no parameter over a data axis of the mesh {} ({}), so the state "
                     "would be replicated as the parameters are: give rules that shard over a "
                     "data axis (e.g. fsdp) or plan it with --optimizer-sharding rules",
                     detail::printable(rules->name()), detail::printable(mesh.to_string()),
                     detail::printable(axes)));
}

void check_tp_plan(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                   const TrainPlanOptions& o, const Layout& layout) {
  if (o.tp_plan != TpPlan::kModules || stack_sets(o, "--tp-plan")) return;
  const Tree<TensorSpec> params = config.parameters(o.param_dtype);
  const auto in_use = layer_in_use(config, mesh, rules, params, layout);
  if (pins_some_layer(in_use)) return;
  const std::string axes =
      layout.model.empty()
          ? std::string("it has no tensor-parallel axis")
          : fmt::format("its tensor-parallel axes are [{}]", fmt::join(layout.model, ", "));
  refuse(Refusal::kTpPlanNoModelSplit,
         fmt::format("{} split no layer weight over a tensor-parallel axis of more than one "
                     "device of the mesh {} ({}), so the column- and row-parallel modules would "
                     "split nothing: plan it without --tp-plan modules, or with rules and a mesh "
                     "that split the layers over a model axis (e.g. tp)",
                     detail::printable(rules->name()), detail::printable(mesh.to_string()),
                     detail::printable(axes)));
}

void check_dp_overlap(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                      const TrainPlanOptions& o, const Layout& layout) {
  const DpOverlap overlap = o.dp_overlap.value_or(DpOverlap::kFsdp);
  if ((overlap != DpOverlap::kBuckets && overlap != DpOverlap::kGradBuckets) ||
      o.optimizer_sharding == OptimizerSharding::kZero1) {
    return;
  }
  for (const auto& [path, t] : config.parameters(o.param_dtype).flatten()) {
    const AxisNames data = data_axes_of(rules->apply(RuleInput{path, t, mesh}).spec, layout, mesh);
    if (data.empty()) continue;
    refuse(Refusal::kDpBucketsSharded,
           fmt::format("{} split '{}' over [{}] of the mesh {}: FSDP gathers it layer by layer, "
                       "and the buckets of Megatron's DDP hold whole (replicated) parameters: "
                       "plan it with --dp-overlap fsdp, with --optimizer-sharding zero1, or "
                       "with rules that replicate the parameters over the data axes",
                       detail::printable(rules->name()), detail::printable(path),
                       detail::printable(fmt::format("{}", fmt::join(data, ", "))),
                       detail::printable(mesh.to_string())));
  }
}

std::int64_t dp_bucket_size(const TrainPlanOptions& o, const Layout& layout) {
  // megatron/core/distributed/distributed_data_parallel.py (d98e8a6),
  // DistributedDataParallel.__init__: max(40000000, 1000000 * dp_group.size()).
  if (o.dp_bucket_size > 0) return o.dp_bucket_size;
  return std::max<std::int64_t>(40'000'000, 1'000'000 * layout.batch_ways);
}

std::vector<std::int64_t> dp_buckets(const ModelConfig& config, const Mesh& mesh,
                                     const RulePtr& rules, const TrainPlanOptions& o,
                                     const Layout& layout, std::int64_t bucket_size) {
  // The parameters in the model's order (the family adds them so), walked backwards as the
  // backward pass produces their gradients; each device's elements: the rules' split over the
  // axes that are not data axes (over those Megatron's DDP holds them whole).
  NamedSpecs named{o.param_dtype, {}};
  config.family->add_parameters(config, named);
  std::vector<std::int64_t> buckets;
  std::int64_t open = 0;
  bool any = false;
  for (auto it = named.named.rbegin(); it != named.named.rend(); ++it) {
    const TensorSpec& t = it->second;
    const PartitionSpec spec = rules->apply(RuleInput{tree_path_of_name(it->first), t, mesh}).spec;
    const std::vector<std::int64_t> dims = t.shape.dims();
    std::int64_t elements = 1;
    for (std::size_t d = 0; d < dims.size(); ++d) {
      std::int64_t ways = 1;
      if (d < spec.dims().size()) {
        for (const std::string& a : spec.dims()[d]) {
          if (!has_axis(layout.batch, a) && !has_axis(layout.context, a)) {
            ways *= mesh.axis_size(a);
          }
        }
      }
      const std::int64_t n = dims[d];
      elements *= (n + ways - 1) / ways;  // a padded shard's rows
    }
    open += elements;
    any = true;
    // param_and_grad_buffer.py _compute_default_per_buffer_param_layout: a bucket closes once
    // it holds bucket_size elements or more.
    if (open >= bucket_size) {
      buckets.push_back(open);
      open = 0;
      any = false;
    }
  }
  if (any) buckets.push_back(open);
  return buckets;
}

}  // namespace shardplan::train
