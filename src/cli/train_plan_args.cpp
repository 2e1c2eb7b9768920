// `shardplan train-plan`'s command line: its options and their checks as CLI11 runs them
// (train_plan_cmd.hpp; what they mean: docs/cli.md).
#include <fmt/format.h>

#include "output_path_option.hpp"
#include "shardplan/train_plan.hpp"
#include "train_plan_cmd.hpp"

namespace shardplan::cli {
namespace {

/// Refuses an empty value (CLI11 names the option: "--hardware: the value is empty").
CLI::Validator non_empty_value() {
  return CLI::Validator(
      [](std::string& v) {
        return v.empty() ? std::string("the value is empty (leave the option out for its default)")
                         : std::string();
      },
      "");
}

// The dtypes of the step and the hardware it is timed on (what each number is computed in).
void add_precision_options(CLI::App* t, TrainPlanCommand& c) {
  t->add_option("--param-dtype", c.param_dtype,
                "The weights' dtype, bf16, f32 or f64 (the forward computes in it)")
      ->capture_default_str();
  t->add_option("--grad-dtype", c.grad_dtype,
                "The gradients' dtype, bf16, f32 or f64. Default: --param-dtype");
  t->add_option("--master-dtype", c.master_dtype,
                "Mixed precision (FSDP2's MixedPrecisionPolicy): the weights held, sharded, and "
                "updated in this dtype, cast to --param-dtype for use. Default: --param-dtype");
  t->add_option("--reduce-dtype", c.reduce_dtype,
                "Mixed precision: the gradients reduced over the batch axes in this dtype "
                "(FSDP2's reduce_dtype). Default: as computed (--param-dtype)");
  t->add_option("--mixed-precision", c.mixed_precision,
                "fsdp2: torchtitan's default, weights and optimizer state f32, computed in "
                "--param-dtype (bf16), gradients reduced and held in f32 (= --master-dtype f32 "
                "--reduce-dtype f32 --grad-dtype f32 --optimizer-dtype f32)");
  t->add_option("--hardware", c.hardware,
                "Estimate the step's time on this hardware: h100-sxm, h200, a100-80g, a100-40g, "
                "a100-80g-p4de, or a .yaml file (docs/training.md); its memory is the device "
                "memory unless --device-memory is given");
  t->add_option("--optimizer-dtype", c.optimizer_dtype,
                "The optimizer state's dtype, bf16, f32 or f64 (the update runs in it)")
      ->capture_default_str();
  t->add_flag("--float8", c.float8,
              "The decoder blocks' linear layers in float8 as torchao's Float8Linear (tensorwise "
              "scaling; inputs kept in 8 bits; products at the hardware's fp8 rate); the head and "
              "attention stay in --param-dtype. LLaMA-family models");
  t->add_option("--float8-recipe", c.float8_recipe,
                "With --float8: tensorwise, rowwise or rowwise_with_gw_hp, torchao's recipes "
                "(a scale per tensor, or per row of each product's operands; rowwise_with_gw_hp "
                "computes the weight gradient in high precision). Default: tensorwise");
  t->add_option("--float8-all-gather", c.float8_all_gather,
                "With --float8: float8 (each weight cast on its shard, gathered in 8 bits; "
                "tensorwise only) or bf16 (gathered in --param-dtype, cast after the gather). "
                "Default: float8 with tensorwise, bf16 with rowwise");
  t->add_flag("--strict-shards", c.strict_shards,
              "Refuse a tensor dimension its mesh axes do not divide (the error names the tensor, "
              "its shape and the axes). Default: padded as FSDP and JAX pad it, each device "
              "holding ceil(n/k) rows, and those bytes counted");
  t->add_flag("--eager,!--compile", c.eager,
              "Plan the step as eager PyTorch runs it (no torch.compile): every elementwise op "
              "writes its result, so each op's temporaries are held and its bytes read and "
              "written. --compile: as a compiler runs it, each chain of elementwise ops one kernel "
              "(the default; overrides a --stack that runs eager)");
  t->add_flag("--fsdp-root,!--no-fsdp-root", c.fsdp_root,
              "FSDP2 wrapped as torchtitan did before mid-2025: the embedding, final norm and head "
              "in the root module, gathered from the forward's start to the backward's end, and "
              "the last block not resharded after forward. Default (--no-fsdp-root): each its own "
              "unit");
  t->add_flag("--reshard-last-block,!--no-reshard-last-block", c.reshard_last_block,
              "Whether FSDP reshards the last block after forward like the others (no: its "
              "gathered weights kept for its backward pass). Default: no with --fsdp-root, else "
              "yes");
}

// The stack a step is planned as (--stack, --explain) and its tensor-parallel plan.
void add_stack_options(CLI::App* t, TrainPlanCommand& c) {
  t->add_option("--tp-plan", c.tp_plan,
                "partitioner or modules: where a tensor-parallel step's layer weights are laid "
                "out as used; modules: in their model-axis split, gathered over the data axes "
                "only, as Megatron's and torchtitan's column/row-parallel modules (the "
                "activations all-gathered and reduce-scattered around each block). Default: "
                "partitioner (it may gather a weight over the model axes and move activations "
                "instead)");
  t->add_flag("--async-tp", c.async_tp,
              "Async tensor parallelism (torchtitan's enable_async_tensor_parallel, PyTorch's "
              "micro-pipeline TP): each tensor-parallel all-gather feeding products and each "
              "reduce-scatter fed by a product overlapped with them, chunk by chunk. With a "
              "model axis, --tp-plan modules, not --eager");
  t->add_option("--cp-rotate", c.cp_rotate,
                "permute or allgather: how context parallelism's ring attention exchanges the "
                "key/value blocks; permute: passed to the next device each step (Megatron's "
                "p2p), allgather: gathered once each way (torchtitan's default). Default: "
                "permute; the ring's only (refused with another --cp-kernel)");
  t->add_option("--cp-kernel", c.cp_kernel,
                "ring, allgather-kv or ulysses: context parallelism's attention kernel; ring: "
                "key/value blocks passed round (--cp-rotate), allgather-kv: k and v all-gathered "
                "whole (Llama 3; Megatron's all_gather), ulysses: q, k, v and the output by "
                "all-to-all between the sequence's split and the heads' (Megatron's a2a). "
                "Default: ring");
  t->add_option("--dp-overlap", c.dp_overlap,
                "fsdp, off, buckets or grad-buckets: how the step time overlaps the "
                "data-parallel collectives with compute (with --hardware); fsdp: layer by layer "
                "(FSDP2's prefetch); off: exposed (Megatron's default); buckets: the gradient "
                "reductions by bucket under the backward pass and ZeRO-1's parameter gathers "
                "under the forward pass (Megatron's --overlap-grad-reduce "
                "--overlap-param-gather); grad-buckets: the reductions only (with "
                "--optimizer-sharding zero1). Default: fsdp");
  t->add_option("--dp-bucket-size", c.dp_bucket_size,
                "With --dp-overlap buckets or grad-buckets: parameter elements per device a "
                "bucket closes at (Megatron's --ddp-bucket-size). Default: max(40000000, "
                "1000000 x the data-parallel devices)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 50));
  t->add_option("--stack", c.stack,
                "Plan the step as this training stack runs it (docs/training.md \"Training "
                "stacks\"; --explain lists its choices and sources); an option given overrides "
                "the stack's choice it sets");
  t->add_option("--from-config", c.from_config,
                "Read the stack's own config: a torchtitan .toml, a file of Megatron arguments "
                "(.args), a MaxText .yml (--stack, else by extension); options given override "
                "its keys (docs/training.md \"Stack configs\")");
  t->add_option("--emit-config", c.emit_config,
                "Write the --stack's config for the plan (--from-config of it plans the same)")
      ->check(cli::non_empty_output_path());
  t->add_flag("--explain", c.explain,
              "With --stack: list every choice of the stack (what it runs, how it is planned or "
              "that it is not modelled, the source), marking those the options given override, "
              "and plan nothing");
}

// The device's memory and what is printed or written.
void add_output_options(CLI::App* t, TrainPlanCommand& c) {
  t->add_option("--device-memory", c.device_memory,
                "Memory of one device, to say whether the step fits. Example: 80GiB");
  t->add_option("--headroom", c.headroom,
                "Fraction of --device-memory kept free (runtime, fragmentation)")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  add_stack_options(t, c);
  t->add_flag("--json", c.json, "Print JSON (schema in docs/cli.md)");
  t->add_option("--html", c.html,
                "Also write the plan as a self-contained HTML page (memory per device, the live "
                "bytes over the step with its peak, the time split). Example: --html plan.html")
      ->check(cli::non_empty_output_path());
  t->add_flag("--compare", c.compare,
              "Plan every --mesh with every --rules, one row each, and name the cheapest that "
              "fits (fewest bytes moved per step)");
}

// The optimizer: its kind, its update's kernel and how its state is sharded.
void add_optimizer_options(CLI::App* t, TrainPlanCommand& c) {
  t->add_option("--optimizer", c.optimizer, "sgd, adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  t->add_option("--optimizer-kernel", c.optimizer_kernel,
                "ops: the update as the program's elementwise ops; fused: Adam(W)'s update of "
                "each parameter as one kernel (torch.optim.AdamW(fused=True), FusedAdam); "
                "foreach: Adam(W)'s update as torch's foreach passes, each reading and writing "
                "whole arrays (torch.optim.AdamW(foreach=True)). Default: ops")
      ->check(CLI::IsMember({"ops", "fused", "foreach"}))
      ->capture_default_str();
  t->add_option("--optimizer-sharding", c.optimizer_sharding,
                "rules: parameters, gradients and optimizer state as the rules shard them; "
                "zero1: the parameters replicated over the data axes, the master weights and "
                "state as the rules shard them (Megatron's --use-distributed-optimizer). "
                "Default: rules")
      ->check(CLI::IsMember({"rules", "zero1"}))
      ->capture_default_str();
}

}  // namespace

TrainPlanCommand& add_train_plan_command(CLI::App& app, TrainPlanCommand& c,
                                         std::int64_t max_devices) {
  c.command = app.add_subcommand(
      "train-plan",
      "Size one training step (forward, loss, backward, optimizer) of a Hugging Face model on a "
      "mesh: memory per device, FLOPs, bytes moved, whether it fits");
  CLI::App* t = c.command;
  t->add_option(
       "--config,-c", c.config,
       "A Hugging Face config.json, or a checkpoint directory holding one (model types "
       "llama, mistral, qwen2, mixtral, gpt2, t5). Example: --config "
       "Meta-Llama-3-70B/config.json. Required unless --explain");
  t->add_option("--mesh", c.meshes,
                "Mesh axes as name:size (one size may be -1). Repeat it with --compare. Default: "
                "the rule file's mesh. Example: --mesh fsdp:64,tp:8");
  t->add_option("--devices,-n", c.devices,
                fmt::format("Number of devices, 1 to {}. Default: the mesh's size when every "
                            "axis size is given",
                            max_devices))
      ->check(CLI::Range(std::int64_t{1}, max_devices));
  t->add_option("--rules,-r", c.rules,
                "A YAML rule file or preset:NAME. Repeat it with --compare. Default: the "
                "model family's preset (docs/cli.md lists them; its FSDP-only one on a mesh "
                "without a model axis), leaving out the axes the mesh lacks");
  t->add_option("--batch,-b", c.batch, "Sequences per step (the global batch)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  t->add_option("--seq,-s", c.seq, "Tokens per sequence")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30))
      ->capture_default_str();
  t->add_option("--target-seq", c.target_seq,
                "T5: the decoder's tokens per sequence (--seq is the encoder's). Default: --seq")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  add_optimizer_options(t, c);
  add_precision_options(t, c);
  t->add_option("--grad-accum", c.grad_accum,
                "Micro-batches per step (the batch splits evenly; activations of one at a time)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  t->add_flag("--recompute", c.recompute,
              "Recompute each layer's activations in the backward pass (keep only layer inputs); "
              "the same as --remat full");
  t->add_flag("--no-reshard-after-forward", c.no_reshard_after_forward,
              "Without recomputation, keep each layer's gathered weights from the forward pass "
              "to the backward pass (ZeRO-2) instead of gathering them again (FSDP2's default)");
  t->add_option("--remat", c.remat,
                "What each layer keeps for the backward pass, the rest recomputed: none, full "
                "(its input only), dots (its weights' matmul outputs), names:A,B (the values "
                "named A, B in the layer: docs/training.md), STACK:NAME (a stack's own: "
                "maxtext:minimal, torchtitan:op, ...). Default: none, full with --recompute");
  t->add_option("--remat-blocks", c.remat_blocks,
                "The layers --remat applies to: all, every:K (layers K-1, 2K-1, ... from 0: "
                "torchtitan's selective layer AC), fraction:P (fms-fsdp's "
                "selective_checkpointing), layers:A-B,C. Default: all");
  t->add_option("--attention", c.attention,
                "fused: dot_product_attention (blocked, no [t, t] scores held); naive: the scores, "
                "mask and softmax as separate ops. Default: fused (T5: naive; fused is refused)");
  t->add_option("--loss", c.loss,
                "fused: the LM head and the loss in groups of tokens (the logits never whole); "
                "naive: the logits whole, then the loss. Default: fused where the tokens split "
                "into groups (T5: naive; fused is refused)");
  t->add_option("--loss-dtype", c.loss_dtype,
                "f32: the naive loss on a float32 copy of the logits (cross_entropy(logits.float(), "
                "labels)); bf16: on the bf16 logits as computed, no copy (F.cross_entropy on "
                "them). Default: f32")
      ->check(CLI::IsMember({"f32", "bf16"}));
  t->add_option("--sequence-parallel", c.sequence_parallel,
                "on or off: split the layers' norm and residual regions along the sequence over "
                "the tensor-parallel axes (Megatron's sequence parallelism; the rules' "
                "activations map activation_norm_length). Default: on when the rules map it");
  t->add_option("--batch-axes", c.batch_axes,
                "Mesh axes the batch is split over, comma-separated. Default: every axis except "
                "tp, model, mp, tensor (model axes) and cp, context (context axes)");
  add_output_options(t, c);
  // Every option that takes a value refuses an empty one (docs/cli.md, "Refused combinations"):
  // '' is not "not given" (--rules '' once planned the default preset).
  for (CLI::Option* opt : t->get_options()) {
    if (opt->get_type_size() > 0 && opt->get_name() != "--html" &&
        opt->get_name() != "--emit-config") {
      opt->check(non_empty_value());
    }
  }
  return c;
}

}  // namespace shardplan::cli
