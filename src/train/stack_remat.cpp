// The training stacks' own remat policy names (--remat STACK:NAME), each mapped to a RematPolicy
// over the checkpoint names of train-plan's layers (MaxText's: query_proj, key_proj, value_proj,
// context, out_proj, mlpwi_0, mlpwi_1, mlpwo; GPT-2's qkv_proj and mlpwi). A stack's list may
// name values a family's layer does not give (MaxText lists kv_proj and qkv_proj for every
// model): those are ignored, as jax.checkpoint_policies.save_only_these_names ignores them,
// while --remat names:A,B keeps refusing an absent name as a typo.
#include "stack_remat.hpp"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"

namespace shardplan::train {
namespace {

constexpr std::string_view kMaxText =
    "AI-Hypercomputer/maxtext e591f30 src/maxtext/layers/decoders.py: ";
constexpr std::string_view kTorchtitan =
    "pytorch/torchtitan b5bcd76 torchtitan/distributed/activation_checkpoint.py: ";
constexpr std::string_view kMegatron =
    "NVIDIA/Megatron-LM d98e8a6 megatron/core/transformer/transformer_config.py: ";

RematPolicy names(std::vector<std::string> listed) {
  return checkpoint_policies::save_only_these_names(std::move(listed)).ignoring_absent_names();
}

// MaxText's attention projections, in minimal_policy's order.
std::vector<std::string> maxtext_qkv() {
  return {"query_proj", "value_proj", "key_proj", "kv_proj", "qkv_proj"};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<StackRematName> make() {
  const auto at = [](std::string_view stack, std::string_view symbol) {
    return std::string(stack) + std::string(symbol);
  };
  const auto maxtext = [&](std::string_view policy) {
    return at(kMaxText, fmt::format("get_remat_policy, remat_policy '{}'", policy));
  };
  const std::vector<std::string> mlp = {"mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo"};
  const std::vector<std::string> minimal = with(with(maxtext_qkv(), {"out_proj"}), mlp);
  const auto full = checkpoint_policies::nothing_saveable();
  return {
      {"maxtext:full", maxtext("full") + " (policy None: jax.checkpoint's nothing_saveable)", full,
       ""},
      {"maxtext:minimal", at(kMaxText, "minimal_policy() (remat_policy 'minimal')"), names(minimal),
       ""},
      {"maxtext:minimal_with_context",
       at(kMaxText, "minimal_policy(with_context=True) (remat_policy 'minimal_with_context')"),
       names(with(minimal, {"context"})), ""},
      {"maxtext:save_dot_except_mlp", maxtext("save_dot_except_mlp"),
       names(with(maxtext_qkv(), {"out_proj"})), ""},
      {"maxtext:save_dot_except_mlpwi", maxtext("save_dot_except_mlpwi"),
       names(with(maxtext_qkv(), {"out_proj", "mlpwo"})), ""},
      {"maxtext:save_dot_with_context_except_mlp", maxtext("save_dot_with_context_except_mlp"),
       names(with(maxtext_qkv(), {"context", "out_proj"})), ""},
      {"maxtext:save_qkv_proj", maxtext("save_qkv_proj"), names(maxtext_qkv()), ""},
      {"maxtext:save_out_proj", maxtext("save_out_proj"), names({"out_proj"}), ""},
      {"torchtitan:full", at(kTorchtitan, "FullAC (mode 'full': each block saves its input)"), full,
       ""},
      {"torchtitan:op",
       at(kTorchtitan,
          "SelectiveAC op policy: _get_default_save_ops, every second aten.mm recomputed "
          "(mm_count % 2 == 0): in a Llama block wq, wv, w1, w2 and "
          "scaled_dot_product_attention saved"),
       names({"query_proj", "value_proj", "context", "mlpwi_0", "mlpwo"}), ""},
      {"megatron:full", at(kMegatron, "recompute_granularity 'full' (each layer saves its input)"),
       full, ""},
      {"megatron:selective",
       at(kMegatron, "recompute_granularity 'selective', recompute_modules ['core_attn']"),
       std::nullopt,
       "Megatron recomputes the core attention only (QK^T, softmax, dropout, the product with "
       "V) and keeps every other activation; train-plan's layers name no value inside the "
       "attention (a policy saves its output 'context' or not), so the scores cannot be "
       "recomputed apart from it"},
  };
}

}  // namespace

const std::vector<StackRematName>& stack_remat_names() {
  static const std::vector<StackRematName> table = make();
  return table;
}

const StackRematName& stack_remat_name(std::string_view name) {
  for (const StackRematName& s : stack_remat_names()) {
    if (s.name == name) return s;
  }
  std::string known;
  for (const StackRematName& s : stack_remat_names()) {
    known += fmt::format("{}{}", known.empty() ? "" : ", ", s.name);
  }
  throw SpecError(fmt::format("[train] unknown stack remat policy '{}' (known: {})",
                              detail::printable(name), known));
}

}  // namespace shardplan::train
