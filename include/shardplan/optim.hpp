#pragma once
// Optimizers in the spirit of optax, over trees of arrays: `init(params) -> state` and
// `update(grads, state, params) -> {new_params, new_state}`. The state is a tree with paths such
// as `mu/...` and `nu/...` under the parameters' own paths, every array created with its
// parameter's sharding, so under FSDP each device holds only its slice of the moments, and the
// same rules shard it when it is part of a train state (`opt_state/mu/...`). Works eagerly and
// inside sjit.

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "shardplan/array.hpp"

namespace shardplan {

/// A learning rate as a function of the step count (a f32 scalar array).
using Schedule = std::function<Array(const Array& count)>;
/// The same rate every step.
Schedule constant_schedule(double value);
/// optax.warmup_cosine_decay_schedule: linear from `init` to `peak` over `warmup_steps`, then a
/// cosine from `peak` to `end` at `decay_steps` (counted from the start), `end` afterwards.
Schedule warmup_cosine_decay_schedule(double init, double peak, double warmup_steps,
                                      double decay_steps, double end = 0);

/// An array of zeros shaped and sharded like `x` (eagerly: only the shards are made).
Array zeros_like(const Array& x);
/// sqrt(sum of squares of every leaf).
Array global_norm(const Tree<Array>& tree);

class Optimizer {
 public:
  /// Stochastic gradient descent, with (optionally Nesterov) momentum when momentum > 0.
  static Optimizer sgd(Schedule lr, double momentum = 0, bool nesterov = false);
  static Optimizer sgd(double lr, double momentum = 0, bool nesterov = false) {
    return sgd(constant_schedule(lr), momentum, nesterov);
  }
  static Optimizer adam(Schedule lr, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8);
  static Optimizer adam(double lr, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8) {
    return adam(constant_schedule(lr), b1, b2, eps);
  }
  /// Adam with decoupled weight decay on the leaves whose path matches one of `decay_paths`
  /// (Python re patterns, searched, as rule patterns; empty: every leaf), as EasyLM masks norms
  /// and biases out.
  static Optimizer adamw(Schedule lr, double weight_decay,
                         std::vector<std::string> decay_paths = {}, double b1 = 0.9,
                         double b2 = 0.999, double eps = 1e-8);
  /// Scales the gradients so that their global norm is at most `max_norm`, before the update.
  Optimizer clip_by_global_norm(double max_norm) const;
  /// Adam's update of each leaf as one kernel (adamw_update, ops.hpp: torch.optim.AdamW with
  /// fused=True) instead of its elementwise ops; the same values to rounding. Throws SpecError
  /// for SGD (whose update has no fused kernel here). The later of fused() and foreach() decides.
  Optimizer fused() const;
  /// Whether fused() made it.
  bool is_fused() const { return fused_; }
  /// Adam's update as torch's foreach passes over all the leaves (adamw_foreach, ops.hpp:
  /// torch.optim.AdamW with foreach, its default on CUDA): the same values to rounding, each pass
  /// reading and writing whole arrays. Throws SpecError for SGD. The later of fused() and
  /// foreach() decides.
  Optimizer foreach() const;
  /// Whether foreach() made it.
  bool is_foreach() const { return foreach_; }

  /// The state for `params`: {"count": f32 scalar, "mu": ..., "nu": ...} (what the optimizer
  /// needs), each moment shaped and sharded like its parameter.
  Tree<Array> init(const Tree<Array>& params) const;
  /// New parameters and state. Throws TreeError when the trees do not match.
  std::pair<Tree<Array>, Tree<Array>> update(const Tree<Array>& grads, const Tree<Array>& state,
                                             const Tree<Array>& params) const;

 private:
  enum class Kind { kSgd, kAdam };
  Kind kind_ = Kind::kSgd;
  Schedule lr_;
  double momentum_ = 0, b1_ = 0.9, b2_ = 0.999, eps_ = 1e-8, weight_decay_ = 0, max_norm_ = 0;
  bool nesterov_ = false;
  bool fused_ = false;
  bool foreach_ = false;
  std::vector<std::string> decay_paths_;
};

}  // namespace shardplan
