// IBM's fms-fsdp Llama pretraining as declared data (training_stack.hpp).
#include "choices.hpp"
#include "stacks.hpp"

namespace shardplan::train::stacks {

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
            .what = "CrossEntropyLoss reads the bfloat16 logits fms's LLaMA head returns (no "
                    "float32 cast): its log_softmax keeps bfloat16 log-probabilities, its "
                    "gradient bfloat16",
            .source = "foundation-model-stack/fms-fsdp@5a296af fms_fsdp/utils/train_utils.py: "
                      "train; foundation-model-stack/foundation-model-stack@062adf6 "
                      "fms/models/llama.py: LLaMA.forward (preds = self.head(output))",
            .setting = "--loss-dtype bf16",
            .options = {"--loss-dtype"},
            .apply = bf16_loss},
           {.topic = "optimizer",
            .what = "torch.optim.AdamW(betas=(0.9, 0.95), weight_decay=0.1), torch's default "
                    "kernel (foreach on CUDA)",
            .source = "foundation-model-stack/fms-fsdp@5a296af main_training_llama.py",
            .setting = "--optimizer adamw",
            .options = {"--optimizer"},
            .apply = adamw},
           foreach_optimizer_kernel(
               "foreach (torch's default for CUDA tensors when neither fused nor foreach "
               "is given): _multi_tensor_adamw's passes",
               "pytorch/pytorch@v2.5.0 torch/optim/optimizer.py: _default_to_fused_or_foreach; "
               "torch/optim/adamw.py: _multi_tensor_adamw")},
      .validated_by = {}};
  return s;
}

}  // namespace shardplan::train::stacks
