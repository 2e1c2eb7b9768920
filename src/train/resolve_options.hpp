#pragma once
// train-plan's options resolved against what the model family's step and the mesh support: each
// option either applies to the planned program or is refused with an OptionError naming it (the
// closed list of train_plan_refusals(), docs/cli.md). Private to the library.
#include <cstddef>
#include <string>
#include <string_view>

#include "model_step.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/train_plan.hpp"

namespace shardplan::train {

/// The refusals, in train_plan_refusals()'s order (an index into it).
enum class Refusal : std::size_t {
  kEmptyValue,
  kMixedPrecisionDtypes,
  kMixedPrecisionOptimizerDtype,
  kHeadroomWithoutMemory,
  kTargetSeqDecoderOnly,
  kContextFamily,
  kContextAxes,
  kContextWindow,
  kContextNaiveAttention,
  kFusedAttentionFamily,
  kFusedLossFamily,
  kFusedLossNoGroups,
  kSequenceParallelUnmapped,
  kSequenceParallelSplit,
  kFloat8Family,
  kFloat8Dtype,
  kFloat8Hardware,
  kRematFamily,
  kFsdpRootFamily,
  kFusedAttentionSoftcap,
  kFusedLossSoftcap,
  kContextSoftcap,
  kRematBlocksWithoutRemat,
  kRematBlocksPastLayers,
  kReshardLastBlockFamily,
  kFusedOptimizerSgd,
  kForeachOptimizerSgd,
  kZero1NothingToShard,
  kTpPlanNoModelSplit,
  kCpRotateNoContext,
  kAsyncTpModelAxis,
  kAsyncTpPlan,
  kAsyncTpEager,
  kCpRotateNotRing,
  kUlyssesHeads,
  kCpKernelNoContext,
  kFloat8RecipeWithoutFloat8,
  kFloat8GatherRowwise,
  kDpOverlapWithoutHardware,
  kDpBucketSizeWithoutBuckets,
  kDpGradBucketsWithoutZero1,
  kDpBucketsSharded,
  kLossDtypeFamily,
  kLossDtypeFused,
  kLossDtypeLogits,
  kCount
};

/// Throws OptionError for `r`: "[train] OPTION (VALUES) is refused: CONDITION; REASON".
[[noreturn]] void refuse(Refusal r, const std::string& values);

/// Whether `o`'s stack (apply_stack) set `option` ("--tp-plan"), rather than the caller.
bool stack_sets(const TrainPlanOptions& o, std::string_view option);

/// What one model family's training step can run: one record per family.
struct FamilySupport {
  bool decoder_only = true;      // one sequence (no --target-seq)
  bool ring_attention = true;    // context parallelism (its attention by ring)
  bool fused_attention = true;   // dot_product_attention
  bool fused_loss = true;        // linear_cross_entropy
  bool annotated_regions = true; // norm and residual regions (sequence parallelism)
  bool float8 = true;            // float8 linear layers
  bool remat = true;             // each layer a checkpoint
  bool fsdp_root = true;         // FSDP2's root module
};
const FamilySupport& support_of(const ModelConfig& config);

/// The float8 all-gather dtype the step runs with (TrainPlanOptions::float8_all_gather, or its
/// default for the recipe).
Float8Gather effective_float8_gather(const TrainPlanOptions& o);

/// The values the options take alone (positive sizes, a headroom fraction, GPT-2's positions)
/// and the combinations with the family that cannot apply. Throws SpecError / OptionError.
void check_options(const ModelConfig& config, const TrainPlanOptions& o);

/// The options as the step will run them on `layout`: fused_attention and fused_loss decided
/// where not given, sequence_parallel decided (off where the sequence cannot split), a stack's
/// loss_dtype dropped where it cannot apply, and every option that cannot apply on this mesh
/// refused (OptionError).
TrainPlanOptions resolve_options(const ModelConfig& config, const Mesh& mesh, const Layout& layout,
                                 const TrainPlanOptions& o);

}  // namespace shardplan::train
