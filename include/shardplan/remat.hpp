#pragma once
// Rematerialisation (jax.checkpoint / jax.remat): checkpoint(f, policy) runs f as it is, but when
// it is differentiated (value_and_grad, inside sjit or eagerly), the values computed inside f
// that the policy does not save are not kept from the forward pass for the backward one: they
// are computed again from f's inputs when the backward pass reaches f. The inputs are read
// through optimization_barrier there, so a weight that the forward pass gathered is gathered
// again where it is used (as FSDP does) instead of kept gathered across the step.
//
//   auto layer = checkpoint([&](const Array& x) { return mlp(params, x); },
//                           checkpoint_policies::save_only_these_names({"up"}));
//   ... inside mlp: Array up = checkpoint_name(matmul(x, w_up), "up");
//
// What is saved is exactly what the policy names; recomputed values are bitwise the ones the
// forward pass made (the same ops on the same operands). docs/training.md, "Recomputation".

#include <string>
#include <utility>
#include <vector>

#include "shardplan/array.hpp"

namespace shardplan {

/// Which values computed inside checkpoint(f) the backward pass takes from the forward pass
/// (saved); the others are computed again. jax.checkpoint_policies.
class RematPolicy {
 public:
  enum class Kind {
    kEverythingSaveable,         // nothing is recomputed (as no checkpoint)
    kNothingSaveable,            // only f's inputs are kept (jax.checkpoint's default)
    kDotsSaveable,               // every dot_general's result
    kDotsWithNoBatchDimsSaveable,  // dot_general results without batch dimensions (the
                                   // matmuls of weights, not attention's scores)
    kSaveOnlyTheseNames,         // the values given a listed name by checkpoint_name
    kSaveAnythingExceptTheseNames,  // every value but those given a listed name
  };
  Kind kind() const { return kind_; }
  const std::vector<std::string>& names() const { return names_; }
  /// Whether a listed name that no checkpoint_name inside gives is ignored, as JAX's policies do
  /// (a policy written for many models), instead of refused as a typo (the default).
  bool absent_names_ignored() const { return absent_names_ignored_; }
  /// This policy, with the listed names that no checkpoint_name inside gives ignored.
  RematPolicy ignoring_absent_names() const {
    RematPolicy p = *this;
    p.absent_names_ignored_ = true;
    return p;
  }
  /// "nothing_saveable", "save_only_these_names(a, b)", "save_anything_except_these_names(a)".
  std::string to_string() const;
  friend bool operator==(const RematPolicy&, const RematPolicy&) = default;

  static RematPolicy of(Kind kind, std::vector<std::string> names = {}) {
    return RematPolicy(kind, std::move(names));
  }

 private:
  RematPolicy(Kind kind, std::vector<std::string> names) : kind_(kind), names_(std::move(names)) {}
  Kind kind_;
  std::vector<std::string> names_;
  bool absent_names_ignored_ = false;
};

namespace checkpoint_policies {
RematPolicy everything_saveable();
RematPolicy nothing_saveable();
RematPolicy dots_saveable();
RematPolicy dots_with_no_batch_dims_saveable();
/// The values named (checkpoint_name) with one of `names`. A name that no checkpoint_name inside
/// the checkpointed function gives is a SpecError when the function is differentiated (unless
/// the policy is made with ignoring_absent_names()).
RematPolicy save_only_these_names(std::vector<std::string> names);
/// Every value but those named with one of `names`: what those are computed from is kept and
/// they are computed again (FSDP's reshard after forward, with the weights as used named). As
/// for save_only_these_names, a listed name that no checkpoint_name inside gives is a
/// SpecError. With no names it saves everything, but unlike everything_saveable it is a
/// checkpoint: the backward pass reads what the function took from outside through
/// optimization_barrier, so weights gathered in the forward pass are gathered again there.
RematPolicy save_anything_except_these_names(std::vector<std::string> names);
}  // namespace checkpoint_policies

/// jax.ad_checkpoint.checkpoint_name: x itself, named for save_only_these_names. The name is
/// only read by differentiation (value_and_grad); elsewhere it changes nothing.
Array checkpoint_name(const Array& x, const std::string& name);

namespace detail {
/// While alive, the ops recorded by this thread's trace belong to a checkpointed region with
/// `policy` (nested regions: the innermost decides for its ops). Nothing outside a trace.
class RematScope {
 public:
  RematScope(const RematPolicy& policy, bool prevent_cse);
  ~RematScope();
  RematScope(const RematScope&) = delete;
  RematScope& operator=(const RematScope&) = delete;

 private:
  void* trace_ = nullptr;
  int previous_ = -1;
};
}  // namespace detail

/// jax.checkpoint(f, policy=..., prevent_cse=...): a callable that calls f with its arguments
/// (and returns what f returns), its ops recomputed in the backward pass as `policy` says. With
/// `prevent_cse` (the default, as JAX's) the recomputation reads f's inputs through
/// optimization_barrier, so that what it needs of them (a gathered weight) is made again there;
/// without, it shares what the rest of the program made of them (a weight gathered once for
/// many checkpoints of one loop, as the groups of linear_cross_entropy).
template <class F>
auto checkpoint(F f, RematPolicy policy = checkpoint_policies::nothing_saveable(),
                bool prevent_cse = true) {
  return [f = std::move(f), policy = std::move(policy), prevent_cse](auto&&... args)
             -> decltype(auto) {
    detail::RematScope scope(policy, prevent_cse);
    return f(std::forward<decltype(args)>(args)...);
  };
}
/// jax.remat: the same as checkpoint.
template <class F>
auto remat(F f, RematPolicy policy = checkpoint_policies::nothing_saveable(),
           bool prevent_cse = true) {
  return checkpoint(std::move(f), std::move(policy), prevent_cse);
}

}  // namespace shardplan
