#include "shardplan/optim.hpp"

#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <utility>

#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/rules/path_patterns.hpp"
#include "../frontend/trace.hpp"

namespace shardplan {
namespace {

// f(leaf of a, leaf of b, path) over two trees of one structure.
template <class F>
Tree<Array> zip(const Tree<Array>& a, const Tree<Array>& b, F f, std::string_view what) {
  if (!a.same_structure(b)) {
    throw TreeError(fmt::format("[optim] the {} do not have the parameters' structure: {}", what,
                                prefix_mismatch(a, b)));
  }
  const auto bl = b.leaves();
  std::size_t k = 0;
  return a.map_with_path(
      [&](const std::string& path, const Array& x) { return f(x, bl[k++], path); });
}

Array scalar_like(double v, const Array& like) { return full(Shape{}, like.dtype(), v, like); }

// Whether the leaf at `path` decays: a positive decay, and no patterns or one matching.
bool decays(double weight_decay, const std::vector<std::string>& paths, const PathPatterns& decay,
            const std::string& path) {
  if (!(weight_decay > 0)) return false;
  if (decay.size() == 0) return true;
  try {
    return decay.first_match(path) >= 0;
  } catch (const PathPatternBudgetError& e) {
    throw RuleError(
        fmt::format("[optim] weight-decay path '{}' gave up on '{}' after {} backtracking steps",
                    paths[e.index()], path, PathPatterns::kBacktrackBudget));
  }
}

// Adam's constants: b1, b2, eps, weight decay.
struct AdamConstants {
  double b1, b2, eps, weight_decay;
};
// The rate and the step count after this step.
struct AdamScalars {
  const Array& lr;
  const Array& count;
};

// Throws TreeError when the moments or the gradients do not have the parameters' structure.
void check_adam_trees(const Tree<Array>& grads, const Tree<Array>& state,
                      const Tree<Array>& params) {
  using Named = std::pair<const Tree<Array>*, const char*>;
  for (const Named& t : {Named(&state.at("mu"), "first moments"),
                         Named(&state.at("nu"), "second moments"), Named(&grads, "gradients")}) {
    if (!params.same_structure(*t.first)) {
      throw TreeError(fmt::format("[optim] the {} do not have the parameters' structure: {}",
                                  t.second, prefix_mismatch(*t.first, params)));
    }
  }
}

// Each leaf's decoupled weight decay, in leaf order: c.weight_decay where `decay_paths` select
// its path (all when none are given), else 0.
std::vector<double> leaf_decays(const Tree<Array>& params, const AdamConstants& c,
                                const std::vector<std::string>& decay_paths) {
  const PathPatterns decay(decay_paths);  // validated by adamw()
  std::vector<double> wd;
  for (const std::string& path : params.paths()) {
    wd.push_back(decays(c.weight_decay, decay_paths, decay, path) ? c.weight_decay : 0.0);
  }
  return wd;
}

// One adamw_update per leaf (Optimizer::fused): its three results read the leaf's four arrays
// once. Returns the new parameters; the new moments go into `next`.
Tree<Array> fused_adam(const Tree<Array>& grads, const Tree<Array>& state,
                       const Tree<Array>& params, AdamScalars s, AdamConstants c,
                       const std::vector<std::string>& decay_paths,
                       std::vector<Tree<Array>::DictEntry>& next) {
  const Tree<Array>& mu = state.at("mu");
  const Tree<Array>& nu = state.at("nu");
  check_adam_trees(grads, state, params);
  const auto p = params.leaves(), g = grads.leaves(), m = mu.leaves(), v = nu.leaves();
  const std::vector<double> wd = leaf_decays(params, c, decay_paths);
  std::vector<Array> new_params, new_mu, new_nu;
  for (std::size_t j = 0; j < p.size(); ++j) {
    AdamwUpdate u = adamw_update(p[j], g[j], m[j], v[j], s.lr, s.count, c.b1, c.b2, c.eps, wd[j]);
    new_params.push_back(std::move(u.param));
    new_mu.push_back(std::move(u.mu));
    new_nu.push_back(std::move(u.nu));
  }
  next.emplace_back("mu", mu.unflatten(std::move(new_mu)));
  next.emplace_back("nu", nu.unflatten(std::move(new_nu)));
  return params.unflatten(std::move(new_params));
}

// torch's foreach passes over every leaf at once (Optimizer::foreach, adamw_foreach). Returns
// the new parameters; the new moments go into `next`.
Tree<Array> foreach_adam(const Tree<Array>& grads, const Tree<Array>& state,
                         const Tree<Array>& params, AdamScalars s, AdamConstants c,
                         const std::vector<std::string>& decay_paths,
                         std::vector<Tree<Array>::DictEntry>& next) {
  const Tree<Array>& mu = state.at("mu");
  const Tree<Array>& nu = state.at("nu");
  check_adam_trees(grads, state, params);
  AdamwForeach u = adamw_foreach(params.leaves(), grads.leaves(), mu.leaves(), nu.leaves(), s.lr,
                                 s.count, c.b1, c.b2, c.eps, leaf_decays(params, c, decay_paths));
  next.emplace_back("mu", mu.unflatten(std::move(u.mu)));
  next.emplace_back("nu", nu.unflatten(std::move(u.nu)));
  return params.unflatten(std::move(u.params));
}

}  // namespace

Schedule constant_schedule(double value) {
  return [value](const Array& count) { return full(Shape{}, count.dtype(), value, count); };
}

Schedule warmup_cosine_decay_schedule(double init, double peak, double warmup_steps,
                                      double decay_steps, double end) {
  return [=](const Array& count) {
    const Array warm = minimum(count / std::max(warmup_steps, 1.0), scalar_like(1, count));
    const Array warm_lr = init + (peak - init) * warm;
    const double span = std::max(decay_steps - warmup_steps, 1.0);
    const Array t =
        minimum(maximum(count - warmup_steps, scalar_like(0, count)) / span, scalar_like(1, count));
    const Array cos_lr = end + (peak - end) * 0.5 * (1.0 + cos(t * std::numbers::pi));
    return where(less(count, scalar_like(warmup_steps, count)), warm_lr, cos_lr);
  };
}

Array zeros_like(const Array& x) {
  if (detail::current_trace() == nullptr && !x.is_tracer()) {
    return Array::zeros(x.shape(), x.dtype(), x.sharding(), x.executor());
  }
  return detail::with_sharding_like(full_like(x, 0), x);
}

Array global_norm(const Tree<Array>& tree) {
  const auto leaves = tree.leaves();
  if (leaves.empty()) throw SpecError("[global_norm] the tree holds no arrays");
  Array total = sum(leaves[0] * leaves[0]);
  for (std::size_t i = 1; i < leaves.size(); ++i) total = total + sum(leaves[i] * leaves[i]);
  return sqrt(total);
}

Optimizer Optimizer::sgd(Schedule lr, double momentum, bool nesterov) {
  Optimizer o;
  o.kind_ = Kind::kSgd;
  o.lr_ = std::move(lr);
  o.momentum_ = momentum;
  o.nesterov_ = nesterov;
  return o;
}

Optimizer Optimizer::adam(Schedule lr, double b1, double b2, double eps) {
  Optimizer o;
  o.kind_ = Kind::kAdam;
  o.lr_ = std::move(lr);
  o.b1_ = b1;
  o.b2_ = b2;
  o.eps_ = eps;
  return o;
}

Optimizer Optimizer::adamw(Schedule lr, double weight_decay, std::vector<std::string> decay_paths,
                           double b1, double b2, double eps) {
  Optimizer o = adam(std::move(lr), b1, b2, eps);
  o.weight_decay_ = weight_decay;
  // The same dialect as rule patterns (Python's re.search).
  try {
    const PathPatterns table(decay_paths);
  } catch (const PathPatternError& e) {
    throw RuleError(
        fmt::format("[optim] weight-decay path '{}' is not a valid regex at position {}: {}",
                    decay_paths[e.index()], e.position(), e.reason()));
  } catch (const PathPatternBudgetError& e) {
    throw RuleError(fmt::format("[optim] weight-decay path '{}' gave up on the empty path",
                                decay_paths[e.index()]));
  }
  o.decay_paths_ = std::move(decay_paths);
  return o;
}

Optimizer Optimizer::clip_by_global_norm(double max_norm) const {
  if (!(max_norm > 0)) {
    throw SpecError(
        fmt::format("[optim] clip_by_global_norm needs a positive norm, got {}", max_norm));
  }
  Optimizer o = *this;
  o.max_norm_ = max_norm;
  return o;
}

Optimizer Optimizer::fused() const {
  if (kind_ == Kind::kSgd) {
    throw SpecError("[optim] fused(): SGD's update has no fused kernel (adamw_update is Adam's)");
  }
  Optimizer o = *this;
  o.fused_ = true;
  o.foreach_ = false;
  return o;
}

Optimizer Optimizer::foreach() const {
  if (kind_ == Kind::kSgd) {
    throw SpecError(
        "[optim] foreach(): SGD's update has no foreach passes here (adamw_foreach is Adam's)");
  }
  Optimizer o = *this;
  o.foreach_ = true;
  o.fused_ = false;
  return o;
}

Tree<Array> Optimizer::init(const Tree<Array>& params) const {
  const auto leaves = params.leaves();
  if (leaves.empty()) throw SpecError("[optim] the parameters hold no arrays");
  const Array& first = leaves[0];
  Array count = detail::current_trace() == nullptr && !first.is_tracer()
                    ? Array::zeros(Shape{}, DType::kF32,
                                   NamedSharding(first.mesh(), PartitionSpec()), first.executor())
                    : full(Shape{}, DType::kF32, 0, first);
  std::vector<Tree<Array>::DictEntry> entries{{"count", Tree<Array>(count)}};
  const auto zeros = [&] { return params.map([](const Array& p) { return zeros_like(p); }); };
  if (kind_ == Kind::kSgd) {
    if (momentum_ > 0) entries.emplace_back("momentum", zeros());
  } else {
    entries.emplace_back("mu", zeros());
    entries.emplace_back("nu", zeros());
  }
  return Tree<Array>::dict(std::move(entries));
}

std::pair<Tree<Array>, Tree<Array>> Optimizer::update(const Tree<Array>& grads_in,
                                                      const Tree<Array>& state,
                                                      const Tree<Array>& params) const {
  if (state.find("count") == nullptr) {
    throw TreeError("[optim] the state has no 'count': make it with this optimizer's init()");
  }
  Tree<Array> grads = grads_in;
  if (max_norm_ > 0) {
    const Array norm = global_norm(grads);
    const Array scale = minimum(scalar_like(1, norm), max_norm_ / (norm + 1e-6));
    grads = grads.map([&](const Array& g) { return g * astype(scale, g.dtype()); });
  }
  const Array count = state.at("count").leaf() + 1.0;
  // Schedules run in f64, so a rate like 0.1 is not rounded to f32 before it meets f64 weights.
  const Array lr = lr_(astype(state.at("count").leaf(), DType::kF64));
  const auto lr_as = [&](const Array& like) { return astype(lr, like.dtype()); };
  std::vector<Tree<Array>::DictEntry> next{{"count", Tree<Array>(count)}};
  Tree<Array> new_params;
  if (kind_ == Kind::kSgd) {
    if (momentum_ > 0) {
      const Tree<Array> mom = zip(
          state.at("momentum"), grads,
          [&](const Array& m, const Array& g, const std::string&) { return m * momentum_ + g; },
          "momentum");
      const Tree<Array> step = nesterov_
                                   ? zip(
                                         mom, grads,
                                         [&](const Array& m, const Array& g, const std::string&) {
                                           return g + m * momentum_;
                                         },
                                         "gradients")
                                   : mom;
      new_params = zip(
          params, step,
          [&](const Array& p, const Array& s, const std::string&) { return p - s * lr_as(p); },
          "updates");
      next.emplace_back("momentum", mom);
    } else {
      new_params = zip(
          params, grads,
          [&](const Array& p, const Array& g, const std::string&) { return p - g * lr_as(p); },
          "gradients");
    }
  } else if (foreach_) {
    new_params = foreach_adam(grads, state, params, {lr, count}, {b1_, b2_, eps_, weight_decay_},
                              decay_paths_, next);
  } else if (fused_) {
    new_params = fused_adam(grads, state, params, {lr, count}, {b1_, b2_, eps_, weight_decay_},
                            decay_paths_, next);
  } else {
    const Tree<Array> mu = zip(
        state.at("mu"), grads,
        [&](const Array& m, const Array& g, const std::string&) { return m * b1_ + g * (1 - b1_); },
        "first moments");
    const Tree<Array> nu = zip(
        state.at("nu"), grads,
        [&](const Array& v, const Array& g, const std::string&) {
          return v * b2_ + g * g * (1 - b2_);
        },
        "second moments");
    // Bias corrections 1 - b^t, as scalars.
    const Array count64 = astype(count, DType::kF64);
    const Array c1 = 1.0 - exp(count64 * std::log(b1_));
    const Array c2 = 1.0 - exp(count64 * std::log(b2_));
    const auto leaves_nu = nu.leaves();
    const PathPatterns decay(decay_paths_);  // validated by adamw()
    const auto mu_leaves = mu.leaves();
    std::size_t j = 0;
    new_params = params.map_with_path([&](const std::string& path, const Array& p) {
      const Array& m = mu_leaves[j];
      const Array& v = leaves_nu[j];
      ++j;
      const Array mhat = m / astype(c1, m.dtype());
      const Array vhat = v / astype(c2, v.dtype());
      Array upd = mhat / (sqrt(vhat) + eps_);
      if (decays(weight_decay_, decay_paths_, decay, path)) upd = upd + p * weight_decay_;
      return p - upd * lr_as(p);
    });
    next.emplace_back("mu", mu);
    next.emplace_back("nu", nu);
  }
  return {new_params, Tree<Array>::dict(std::move(next))};
}

}  // namespace shardplan
