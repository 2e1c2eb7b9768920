// torchtitan (pytorch/torchtitan) by date: what its Llama training step ran at the commits behind
// the published runs (docs/validation.md). Each choice cites the file at that commit.
#include "choices.hpp"
#include "stacks.hpp"

namespace shardplan::train::stacks {
namespace {

// The selective "op" policy by its own name (stack_remat.cpp): every other aten.mm (wq, wv, w1,
// w2) and the attention's output saved (_save_list; mm_count % 2), in the layer's names
// query_proj, value_proj, context, mlpwi_0, mlpwo.
void op_sac(TrainPlanOptions& o) { o.remat = parse_remat("torchtitan:op"); }

// The loss as torchtitan wrote it from late 2024: the logits taken to float32 first.
StackChoice f32_loss(std::string_view source) {
  return {.topic = "loss",
          .what =
              "cross_entropy(pred.flatten(0, 1).float(), labels): the whole logits taken "
              "to float32, then PyTorch's cross-entropy",
          .source = source,
          .setting = "--loss naive",
          .options = {"--loss"},
          .apply = naive_loss};
}

// The choices every version below shares, with the commit its sources are read at.
std::vector<StackChoice> common(std::string_view at_parallelize,
                                std::string_view loss_parallel_source) {
  return {
      {.topic = "mixed precision",
       .what = "FSDP2 MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) over "
               "float32 parameters; AdamW's state float32 (zeros_like the parameter)",
       .source = "torchtitan config: training.mixed_precision_param = bfloat16, "
                 "training.mixed_precision_reduce = float32 (the defaults)",
       .setting = "--mixed-precision fsdp2",
       .options = kDtypeOptions,
       .apply = fsdp2_mixed_precision},
      {.topic = "activation checkpointing",
       .what = "selective op AC (llama3_8b.toml: mode 'selective', selective_ac_option 'op'): "
               "each block saves the outputs of aten.mm but every second one (wq, wv, w1, w2) "
               "and of scaled_dot_product_attention, and recomputes the rest; the 70B and 405B "
               "tomls use mode 'full' (--remat full)",
       .source = at_parallelize,
       .setting = "--remat torchtitan:op",
       .options = kRematOptions,
       .apply = op_sac},
      {.topic = "attention",
       .what = "F.scaled_dot_product_attention, causal (the FlashAttention backend on H100)",
       .source = "torchtitan models/llama model.py: Attention.forward",
       .setting = "--attention fused",
       .options = {"--attention"},
       .apply = fused_attention},
      {.topic = "optimizer",
       .what = "torch.optim.AdamW",
       .source = "torchtitan optimizer: build_optimizers (name = \"AdamW\" in the tomls)",
       .setting = "--optimizer adamw",
       .options = {"--optimizer"},
       .apply = adamw},
      {.topic = "HSDP",
       .what = "data_parallel_replicate_degree x data_parallel_shard_degree: fully_shard over "
               "the 2-D mesh reduce-scatters in the shard group, then all-reduces the shard "
               "across replicas",
       .source = "torchtitan parallel_dims (dp_replicate, dp_shard); torch FSDP2 HSDP",
       .setting = "always planned so: a sum pending over a replica axis is all-reduced after "
                  "the reduce-scatter (docs/runtime.md, reshard)",
       .options = {},
       .apply = as_planned},
      {.topic = "tensor parallelism",
       .what = "ColwiseParallel on wq, wk, wv, w1, w3, RowwiseParallel on wo, w2 (each block's "
               "input all-gathered, its output reduce-scattered), SequenceParallel norms (the "
               "sequence split as the rules' activations map it: --sequence-parallel)",
       .source = at_parallelize,
       .setting = "--tp-plan modules",
       .options = {"--tp-plan"},
       .apply = tp_modules},
      {.topic = "loss parallel",
       .what = "tok_embeddings RowwiseParallel (input Replicate, output Shard(1)), norm "
               "SequenceParallel, output ColwiseParallel (input Shard(1), output Shard(-1)) "
               "and the loss under loss_parallel (on unless disabled: the vocabulary-sharded "
               "logits' max and sum of exponentials all-reduced over tp)",
       .source = loss_parallel_source,
       .setting = "part of --tp-plan modules: the embedding looked up vocabulary-parallel, "
                  "the head used in its vocabulary split (with --loss naive)",
       .options = {"--tp-plan"},
       .apply = tp_modules},
  };
}

// Async TP, available since pytorch/torchtitan#429 (1ec2ece, 2024-06-26), off by default: with it
// on, apply_tp sets torch._inductor.config._micro_pipeline_tp and enables symmetric memory for
// the tp group, and the compiled blocks' collectives are decomposed with their matmuls.
StackChoice async_tp(std::string_view what, std::string_view source) {
  return {.topic = "async TP",
          .what = what,
          .source = source,
          .setting = "off (--async-tp: the tp collectives run under their products; with "
                     "--compile, on a tp axis)",
          .options = {"--async-tp"},
          .apply = no_async_tp};
}

}  // namespace

const TrainingStack& torchtitan_2024_07() {
  static const TrainingStack s{
      .name = "torchtitan-2024-07",
      .summary =
          "torchtitan as of 40f79d7 (2024-07-30): the A100 runs of its mid-2024 "
          "docs/performance.md",
      .choices = joined(
          common("pytorch/torchtitan@40f79d7 torchtitan/parallelisms/parallelize_llama.py: "
                 "_save_list, apply_ac, apply_tp",
                 "pytorch/torchtitan@40f79d7 torchtitan/parallelisms/parallelize_llama.py: "
                 "apply_tp; torchtitan/config_manager.py: --training.enable_loss_parallel "
                 "(default True)"),
          {{.topic = "loss",
            .what = "cross_entropy(pred.flatten(0, 1), labels) on the whole logits the model "
                    "returns",
            .source = "pytorch/torchtitan@40f79d7 train.py: loss_fn",
            .setting = "--loss naive",
            .options = {"--loss"},
            .apply = naive_loss},
           {.topic = "loss dtype",
            .what = "the model's forward casts the head's bfloat16 output to float32 (output = "
                    "self.output(h).float()), so the cross-entropy reads a float32 copy of the "
                    "logits (moved into the loss function by e10cb94, 2024-10-22)",
            .source = "pytorch/torchtitan@40f79d7 torchtitan/models/llama/model.py: "
                      "Transformer.forward",
            .setting = "--loss-dtype f32",
            .options = {"--loss-dtype"},
            .apply = f32_copy_loss},
           float8_tensorwise(
               false,
               "with --float8.enable_float8_linear: torchao's Float8Linear, dynamic tensorwise "
               "scaling; --float8.enable_fsdp_float8_all_gather off by default, so FSDP gathers "
               "the weights in bfloat16 and each is cast whole",
               "pytorch/torchtitan@40f79d7 torchtitan/config_manager.py: "
               "--float8.enable_fsdp_float8_all_gather (store_true, default False); "
               "torchtitan/float8_linear.py: Float8Handler"),
           compile_off("off unless --training.compile (llama3_8b.toml: compile = false) "
                       "(--compile)",
                       "pytorch/torchtitan@40f79d7 torchtitan/config_manager.py: "
                       "--training.compile; train_configs/llama3_8b.toml"),
           root_module("fully_shard on each TransformerBlock, the last with "
                       "reshard_after_forward=False, then on the whole model (the root: embedding, "
                       "final norm, output, never resharded after forward)",
                       "pytorch/torchtitan@40f79d7 torchtitan/parallelisms/parallelize_llama.py: "
                       "apply_fsdp"),
           foreach_optimizer_kernel(
               "AdamW with fused=False (--optimizer.fused off by default): torch's foreach "
               "passes (_multi_tensor_adamw: each a multi-tensor kernel over every parameter)",
               "pytorch/torchtitan@40f79d7 torchtitan/config_manager.py: "
               "--optimizer.fused; pytorch/pytorch@v2.5.0 torch/optim/adamw.py: "
               "_multi_tensor_adamw"),
           async_tp("--experimental.enable_async_tensor_parallel, off by default; when on "
                    "without --training.compile it turns compile on itself (a warning)",
                    "pytorch/torchtitan@40f79d7 torchtitan/config_manager.py: "
                    "--experimental.enable_async_tensor_parallel; "
                    "torchtitan/parallelisms/parallelize_llama.py: apply_tp")}),
      .validated_by = {}};
  return s;
}

const TrainingStack& torchtitan_2024_12() {
  static const TrainingStack s{
      .name = "torchtitan-2024-12",
      .summary =
          "torchtitan as of 3f20451 (2024-12-26): the docs/performance.md tables of "
          "December 2024",
      .choices = joined(
          common("pytorch/torchtitan@3f20451 torchtitan/parallelisms/parallelize_llama.py: "
                 "_save_list, _apply_ac_to_transformer_block, apply_tp",
                 "pytorch/torchtitan@3f20451 torchtitan/parallelisms/parallelize_llama.py: "
                 "apply_tp; torchtitan/config_manager.py: --training.disable_loss_parallel "
                 "(store_true, off)"),
          {f32_loss("pytorch/torchtitan@3f20451 train.py: loss_fn"),
           float8_tensorwise(
               true,
               "with --float8.enable_float8_linear: torchao's Float8Linear, dynamic tensorwise "
               "scaling, launched with --float8.enable_fsdp_float8_all_gather and "
               "--float8.precompute_float8_dynamic_scale_for_fsdp (each weight cast on its FSDP "
               "shard, gathered in float8)",
               "pytorch/torchtitan@3f20451 docs/float8.md (the launch command); "
               "torchtitan/float8.py: Float8Handler"),
           cp_rotate_allgather("pytorch/torchtitan@3f20451 torchtitan/config_manager.py: "
                               "--experimental.context_parallel_rotate_method"),
           compile_off("off unless --training.compile (a store_true flag; llama3_8b.toml: "
                       "compile = false); when on, each TransformerBlock is compiled, the loss "
                       "never (--compile)",
                       "pytorch/torchtitan@3f20451 torchtitan/config_manager.py: "
                       "--training.compile; train_configs/llama3_8b.toml"),
           root_module("fully_shard on each TransformerBlock, the last with "
                       "reshard_after_forward=False, then on the whole model: the root module "
                       "holds the embedding, final norm and output, never resharded after forward",
                       "pytorch/torchtitan@3f20451 torchtitan/parallelisms/parallelize_llama.py: "
                       "apply_fsdp"),
           foreach_optimizer_kernel(
               "AdamW with fused=False (--optimizer.fused is off by default), so torch's "
               "default for CUDA tensors: foreach (multi-tensor kernels, op by op)",
               "pytorch/torchtitan@3f20451 torchtitan/config_manager.py: "
               "--optimizer.fused; pytorch/pytorch@v2.5.0 torch/optim/adamw.py: "
               "_multi_tensor_adamw; torch/optim/optimizer.py: _default_to_fused_or_foreach"),
           async_tp("--experimental.enable_async_tensor_parallel, off by default (the inductor "
                    "pass runs only on compiled blocks: --training.compile)",
                    "pytorch/torchtitan@3f20451 torchtitan/config_manager.py: "
                    "--experimental.enable_async_tensor_parallel; "
                    "torchtitan/parallelisms/parallelize_llama.py: apply_tp")}),
      // tests/published_runs_test.cpp's rows planned through this stack (the test keeps the two
      // lists equal).
      .validated_by = {"Table 1: Llama 3.1 8B, FSDP", "Table 1: Llama 3.1 8B, FSDP + torch.compile",
                       "Table 3: Llama 3.1 8B, FSDP, 128 GPUs",
                       "Table 3: Llama 3.1 8B, FSDP + torch.compile, 128 GPUs",
                       "Table 1: + Float8 (FSDP + torch.compile + Float8)",
                       "Table 3: + Float8, 128 GPUs"}};
  return s;
}

const TrainingStack& torchtitan_2025_06() {
  static const TrainingStack s{
      .name = "torchtitan-2025-06",
      .summary =
          "torchtitan as of 6b11290 (2025-06-27): fused AdamW by default "
          "(pytorch/torchtitan#881), the root wrapping of before #1094",
      .choices = joined(
          common("pytorch/torchtitan@6b11290 torchtitan/models/llama3/infra/parallelize.py: "
                 "_save_list, _apply_ac_to_transformer_block, apply_tp",
                 "pytorch/torchtitan@6b11290 torchtitan/models/llama3/infra/parallelize.py: "
                 "apply_tp; torchtitan/config_manager.py: Parallelism.disable_loss_parallel = "
                 "False"),
          {f32_loss("pytorch/torchtitan@6b11290 torchtitan/components/loss.py: "
                    "cross_entropy_loss"),
           float8_tensorwise(
               true,
               "with model.converters = [\"float8\"]: recipe_name unset, so tensorwise, "
               "launched with --float8.enable_fsdp_float8_all_gather (gathered in float8; "
               "recipe_name rowwise gathers in bfloat16)",
               "pytorch/torchtitan@6b11290 docs/float8.md (the tensorwise launch command); "
               "torchtitan/components/quantization/float8.py: Float8Converter"),
           cp_rotate_allgather("pytorch/torchtitan@6b11290 torchtitan/config_manager.py: "
                               "Parallelism.context_parallel_rotate_method"),
           compile_off("off unless training.compile (llama3_8b.toml: compile = false); when on, "
                       "each TransformerBlock is compiled (--compile)",
                       "pytorch/torchtitan@6b11290 torchtitan/config_manager.py: Training.compile; "
                       "torchtitan/models/llama3/train_configs/llama3_8b.toml"),
           root_module("reshard_after_forward_policy \"default\": fully_shard on each "
                       "TransformerBlock, the last with reshard_after_forward=False, then on the "
                       "whole model (the root: embedding, final norm, output)",
                       "pytorch/torchtitan@6b11290 torchtitan/models/llama3/infra/parallelize.py: "
                       "apply_fsdp"),
           fused_optimizer_kernel("AdamW with implementation = \"fused\" (the default since "
                                  "pytorch/torchtitan#881, 2025-02-24)",
                                  "pytorch/torchtitan@6b11290 torchtitan/config_manager.py: "
                                  "Optimizer.implementation"),
           async_tp("Parallelism.enable_async_tensor_parallel = False; on without "
                    "training.compile it raises \"Async TP requires --training.compile\"",
                    "pytorch/torchtitan@6b11290 torchtitan/config_manager.py: "
                    "Parallelism.enable_async_tensor_parallel; "
                    "torchtitan/models/llama3/infra/parallelize.py")}),
      .validated_by = {}};
  return s;
}

const TrainingStack& torchtitan_2025_08() {
  static const TrainingStack s{
      .name = "torchtitan-2025-08",
      .summary =
          "torchtitan after pytorch/torchtitan#1094 (83e6941, 2025-07-28), as of 07c00d9 "
          "(August 2025)",
      .choices = joined(
          common("pytorch/torchtitan@07c00d9 torchtitan/distributed/activation_checkpoint.py: "
                 "_save_list, _apply_op_sac; torchtitan/models/llama3/infra/parallelize.py: "
                 "apply_tp",
                 "pytorch/torchtitan@07c00d9 torchtitan/models/llama3/infra/parallelize.py: "
                 "apply_tp; torchtitan/config/job_config.py: Parallelism.disable_loss_parallel = "
                 "False"),
          {f32_loss("pytorch/torchtitan@07c00d9 torchtitan/components/loss.py: "
                    "cross_entropy_loss"),
           float8_tensorwise(
               true,
               "with model.converters = [\"float8\"]: recipe_name unset, so tensorwise, "
               "launched with --float8.enable_fsdp_float8_all_gather (gathered in float8; "
               "recipe_name rowwise gathers in bfloat16)",
               "pytorch/torchtitan@07c00d9 docs/float8.md (the tensorwise launch command); "
               "torchtitan/components/quantization/float8.py: Float8Converter"),
           cp_rotate_allgather("pytorch/torchtitan@07c00d9 torchtitan/config/job_config.py: "
                               "Parallelism.context_parallel_rotate_method"),
           compile_off("off unless compile.enable (llama3_8b.toml: enable = false); when on, the "
                       "blocks and the loss (components = [\"model\", \"loss\"]) (--compile)",
                       "pytorch/torchtitan@07c00d9 torchtitan/config/job_config.py: Compile; "
                       "torchtitan/models/llama3/train_configs/llama3_8b.toml"),
           {.topic = "FSDP wrapping",
            .what = "fully_shard on tok_embeddings, on each block (reshard_after_forward=True), "
                    "on [norm, output] together with reshard_after_forward=False (kept for "
                    "their backward pass), then on the model",
            .source = "pytorch/torchtitan@07c00d9 torchtitan/models/llama3/infra/parallelize.py: "
                      "apply_fsdp (pytorch/torchtitan#1094)",
            .setting = "train-plan's default wrapping (no --fsdp-root)",
            .options = {"--fsdp-root"},
            .apply = own_units},
           fused_optimizer_kernel(
               "AdamW with implementation = \"fused\" (the default since "
               "pytorch/torchtitan#881, 2025-02-24): one kernel reads and writes each "
               "parameter, gradient and moment once",
               "pytorch/torchtitan@07c00d9 torchtitan/config/job_config.py: "
               "Optimizer.implementation"),
           async_tp("Parallelism.enable_async_tensor_parallel = False; on without compile.enable "
                    "(and \"model\" in its components) it raises \"Async TP requires "
                    "--training.compile\"",
                    "pytorch/torchtitan@07c00d9 torchtitan/config/job_config.py: "
                    "Parallelism.enable_async_tensor_parallel; "
                    "torchtitan/distributed/tensor_parallel.py: maybe_enable_async_tp")}),
      .validated_by = {}};
  return s;
}

}  // namespace shardplan::train::stacks
