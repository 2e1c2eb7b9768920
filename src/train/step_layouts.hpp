#pragma once
// How the training step uses and holds each parameter (step_layouts.cpp): the layouts the
// traced step pins (FSDP2's root module, float8 weights gathered in bf16, the tensor-parallel
// modules' splits) and ZeRO-1's holding. Private to src/train.
#include <map>
#include <string>
#include <vector>

#include "model_step.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/sharding_rule.hpp"
#include "shardplan/tensor_spec.hpp"
#include "shardplan/tree.hpp"

namespace shardplan::train {

/// Whether `a` is one of `axes`.
bool has_axis(const AxisNames& axes, const std::string& a);

/// The data (batch and context) axes of more than one device `spec` splits over.
AxisNames data_axes_of(const PartitionSpec& spec, const Layout& layout, const Mesh& mesh);

/// FSDP2's root module's parameters (all but the layers') as FSDP gathers them.
std::map<std::string, PartitionSpec> root_in_use(const ModelConfig& config, const Mesh& mesh,
                                                 const RulePtr& rules,
                                                 const Tree<TensorSpec>& params,
                                                 const Layout& layout);

/// Float8 gathered in bf16: per layer, each Linear weight `in_use` does not lay out, as FSDP
/// gathers it, by its path in the layer.
std::vector<std::map<std::string, PartitionSpec>> layer_gathered(
    const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
    const Tree<TensorSpec>& params, const Layout& layout,
    const std::vector<std::map<std::string, PartitionSpec>>& in_use);

/// The parameters as ZeRO-1 holds them: each one's spec (the rules') with only the model axes
/// kept (replicated over the batch and context axes).
RuleTree data_replicated(const Tree<TensorSpec>& params, const Mesh& mesh, const RulePtr& rules,
                         const Layout& layout);

/// TpPlan::kModules: per layer, each layer weight the rules split over a model axis, as the
/// column- and row-parallel modules use it, by its path in the layer.
std::vector<std::map<std::string, PartitionSpec>> layer_in_use(const ModelConfig& config,
                                                               const Mesh& mesh,
                                                               const RulePtr& rules,
                                                               const Tree<TensorSpec>& params,
                                                               const Layout& layout);

/// TpPlan::kModules: the parameters outside the layers split over a model axis (the embedding,
/// the head), by path, as the vocabulary-parallel modules use them.
std::map<std::string, PartitionSpec> outside_in_use(const ModelConfig& config, const Mesh& mesh,
                                                    const RulePtr& rules,
                                                    const Tree<TensorSpec>& params,
                                                    const Layout& layout);

}  // namespace shardplan::train
