// MaxText's base.yml defaults (JAX, XLA-compiled) as declared data (training_stack.hpp).
#include "choices.hpp"
#include "stacks.hpp"

namespace shardplan::train::stacks {
namespace {

void maxtext_precision(TrainPlanOptions& o) {
  o.param_dtype = DType::kBF16;
  o.master_dtype = DType::kF32;
  o.grad_dtype = o.optimizer_dtype = DType::kF32;
}

}  // namespace

const TrainingStack& maxtext() {
  static const TrainingStack s{
      .name = "maxtext",
      .summary =
          "AI-Hypercomputer/maxtext as of e591f30 (2026-08), base.yml's defaults (JAX, "
          "XLA-compiled)",
      .choices =
          {{.topic = "mixed precision",
            .what = "weight_dtype float32, dtype bfloat16 (the weights cast for use), "
                    "grad_dtype float32, mu_dtype inherits the weights' (float32)",
            .source = "AI-Hypercomputer/maxtext@e591f30 src/maxtext/configs/base.yml",
            .setting = "--master-dtype f32 --grad-dtype f32 --optimizer-dtype f32",
            .options = kDtypeOptions,
            .apply = maxtext_precision},
           {.topic = "activation checkpointing",
            .what = "remat_policy 'full' (each scanned layer saves its input only)",
            .source = "AI-Hypercomputer/maxtext@e591f30 src/maxtext/configs/base.yml: "
                      "remat_policy",
            .setting = "--remat maxtext:full",
            .options = kRematOptions,
            .apply = [](TrainPlanOptions& o) { o.remat = parse_remat("maxtext:full"); }},
           {.topic = "compilation",
            .what = "the whole step jit-compiled by XLA (elementwise chains fused, the "
                    "optimizer's update too)",
            .source = "AI-Hypercomputer/maxtext@e591f30 src/maxtext/trainers/pre_train/train.py",
            .setting = "train-plan's default (no --eager)",
            .options = {"--eager"},
            .apply = compiled},
           {.topic = "attention",
            .what = "attention 'autoselected' (a flash kernel: splash on TPU, cuDNN on GPU)",
            .source = "AI-Hypercomputer/maxtext@e591f30 src/maxtext/configs/base.yml: attention",
            .setting = "--attention fused",
            .options = {"--attention"},
            .apply = fused_attention},
           {.topic = "context parallelism",
            .what = "context_parallel_strategy 'all_gather' with context_parallel_load_balance "
                    "true: the keys and values all-gathered over the context axis, the queries' "
                    "chunks in the load-balanced order",
            .source = "AI-Hypercomputer/maxtext@e591f30 src/maxtext/configs/base.yml: "
                      "context_parallel_strategy, context_parallel_load_balance",
            .setting = "--cp-kernel allgather-kv",
            .options = kContextOptions,
            .apply = cp_allgather_kv},
           {.topic = "loss",
            .what = "cross_entropy_with_logits on the whole logits cast to float32 "
                    "(cast_logits_to_fp32: true, num_vocab_tiling: 1)",
            .source = "AI-Hypercomputer/maxtext@e591f30 src/maxtext/configs/base.yml; "
                      "src/maxtext/utils/max_utils.py: cross_entropy_with_logits",
            .setting = "--loss naive",
            .options = {"--loss"},
            .apply = naive_loss},
           {.topic = "optimizer",
            .what = "opt_type adamw (optax), compiled with the step",
            .source = "AI-Hypercomputer/maxtext@e591f30 src/maxtext/configs/base.yml: opt_type",
            .setting = "--optimizer adamw",
            .options = {"--optimizer"},
            .apply = adamw},
           {.topic = "sharding",
            .what = "ici_fsdp_parallelism -1 with the logical axis rules of base.yml",
            .source = "AI-Hypercomputer/maxtext@e591f30 src/maxtext/configs/base.yml",
            .setting = "the rule file decides (a MaxText-style rule file's logical_axes)",
            .options = {},
            .apply = as_planned}},
      .validated_by = {}};
  return s;
}

}  // namespace shardplan::train::stacks
