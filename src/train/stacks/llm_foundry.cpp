// llm-foundry (Composer's FSDP, the MPT pretraining yamls) as declared data (training_stack.hpp).
#include "choices.hpp"
#include "stacks.hpp"

namespace shardplan::train::stacks {

const TrainingStack& llm_foundry() {
  static const TrainingStack s{
      .name = "llm-foundry",
      .summary =
          "mosaicml/llm-foundry as of 8c8dd48 (2025-07) with Composer's FSDP (the MPT "
          "pretraining yamls)",
      .choices =
          {{.topic = "mixed precision",
            .what = "precision amp_bf16 with fsdp_config.mixed_precision PURE: parameters "
                    "gathered, computed and gradients reduced in bfloat16 over float32 flat "
                    "parameters",
            .source = "mosaicml/llm-foundry@8c8dd48 scripts/train/yamls/pretrain/mpt-7b.yaml: "
                      "precision, fsdp_config.mixed_precision; Composer's PURE policy",
            .setting = "--master-dtype f32 --reduce-dtype bf16 --grad-dtype f32",
            .options = kDtypeOptions,
            .apply = fsdp1_bf16_mixed_precision},
           {.topic = "activation checkpointing",
            .what = "fsdp_config.activation_checkpointing: true: each block recomputed whole",
            .source = "mosaicml/llm-foundry@8c8dd48 scripts/train/yamls/pretrain/mpt-7b.yaml",
            .setting = "--remat full",
            .options = kRematOptions,
            .apply = full_remat},
           compile_off("not compiled (Composer runs the model eagerly; the MPT blocks use fused "
                       "kernels for attention and low-precision LayerNorm)",
                       "mosaicml/llm-foundry@8c8dd48 llmfoundry/models/mpt/"
                       "configuration_mpt.py: norm_type low_precision_layernorm"),
           {.topic = "attention",
            .what = "attn_impl: flash (FlashAttention-2)",
            .source = "mosaicml/llm-foundry@8c8dd48 scripts/train/yamls/pretrain/mpt-7b.yaml",
            .setting = "--attention fused",
            .options = {"--attention"},
            .apply = fused_attention},
           {.topic = "loss",
            .what = "loss_fn fused_crossentropy: flash-attn's CrossEntropyLoss kernel on the "
                    "whole bfloat16 logits (no float32 copy)",
            .source = "mosaicml/llm-foundry@8c8dd48 llmfoundry/models/mpt/modeling_mpt.py: "
                      "loss_fn = 'fused_crossentropy'",
            .setting = "--loss naive",
            .options = {"--loss"},
            .apply = naive_loss},
           {.topic = "loss dtype",
            .what = "flash-attn's kernel reads the bfloat16 logits (no float32 copy): it keeps "
                    "them and a float32 log-sum-exp per token for its backward pass and writes "
                    "the gradient in bfloat16 in one pass (planned as torch's cross_entropy on "
                    "bfloat16: the log-probabilities kept in bfloat16, the backward pass's two "
                    "bfloat16 arrays)",
            .source = "mosaicml/llm-foundry@8c8dd48 llmfoundry/models/mpt/modeling_mpt.py: "
                      "compute_loss_from_logits; Dao-AILab/flash-attention "
                      "flash_attn/ops/triton/cross_entropy.py: CrossEntropyLossFunction "
                      "(save_for_backward(logits, lse, labels))",
            .setting = "--loss-dtype bf16",
            .options = {"--loss-dtype"},
            .apply = bf16_loss},
           {.topic = "optimizer",
            .what = "decoupled_adamw (Composer's DecoupledAdamW, a loop over the parameters)",
            .source = "mosaicml/llm-foundry@8c8dd48 scripts/train/yamls/pretrain/mpt-7b.yaml: "
                      "optimizer.name",
            .setting = "--optimizer adamw",
            .options = {"--optimizer"},
            .apply = adamw},
           optimizer_kernel(
               "DecoupledAdamW updates one parameter at a time with torch's in-place ops: the "
               "passes of torch's foreach but a launch per op per parameter, the first moment "
               "as mul_ then add_ (88 B per f32 element where foreach's lerp_ makes 80), each "
               "square root freed with its parameter, and the decay not scaled by the rate "
               "(lr / initial_lr times weight_decay): none of --optimizer-kernel's settings",
               "mosaicml/composer composer/optim/decoupled_weight_decay.py: "
               "DecoupledAdamW.adamw"),
           {.topic = "FSDP wrapping",
            .what = "FSDP1 FULL_SHARD, each block its own unit",
            .source = "mosaicml/llm-foundry@8c8dd48 scripts/train/yamls/pretrain/mpt-7b.yaml: "
                      "fsdp_config.sharding_strategy",
            .setting = "train-plan's default wrapping (each block resharded after forward)",
            .options = {"--fsdp-root", "--no-reshard-after-forward"},
            .apply = reshard_after_forward}},
      .validated_by = {}};
  return s;
}

}  // namespace shardplan::train::stacks
