// Megatron-Core, llm-foundry (Composer FSDP), fms-fsdp and MaxText: what each stack's training step
// runs by default, read from its code at the commit each source names.
#include "choices.hpp"
#include "stacks.hpp"

namespace shardplan::train::stacks {
namespace {

void megatron_precision(TrainPlanOptions& o) {
  o.param_dtype = DType::kBF16;
  o.master_dtype = DType::kF32;
  o.reduce_dtype = o.grad_dtype = DType::kBF16;
  o.optimizer_dtype = DType::kF32;
}
void maxtext_precision(TrainPlanOptions& o) {
  o.param_dtype = DType::kBF16;
  o.master_dtype = DType::kF32;
  o.grad_dtype = o.optimizer_dtype = DType::kF32;
}

}  // namespace

const TrainingStack& megatron_core() {
  static const TrainingStack s{
      .name = "megatron-core",
      .summary = "NVIDIA Megatron-LM / Megatron-Core as of d98e8a6 (2026-08), GPT pretraining "
                 "with --bf16 and Transformer Engine",
      .choices =
          {{.topic = "mixed precision",
            .what = "--bf16: the model's parameters and gradients in bfloat16, the optimizer's "
                    "float32 main parameters and state; gradients reduced in bfloat16 "
                    "(--accumulate-allreduce-grads-in-fp32 is off by default)",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/training/arguments.py: --bf16, "
                      "--accumulate-allreduce-grads-in-fp32",
            .setting = "--master-dtype f32 --grad-dtype bf16 --reduce-dtype bf16",
            .options = kDtypeOptions,
            .apply = megatron_precision},
           {.topic = "distributed optimizer",
            .what = "--use-distributed-optimizer (off by default; ZeRO-1 when on): bfloat16 "
                    "parameters replicated over data parallelism, the float32 main parameters "
                    "and state sharded",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/training/arguments.py: "
                      "--use-distributed-optimizer",
            .setting = "not modelled: the rule file shards the parameters, their gradients and "
                       "state alike (FSDP)",
            .options = {},
            .apply = nullptr},
           {.topic = "activation checkpointing",
            .what = "recompute_granularity None by default (nothing recomputed); selective "
                    "recomputes the core attention, full whole layers",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/transformer/"
                      "transformer_config.py: recompute_granularity",
            .setting = "--remat none",
            .options = kRematOptions,
            .apply = no_remat},
           {.topic = "kernels",
            .what = "no torch.compile; Transformer Engine's fused kernels (LayerNorm/RMSNorm "
                    "with the next GEMM, bias with GeLU/SwiGLU, softmax)",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/models/gpt/"
                      "gpt_layer_specs.py (TE specs)",
            .setting = "train-plan's default (no --eager): each chain of elementwise ops one "
                       "kernel",
            .options = {"--eager"},
            .apply = compiled},
           {.topic = "attention",
            .what = "TE's fused attention (FlashAttention or cuDNN backends)",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/transformer/"
                      "transformer_config.py: attention_backend",
            .setting = "--attention fused",
            .options = {"--attention"},
            .apply = fused_attention},
           {.topic = "loss",
            .what = "vocab_parallel_cross_entropy on the whole [s, b, v / tp] logits, in "
                    "float32 (--cross-entropy-loss-fusion off by default)",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/tensor_parallel/"
                      "cross_entropy.py",
            .setting = "--loss naive",
            .options = {"--loss"},
            .apply = naive_loss},
           {.topic = "optimizer",
            .what = "--optimizer adam: TE's (or Apex's) FusedAdam with decoupled weight decay, "
                    "one fused kernel",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/optimizer/__init__.py "
                      "(FusedAdam as Adam)",
            .setting = "--optimizer adamw",
            .options = {"--optimizer"},
            .apply = adamw},
           {.topic = "optimizer kernel",
            .what = "FusedAdam: one kernel reads and writes each parameter, gradient and moment "
                    "once",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/optimizer/__init__.py",
            .setting = "not modelled: the update is planned as the program's elementwise ops",
            .options = {},
            .apply = nullptr},
           {.topic = "tensor parallelism",
            .what = "ColumnParallelLinear (qkv, fc1), RowParallelLinear (proj, fc2); sequence "
                    "parallelism with --sequence-parallel",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/tensor_parallel/layers.py",
            .setting = "--tp-plan modules",
            .options = {"--tp-plan"},
            .apply = tp_modules},
           {.topic = "vocabulary parallelism",
            .what = "VocabParallelEmbedding and the output layer's vocabulary-parallel logits",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/tensor_parallel/layers.py",
            .setting = "not modelled: the embedding's and the head's layouts as used are the "
                       "partitioner's",
            .options = {},
            .apply = nullptr},
           {.topic = "gradient reduction overlap",
            .what = "--overlap-grad-reduce and --overlap-param-gather off by default; buckets "
                    "of --ddp-bucket-size",
            .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/training/arguments.py",
            .setting = "not modelled: data-parallel transfers are overlapped with compute as "
                       "FSDP's are (docs/training.md, Step time)",
            .options = {},
            .apply = nullptr}},
      .validated_by = {}};
  return s;
}

const TrainingStack& llm_foundry() {
  static const TrainingStack s{
      .name = "llm-foundry",
      .summary = "mosaicml/llm-foundry as of 8c8dd48 (2025-07) with Composer's FSDP (the MPT "
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
           {.topic = "torch.compile",
            .what = "not compiled (Composer runs the model eagerly; the MPT blocks use fused "
                    "kernels for attention and low-precision LayerNorm)",
            .source = "mosaicml/llm-foundry@8c8dd48 llmfoundry/models/mpt/"
                      "configuration_mpt.py: norm_type low_precision_layernorm",
            .setting = "--eager",
            .options = {"--eager"},
            .apply = eager},
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
            .what = "the loss kernel reads the bfloat16 logits",
            .source = "mosaicml/llm-foundry@8c8dd48 llmfoundry/models/mpt/modeling_mpt.py",
            .setting = "not modelled: the naive loss is planned on a float32 copy of the logits",
            .options = {},
            .apply = nullptr},
           {.topic = "optimizer",
            .what = "decoupled_adamw (Composer's DecoupledAdamW, a loop over the parameters)",
            .source = "mosaicml/llm-foundry@8c8dd48 scripts/train/yamls/pretrain/mpt-7b.yaml: "
                      "optimizer.name",
            .setting = "--optimizer adamw",
            .options = {"--optimizer"},
            .apply = adamw},
           {.topic = "optimizer kernel",
            .what = "DecoupledAdamW updates one parameter at a time (torch ops per parameter)",
            .source = "mosaicml/composer composer/optim/decoupled_weight_decay.py: "
                      "DecoupledAdamW.adamw",
            .setting = "not modelled: the update is planned as the program's elementwise ops",
            .options = {},
            .apply = nullptr},
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

const TrainingStack& fms_fsdp() {
  static const TrainingStack s{
      .name = "fms-fsdp",
      .summary = "IBM foundation-model-stack/fms-fsdp as of 5a296af (2025-07), Llama pretraining",
      .choices =
          {{.topic = "mixed precision",
            .what = "mixed_precision: True: FSDP1 bfSixteen (param, reduce and buffer dtypes "
                    "bfloat16) over float32 flat parameters",
            .source = "foundation-model-stack/fms-fsdp@5a296af fms_fsdp/config/training.py; "
                      "fms_fsdp/policies/mixed_precision.py: bfSixteen",
            .setting = "--master-dtype f32 --reduce-dtype bf16 --grad-dtype f32",
            .options = kDtypeOptions,
            .apply = fsdp1_bf16_mixed_precision},
           {.topic = "activation checkpointing",
            .what = "fsdp_activation_checkpointing: False by default; when on, "
                    "selective_checkpointing p checkpoints the fraction p of the blocks, evenly "
                    "spaced (p = 1/2: every other block)",
            .source = "foundation-model-stack/fms-fsdp@5a296af fms_fsdp/config/training.py; "
                      "fms_fsdp/policies/ac_handler.py: apply_fsdp_checkpointing",
            .setting = "--remat none",
            .options = kRematOptions,
            .apply = no_remat},
           {.topic = "activation checkpointing of a fraction of the blocks",
            .what = "selective_checkpointing p < 1 with fsdp_activation_checkpointing on: the "
                    "fraction p of the blocks, evenly spaced",
            .source = "foundation-model-stack/fms-fsdp@5a296af fms_fsdp/policies/ac_handler.py",
            .setting = "as the run sets it: --remat full --remat-blocks fraction:P",
            .options = {"--remat-blocks"},
            .apply = as_planned},
           {.topic = "torch.compile",
            .what = "use_torch_compile: True (the whole model)",
            .source = "foundation-model-stack/fms-fsdp@5a296af fms_fsdp/config/training.py",
            .setting = "train-plan's default (no --eager)",
            .options = {"--eager"},
            .apply = compiled},
           {.topic = "sharding",
            .what = "sharding_strategy \"hsdp\" (HYBRID_SHARD: shard within a node, replicate "
                    "across nodes)",
            .source = "foundation-model-stack/fms-fsdp@5a296af fms_fsdp/config/training.py; "
                      "fms_fsdp/utils/train_utils.py: get_policies",
            .setting = "the mesh decides (e.g. --mesh dp:N,fsdp:8); reduced in the shard group, "
                       "then across replicas",
            .options = {},
            .apply = as_planned},
           {.topic = "loss",
            .what = "torch.nn.CrossEntropyLoss on the whole logits as the model returns them "
                    "(bfloat16)",
            .source = "foundation-model-stack/fms-fsdp@5a296af fms_fsdp/utils/train_utils.py: "
                      "train",
            .setting = "--loss naive",
            .options = {"--loss"},
            .apply = naive_loss},
           {.topic = "loss dtype",
            .what = "the cross-entropy reads the bfloat16 logits",
            .source = "foundation-model-stack/fms-fsdp@5a296af fms_fsdp/utils/train_utils.py",
            .setting = "not modelled: the naive loss is planned on a float32 copy of the logits",
            .options = {},
            .apply = nullptr},
           {.topic = "optimizer",
            .what = "torch.optim.AdamW(betas=(0.9, 0.95), weight_decay=0.1), torch's default "
                    "kernel (foreach on CUDA)",
            .source = "foundation-model-stack/fms-fsdp@5a296af main_training_llama.py",
            .setting = "--optimizer adamw",
            .options = {"--optimizer"},
            .apply = adamw},
           {.topic = "optimizer kernel",
            .what = "foreach (torch's default for CUDA tensors when neither fused nor foreach "
                    "is given)",
            .source = "pytorch/pytorch torch/optim/optimizer.py: _default_to_fused_or_foreach",
            .setting = "not modelled: the update is planned as the program's elementwise ops",
            .options = {},
            .apply = nullptr}},
      .validated_by = {}};
  return s;
}

const TrainingStack& maxtext() {
  static const TrainingStack s{
      .name = "maxtext",
      .summary = "AI-Hypercomputer/maxtext as of e591f30 (2026-08), base.yml's defaults (JAX, "
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
            .setting = "--remat full",
            .options = kRematOptions,
            .apply = full_remat},
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
