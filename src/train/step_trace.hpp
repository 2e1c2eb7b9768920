#pragma once
// One training step traced under sjit on TensorSpecs and lowered for a mesh: the step's cost
// read off the compiled program (plan_training's one source of figures). Private to the library.

#include <cstdint>
#include <map>
#include <string>

#include "model_step.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/sharding_rule.hpp"
#include "shardplan/train_plan.hpp"
#include "step_scaling.hpp"

namespace shardplan::train {

/// What a traced step's program holds, read from its operations (Lowered::ops): the report
/// says these, never the options asked for.
struct ProgramFacts {
  bool fused_attention = false;  // it holds the fused attention primitive ("attention")
  bool fused_loss = false;       // it holds linear_cross_entropy's ops (their named scope)
  /// The dtype of the loss it returns (its "loss" output): that of the log-probabilities its
  /// cross-entropy reads the targets from (the logits' copy, or the logits as computed).
  DType loss_dtype = DType::kF32;
  bool float8 = false;           // it holds float8 products ("scaled_dot")
  /// With float8, its products' scales: "tensorwise" (all scalars), "rowwise" (all per row),
  /// "rowwise_with_gw_hp" (a product with one of each: rowwise_with_gw_hp's dx). Empty: none.
  std::string float8_recipe;
  /// With float8, the dtype its gathers of arguments (weights) move: "float8" when some is in a
  /// float8 dtype, else the gathers' ("bf16"); "none" when it gathers no argument.
  std::string float8_all_gather;
  /// How it updates: "fused" (it holds "adamw_update"), "foreach" ("adamw_foreach") or "ops".
  std::string optimizer_kernel = "ops";
  /// The model (not batch, not context) axes its annotated norm and residual regions split the
  /// sequence (their dimension 1) over: Megatron's sequence parallelism. Empty: none.
  AxisNames sequence_axes;
  /// The axes the tokens' sequence is split over, when the program exchanges key/value blocks
  /// by ring (ppermute): context parallelism. Empty: none.
  AxisNames context_axes;
  /// The ring's key/value blocks are all-gathered (its ops hold an all-gather: RingRotate::
  /// kAllGather), not passed round by ppermute.
  bool context_gathered = false;
  /// The kernel of context parallelism's attention, from the composite its ops belong to.
  ContextKernel context_kernel = ContextKernel::kRing;
  /// It uses some layer weight in its model-axis split (TpPlan::kModules).
  bool tp_modules = false;
  /// It takes some parameter replicated over a batch or context axis of more than one device
  /// that the optimizer state is split over (OptimizerSharding::kZero1).
  bool zero1 = false;
  friend bool operator==(const ProgramFacts&, const ProgramFacts&) = default;
};

/// What one trace of the step gives: the figures that grow with the layers and micro-batches,
/// and the state each device holds (from the traced program's input shardings).
struct TracedStep {
  StepFigures figures;
  std::int64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
  /// The live bytes over the step, its values at the peak named for the step.
  MemoryTimeline timeline;
  ProgramFacts facts;
};

/// How the step takes the parameters: the rules, or under OptimizerSharding::kZero1 each
/// parameter's spec with only the model axes kept (whole over the batch and context axes).
RuleTree held_parameter_rule(const Tree<TensorSpec>& params, const Mesh& mesh,
                             const RulePtr& rules, const TrainPlanOptions& o, const Layout& layout);

/// Refuses OptimizerSharding::kZero1 (OptionError, Refusal::kZero1NothingToShard) when it
/// would shard nothing: the rules split no parameter over a batch or context axis of more than
/// one device, or SGD holds no state and no master weights.
void check_optimizer_sharding(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                              const TrainPlanOptions& o, const Layout& layout);

/// Refuses TpPlan::kModules given by the caller (OptionError, Refusal::kTpPlanNoModelSplit)
/// when the rules split no layer weight over a model axis of more than one device: the modules
/// would use nothing in a split. A stack's setting (stack_sets) is its default there instead.
void check_tp_plan(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                   const TrainPlanOptions& o, const Layout& layout);

/// Refuses DpOverlap::kBuckets and kGradBuckets (OptionError, Refusal::kDpBucketsSharded)
/// when the rules split a parameter over a data axis of more than one device without ZeRO-1.
void check_dp_overlap(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                      const TrainPlanOptions& o, const Layout& layout);

/// The elements a data-parallel bucket closes at: TrainPlanOptions::dp_bucket_size, else
/// Megatron's default max(40,000,000, 1,000,000 x the batch axes' devices).
std::int64_t dp_bucket_size(const TrainPlanOptions& o, const Layout& layout);

/// Megatron's DDP buckets (docs/training.md "Step time"): the parameters in the model's order
/// walked backwards, each device's elements of each (the rules' split over the axes that are
/// not batch or context axes) added to the open bucket, which closes once it holds
/// `bucket_size` or more. Each bucket's elements, in that order (the last: the first layers').
std::vector<std::int64_t> dp_buckets(const ModelConfig& config, const Mesh& mesh,
                                     const RulePtr& rules, const TrainPlanOptions& o,
                                     const Layout& layout, std::int64_t bucket_size);

/// "the 8-layer sample step", "the 4-layer x 2 micro-batch sample step".
std::string sample_name(std::int64_t layers, std::int64_t micro_batches);

/// Whether the step gathers the weights of the layers that are no checkpoints again for the
/// backward pass (TrainPlanOptions::reshard_after_forward, with batch axes to gather over and
/// such a layer among `layers`).
bool reshards_after_forward(const TrainPlanOptions& o, const Layout& layout, std::int64_t layers);
/// Whether the recomputation reads the weights the forward pass gathered, kept to the backward
/// pass (TrainPlanOptions::reshard_after_forward false, with batch axes and a checkpoint among
/// `layers`).
bool keeps_gathered_for_recompute(const TrainPlanOptions& o, const Layout& layout,
                                  std::int64_t layers);
/// Whether the last layer keeps its gathered weights from its forward to its backward pass
/// (TrainPlanOptions::reshard_last_block resolved, with batch or context axes).
bool keeps_last_gathered(const TrainPlanOptions& o, const Layout& layout);
/// Whether FSDP2's root module is modelled (TrainPlanOptions::fsdp_root, with batch or context
/// axes the weights are sharded over).
bool fsdp_root_applies(const TrainPlanOptions& o, const Layout& layout);

/// Traces the whole step of `config` with `o.grad_accum` micro-batches and lowers it for `mesh`.
/// `annotations`: the shardings of the layers' named activations (Layout::annotate).
/// Throws as sjit's lower() does (a rule no tensor matches, a shape that does not divide).
TracedStep trace_step(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                      const TrainPlanOptions& o, const Layout& layout,
                      const std::map<std::string, RuleTree>& annotations = {});

}  // namespace shardplan::train
