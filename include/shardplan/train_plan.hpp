#pragma once
// Sizing a training run from the sharded program itself: a Hugging Face config.json becomes the
// model family's parameter tree (as TensorSpecs) and training step (forward, loss, backward,
// optimizer update), the step is lowered for a mesh with sjit on abstract arguments (nothing is
// allocated), and the compiled program's cost gives the bytes each device holds, its FLOPs and
// the bytes each collective moves.
//
//   const ModelConfig cfg = ModelConfig::load("Meta-Llama-3-70B/config.json");
//   TrainPlanOptions o;
//   o.batch = 256;
//   o.seq = 4096;
//   o.device_memory = parse_bytes("80GiB");
//   const TrainPlan p = plan_training(cfg, Mesh::parse("fsdp:-1,tp:8", 512), rules, o);
//   std::cout << p.table();

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardplan/collective_kind.hpp"
#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/hardware.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/program_cost.hpp"
#include "shardplan/remat.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sharding_rule.hpp"
#include "shardplan/tensor_spec.hpp"
#include "shardplan/train_step_time.hpp"
#include "shardplan/tree.hpp"

namespace shardplan {

namespace train {
struct FamilyDef;  // a model family's declaration (src/train/families/)
}

/// The fields of a Hugging Face config.json a training step needs.
struct ModelConfig {
  /// The family the model_type belongs to: what reads its fields, builds its parameters and its
  /// step (set by parse).
  const train::FamilyDef* family = nullptr;
  std::string model_type;  // as the file says ("llama", "gpt2", ...)
  std::int64_t vocab = 0;
  std::int64_t hidden = 0;
  std::int64_t layers = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;           // grouped-query attention; = heads when the file has none
  std::int64_t intermediate = 0;       // the MLP's inner width
  std::int64_t positions = 0;          // GPT-2's learned position table (n_positions)
  bool tie_embeddings = false;         // the output projection is the embedding (no lm_head)
  bool attention_bias = false;         // q/k/v projections have biases (Qwen2, LLaMA's flag)
  bool output_bias = false;            // o_proj has a bias (LLaMA's attention_bias)
  bool mlp_bias = false;               // gate/up/down projections have biases (LLaMA's mlp_bias)
  bool qk_norm = false;  // an RMSNorm over each query and key head before RoPE (Qwen3's q/k_norm)
  std::int64_t experts = 0;            // Mixtral: experts per layer (num_local_experts)
  std::int64_t experts_per_token = 0;  // Mixtral: experts each token goes to (top-k)
  /// The heads' width: head_dim (LLaMA family, else hidden / heads), d_kv (T5), hidden / heads
  /// (GPT-2). It need not be hidden / heads (Mistral-NeMo: 128 with hidden 5120 and 32 heads).
  std::int64_t head_dim = 0;
  std::int64_t decoder_layers = 0;         // T5: num_decoder_layers (= layers when absent)
  std::int64_t relative_buckets = 0;       // T5: relative_attention_num_buckets
  std::int64_t relative_max_distance = 0;  // T5: relative_attention_max_distance
  bool gated_mlp = false;  // T5 v1.1 / Flan-T5: wi_0, wi_1 (feed_forward_proj gated-*)
  /// Sliding-window attention (Mistral, Mixtral, Qwen2): a query attends to itself and the
  /// sliding_window - 1 keys before it, on the layers window_layers marks (empty: none).
  std::int64_t sliding_window = 0;
  std::vector<bool> window_layers;
  /// The attention scores' scale (Gemma 2: 1 / sqrt(query_pre_attn_scalar)); 0: 1 / sqrt(head_dim).
  double attention_scale = 0;
  /// Soft-capping x -> cap * tanh(x / cap) (0: none) of the attention scores, after the scale and
  /// before the mask (Gemma 2's attn_logit_softcapping), and of the LM head's logits before the
  /// loss (final_logit_softcapping). The fused attention kernel and the fused loss have none: a
  /// capped model runs them as ops (train-plan refuses --attention / --loss fused for it).
  double attention_softcap = 0;
  double logit_softcap = 0;
  /// What the file says that the step does not model, one entry each ("hidden_act 'gelu' (the
  /// step's MLP is SwiGLU, with silu)", "dropout (resid_pdrop 0.1)", a field not known here).
  /// Fields known to change neither shapes nor work (token ids, epsilons, rotary settings) are
  /// not listed; docs/training.md lists what is read.
  std::vector<std::string> not_modelled;

  /// The attention window of decoder layer `layer`: 0 for full causal attention.
  std::int64_t window(std::size_t layer) const {
    return layer < window_layers.size() && window_layers[layer] ? sliding_window : 0;
  }

  /// Parses config.json text. Throws IoError naming `source` and the missing or bad field, or
  /// the model_type when the family has no training step here (listing the ones that do).
  static ModelConfig parse(std::string_view json, std::string_view source = "<memory>");
  /// Reads `path`: a config.json, or a checkpoint directory holding one. Throws IoError.
  static ModelConfig load(const std::filesystem::path& path);

  /// The parameters in Hugging Face naming, as a tree ("model/layers/0/mlp/up_proj/weight"),
  /// every leaf of `dtype`. Throws SpecError when a size does not divide (hidden by heads).
  Tree<TensorSpec> parameters(DType dtype) const;
  /// Number of parameters (the elements of parameters()).
  std::int64_t parameter_count() const;
  /// The parameters one token runs through: parameter_count() less, for a mixture of experts
  /// (Mixtral), the experts it is not routed to (each layer's E experts counted k / E, k =
  /// experts_per_token), as torchtitan and Megatron count active parameters for MFU.
  std::int64_t active_parameter_count() const;
  /// The family's name: "llama" (llama, mistral, qwen2), "qwen3", "gemma2", "mixtral", "gpt2",
  /// "t5".
  std::string family_name() const;
  /// Where the list of decoder layers sits in parameters(): "model/layers" / "h" (T5 has two
  /// stacks, "encoder/block" and "decoder/block"; this gives the decoder's).
  std::string layers_path() const;
};

/// train-plan's --remat: "none" (nothing), "full" (nothing_saveable: each layer's input only),
/// "dots" (dots_with_no_batch_dims_saveable), "names:a,b" (save_only_these_names; the names
/// checkpoint_name gives in a layer: docs/training.md), "STACK:NAME" (a stack's own policy,
/// "maxtext:minimal": its names the layer gives). Throws SpecError naming the forms.
std::optional<RematPolicy> parse_remat(std::string_view text);
/// The --remat form of a policy ("none" for nothing; a stack's list by its STACK:NAME).
std::string remat_name(const std::optional<RematPolicy>& policy);

/// Where a tensor-parallel step's layer weights are laid out as they are used (--tp-plan).
/// kPartitioner: as the partitioner chooses (it may gather a weight over the model axes and move
/// activations by all-to-all instead, when that moves fewer bytes). kModules: as the stacks'
/// column- and row-parallel modules hold them (Megatron-Core's ColumnParallelLinear and
/// RowParallelLinear, torchtitan's ColwiseParallel and RowwiseParallel): every layer weight the
/// rules split over a model axis is used in that split, gathered over the data axes only, so the
/// activations around each block are all-gathered and reduce-scattered as those modules do.
enum class TpPlan { kPartitioner, kModules };
/// "partitioner", "modules". Throws SpecError naming the known ones.
TpPlan parse_tp_plan(std::string_view name);
std::string_view name(TpPlan plan);
/// "permute", "allgather" (--cp-rotate; RingRotate). Throws SpecError naming the known ones.
RingRotate parse_ring_rotate(std::string_view name);
std::string_view name(RingRotate rotate);
/// "ring", "allgather-kv", "ulysses" (--cp-kernel; ContextKernel). Throws SpecError naming the
/// known ones.
ContextKernel parse_context_kernel(std::string_view name);
std::string_view name(ContextKernel kernel);
/// "tensorwise", "rowwise", "rowwise_with_gw_hp" (--float8-recipe; torchao's recipe names,
/// Float8Scaling). Throws SpecError naming the known ones.
Float8Scaling parse_float8_recipe(std::string_view name);
std::string_view name(Float8Scaling scaling);
/// Which dtype FSDP all-gathers float8 linear layers' weights in (--float8-all-gather).
/// kFloat8: each weight cast on its shard (the amax reduced over the shards) and its 8 bits
/// gathered (torchao's enable_fsdp_float8_all_gather; tensorwise scaling only). kBf16: gathered
/// as used (in --param-dtype, bf16 in the stacks) and cast after the gather, on the whole weight
/// on every device.
enum class Float8Gather { kFloat8, kBf16 };
/// "float8", "bf16". Throws SpecError naming the known ones.
Float8Gather parse_float8_gather(std::string_view name);
std::string_view name(Float8Gather gather);

/// Which decoder layers --remat makes checkpoints (--remat-blocks; docs/training.md "Remat per
/// block"). Layer i counts from 0. kAll: every layer. kEvery: every k-th, layers k-1, 2k-1, ...
/// (torchtitan's selective layer AC, selective_ac_option "k"). kFraction: fms-fsdp's
/// selective_checkpointing p, block n (from 1) when n p >= the count chosen before it + 1/2, in
/// doubles as Python computes it. kLayers: the listed ranges (inclusive).
struct RematBlocks {
  enum class Kind { kAll, kEvery, kFraction, kLayers };
  Kind kind = Kind::kAll;
  std::int64_t every = 1;
  double fraction = 1;
  std::string fraction_text;  // as given ("1/3", "0.5"), for remat_blocks_name
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;  // [first, last] each
  /// Whether layer `layer` (from 0) is a checkpoint.
  bool selects(std::int64_t layer) const;
  friend bool operator==(const RematBlocks&, const RematBlocks&) = default;
};
/// train-plan's --remat-blocks: "all", "every:K" (K >= 1), "fraction:P" (P a decimal or A/B in
/// (0, 1]), "layers:A-B,C" (ranges from 0, ascending, not overlapping). Throws SpecError naming
/// the text and the forms.
RematBlocks parse_remat_blocks(std::string_view text);
/// The --remat-blocks form ("all" for every layer).
std::string remat_blocks_name(const RematBlocks& blocks);

enum class OptimizerKind { kSgd, kAdam, kAdamw };
/// "sgd", "adam", "adamw". Throws SpecError naming the known ones.
OptimizerKind parse_optimizer(std::string_view name);
std::string_view name(OptimizerKind kind);

/// How the optimizer's update runs (--optimizer-kernel). kOps: as the program's elementwise ops
/// (one kernel per chain when compiled, per op with --eager; torch's for-loop and foreach
/// implementations run the same passes over memory). kFused: Adam's and AdamW's update of each
/// parameter as one kernel (adamw_update, torch.optim.AdamW(fused=True), Apex's and Transformer
/// Engine's FusedAdam): the parameter, gradient and moments read once, the three results written
/// once (28 bytes per f32 element). kForeach: Adam's and AdamW's update as torch's foreach
/// passes (adamw_foreach, torch.optim.AdamW(foreach=True), its default on CUDA): each pass reads
/// and writes whole arrays in place (80 bytes per f32 element with decay, 72 without), and the
/// square roots of the second moments are one more array per parameter, held for the update.
enum class OptimizerKernel { kOps, kFused, kForeach };
/// "ops", "fused", "foreach". Throws SpecError naming the known ones.
OptimizerKernel parse_optimizer_kernel(std::string_view name);
std::string_view name(OptimizerKernel kernel);

/// How the parameters, gradients and optimizer state are sharded (--optimizer-sharding).
/// kRules: all three as the rules shard them (FSDP when the rules split over the data axes).
/// kZero1: ZeRO-1, Megatron's --use-distributed-optimizer: the param_dtype parameters held
/// replicated over the batch and context axes (only the rules' model-axis splits kept), the
/// master weights (master_dtype) and the optimizer state as the rules shard them; the gradients
/// reduce-scattered to that sharding, the update on the shard, the new parameters all-gathered.
enum class OptimizerSharding { kRules, kZero1 };
/// "rules", "zero1". Throws SpecError naming the known ones.
OptimizerSharding parse_optimizer_sharding(std::string_view name);
std::string_view name(OptimizerSharding sharding);

/// How the step time overlaps the data-parallel collectives (--dp-overlap; docs/training.md
/// "Step time"): kFsdp FSDP2's layer pipeline; kOff all exposed (Megatron's DDP default);
/// kBuckets Megatron's buckets, the reductions under the backward pass and ZeRO-1's gathers
/// under the forward pass; kGradBuckets the reductions so, the gathers exposed.
enum class DpOverlap { kFsdp, kOff, kBuckets, kGradBuckets };
/// "fsdp", "off", "buckets", "grad-buckets". Throws SpecError naming the known ones.
DpOverlap parse_dp_overlap(std::string_view name);
std::string_view name(DpOverlap overlap);

/// The declared training stack a plan's options came from (--stack; training_stack.hpp), as
/// the report names it.
struct StackUse {
  std::string name;
  bool validated = false;  // planned through on at least 2 published runs
  /// "topic: setting" ("loss: --loss naive"): the stack's choices applied.
  std::vector<std::string> applied;
  /// "topic (by --option)": the stack's choices the user's options overrode.
  std::vector<std::string> overridden;
  /// The topics of its choices train-plan does not plan ("optimizer kernel").
  std::vector<std::string> not_modelled;
  /// The options its applied choices set ("--tp-plan"): a stack's setting that a mesh gives no
  /// place to (--tp-plan modules without a model axis) is its default there, not refused; the
  /// same option given by the user is refused (train_plan_refusals()).
  std::vector<std::string> options_set;
  /// --from-config (stack_config.hpp): the stack's config file read (empty: none) and its keys:
  /// planned ("training.seq_len = 8192: --seq 8192"), overridden by an option given
  /// ("training.seq_len = 8192 (by --seq)"), read and not planned, with why.
  std::string config;
  std::vector<std::string> config_applied, config_overridden, config_ignored;
};

/// What step to plan: the batch, the precision, the optimizer.
struct TrainPlanOptions {
  std::int64_t batch = 8;       // sequences per step (the global batch)
  std::int64_t seq = 2048;      // tokens per sequence (T5: the encoder's input)
  std::int64_t target_seq = 0;  // T5: the decoder's tokens per sequence; 0: = seq
  OptimizerKind optimizer = OptimizerKind::kAdamw;
  /// The update's kernel; kFused with SGD is an OptionError.
  OptimizerKernel optimizer_kernel = OptimizerKernel::kOps;
  /// Where the parameters, gradients and state live (OptimizerSharding); kZero1 is an
  /// OptionError when the rules split no parameter over a data axis of more than one device.
  OptimizerSharding optimizer_sharding = OptimizerSharding::kRules;
  DType param_dtype = DType::kBF16;     // the weights as computed with (and held: master_dtype)
  DType grad_dtype = DType::kBF16;      // gradients, accumulated and handed to the optimizer
  DType optimizer_dtype = DType::kF32;  // the optimizer's moments; the update runs in it
  /// Mixed precision as FSDP2's MixedPrecisionPolicy and Megatron's distributed optimizer: the
  /// weights held (sharded) and updated in master_dtype and cast to param_dtype, shard by shard,
  /// before use (so FSDP gathers them in param_dtype). nullopt: held in param_dtype.
  std::optional<DType> master_dtype;
  /// The dtype the gradients are reduced over the batch axes in (FSDP2's reduce_dtype): the
  /// gradients of the step's param_dtype weights are converted to it, reduced to their shards,
  /// then held in grad_dtype. nullopt: reduced as computed (param_dtype).
  std::optional<DType> reduce_dtype;
  /// The hardware whose step time to estimate (hardware.hpp; docs/training.md "Step time");
  /// nullopt: no time. Its memory is the device memory when device_memory is 0.
  std::optional<Hardware> hardware;
  int grad_accum = 1;                   // micro-batches per step (the batch splits evenly)
  /// Keep only each layer's input in the forward pass and recompute the layer's activations in
  /// the backward pass (gradient checkpointing per layer): less memory, one more forward. The
  /// same as remat = nothing_saveable (--recompute is --remat full); `remat`, when set, decides.
  bool recompute = false;
  /// Each layer a checkpoint with this policy (remat.hpp; --remat full|dots|names:a,b).
  std::optional<RematPolicy> remat = std::nullopt;
  /// The layers the policy applies to (--remat-blocks); the others run as without it (and are
  /// resharded after forward as reshard_after_forward says). Not kAll without a policy is an
  /// OptionError, as a layers range past the model's last layer.
  RematBlocks remat_blocks;
  /// Without recomputation, over batch axes: each layer's weights gathered (and cast) again for
  /// the backward pass rather than kept gathered from the forward pass, as FSDP2's
  /// reshard_after_forward (its default); false: kept (--no-reshard-after-forward, ZeRO-2's
  /// behaviour). With recomputation, false keeps the forward pass's gathered weights for the
  /// recomputation (FSDP2's reshard_after_forward=False under activation checkpointing); true
  /// gathers them again there.
  bool reshard_after_forward = true;
  /// torchao's float8 training (--float8): every linear layer of the decoder blocks (attention's
  /// q, k, v, o; the MLP's gate, up, down) as float8_linear (ops.hpp: scaling as float8_recipe
  /// says, products at the hardware's fp8 rate); the LM head, attention and Mixtral's experts
  /// stay in the compute dtype. LLaMA-family models only.
  bool float8 = false;
  /// The float8 recipe (--float8-recipe); nullopt: tensorwise. Given without float8: an
  /// OptionError.
  std::optional<Float8Scaling> float8_recipe = std::nullopt;
  /// The dtype the float8 layers' weights are all-gathered in (--float8-all-gather); nullopt:
  /// float8 with tensorwise scaling, bf16 with rowwise (torchao gathers rowwise weights in high
  /// precision). kFloat8 with a rowwise recipe, or either without float8: an OptionError.
  std::optional<Float8Gather> float8_all_gather = std::nullopt;
  /// A dimension its mesh axes do not divide (FSDP over 96 devices of a hidden size of 8192):
  /// padded as FSDP and JAX pad it, each shard's bytes the padded block's, ceil(n/k) rows
  /// (kPad, the default); kRefuse (--strict-shards): a SpecError naming the tensor, its shape
  /// and the axes.
  Uneven uneven = Uneven::kPad;
  /// The LM head and the loss as linear_cross_entropy (groups of tokens; --loss fused), or the
  /// logits whole (--loss naive). nullopt: fused where it applies (not T5, whose loss reads the
  /// whole logits; not a sequence that splits into no groups); true where it cannot apply is an
  /// OptionError.
  std::optional<bool> fused_loss;
  /// The dtype the naive loss's log-softmax reads the logits in (--loss-dtype): kF32, a float32
  /// copy of the [tokens, vocab] logits (cross_entropy(logits.float(), labels)); kBF16, the bf16
  /// logits as the head computes them (F.cross_entropy on them: log-probabilities and their
  /// gradient in bf16). nullopt: f32 (the logits' own dtype when wider). Where it cannot apply
  /// it is an OptionError: bf16 with the fused loss or logits other than bf16 (--param-dtype),
  /// f32 of f64 logits, either with T5 (whose step reads its logits as computed); set by a
  /// stack, it is that stack's default there.
  std::optional<DType> loss_dtype;
  /// Attention as dot_product_attention (no [t, t] scores; --attention fused), or the scores,
  /// mask and softmax as ops (--attention naive). nullopt: fused where the family has it (not
  /// T5, whose attention with its relative position bias runs as ops); true for T5 and false
  /// with context parallelism (ring attention runs the fused kernel) are OptionErrors.
  std::optional<bool> fused_attention;
  /// The step as eager PyTorch runs it, without torch.compile (--eager): every elementwise op
  /// writes its result (a broadcast is read in place, as expand is a view), so the step holds
  /// each op's temporaries and reads and writes memory once per op. Default: as a compiler runs
  /// it, each chain of elementwise ops one kernel (SjitOptions::eager).
  bool eager = false;
  /// FSDP2 wrapping as torchtitan did before mid-2025 (--fsdp-root): the embedding, the final norm
  /// and the head belong to the root module, which FSDP2 keeps unsharded from its pre-forward to
  /// its post-backward (gathered at the forward pass's start, held to the backward pass's end,
  /// their gradients reduced there), and the last block is not resharded after forward (its
  /// gathered weights kept for its backward pass). Default: each its own unit (torchtitan since
  /// pytorch/torchtitan#1094): the embedding resharded after forward, the head gathered for the
  /// loss and kept for its backward pass only, every block resharded. Applied when the weights
  /// are sharded over batch or context axes (FSDP); the root's parameters are held as FSDP
  /// gathers them, over those axes only (docs/training.md).
  bool fsdp_root = false;
  /// Whether FSDP reshards the last block after forward like the others (false: its gathered
  /// weights kept for its backward pass, --no-reshard-last-block; torchtitan before #1094).
  /// nullopt: !fsdp_root (--fsdp-root keeps it, as torchtitan's root wrapping then did).
  /// Applied as fsdp_root; with a family without per-block FSDP units (T5) false is refused.
  std::optional<bool> reshard_last_block;
  /// The mesh axes the batch is split over; empty: every axis except tensor-parallel ones
  /// (tp, model, mp, tensor).
  std::vector<std::string> batch_axes;
  std::int64_t device_memory = 0;  // bytes per device; 0: do not check
  double headroom = 0.1;           // fraction of device_memory kept free (runtime, fragments)
  /// Plan many layers or micro-batches from a few small traced steps (docs/training.md, "Sizing
  /// a training run"); false: trace every layer and micro-batch (slow; to check the former).
  bool extrapolate = true;
  /// When the figures are extrapolated: trace the whole step as well, for the caching allocator
  /// model's reserved bytes (not affine in the layers; docs/training.md, "Reserved bytes"). Off:
  /// an extrapolated plan's reserved figures are 0 (not computed). The CLI turns it on for one
  /// plan, not for --compare.
  bool reserved_whole = false;
  /// The rule file whose `activations:` (with its logical_axes) shard the layers' norm and
  /// residual regions (docs/training.md, "Sequence parallelism"); none, or a file without
  /// activations: those regions are split over the batch axes only. train-plan binds the
  /// logical axis activation_batch to the batch axes.
  std::optional<RuleFile> activations;
  /// Megatron's sequence parallelism: the regions' sequence dimension split over the mesh axes
  /// the logical axis activation_norm_length maps to. nullopt: on when it maps to one; false:
  /// off (activation_norm_length unsharded); true: on, a SpecError when nothing maps it.
  std::optional<bool> sequence_parallel;
  /// Where the layer weights are laid out as used (TpPlan); with a model axis only.
  TpPlan tp_plan = TpPlan::kPartitioner;
  /// How context parallelism's ring attention exchanges the key/value blocks (RingRotate); with a
  /// context axis only. nullopt: not set (kPermute); set with another cp_kernel it is refused.
  std::optional<RingRotate> cp_rotate;
  /// Context parallelism's attention kernel (ContextKernel: the ring, all-gather of K/V,
  /// Ulysses); with a context axis only.
  ContextKernel cp_kernel = ContextKernel::kRing;
  /// Async tensor parallelism (--async-tp; docs/training.md "Async TP"): each tensor-parallel
  /// all-gather that feeds products, and each reduce-scatter a product feeds, runs decomposed
  /// and overlapped with those products (PyTorch's micro-pipeline TP, torchtitan's
  /// enable_async_tensor_parallel). With a model axis, --tp-plan modules and a compiled step.
  bool async_tp = false;
  /// DpOverlap (nullopt: kFsdp). Without hardware (and a stack), kGradBuckets without kZero1,
  /// the bucket values with rules that shard over a data axis without kZero1: OptionErrors.
  std::optional<DpOverlap> dp_overlap;
  /// With the bucket values: the parameter elements per device a bucket closes at (0: Megatron's
  /// default, max(4e7, 1e6 x the batch axes' devices)); with another DpOverlap an OptionError.
  std::int64_t dp_bucket_size = 0;
  /// The stack these options were set from (apply_stack); reported with the plan.
  std::optional<StackUse> stack;
};

/// One kind of refusal of train-plan's options: an option (as the command spells it) under a
/// condition it cannot apply in. The list is closed (train_plan_refusals(); docs/cli.md prints
/// it as a table, and a test keeps the two equal).
struct OptionRefusal {
  std::string_view option;     // "--attention fused"
  std::string_view condition;  // "T5 (its attention, with a relative position bias, runs as ops)"
};

/// Every refusal train-plan makes, in docs/cli.md's order.
const std::vector<OptionRefusal>& train_plan_refusals();

/// An option train-plan cannot apply (the CLI exits 2): which refusal of train_plan_refusals()
/// and, in the message, the values ("[train] --target-seq 16: a decoder-only model (llama): ...").
class OptionError : public SpecError {
 public:
  OptionError(std::size_t refusal, const std::string& what) : SpecError(what), refusal_(refusal) {}
  /// The index of the refusal in train_plan_refusals().
  std::size_t refusal_index() const { return refusal_; }
  const OptionRefusal& refusal() const { return train_plan_refusals().at(refusal_); }

 private:
  std::size_t refusal_;
};

/// The bytes a device holds over one traced training step, as the memory pass counts them
/// (ProgramCost::timeline): the whole step when it was traced whole, else the largest of the
/// small steps the figures were extrapolated from.
struct StepTimeline {
  /// Which step: "the whole step", "the 8-layer sample step", "the 4-layer x 2 micro-batch
  /// sample step".
  std::string traced;
  /// Its values live at the peak are named for the step: "parameter layers/0/mlp/w_in",
  /// "parameter layers/0/mlp/w_in resharded as bf16", "optimizer state mu/...", "tokens",
  /// or the op that made them with its checkpoint names ("dot_general 'mlpwo'").
  MemoryTimeline memory;
};

/// Per device (the most any device needs), for one training step.
struct TrainPlan {
  std::string model;  // "llama, 70.6B parameters"
  std::string mesh;
  std::int64_t devices = 0;
  std::int64_t parameter_count = 0;
  /// The parameters a token runs through (ModelConfig::active_parameter_count: a mixture of
  /// experts counts its routed experts only); the model FLOPs of MFU are of these.
  std::int64_t active_parameter_count = 0;
  std::vector<std::string> batch_axes;
  std::int64_t batch = 0, seq = 0;
  std::int64_t target_seq = 0;  // T5: the decoder's tokens per sequence; 0 for decoder-only
  int grad_accum = 1;
  bool recompute = false;    // some recomputation (remat is not "none")
  std::string remat = "none";  // --remat's form of the policy
  std::string remat_blocks = "all";  // --remat-blocks' form
  std::int64_t remat_layers = 0;     // the layers that are checkpoints (0 without recomputation)
  /// Without recomputation: the layers' weights gathered again for the backward pass
  /// (TrainPlanOptions::reshard_after_forward, applied: there are batch axes).
  bool reshard_after_forward = false;
  /// With recomputation: the layers' weights as the forward pass gathered them kept for the
  /// recomputation and the backward pass, not gathered again (TrainPlanOptions::
  /// reshard_after_forward false, applied: there are batch axes).
  bool kept_gathered_for_recompute = false;
  /// What the planned program holds, read from it (never from the options): float8 products
  /// (the decoder blocks' linear layers, TrainPlanOptions::float8), linear_cross_entropy's
  /// groups (the fused loss), the fused attention primitive.
  bool float8 = false;
  /// With float8, read from the program's float8 products: "tensorwise" (every scale a scalar),
  /// "rowwise" (every scale per row), "rowwise_with_gw_hp" (some product with a per-row and a
  /// whole-tensor scale: its dx); empty without float8.
  std::string float8_recipe;
  /// With float8, the dtype the program all-gathers its arguments (weights) in: "float8" when
  /// some gather of an argument is in a float8 dtype, else that of the gathers ("bf16"), "none"
  /// when it gathers no argument; empty without float8.
  std::string float8_all_gather;
  bool fused_loss = true;
  /// The dtype the loss ran in, read from the program (the dtype of the loss it returns, that of
  /// the log-probabilities its cross-entropy reads the targets from): f32 with a float32 copy of
  /// the logits or the fused loss's f32 groups, bf16 when the logits are read as computed
  /// (TrainPlanOptions::loss_dtype; T5's step).
  DType loss_dtype = DType::kF32;
  bool fused_attention = true;
  bool eager = false;  // TrainPlanOptions::eager
  /// "fused" when the program updates the parameters with adamw_update, "foreach" with
  /// adamw_foreach's passes (read from the program, TrainPlanOptions::optimizer_kernel), else
  /// "ops".
  std::string optimizer_kernel = "ops";
  /// "zero1" when the program takes some parameter replicated over a batch or context axis that
  /// the optimizer state beside it is split over (read from its input shardings,
  /// TrainPlanOptions::optimizer_sharding), else "rules".
  std::string optimizer_sharding = "rules";
  /// Whether the program uses the layer weights in their model-axis split (TpPlan::kModules
  /// applied: some layer weight is split over a model axis).
  bool tp_modules = false;
  bool fsdp_root = false;  // TrainPlanOptions::fsdp_root, applied (batch or context axes)
  /// The last block's weights kept gathered from its forward to its backward pass, not
  /// resharded (TrainPlanOptions::reshard_last_block false, applied as fsdp_root).
  bool last_block_kept_gathered = false;
  /// Whether the program splits the norm and residual regions along the sequence over model
  /// (tensor-parallel) axes, and over which (read from the program's annotated values).
  bool sequence_parallel = false;
  std::vector<std::string> sequence_axes;
  /// The axes the program splits the tokens' sequence over and runs ring attention on (its
  /// key/value blocks exchanged by ppermute): context parallelism (cp, context; the tokens in
  /// the load-balanced order); empty for none.
  std::vector<std::string> context_axes;
  /// With context_axes: whether the ring's key/value blocks are all-gathered
  /// (RingRotate::kAllGather: the ring's ops hold an all-gather), else passed round by ppermute.
  bool context_gathered = false;
  /// With context_axes: the kernel the program's attention ran (read from its composite ops).
  ContextKernel context_kernel = ContextKernel::kRing;
  std::string optimizer;
  DType param_dtype = DType::kBF16, grad_dtype = DType::kBF16, optimizer_dtype = DType::kF32;
  /// Mixed precision (TrainPlanOptions): the dtype the weights are held in and the one the
  /// gradients are reduced in; equal to param_dtype when not asked for.
  DType master_dtype = DType::kBF16, reduce_dtype = DType::kBF16;

  std::int64_t parameter_bytes = 0;  // this device's parameter shards
  std::int64_t gradient_bytes = 0;   // its gradient shards (sharded like the parameters)
  std::int64_t optimizer_bytes = 0;  // its optimizer-state shards
  std::int64_t batch_bytes = 0;      // its tokens and targets
  /// The program's peak: everything live at once (inputs, activations, gradients, temporaries).
  std::int64_t peak_bytes = 0;
  /// peak - (parameters + optimizer state + batch): activations, gradients and temporaries
  /// live at the peak.
  std::int64_t transient_bytes = 0;
  /// What is live at the peak (adds up to peak_bytes): the arguments still held (parameters,
  /// optimizer state and batch not yet given up to the new ones), the parameters gathered or
  /// moved to the sharding an op needs (FSDP's gathered weights), and what the step computed
  /// (activations, gradients, temporaries).
  std::int64_t peak_held_bytes = 0, peak_gathered_bytes = 0, peak_computed_bytes = 0;
  /// What PyTorch's CUDA caching allocator would reserve at its peak (reserved_bytes.all.peak)
  /// running the step as FSDP2 does: a model of the allocator, its rules and constants
  /// PyTorch's, nothing fitted (docs/training.md, "Reserved bytes"). With a segment per
  /// cudaMalloc (PyTorch's default) and with expandable segments. The verdict stays on
  /// peak_bytes (on a failed cudaMalloc PyTorch frees its cached segments and retries). 0: not
  /// computed (an extrapolated step without TrainPlanOptions::reserved_whole).
  std::int64_t reserved_bytes = 0, reserved_bytes_expandable = 0;
  double flops = 0;                                         // floating-point operations per step
  /// Of `flops`: products, fused attention and float8 products (ProgramCost::matmul_flops,
  /// attention_flops, matmul_fp8_flops); and the bytes the other kernels read and write
  /// (ProgramCost::memory_traffic).
  double matmul_flops = 0, attention_flops = 0, matmul_fp8_flops = 0;
  std::int64_t memory_traffic = 0;
  /// The operations the forward and backward passes launch one by one when run eagerly: each
  /// kernel step (views too) and each collective that moves bytes; constant steps and the
  /// update are not counted (StepTime::launched_ops: what eager tensor parallelism dispatches).
  std::int64_t launched_ops = 0;
  std::map<CollectiveKind, std::int64_t> bytes_by_collective;  // bytes received, per kind
  std::map<CollectiveOn, std::int64_t> bytes_by_axes;          // the same per kind and mesh axes
  /// Async TP (TrainPlanOptions::async_tp): the tensor-parallel collectives the program pairs
  /// with products, by kind; empty without.
  std::vector<TpOverlap> tp_overlaps;
  /// With TrainPlanOptions::hardware: the step's time on it.
  std::optional<StepTime> time;
  /// The live bytes over the traced step (the HTML page's chart).
  std::optional<StepTimeline> timeline;
  std::int64_t device_memory = 0;
  double headroom = 0;
  double seconds_to_plan = 0;
  /// Whether the figures were extrapolated from small traced steps (TrainPlanOptions::
  /// extrapolate), and what was traced: "the whole step" or "steps of 2, 3, 4, 8 layers x 1
  /// micro-batch".
  bool extrapolated = false;
  std::string traced;
  std::string rules;  // where the rules came from ("preset llama_fsdp_tp", a file name)
  /// Why these rules, when train-plan chose them ("the default for llama on a mesh without tp").
  std::string rules_note;
  /// ModelConfig::not_modelled: what the config says that the figures leave out.
  std::vector<std::string> not_modelled;
  /// FLOPs of every device together (flops is the busiest device's).
  double total_flops = 0;
  /// In a comparison, why this configuration could not be planned (empty: it was).
  std::string error;
  /// The declared stack the options came from (TrainPlanOptions::stack), if any.
  std::optional<StackUse> stack;

  /// Sum of bytes_by_collective.
  std::int64_t bytes_moved() const;
  /// device_memory * (1 - headroom); 0 when no memory was given.
  std::int64_t usable_bytes() const;
  /// Empty when no memory was given, else whether peak_bytes <= usable_bytes().
  std::optional<bool> fits() const;

  /// The step line's remat: "full", "full on blocks every:2 (16 layers)", with how the layers'
  /// weights are gathered for the backward pass when FSDP gathers them.
  std::string remat_text() const;
  /// A few lines for people: the sizes per device, whether they fit, FLOPs, bytes moved.
  std::string table() const;
  /// The same as one JSON object (schema in docs/cli.md).
  void write_json(std::ostream& os) const;
};

/// One row per plan (mesh, rules, peak, fits, bytes moved, FLOPs), then which of them is
/// cheapest_fitting(), or a line saying none fits. When the plans have times (--hardware):
/// ranked by them instead (peak, fits, step time, tokens/s per device, MFU, device-hours per
/// step, why_slower()), then fastest_fitting().
std::string compare_table(const std::vector<TrainPlan>& plans);
/// The plan that fits (fits() is true, or no memory was given) with the fewest bytes moved per
/// step (ties: the lower peak, then the first); plans with an error never count. nullopt when
/// none fits.
std::optional<std::size_t> cheapest_fitting(const std::vector<TrainPlan>& plans);
/// With a time (TrainPlanOptions::hardware): the plan that fits with the most tokens/s per
/// device, i.e. for one global batch the least device-time per step (ties: the lower peak, then
/// the first); plans with an error or no time never count. nullopt when none fits.
std::optional<std::size_t> fastest_fitting(const std::vector<TrainPlan>& plans);
/// Why `p` is not `best` in one phrase: "cannot be planned", "does not fit: peak ... > ...
/// usable", or the part of its device-seconds per step (compute, exposed communication on the
/// node's links, over the network) that exceeds best's the most; "" for best itself or without
/// times; "as fast" for a tie.
std::string why_slower(const TrainPlan& p, const TrainPlan& best);
/// The plans as {"plans": [...], "cheapest_fitting": index or null}, and with times
/// "fastest_fitting": index or null, "why_not_fastest": [phrase per plan].
void write_compare_json(std::ostream& os, const std::vector<TrainPlan>& plans);

/// Plans one training step of `config` on `mesh`: parameters sharded by `rules` (the optimizer
/// state like its parameter), the batch over the batch axes. Throws RuleError (a tensor no rule
/// matches), SpecError (a shape that does not divide, an unknown axis, a batch that does not
/// split) naming the path, shape and axis.
TrainPlan plan_training(const ModelConfig& config, const Mesh& mesh, const RulePtr& rules,
                        const TrainPlanOptions& options);

/// plan(0), ..., plan(n - 1) on up to `threads` threads at once (0: one per core), the plans in
/// that order: a comparison of configurations (`train-plan --compare`) on every core.
/// plan_training may run on several threads at once (each call traces on its own thread and
/// shares only its const arguments), and gives the same plan as alone (but seconds_to_plan).
/// When calls throw, the exception of the first of them in order is rethrown, as a loop would
/// throw it; calls after a failed one that have not started are skipped.
std::vector<TrainPlan> plan_concurrently(std::size_t n,
                                         const std::function<TrainPlan(std::size_t)>& plan,
                                         int threads = 0);

/// "80GiB", "80 GB", "1.5TiB", "1000000": bytes. Throws SpecError for anything else.
std::int64_t parse_bytes(std::string_view text);

}  // namespace shardplan
