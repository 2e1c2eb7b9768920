#pragma once
// Operations on sharded arrays. Outside sjit they run at once, shard by shard, under the same
// sharding rules sjit uses (sin of a sharded array is computed where its shards are, as in JAX);
// inside sjit they record the traced program. Shape errors name the op and the shapes.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/array.hpp"

namespace shardplan {

/// The dimensions of a dot_general: batch pairs and contracting pairs (XLA's DotDimensionNumbers).
struct DotDims {
  std::vector<int> lhs_batch, rhs_batch, lhs_contract, rhs_contract;
  friend bool operator==(const DotDims&, const DotDims&) = default;
};

// Elementwise.
Array neg(const Array& x);
Array exp(const Array& x);
Array log(const Array& x);
Array sqrt(const Array& x);
Array rsqrt(const Array& x);
Array sin(const Array& x);
Array cos(const Array& x);
Array tanh(const Array& x);
Array relu(const Array& x);
/// The tanh approximation, as jax.nn.gelu's default.
Array gelu(const Array& x);
Array sigmoid(const Array& x);
Array abs(const Array& x);
/// The error function (floats).
Array erf(const Array& x);
/// jax.nn.gelu(x, approximate): the tanh approximation when `approximate` (as gelu(x)), else the
/// exact 0.5 x (1 + erf(x / sqrt 2)) (PyTorch's default).
Array gelu(const Array& x, bool approximate);

// Binary, with numpy broadcasting; both operands of one dtype (a double adopts the array's).
Array add(const Array& a, const Array& b);
Array subtract(const Array& a, const Array& b);
Array multiply(const Array& a, const Array& b);
Array divide(const Array& a, const Array& b);
Array maximum(const Array& a, const Array& b);
Array minimum(const Array& a, const Array& b);
Array power(const Array& a, const Array& b);
// Comparisons give bool arrays.
Array equal(const Array& a, const Array& b);
Array not_equal(const Array& a, const Array& b);
Array less(const Array& a, const Array& b);
Array less_equal(const Array& a, const Array& b);
Array greater(const Array& a, const Array& b);
Array greater_equal(const Array& a, const Array& b);
/// cond ? a : b, elementwise, broadcasting all three.
Array where(const Array& cond, const Array& a, const Array& b);

Array operator-(const Array& x);
Array operator+(const Array& a, const Array& b);
Array operator-(const Array& a, const Array& b);
Array operator*(const Array& a, const Array& b);
Array operator/(const Array& a, const Array& b);
Array operator+(const Array& a, double b);
Array operator-(const Array& a, double b);
Array operator*(const Array& a, double b);
Array operator/(const Array& a, double b);
Array operator+(double a, const Array& b);
Array operator-(double a, const Array& b);
Array operator*(double a, const Array& b);
Array operator/(double a, const Array& b);
/// A scalar of `x`'s dtype, broadcast to `x`'s shape, on `x`'s devices.
Array full_like(const Array& x, double value);
/// `value` broadcast to `shape` as `dtype`, on the devices of `placement`.
Array full(const Shape& shape, DType dtype, double value, const Array& placement);
/// A host tensor as an array on the devices of `placement` (replicated): inside sjit a constant
/// of the program (made once per executor), outside it put at once.
Array constant(const Tensor& value, const Array& placement);

Array astype(const Array& x, DType dtype);
/// astype between float types, for a value that may be a sum pending over devices (a gradient
/// summed over the batch axes inside sjit): the sum is carried through and reduced in `dtype`,
/// never before the conversion even when that would move fewer bytes (FSDP2's reduce_dtype:
/// bf16 gradients reduced in f32). Its gradient is convert_pending too: an f32 weight cast with
/// it to bf16 for use has its gradient's sum reduced in f32. Elsewhere the same as astype.
/// Throws SpecError for a type that is not a float.
Array convert_pending(const Array& x, DType dtype);

// Contractions.
/// XLA's dot_general: result dims are batch, lhs free, rhs free.
Array dot_general(const Array& a, const Array& b, const DotDims& dims);
/// a[..., k] x b[k, n] (b of rank 2), or batched a[B..., m, k] x b[B..., k, n] (same batch).
Array matmul(const Array& a, const Array& b);
/// torch._scaled_mm: dot_general(a, b, dims) * scale_a * scale_b for float8 a and b (f8_e4m3 or
/// f8_e5m2, either), the products summed in f32 and the result written in `out_dtype` (bf16 or
/// f32). scale_a and scale_b are the inverses of the scales a and b were cast with, f32: a
/// scalar (shape [], tensorwise) or one per row, i.e. of the operand's shape without its
/// contracting dimensions (rowwise: torch._scaled_mm's [M, 1] and [1, N]). No gradient flows
/// through it (float8_linear gives its own). Throws SpecError for other dtypes, a scale of
/// another shape, or dimensions that do not pair up.
Array scaled_dot(const Array& a, const Array& b, const Array& scale_a, const Array& scale_b,
                 const DotDims& dims, DType out_dtype);
/// torchao's float8 training recipes (Float8LinearConfig.from_recipe_name).
enum class Float8Scaling {
  /// "tensorwise": one scale per tensor (amax of the whole tensor); the output's cotangent in
  /// f8_e5m2.
  kTensorwise,
  /// "rowwise": a scale per row of each operand of each of the three products (per token of x
  /// and of the cotangent, per output channel of w in the forward product, per input channel in
  /// the backward ones), everything in f8_e4m3, scales rounded down to powers of 2; x and w kept
  /// in their own dtype for the backward pass, which casts them along its own rows.
  kRowwise,
  /// "rowwise_with_gw_hp": rowwise forward; dx from the cotangent per row (f8_e4m3) and w
  /// tensorwise; dw in high precision (a dot_general of the cotangent and x as they are).
  kRowwiseWithGwHp,
};
/// How float8_linear casts and where the weight is cast (TrainPlanOptions::float8_all_gather).
struct Float8Options {
  Float8Scaling scaling = Float8Scaling::kTensorwise;
  /// A pinned w (a tensor-parallel module's weight, or one gathered whole for use) is cast as
  /// it was before the pin and its 8 bits pinned instead (gathered in 8 bits: torchao's
  /// enable_fsdp_float8_all_gather, tensorwise only); false: the pinned w is cast as pinned
  /// (gathered in its own dtype, cast after the gather).
  bool cast_before_pin = true;
};
/// torchao's Float8Linear with dynamic scaling: y = x @ w^T for a Linear weight w [out, in]
/// (x [..., in]), both cast to f8_e4m3 with a scale 448 / amax (of the whole tensor, or of each
/// row: Float8Scaling), multiplied by scaled_dot into x's dtype. Differentiable (custom_vjp):
/// each gradient is a scaled_dot (or, for rowwise_with_gw_hp's dw, a dot_general) of the
/// cotangent cast as the recipe says with x and w, in x's and w's dtypes. Tensorwise keeps x and
/// w in 8 bits for the backward pass; rowwise keeps them in their own dtype. A pinned w (a
/// tensor-parallel module's weight) is cast as Float8Options::cast_before_pin says (torchao's
/// Float8ColwiseParallel / Float8RowwiseParallel gather it in 8 bits). Throws SpecError unless x
/// and w are bf16 or f32 of fitting shapes.
Array float8_linear(const Array& x, const Array& w, const Float8Options& options = {});

// Reductions (negative axes count from the end).
Array sum(const Array& x, std::vector<int> axes, bool keepdims = false);
Array mean(const Array& x, std::vector<int> axes, bool keepdims = false);
Array max(const Array& x, std::vector<int> axes, bool keepdims = false);
Array min(const Array& x, std::vector<int> axes, bool keepdims = false);
/// Over every axis.
Array sum(const Array& x);
Array mean(const Array& x);

// Shapes.
Array reshape(const Array& x, const Shape& shape);
Array transpose(const Array& x, std::vector<int> perm);
Array broadcast_to(const Array& x, const Shape& shape);
/// jax.lax.broadcast_in_dim: operand dim i becomes result dim dims[i].
Array broadcast_in_dim(const Array& x, const Shape& shape, std::vector<int> dims);
Array slice(const Array& x, std::vector<std::int64_t> starts, std::vector<std::int64_t> limits);
Array concatenate(const std::vector<Array>& xs, int axis);
/// x's dimension `axis` indexed by `indices` (i32), as jnp.take (indices clipped into range).
Array take(const Array& x, const Array& indices, int axis = 0);
/// What a gather reads at an index outside its axis: the nearest element (numpy's and
/// jnp.take's clip), or 0 (jnp's mode='fill' with 0; the gradient there is 0 too).
enum class OutOfBounds : std::uint8_t { kClip, kZero };
/// numpy's take_along_axis for one element per row: indices (i32) of x's shape with 1 along
/// `axis`, clipped into range (or read as 0: `mode`); the result has their shape. One kernel, as torch.gather and
/// nll_loss read the log-probabilities at the targets; from an axis split over devices each
/// device takes the indices in its slice and the result is a sum pending over them (DTensor's
/// _MaskPartial): x is never gathered. Its cotangent is one array of x's size (zero but at the
/// indices).
Array take_along_axis(const Array& x, const Array& indices, int axis,
                      OutOfBounds mode = OutOfBounds::kClip);
/// labels (i32) -> `dtype` one-hot vectors of length n along a new last axis.
Array one_hot(const Array& labels, std::int64_t n, DType dtype = DType::kF32);
/// Random arrays inside sjit (counter-based, as Array::normal / uniform: the value at each index
/// depends only on the seed and the index): each device makes only its block of the sharding
/// the program gives the result (choose it with out_shardings or a constraint), so a sharded
/// model is initialised without any device holding a whole weight. Throws ArrayError outside
/// sjit (use Array::normal with a sharding there).
Array random_normal(const Shape& shape, DType dtype, std::uint64_t seed, double mean = 0,
                    double stddev = 1);
Array random_uniform(const Shape& shape, DType dtype, std::uint64_t seed, double low = 0,
                     double high = 1);

/// Values along `axis`, shaped like `like` (any dtype).
Array iota_like(const Array& like, int axis, DType dtype = DType::kI32);

// Neural-network pieces (built from the ops above).
Array softmax(const Array& x, int axis = -1);
Array log_softmax(const Array& x, int axis = -1);
/// log_softmax as one kernel, as PyTorch's (and cuDNN's) is: it reads whole rows of `axis` (a
/// split axis is gathered first) and writes only its result, where log_softmax's ops also write
/// x - max and exp(x - max) and reduce a split axis with collectives. The backward pass keeps
/// the result only. Equal to log_softmax to rounding.
Array fused_log_softmax(const Array& x, int axis = -1);
/// x * sigmoid(x) (jax.nn.silu, torch.nn.functional.silu), differentiated as PyTorch's kernel
/// is: only x is kept for the backward pass, which makes sigmoid(x) again.
Array silu(const Array& x);
/// The label that marks a token every loss leaves out (PyTorch's ignore_index default).
inline constexpr std::int64_t kIgnoreIndex = -100;
/// The losses' label rule: labels (i32) as they are (a view: no bytes, no FLOPs), each checked
/// to be a class in [0, classes) or `ignore_index` on the device that holds it when the op runs.
/// Eagerly a bad label throws at once; under sjit the compiled step throws when it runs (over
/// processes, on every process: docs/distributed.md). The error is a ValueError naming `op`,
/// the label, its index and `classes`, nested in the DeviceError naming the device (PyTorch's
/// "Target out of bounds"). Throws SpecError for classes < 1 or labels not i32.
Array check_labels(const Array& labels, std::int64_t classes,
                   std::int64_t ignore_index = kIgnoreIndex,
                   std::string_view op = "check_labels");
/// Per-example cross-entropy of logits [..., C] against integer labels [...] (optax's
/// softmax_cross_entropy_with_integer_labels; PyTorch's cross_entropy with reduction='none'):
/// a label equal to `ignore_index` gives 0 and no gradient; any other outside [0, C) is an
/// error (check_labels). mean_over_labels gives PyTorch's reduction='mean'.
Array cross_entropy(const Array& logits, const Array& labels,
                    std::int64_t ignore_index = kIgnoreIndex);
/// PyTorch's reduction='mean' of per-token losses [...]: their sum over the number of labels
/// [...] not equal to `ignore_index` (NaN when every label is ignored: 0 / 0, as PyTorch).
Array mean_over_labels(const Array& losses, const Array& labels,
                       std::int64_t ignore_index = kIgnoreIndex);
/// The per-token cross-entropy of the logits h @ w^T against labels, without the logits ever
/// existing whole: hidden h [..., t, d], a Linear weight w [vocab, d] (an LM head), labels
/// [..., t] (i32) -> [..., t], f32 (f64 for f64 h), the logits taken to f32 for the softmax. The
/// t tokens are split into `chunks` groups (every chunks-th token: a sharded token dimension is
/// not moved); each group's logits are made, used and dropped, and made again in the backward
/// pass (a checkpoint that saves nothing), so a device holds one group's logits at a time.
/// `chunks` 0: linear_cross_entropy_chunks. Equal to cross_entropy(h @ w^T, labels) to rounding,
/// labels checked alike (check_labels, with vocab classes; `ignore_index` gives 0).
Array linear_cross_entropy(const Array& h, const Array& w, const Array& labels, int chunks = 0,
                           std::int64_t ignore_index = kIgnoreIndex);
/// The groups linear_cross_entropy makes by default for hidden [..., t, d]: the smallest divisor
/// of t from 16 to 64, else the largest below 16 (1 for a prime t).
std::int64_t linear_cross_entropy_chunks(const Shape& hidden);
/// The new parameter and moments of one Adam(W) step (adamw_update).
struct AdamwUpdate {
  Array param, mu, nu;
};
/// One step of Adam with decoupled weight decay on a parameter as one kernel (torch.optim.AdamW
/// with fused=True): param, grad, mu, nu of one float dtype and shape; lr and count float scalars
/// (the rate, and the step count after this step: the bias corrections are 1 - b^count).
/// m = b1 mu + (1 - b1) g, v = b2 nu + (1 - b2) g^2, param - lr (m / (1 - b1^count) /
/// (sqrt(v / (1 - b2^count)) + eps) + weight_decay param). Its three results are read once per
/// element between them (28 bytes per f32 element). Not differentiable (SpecError).
AdamwUpdate adamw_update(const Array& param, const Array& grad, const Array& mu, const Array& nu,
                         const Array& lr, const Array& count, double b1, double b2, double eps,
                         double weight_decay);
/// The new parameters and moments of one foreach Adam(W) step (adamw_foreach), one per parameter.
struct AdamwForeach {
  std::vector<Array> params, mu, nu;
};
/// One step of Adam with decoupled weight decay over a list of parameters as torch's foreach
/// passes run it (torch.optim.AdamW(foreach=True), _multi_tensor_adamw): the same values as
/// adamw_update's formula to rounding (each pass stores in the arrays' dtype); weight_decay[j]
/// is parameter j's (0: none). Each pass reads and writes whole arrays: 80 bytes per f32 element
/// with decay (72 without), and every square root (one array per parameter) is made before the
/// first parameter is updated. Not differentiable (SpecError).
AdamwForeach adamw_foreach(const std::vector<Array>& params, const std::vector<Array>& grads,
                           const std::vector<Array>& mu, const std::vector<Array>& nu,
                           const Array& lr, const Array& count, double b1, double b2, double eps,
                           const std::vector<double>& weight_decay);
/// Over the last axis, then * scale + bias (both of the last dimension's size).
Array layer_norm(const Array& x, const Array& scale, const Array& bias, double eps = 1e-5);
Array rms_norm(const Array& x, const Array& scale, double eps = 1e-6);
/// Scores [..., T, T] with every position j > i of the last two dimensions set to a large
/// negative value (causal attention).
Array causal_mask(const Array& scores);

/// Options of dot_product_attention: a bool `mask` (true: attend) and a `bias` of q's dtype, each
/// broadcastable to [B, N, T, S] (numpy rules) and the bias added to the scaled scores; `scale`
/// (default 1 / sqrt(H)); `is_causal`: query i sees keys j <= i (top-left aligned, as
/// jnp.tril(ones(T, S)) and PyTorch's is_causal).
struct AttentionOptions {
  std::optional<Array> bias;
  std::optional<Array> mask;
  std::optional<double> scale;
  bool is_causal = false;
};
/// jax.nn.dot_product_attention / torch's scaled_dot_product_attention, fused (FlashAttention-2's
/// blocked online softmax: no [T, S] scores are ever held, forward or backward). q [B, T, N, H],
/// k and v [B, S, K, H], N a multiple of K (grouped-query: query head n uses kv head n / G, G =
/// N / K); returns [B, T, N, H] in q's dtype (f32 and bf16 computed in f32). Non-finite values
/// as PyTorch (docs/sjit.md "Non-finite values"): a NaN score not masked gives a NaN row, a
/// masked pair has no effect, a query row with no allowed key gives 0. Gradients flow to q, k,
/// v and the bias; the backward pass keeps FlashAttention-2's residuals, the output in q's dtype
/// and the f32 log-sum-exp per query row (it reads the output rounded to q's dtype, as FA2's
/// backward does); a second derivative (through the gradient) is a SpecError, not zero. Throws
/// SpecError naming the operands for shapes, heads, mask or dtypes that disagree, and for a
/// `scale` that is NaN, infinite or not positive. Shards over batch, heads and the query
/// sequence.
Array dot_product_attention(const Array& q, const Array& k, const Array& v,
                            const AttentionOptions& options = {});

/// jax.lax.optimization_barrier: x itself, but inside sjit a value of its own that the program
/// takes as x is (its sharding, no step, no FLOPs), so that what its users need of it is made
/// anew where they use it: a weight read through a barrier in the backward pass is gathered
/// again there rather than kept gathered from the forward pass (rematerialisation). Outside sjit
/// it returns x.
Array optimization_barrier(const Array& x);
/// x itself; inside sjit the arrays of `held` (each of x's shape) stay live until this point of
/// the program, as autograd keeps a node's saved tensors until the node has run, or as
/// jax.lax.optimization_barrier over (x, *held) keeps them. No step, no bytes of its own, no
/// FLOPs; each held array is read as it is (its sharding, a pending sum: no collective). Outside
/// sjit, or with nothing held, it returns x.
Array keep_alive(const Array& x, const std::vector<Array>& held);
/// jax.lax.with_sharding_constraint: inside sjit, fixes the sharding of x at this point of the
/// program; outside, reshards x at once.
Array with_sharding_constraint(const Array& x, const PartitionSpec& spec);
/// scalax's with_sharding_annotation: inside sjit, x takes the sharding the sjit was given for
/// `name` (an unknown name is an error listing the known ones, unless the sjit allows it);
/// outside any sjit, x resharded to the active MeshContext's sharding for `name`, else unchanged.
Array with_sharding_annotation(const Array& x, const std::string& name);

}  // namespace shardplan
