#pragma once
// What several declared stacks set alike (training_stack.hpp): each setting once, as a function
// a StackChoice points at, with the options that override it. Private to the library.
#include <string_view>
#include <vector>

#include "shardplan/train_plan.hpp"
#include "shardplan/training_stack.hpp"

namespace shardplan::train::stacks {

/// `a`'s choices, then `b`'s.
inline std::vector<StackChoice> joined(std::vector<StackChoice> a, std::vector<StackChoice> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// The options that set the step's dtypes: one given overrides a stack's precision choice.
inline const std::vector<std::string_view> kDtypeOptions = {"--mixed-precision", "--master-dtype",
                                                            "--reduce-dtype",    "--grad-dtype",
                                                            "--optimizer-dtype", "--param-dtype"};
inline const std::vector<std::string_view> kRematOptions = {"--remat", "--recompute"};

/// FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32) over f32 parameters:
/// --mixed-precision fsdp2.
inline void fsdp2_mixed_precision(TrainPlanOptions& o) {
  o.param_dtype = DType::kBF16;
  o.master_dtype = o.reduce_dtype = DType::kF32;
  o.grad_dtype = o.optimizer_dtype = DType::kF32;
}

/// FSDP1's MixedPrecision(param_dtype=bf16, reduce_dtype=bf16) over f32 flat parameters: held
/// and updated in f32, gathered and computed in bf16, gradients reduced in bf16 and kept in f32
/// (the sharded flat parameter's gradient).
inline void fsdp1_bf16_mixed_precision(TrainPlanOptions& o) {
  o.param_dtype = DType::kBF16;
  o.master_dtype = DType::kF32;
  o.reduce_dtype = DType::kBF16;
  o.grad_dtype = o.optimizer_dtype = DType::kF32;
}

/// Each block a checkpoint that keeps only its input (--remat full).
inline void full_remat(TrainPlanOptions& o) { o.remat = parse_remat("full"); }
/// No activation checkpointing (--remat none).
inline void no_remat(TrainPlanOptions& o) { o.remat = parse_remat("none"); }
inline void compiled(TrainPlanOptions& o) { o.eager = false; }
inline void naive_loss(TrainPlanOptions& o) { o.fused_loss = false; }
/// The naive loss on the bf16 logits as computed, no float32 copy (--loss-dtype bf16), or on a
/// float32 copy of them (--loss-dtype f32).
inline void bf16_loss(TrainPlanOptions& o) { o.loss_dtype = DType::kBF16; }
inline void f32_copy_loss(TrainPlanOptions& o) { o.loss_dtype = DType::kF32; }
inline void fused_attention(TrainPlanOptions& o) { o.fused_attention = true; }
inline void own_units(TrainPlanOptions& o) { o.fsdp_root = false; }
inline void reshard_after_forward(TrainPlanOptions& o) { o.reshard_after_forward = true; }
inline void adamw(TrainPlanOptions& o) { o.optimizer = OptimizerKind::kAdamw; }
/// Column/row-parallel modules: layer weights used in their model-axis split (--tp-plan modules).
inline void tp_modules(TrainPlanOptions& o) { o.tp_plan = TpPlan::kModules; }
/// No async tensor parallelism (--async-tp off: the stacks' default).
inline void no_async_tp(TrainPlanOptions& o) { o.async_tp = false; }
inline void cp_allgather(TrainPlanOptions& o) { o.cp_rotate = RingRotate::kAllGather; }
inline void cp_permute(TrainPlanOptions& o) { o.cp_rotate = RingRotate::kPermute; }
inline void cp_allgather_kv(TrainPlanOptions& o) { o.cp_kernel = ContextKernel::kAllGatherKv; }
/// The options that override a stack's context-parallel choice: the kernel or the ring's
/// rotation.
inline const std::vector<std::string_view> kContextOptions = {"--cp-rotate", "--cp-kernel"};

// torchtitan's context parallelism: PyTorch's ring attention with its rotate method, "allgather"
// by default, `source` naming the option at the stack's commit.
inline StackChoice cp_rotate_allgather(std::string_view source) {
  return {.topic = "context parallelism",
          .what = "context_parallel_rotate_method \"allgather\" (the default): the key/value "
                  "shards all-gathered once per attention, forward and backward, their "
                  "gradients sent round the ring",
          .source = source,
          .setting = "--cp-rotate allgather",
          .options = kContextOptions,
          .apply = cp_allgather};
}
// Choices several stacks make, each with its own words and source (string literals: a choice
// keeps views of them).

/// The optimizer's kernel when it is a loop over the parameters: not modelled.
inline StackChoice optimizer_kernel(std::string_view what, std::string_view source) {
  return {.topic = "optimizer kernel",
          .what = what,
          .source = source,
          .setting =
              "not modelled: the update is planned as the program's elementwise ops "
              "(--optimizer-kernel ops: one kernel per chain when compiled, per op with "
              "--eager), not as its in-place passes one parameter at a time",
          .options = {},
          .apply = nullptr};
}
/// torch's foreach AdamW (_multi_tensor_adamw: its default on CUDA when neither fused nor
/// foreach is given): --optimizer-kernel foreach.
inline StackChoice foreach_optimizer_kernel(std::string_view what, std::string_view source) {
  return {.topic = "optimizer kernel",
          .what = what,
          .source = source,
          .setting = "--optimizer-kernel foreach",
          .options = {"--optimizer-kernel"},
          .apply = [](TrainPlanOptions& o) { o.optimizer_kernel = OptimizerKernel::kForeach; }};
}
/// A fused Adam(W) kernel (torch's fused=True, Apex's or Transformer Engine's FusedAdam):
/// --optimizer-kernel fused.
inline StackChoice fused_optimizer_kernel(std::string_view what, std::string_view source) {
  return {.topic = "optimizer kernel",
          .what = what,
          .source = source,
          .setting = "--optimizer-kernel fused",
          .options = {"--optimizer-kernel"},
          .apply = [](TrainPlanOptions& o) { o.optimizer_kernel = OptimizerKernel::kFused; }};
}
/// torch.compile off by default: --eager (a run that turned it on gives --compile).
inline StackChoice compile_off(std::string_view what, std::string_view source) {
  return {.topic = "torch.compile",
          .what = what,
          .source = source,
          .setting = "--eager",
          .options = {"--eager"},
          .apply = [](TrainPlanOptions& o) { o.eager = true; }};
}
/// FSDP2's root module holding the embedding, final norm and head, the last block kept:
/// --fsdp-root.
inline StackChoice root_module(std::string_view what, std::string_view source) {
  return {.topic = "FSDP wrapping",
          .what = what,
          .source = source,
          .setting = "--fsdp-root",
          .options = {"--fsdp-root"},
          .apply = [](TrainPlanOptions& o) { o.fsdp_root = true; }};
}

/// torchtitan's float8 recipe: Float8LinearConfig's default, tensorwise dynamic scaling (no
/// recipe_name), with the weights all-gathered in float8 (cast on their FSDP shards:
/// --float8.enable_fsdp_float8_all_gather, as docs/float8.md launches it) or in bf16 (the flag's
/// default, off). Applies with --float8 only (a config read sets its own keys: --from-config).
inline void float8_tensorwise_float8(TrainPlanOptions& o) {
  if (!o.float8) return;
  o.float8_recipe = Float8Scaling::kTensorwise;
  o.float8_all_gather = Float8Gather::kFloat8;
}
inline void float8_tensorwise_bf16(TrainPlanOptions& o) {
  if (!o.float8) return;
  o.float8_recipe = Float8Scaling::kTensorwise;
  o.float8_all_gather = Float8Gather::kBf16;
}
inline StackChoice float8_tensorwise(bool gathered_in_float8, std::string_view what,
                                     std::string_view source) {
  return {.topic = "float8 recipe",
          .what = what,
          .source = source,
          .setting = gathered_in_float8
                         ? "with --float8: --float8-recipe tensorwise --float8-all-gather float8"
                         : "with --float8: --float8-recipe tensorwise --float8-all-gather bf16",
          .options = {"--float8-recipe", "--float8-all-gather"},
          .apply = gathered_in_float8 ? float8_tensorwise_float8 : float8_tensorwise_bf16};
}

/// A choice the planner always makes so, or that the mesh and rules given decide: nothing to set.
inline void as_planned(TrainPlanOptions&) {}

}  // namespace shardplan::train::stacks
