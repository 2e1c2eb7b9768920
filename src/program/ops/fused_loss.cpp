// linear_cross_entropy (ops.hpp): the LM head and the cross-entropy in chunks of tokens, each
// chunk a checkpoint (remat.hpp) that saves nothing, so that the backward pass recomputes one
// chunk's logits at a time. The checkpoints share the weight as the program gathers it (no
// barrier: prevent_cse off), so the head is gathered once for all chunks, not once per chunk. Written with the public ops, so it shards like any code: a
// vocabulary-parallel head reduces the chunk's max and sum over the vocabulary axis (Megatron's
// vocab-parallel cross-entropy) and a data-parallel one never moves the tokens.
#include <fmt/format.h>

#include <algorithm>

#include "../ir/primitives.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/profiler.hpp"
#include "shardplan/remat.hpp"
#include "shardplan/sjit.hpp"
#include "../frontend/trace.hpp"

namespace shardplan {
namespace {

using detail::type_str;

void check_operands(const Array& h, const Array& w, const Array& labels, int chunks) {
  const auto fail = [&](const std::string& why) {
    return SpecError(fmt::format("[linear_cross_entropy] hidden {}, weight {}, labels {}: {}",
                                 type_str(h), type_str(w), type_str(labels), why));
  };
  const int r = h.shape().rank();
  if (r < 2) throw fail("hidden must be [..., tokens, d] (rank 2 or more)");
  if (w.shape().rank() != 2) throw fail("the weight must be [vocab, d] (a Linear weight)");
  if (w.shape()[1] != h.shape()[r - 1]) {
    throw fail(fmt::format("the weight's d ({}) is not hidden's last dimension ({})",
                           w.shape()[1], h.shape()[r - 1]));
  }
  if (w.dtype() != h.dtype()) throw fail("hidden and weight must have one dtype");
  if (h.dtype() != DType::kF32 && h.dtype() != DType::kF64 && h.dtype() != DType::kBF16 &&
      h.dtype() != DType::kF16) {
    throw fail("hidden must be a float array");
  }
  std::vector<std::int64_t> lead = h.shape().dims();
  lead.pop_back();
  if (labels.shape().dims() != lead) {
    throw fail(fmt::format("labels must be shaped {} (hidden without its last dimension)",
                           Shape(lead).to_string()));
  }
  if (labels.dtype() != DType::kI32) throw fail("labels must be i32");
  const std::int64_t t = h.shape()[r - 2];
  if (chunks < 0 || (chunks > 0 && t % chunks != 0)) {
    throw fail(fmt::format("{} chunks do not divide the {} tokens of dimension {}", chunks, t,
                           r - 2));
  }
}

}  // namespace

std::int64_t linear_cross_entropy_chunks(const Shape& hidden) {
  // 16 groups: a group's logits are 1/16 of the whole (the unfused step holds several copies of
  // the whole), and the traced step grows by a few ops per group only. Else the smallest
  // divisor of t up to 64, else the largest below 16 (1 for a prime t: no groups).
  const std::int64_t t = hidden[hidden.rank() - 2];
  for (std::int64_t k = 16; k <= std::min<std::int64_t>(64, t); ++k) {
    if (t % k == 0) return k;
  }
  for (std::int64_t k = std::min<std::int64_t>(15, t); k > 1; --k) {
    if (t % k == 0) return k;
  }
  return 1;
}

Array linear_cross_entropy(const Array& h, const Array& w, const Array& labels, int chunks,
                           std::int64_t ignore_index) {
  check_operands(h, w, labels, chunks);
  // Its ops are the composite's (Lowered::ops says a program holds the fused loss), and are
  // named in traces by its scope.
  const detail::CompositeScope in_composite(composite::kLinearCrossEntropy);
  const NamedScope scope("linear_cross_entropy");
  // Checked once, whole, before the groups (which read them as they are).
  const Array checked = check_labels(labels, w.shape()[0], ignore_index, "linear_cross_entropy");
  const int r = h.shape().rank();
  const std::int64_t t = h.shape()[r - 2], d = h.shape()[r - 1];
  const std::int64_t k = chunks > 0 ? chunks : linear_cross_entropy_chunks(h.shape());
  const DType acc = h.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  // Tokens i*k + j for j in [0, k): chunk j takes every k-th token, so that a chunk is a slice of
  // the minor dimension of [.., t / k, k, ..] and a sharded token dimension (its major part)
  // stays where it is: no chunk gathers tokens from other devices.
  std::vector<std::int64_t> hd = h.shape().dims();
  hd.resize(hd.size() - 2);
  std::vector<std::int64_t> ld = hd;
  hd.insert(hd.end(), {t / k, k, d});
  ld.insert(ld.end(), {t / k, k});
  const Array hs = reshape(h, Shape(hd));
  const Array ls = reshape(checked, Shape(ld));
  const auto chunk_loss = checkpoint([&](const Array& hc, const Array& lc) {
    const int cr = hc.shape().rank();
    const Array logits = dot_general(hc, w, DotDims{{}, {}, {cr - 1}, {1}});
    return detail::cross_entropy_of_checked(logits.dtype() == acc ? logits : astype(logits, acc),
                                            lc, ignore_index);
  }, checkpoint_policies::nothing_saveable(), /*prevent_cse=*/false);
  std::vector<Array> losses;
  losses.reserve(static_cast<std::size_t>(k));
  for (std::int64_t j = 0; j < k; ++j) {
    std::vector<std::int64_t> hs0(hd.size(), 0), hl = hd, ls0(ld.size(), 0), ll = ld;
    hs0[hd.size() - 2] = j;
    hl[hd.size() - 2] = j + 1;
    ls0[ld.size() - 1] = j;
    ll[ld.size() - 1] = j + 1;
    losses.push_back(chunk_loss(slice(hs, hs0, hl), slice(ls, ls0, ll)));  // [.., t / k, 1]
  }
  std::vector<std::int64_t> out(labels.shape().dims());
  return reshape(concatenate(losses, static_cast<int>(ld.size()) - 1), Shape(out));
}

}  // namespace shardplan
