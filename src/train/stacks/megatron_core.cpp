// Megatron-Core's GPT pretraining as declared data (training_stack.hpp): each choice with its
// source at the commit it names.
#include "choices.hpp"
#include "stacks.hpp"

namespace shardplan::train::stacks {
namespace {

// --use-distributed-optimizer off (Megatron's default): the state sharded as the parameters.
void rules_sharding(TrainPlanOptions& o) { o.optimizer_sharding = OptimizerSharding::kRules; }

// --overlap-grad-reduce and --overlap-param-gather off (Megatron's defaults): exposed.
void dp_overlap_off(TrainPlanOptions& o) { o.dp_overlap = DpOverlap::kOff; }

void megatron_precision(TrainPlanOptions& o) {
  o.param_dtype = DType::kBF16;
  o.master_dtype = DType::kF32;
  o.reduce_dtype = o.grad_dtype = DType::kBF16;
  o.optimizer_dtype = DType::kF32;
}

// Its parallelism: the tensor-parallel layers and what of the rest is not modelled.
std::vector<StackChoice> megatron_parallelism() {
  return {
      {.topic = "tensor parallelism",
       .what = "ColumnParallelLinear (qkv, fc1), RowParallelLinear (proj, fc2); sequence "
               "parallelism with --sequence-parallel",
       .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/tensor_parallel/layers.py",
       .setting = "--tp-plan modules",
       .options = {"--tp-plan"},
       .apply = tp_modules},
      {.topic = "context parallelism",
       .what = "--cp-comm-type p2p (the default): Transformer Engine's ring attention passes "
               "each key/value block to the next rank",
       .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/training/arguments.py: --cp-comm-type",
       .setting = "--cp-rotate permute",
       .options = kContextOptions,
       .apply = cp_permute},
      {.topic = "vocabulary parallelism",
       .what = "VocabParallelEmbedding and the output layer's vocabulary-parallel logits",
       .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/tensor_parallel/layers.py: "
                 "VocabParallelEmbedding; megatron/core/tensor_parallel/cross_entropy.py: "
                 "vocab_parallel_cross_entropy",
       .setting = "part of --tp-plan modules: the embedding looked up vocabulary-parallel, "
                  "the head used in its vocabulary split (with --loss naive)",
       .options = {"--tp-plan"},
       .apply = tp_modules},
      {.topic = "tensor-parallel overlap",
       .what = "--tp-comm-overlap off by default (ModelParallelConfig.tp_comm_overlap = False); "
               "when on, Transformer Engine's userbuffers pipeline each all-gather and "
               "reduce-scatter with its linear layer's GEMM, and in the backward pass also "
               "overlap them in bulk with the weight-gradient GEMMs (tp_comm_bulk_wgrad, "
               "tp_comm_bulk_dgrad); it asserts --sequence-parallel",
       .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/model_parallel_config.py: "
                 "tp_comm_overlap, tp_comm_overlap_ag, tp_comm_overlap_rs, tp_comm_bulk_wgrad; "
                 "megatron/training/arguments.py (its fields are arguments; the assert)",
       .setting = "off (--async-tp plans the pipelined pairs as PyTorch's micro-pipeline TP "
                  "does; the bulk overlaps with the weight-gradient GEMMs are not modelled)",
       .options = {"--async-tp"},
       .apply = no_async_tp},
      {.topic = "gradient reduction overlap",
       .what = "--overlap-grad-reduce and --overlap-param-gather off by default: the "
               "gradients' all-reduce (reduce-scatter with --use-distributed-optimizer) after "
               "the backward pass, the parameters' all-gather after the optimizer step, both "
               "exposed. On, each bucket's reduction starts when its gradients are all ready "
               "(the parameters taken backwards, a bucket closing at --ddp-bucket-size "
               "elements, by default max(40000000, 1000000 x data-parallel size)), and the "
               "next step's forward pre-hooks wait for each bucket's all-gather, dispatching "
               "the next",
       .source = "NVIDIA/Megatron-LM@d98e8a6 megatron/core/distributed/"
                 "distributed_data_parallel_config.py: DistributedDataParallelConfig "
                 "(overlap_grad_reduce, overlap_param_gather, bucket_size); megatron/core/"
                 "distributed/distributed_data_parallel.py: DistributedDataParallel.__init__ "
                 "(the default bucket size; none without overlap_grad_reduce); megatron/core/"
                 "distributed/param_and_grad_buffer.py: "
                 "_compute_default_per_buffer_param_layout, _ParamAndGradBucketGroup."
                 "finish_param_sync; megatron/core/optimizer/distrib_optimizer.py: "
                 "DistributedOptimizer.step_with_ready_grads; megatron/training/arguments.py "
                 "(the flags; --overlap-param-gather asserts --overlap-grad-reduce and the "
                 "distributed optimizer)",
       .setting = "off, as --dp-overlap off (a run with --overlap-grad-reduce: --dp-overlap "
                  "buckets, or grad-buckets without --overlap-param-gather under the "
                  "distributed optimizer; --ddp-bucket-size: --dp-bucket-size)",
       .options = {"--dp-overlap", "--dp-bucket-size"},
       .apply = dp_overlap_off},
  };
}

}  // namespace

const TrainingStack& megatron_core() {
  static const TrainingStack s{
      .name = "megatron-core",
      .summary =
          "NVIDIA Megatron-LM / Megatron-Core as of d98e8a6 (2026-08), GPT pretraining "
          "with --bf16 and Transformer Engine",
      .choices = joined(
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
            .setting = "train-plan's default (--optimizer-sharding rules: off, as Megatron's "
                       "default); --use-distributed-optimizer: --optimizer-sharding zero1",
            .options = {"--optimizer-sharding"},
            .apply = rules_sharding},
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
           fused_optimizer_kernel(
               "FusedAdam: one kernel reads and writes each parameter, gradient and moment "
               "once",
               "NVIDIA/Megatron-LM@d98e8a6 megatron/core/optimizer/__init__.py")},
          megatron_parallelism()),
      .validated_by = {}};
  return s;
}

}  // namespace shardplan::train::stacks
