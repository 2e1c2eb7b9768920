#pragma once
// The training steps train-plan lowers: each family's forward pass split into the embedding,
// one decoder layer and the head with its loss, so that the step can be differentiated whole or
// layer by layer (activation recomputation). Private to the library.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/remat.hpp"
#include "shardplan/train_plan.hpp"
#include "shardplan/tree.hpp"

namespace shardplan::train {

/// How activations are laid out: the batch over `batch` axes, heads and the MLP's inner width
/// over `model` axes (each spec entry names the axes, empty for none). The constraints are
/// applied only where the sizes divide.
struct Layout {
  AxisNames batch;
  AxisNames model;
  std::int64_t batch_ways = 1;  // product of the batch axes' sizes
  std::int64_t model_ways = 1;  // product of the model axes' sizes
  /// The decoder layers (LLaMA, Mixtral's attention, GPT-2) mark their norm and residual
  /// regions with with_sharding_annotation (kActivationNames; the sjit gives their shardings,
  /// as a rule file's `activations:`) instead of constraining them to the batch: Megatron's
  /// sequence parallelism when the sequence maps to the tensor-parallel axes.
  bool annotate = false;
  /// With `annotate`: the rules split those regions along the sequence over model axes
  /// (sequence parallelism on), so the embedding's output starts split so (ModelStep::lookup).
  bool sequence_parallel = false;
  /// Context parallelism: the sequence split over these axes (one axis), the tokens arriving in
  /// the load-balanced order (load_balanced_positions), attention by ring in a shard_map over
  /// `mesh` (context_parallel_attention's algorithm).
  AxisNames context;
  std::int64_t context_ways = 1;
  /// The mesh, with a context or a model axis (ring attention's and the vocabulary-parallel
  /// embedding's shard_map).
  std::optional<Mesh> mesh;
};

/// The annotation names the layers use when Layout::annotate: the residual stream (a layer's
/// input, h + attention, its output), the norms' outputs, the attention's and the MLP's
/// output projections before the residual add, and the norms' outputs as the attention's and
/// the MLP's input projections and the LM head read them (where sequence parallelism gathers
/// the sequence, as MaxText's activation_length). Each is [batch, sequence, hidden].
/// The checkpoint name of a layer's weights as used (ModelStep::reshard_after_forward).
inline constexpr const char* kWeightsInUse = "weights_in_use";

inline constexpr const char* kActivationNames[] = {
    "residual", "norm", "attention_out", "mlp_out", "attention_in", "mlp_in", "head_in"};

/// Tables every layer and micro-batch of one traced step reads alike, made once: the rotary
/// positions' cos and sin [t, dh / 2] by (t, dh / 2, dtype). Made per layer, each layer's copy
/// of these small constants would be kept between runs (program constants), one per layer and
/// micro-batch. Holds arrays of one trace: loss_and_grads makes one inside each value_and_grad
/// it traces (a micro-batch's tracers are not valid in the next one's trace).
struct SharedTables {
  // By (t, dh / 2, dtype, devices of the load-balanced order: 1 for the natural one).
  std::map<std::tuple<std::int64_t, std::int64_t, DType, std::int64_t>, std::pair<Array, Array>>
      rotary;
};

/// Whether some layer has a parameter in `per_layer` (ModelStep::layer_in_use, layer_gathered):
/// the step pins a layout of a layer weight.
bool pins_some_layer(const std::vector<std::map<std::string, PartitionSpec>>& per_layer);

/// The family's forward pass in three parts. `rest` is the parameter tree without its layers
/// (the layers list replaced by an empty list); `layer` one element of the layers list.
struct ModelStep {
  const ModelConfig& config;
  Layout layout;
  SharedTables* tables = nullptr;  // none: every layer makes its own tables
  /// Each layer a checkpoint with this policy (remat.hpp): what it does not save is recomputed
  /// in the backward pass, its weights gathered again there. None: every activation is kept.
  std::optional<RematPolicy> remat = std::nullopt;
  /// The layers `remat` applies to (TrainPlanOptions::remat_blocks); the others run as without
  /// it (reshard_after_forward decides whether they gather their weights again).
  RematBlocks remat_blocks;
  /// The forward pass reads the weights through optimization_barrier, so that each micro-batch
  /// of a step gathers the weights it uses again instead of reusing, and so keeping alive, the
  /// first one's gathered copies.
  bool regather = false;
  /// Attention as dot_product_attention (blocked, no [t, t] scores held); false: the scores,
  /// the mask and the softmax as separate ops.
  bool fused_attention = true;
  /// How the ring attention of context parallelism exchanges key/value blocks (RingRotate).
  RingRotate ring_rotate = RingRotate::kPermute;
  /// Context parallelism's attention kernel (ContextKernel; ring_rotate is the ring's).
  ContextKernel context_kernel = ContextKernel::kRing;
  /// The head and the loss as linear_cross_entropy (groups of tokens, the logits never whole);
  /// false: the logits whole, then cross_entropy.
  bool fused_loss = true;
  /// The naive loss's log-softmax reads the logits in this dtype (TrainPlanOptions::loss_dtype):
  /// a copy in it when it is wider than the logits, the logits as they are when equal. nullopt:
  /// f32 (f64 for f64 logits).
  std::optional<DType> loss_dtype = std::nullopt;
  /// Mixed precision: the weights, held in another dtype, cast to this one where they are used
  /// (each layer's inside its checkpoint, so that the backward pass casts and gathers them
  /// again, as FSDP2 does per layer). `reduce_in_held`: their gradients' sums reduced in the
  /// held dtype (convert_pending), else in this one.
  std::optional<DType> compute_dtype = std::nullopt;
  bool reduce_in_held = false;
  /// For a layer that is no checkpoint of `remat`: FSDP's reshard after forward. It becomes a
  /// checkpoint that saves every value but its weights as used (kWeightsInUse: the casts of
  /// compute_dtype), so the backward pass reads the held weights again and gathers (and casts)
  /// them again instead of keeping the forward pass's gathered copies. (A checkpoint of `remat`
  /// does this already.)
  bool reshard_after_forward = false;
  /// For a checkpoint of `remat`: FSDP2's reshard_after_forward=False under activation
  /// checkpointing. Its weights as used are made once, outside its checkpoint, and its
  /// recomputation reads them as they are (as keep_last_gathered's last layer), so the forward
  /// pass's gathered copies are kept to the backward pass instead of gathered again.
  bool keep_gathered = false;
  /// The LLaMA-family blocks' linear layers (q, k, v, o, gate, up, down) as float8_linear,
  /// with these options (the recipe; whether a pinned weight is cast before its pin).
  bool float8 = false;
  Float8Options float8_options;
  /// FSDP2's root module holds the parameters outside the layers (TrainPlanOptions::fsdp_root):
  /// gathered at the forward pass's start and read again at the backward pass's end (their
  /// gradients with them).
  bool fsdp_root = false;
  /// The last layer not resharded after forward (TrainPlanOptions::reshard_last_block false):
  /// its weights as used shared by its forward pass, its recomputation and its backward pass.
  bool keep_last_gathered = false;
  /// With fsdp_root, each root parameter's layout as FSDP gathers it, by path: its spec without
  /// the batch and context axes (what stays split is tensor parallelism's). A path not listed is
  /// gathered whole.
  std::map<std::string, PartitionSpec> root_in_use;
  /// TpPlan::kModules: per layer, each weight the rules split over a model axis, by its path in
  /// the layer ("self_attn/q_proj/weight"), as the column/row-parallel modules use it: its spec
  /// without the batch and context axes. Empty: the partitioner chooses.
  std::vector<std::map<std::string, PartitionSpec>> layer_in_use;
  /// TpPlan::kModules: the parameters outside the layers the rules split over a model axis (the
  /// embedding, the head), by path, in that split (the batch and context axes left out): the
  /// embedding looked up vocabulary-parallel (lookup), the head used as it is split. Empty: the
  /// partitioner chooses.
  std::map<std::string, PartitionSpec> outside_in_use;
  /// Float8 with its weights all-gathered in bf16 (TrainPlanOptions::float8_all_gather): per
  /// layer, each weight of rank 2 not in layer_in_use, by its path in the layer, gathered over
  /// the data axes (its spec without the batch and context axes), so that float8_linear casts
  /// it after the gather, as torchao's Float8Linear casts the weight FSDP2 gathered.
  std::vector<std::map<std::string, PartitionSpec>> layer_gathered;

  /// Layer `i`'s weights as used: layer_in_use's and layer_gathered's constraints on them (as
  /// they are without).
  Tree<Array> module_layouts(std::size_t i, const Tree<Array>& weights) const;

  /// y = x @ w^T for a block's Linear weight w [out, in]: float8_linear with `float8`.
  Array block_linear(const Array& x, const Array& w) const;

  /// `weights` cast for use (compute_dtype); as they are without one.
  Tree<Array> for_use(const Tree<Array>& weights) const;

  /// The rows of the embedding `table` [vocab, d] (the parameter at `path`) at tokens [b, t]:
  /// [b, t, d]. With outside_in_use splitting the table's vocabulary over the model axes (and
  /// no context axis), as torchtitan's RowwiseParallel tok_embeddings (input Replicate, output
  /// Shard(1)) and Megatron's VocabParallelEmbedding run it: each device takes the tokens that
  /// fall in its rows (the others read 0) and the partial sums are reduce-scattered along the
  /// sequence with sequence parallelism (Layout::sequence_parallel, where the model axes divide
  /// it), else all-reduced; without that split, take() as the partitioner lays it out.
  Array lookup(const Array& table, std::string_view path, const Array& tokens) const;
  /// The LLaMA layout's embedding: tokens [b, t] (i32) -> hidden [b, t, d].
  Array embed(const Tree<Array>& rest, const Array& tokens) const;
  /// hidden [b, t, d] -> hidden [b, t, d], the family's layer; `window` > 0: sliding-window
  /// attention (ModelConfig::window of the layer).
  Array layer(const Tree<Array>& layer, const Array& h, std::int64_t window = 0) const;
  /// The LLaMA layout's layer: RMSNorm, rotary attention, RMSNorm, the family's MLP.
  Array rms_norm_layer(const Tree<Array>& layer, const Array& h, std::int64_t window) const;
  /// attention() on the normed x [b, t, d] through o_proj (and its bias): [b, t, d], the
  /// "attention_out" region, before the residual add.
  Array attention_out(const Tree<Array>& layer, const Array& x, std::int64_t window) const;
  /// LLaMA's gated MLP on the normed x [b, t, d]: down(act(gate(x)) * up(x)), act silu (SwiGLU)
  /// unless given (GeGLU: the tanh gelu).
  Array gated_mlp(const Tree<Array>& layer, const Array& x,
                  Array (*act)(const Array&) = nullptr) const;
  Array rms_final_norm(const Tree<Array>& rest, const Array& h) const;
  /// Ring attention over the context axes (Layout::context): q [b, t, heads, dh], k, v [b, t,
  /// kv, dh] -> [b, t, heads, dh].
  Array ring(const Array& q, const Array& k, const Array& v) const;
  /// LLaMA's self-attention on the normed input x [b, t, d]: the heads merged [b, t, heads * dh].
  Array attention(const Tree<Array>& layer, const Array& x, std::int64_t window) const;
  /// Its fused form from the projections [b, t, heads * dh] and [b, t, kv * dh].
  Array fused_rotary_attention(const Array& q_proj, const Array& k_proj, const Array& v_proj,
                              std::int64_t window, bool repeat_kv) const;
  /// The mean next-token cross-entropy of hidden [b, t, d] against targets [b, t].
  Array loss(const Tree<Array>& rest, const Array& h, const Array& targets) const;
  /// The whole forward pass and its loss over the full parameter tree.
  Array forward_loss(const Tree<Array>& params, const Array& tokens, const Array& targets) const;
};

/// Soft-capping: cap * tanh(x / cap), x itself for cap 0 (Gemma 2's attention scores and
/// logits: ModelConfig::attention_softcap, logit_softcap).
Array soft_cap(const Array& x, double cap);

/// Causal attention's mask on scores [..., q, k] (q == k): a query sees the keys at or before
/// it, and with `window` > 0 only the `window` latest of them (itself included), as Mistral's
/// sliding window. Masked scores become -1e30.
Array attention_mask(const Array& scores, std::int64_t window);

// The pieces the families' step parts are written with (src/train/families/).

/// The leaf at `path` of `t`.
const Array& at(const Tree<Array>& t, std::string_view path);
/// y = x @ w^T for a Linear weight w [out, in].
Array linear(const Array& x, const Array& w);
/// y = x @ w for a Conv1D weight w [in, out] (GPT-2).
Array conv1d(const Array& x, const Array& w);
/// The layout constraints: each is applied only when the dimension divides, so a model whose
/// heads do not split over the model axes is left to propagation instead of failing here.
Array constrain(const Array& x, const std::vector<std::pair<int, const AxisNames*>>& dims,
                const Layout& layout);
/// A norm or residual region [b, t, d] (kActivationNames): annotated when the layout says so,
/// else constrained to the batch when `batch` (the constraints the layers had before), else
/// left to propagation.
Array region(const Array& x, const char* name, const Layout& layout, bool batch = false);
/// A norm's output `x`: the "norm" region, then as the projections named by `reader` read it.
Array normed(const Array& x, const char* reader, const Layout& layout);

/// T5's relative position bias [heads, q, k] from its table `weight` [buckets, heads]: the
/// distance from query i to key j in buckets, exact below half the buckets (of each direction,
/// for the encoder's `bidirectional` attention) and logarithmic up to `max_distance`.
Array relative_bias(const Array& weight, std::int64_t q, std::int64_t k, bool bidirectional,
                    std::int64_t max_distance);

/// `tree` with the subtree at `path` ("model/layers") replaced by `subtree`. Throws TreeError
/// when the path is missing.
template <class T>
Tree<T> replace_at_path(const Tree<T>& tree, std::string_view path, const Tree<T>& subtree);

/// The policy the options ask for: `remat` when set, else nothing_saveable for `recompute`.
inline std::optional<RematPolicy> effective_remat(const TrainPlanOptions& o) {
  if (o.remat) return o.remat;
  if (o.recompute) return checkpoint_policies::nothing_saveable();
  return std::nullopt;
}

/// Whether each of `layers` layers is a checkpoint (a policy, and remat_blocks selects it).
std::vector<bool> checkpointed_layers(const TrainPlanOptions& o, std::int64_t layers);
/// The least p such that layer i + p is a checkpoint exactly when layer i is, over `layers`
/// layers (1 for all or none; `layers` when the choice never repeats).
std::int64_t checkpoint_period(const TrainPlanOptions& o, std::int64_t layers);

/// The loss and the gradient of every parameter (in the parameters' tree shape) for one batch,
/// differentiated whole; `model.remat` makes the layers remat_blocks selects checkpoints.
std::pair<Array, Tree<Array>> loss_and_grads(const ModelStep& model, const Tree<Array>& params,
                                             const Array& tokens, const Array& targets);

}  // namespace shardplan::train
