#pragma once
// Fused attention (FlashAttention-2's blocked online softmax), private to its three primitives:
// `attention` (forward), `attention_grad_q` and `attention_grad_kv` (backward). The layout every
// one of them shares, with G = N / K the query heads of a kv head:
//   q [B, T, K, G, H], k and v [B, S, K, H],
//   mask (bool) and bias (q's dtype) [B|1, K|1, G|1, T|1, S|1] (a 1 broadcasts),
//   packed result of `attention` [B, T, K, G, H + 1] in the accumulator dtype (f32 for f32 and
//   bf16, f64 for f64): the output in [..., :H], the row's log-sum-exp (natural log, of the
//   scaled and biased scores; -inf for a row with no allowed key, NaN for a row with a NaN or
//   +inf score allowed) in [..., H].
// attention_grad_q takes q, k, v, the packed result, its cotangent (dO in [..., :H], the
// log-sum-exp's in [..., H]) [, mask] [, bias] and gives dq [B, T, K, G, H]; attention_grad_kv
// takes the same and gives dk and dv packed as [B, S, K, 2, H] (index 0: dk, 1: dv), both in q's
// dtype.

#include <cstdint>
#include <optional>
#include <string>

#include "../../ir/primitive.hpp"

namespace shardplan::detail {

struct PrimitiveTests;

/// The attributes of the three primitives.
struct AttentionAttrs {
  double scale = 1;
  bool causal = false;  // query i sees keys j <= i (global indices, top-left aligned)
  bool has_mask = false;
  bool has_bias = false;
};
std::string format_attrs(const AttentionAttrs& a);

/// The operand index of the mask and the bias (when present) given how many operands come first
/// (3 for attention: q, k, v; 5 for the gradients: q, k, v, packed result, its cotangent).
inline int mask_operand(const AttentionAttrs& a, int first) { return a.has_mask ? first : -1; }
inline int bias_operand(const AttentionAttrs& a, int first) {
  return a.has_bias ? first + (a.has_mask ? 1 : 0) : -1;
}

/// The scale of dot_product_attention, ring_attention and context_parallel_attention: `scale`, or
/// 1/sqrt(head_size) when not given. Throws SpecError naming `op` and the value when it is NaN,
/// infinite or not positive (every score would be NaN, or the softmax meaningless).
double attention_scale(const char* op, std::optional<double> scale, std::int64_t head_size);

/// The kernels (attention_kernel.cpp).
void attention_kernel(const KernelArgs& k);
void attention_grad_q_kernel(const KernelArgs& k);
void attention_grad_kv_kernel(const KernelArgs& k);

/// Query and key block sizes of the kernels.
inline constexpr std::int64_t kAttentionQueryBlock = 64;
inline constexpr std::int64_t kAttentionKeyBlock = 64;

/// The (query, key) pairs the kernels visit for T queries and S keys (whole blocks; under a
/// causal mask, the blocks wholly above the diagonal are skipped), with the queries' first index
/// at 0: what the FLOP counts multiply.
double attention_pairs(std::int64_t t, std::int64_t s, bool causal);

/// The test declarations (attention_tests.cpp).
extern const PrimitiveTests kAttentionTests;
extern const PrimitiveTests kAttentionGradQTests;
extern const PrimitiveTests kAttentionGradKvTests;

}  // namespace shardplan::detail
