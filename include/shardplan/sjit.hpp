#pragma once
// sjit: wraps a step function so that it runs SPMD over a mesh, as scalax's
// MeshShardingHelper.sjit (jax.jit with shardings from rules). The function is traced once per
// signature (tree structures, shapes, dtypes, input shardings, static values), its shardings are
// propagated and the program partitioned into per-device kernels and collectives, cached, run.
//
//   auto step = sjit(mesh, [](const Tree<Array>& params, const Array& x) {
//     return relu(matmul(x, params.at("w").leaf()));
//   }, {.in_shardings = RuleTree::list({RuleTree(P(nullptr, "model")), RuleTree(P("data"))})});
//   Array y = step(params, x);          // runs
//   std::cout << step.lower(params, x).text();  // the program, its shardings and its cost

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/program_cost.hpp"
#include "shardplan/tree_struct.hpp"

namespace shardplan {

/// sjit's options (names as scalax). Each sharding tree is a prefix of what it shards, with a
/// rule, a PartitionSpec, Replicated or Unspecified at its leaves (resolved by the planner).
struct SjitOptions {
  /// Over the list of array arguments (statics left out), e.g. RuleTree::list({rules, P("data")}).
  /// Unspecified: an argument keeps the sharding it arrives with.
  std::optional<RuleTree> in_shardings = std::nullopt;
  /// Over the function's output tree. Unspecified: left to propagation.
  std::optional<RuleTree> out_shardings = std::nullopt;
  /// Over the list of array arguments: constraints applied as the function starts.
  std::optional<RuleTree> args_sharding_constraint = std::nullopt;
  /// name -> sharding for with_sharding_annotation(x, name) inside the function.
  std::map<std::string, RuleTree> annotation_shardings = {};
  /// Positions of static arguments; any argument that is not an Array, a Tree<Array>, a
  /// registered struct of Arrays or a TensorSpec (tree) is static anyway. Statics are part of the
  /// cache key (they need std::hash or operator<<).
  std::vector<int> static_argnums = {};
  /// Positions of arguments whose buffers the program may reuse for its outputs; the arrays
  /// passed there cannot be used afterwards (ArrayError).
  std::vector<int> donate_argnums = {};
  /// Let with_sharding_annotation names without a sharding pass (as scalax does); otherwise an
  /// unknown name is an error listing the known ones.
  bool allow_unknown_annotations = false;
  /// The executor for calls without array arguments (else the arguments' own).
  std::optional<Executor> executor = std::nullopt;
};

namespace detail {
struct Compiled;
class SjitCore;

/// One argument leaf as sjit sees it.
struct ArgLeaf {
  TensorType type;
  Array array;  // empty for an abstract (TensorSpec) argument
};

struct CallArgs {
  std::vector<Tree<int>> structures;  // per array-like argument: leaf indices into `leaves`
  std::vector<int> positions;         // the argument position of each array-like argument
  std::vector<ArgLeaf> leaves;
  std::string static_key;
};

template <class T>
struct ArgKind {
  static constexpr int value = 0;  // static
};
template <>
struct ArgKind<Array> {
  static constexpr int value = 1;
};
template <>
struct ArgKind<Tree<Array>> {
  static constexpr int value = 2;
};
template <>
struct ArgKind<TensorSpec> {
  static constexpr int value = 4;
};
template <>
struct ArgKind<Tree<TensorSpec>> {
  static constexpr int value = 5;
};
template <class T>
constexpr int arg_kind() {
  using U = std::remove_cvref_t<T>;
  if constexpr (ArgKind<U>::value != 0) {
    return ArgKind<U>::value;
  } else if constexpr (TreeStruct<U>) {
    return 3;
  } else {
    return 0;
  }
}

/// What the function receives for an argument of type A: tracers in the same shape.
template <class A>
using traced_t = std::conditional_t<
    arg_kind<A>() == 4, Array,
    std::conditional_t<arg_kind<A>() == 5, Tree<Array>,
                       std::conditional_t<arg_kind<A>() == 0, const std::remove_cvref_t<A>&,
                                          std::remove_cvref_t<A>>>>;

template <class T>
std::string static_key_of(const T& v) {
  std::string key = typeid(T).name();
  if constexpr (requires(std::ostream & os) { os << v; }) {
    std::ostringstream os;
    os << v;
    return key + "=" + os.str();
  } else if constexpr (requires { std::hash<T>()(v); }) {
    return key + "#" + std::to_string(std::hash<T>()(v));
  } else {
    static_assert(!sizeof(T), "a static sjit argument needs operator<< or std::hash");
  }
}

void add_array_arg(CallArgs& call, int position, const Tree<Array>& tree);
void add_spec_arg(CallArgs& call, int position, const Tree<TensorSpec>& tree);

template <class A>
void add_arg(CallArgs& call, int position, const A& arg) {
  constexpr int kind = arg_kind<A>();
  if constexpr (kind == 1) {
    add_array_arg(call, position, Tree<Array>(arg));
  } else if constexpr (kind == 2) {
    add_array_arg(call, position, arg);
  } else if constexpr (kind == 3) {
    add_array_arg(call, position, to_tree<Array>(arg));
  } else if constexpr (kind == 4) {
    add_spec_arg(call, position, Tree<TensorSpec>(arg));
  } else if constexpr (kind == 5) {
    add_spec_arg(call, position, arg);
  } else {
    call.static_key += "|" + std::to_string(position) + ":" + static_key_of(arg);
  }
}

template <class A>
traced_t<A> make_param(const A& arg, const std::vector<Tree<Array>>& tracers, std::size_t& next) {
  constexpr int kind = arg_kind<A>();
  if constexpr (kind == 1 || kind == 4) {
    return tracers[next++].leaf();
  } else if constexpr (kind == 2 || kind == 5) {
    return tracers[next++];
  } else if constexpr (kind == 3) {
    return from_tree<std::remove_cvref_t<A>>(tracers[next++]);
  } else {
    return arg;
  }
}

template <class R>
Tree<Array> output_tree(const R& r) {
  if constexpr (std::is_same_v<R, Array>) {
    return Tree<Array>(r);
  } else if constexpr (std::is_same_v<R, Tree<Array>>) {
    return r;
  } else {
    static_assert(TreeStruct<R>,
                  "an sjit function returns an Array, a Tree<Array> or a "
                  "registered struct of Arrays");
    return to_tree<Array>(r);
  }
}

template <class R>
R from_output_tree(const Tree<Array>& t) {
  if constexpr (std::is_same_v<R, Array>) {
    return t.leaf();
  } else if constexpr (std::is_same_v<R, Tree<Array>>) {
    return t;
  } else {
    return from_tree<R>(t);
  }
}

using TraceFn = std::function<Tree<Array>(const std::vector<Tree<Array>>&)>;

}  // namespace detail

/// A compiled program, not run: what `lower()` returns.
class Lowered {
 public:
  explicit Lowered(std::shared_ptr<const detail::Compiled> c) : c_(std::move(c)) {}
  /// Every value with its sharding and where that sharding came from, every kernel and
  /// collective (with axes and bytes), then the cost.
  std::string text() const;
  /// The traced program, jaxpr-like.
  std::string jaxpr() const;
  const ProgramCost& cost() const;
  /// The shardings of the array arguments' leaves (in order) and of the outputs' leaves.
  std::vector<NamedSharding> input_shardings() const;
  std::vector<NamedSharding> output_shardings() const;
  /// The outputs' shapes and dtypes, in the output tree's shape (jax.eval_shape).
  Tree<TensorSpec> output_specs() const;

 private:
  std::shared_ptr<const detail::Compiled> c_;
};

namespace detail {

class SjitCore {
 public:
  SjitCore(Mesh mesh, SjitOptions options);
  ~SjitCore();
  std::shared_ptr<const Compiled> get(const CallArgs& call, const TraceFn& trace);
  Tree<Array> run(const Compiled& compiled, const CallArgs& call);
  std::size_t cache_size() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace detail

/// The wrapped function: call it like the function; `lower(args...)` compiles without running
/// (arguments may be TensorSpec trees: plan a step for a model too large for this machine).
template <class F>
class Sjit {
 public:
  Sjit(F f, Mesh mesh, SjitOptions options)
      : f_(std::move(f)),
        core_(std::make_shared<detail::SjitCore>(std::move(mesh), std::move(options))) {}

  template <class... Args>
  auto operator()(const Args&... args) {
    using R = std::remove_cvref_t<std::invoke_result_t<F&, detail::traced_t<Args>...>>;
    detail::CallArgs call = collect(args...);
    auto compiled = core_->get(call, tracer(args...));
    return detail::from_output_tree<R>(core_->run(*compiled, call));
  }

  template <class... Args>
  Lowered lower(const Args&... args) {
    detail::CallArgs call = collect(args...);
    return Lowered(core_->get(call, tracer(args...)));
  }

  /// Programs compiled so far (one per signature).
  std::size_t cache_size() const { return core_->cache_size(); }

 private:
  template <class... Args>
  detail::CallArgs collect(const Args&... args) {
    detail::CallArgs call;
    int position = 0;
    (detail::add_arg(call, position++, args), ...);
    return call;
  }

  template <class... Args>
  detail::TraceFn tracer(const Args&... args) {
    return [this, &args...](const std::vector<Tree<Array>>& tracers) {
      std::size_t next = 0;
      // Braced initialisation evaluates left to right: tracers are taken in argument order.
      auto params =
          std::tuple<detail::traced_t<Args>...>{detail::make_param(args, tracers, next)...};
      using R = std::remove_cvref_t<std::invoke_result_t<F&, detail::traced_t<Args>...>>;
      const R r = std::apply(f_, params);
      return detail::output_tree(r);
    };
  }

  F f_;
  std::shared_ptr<detail::SjitCore> core_;
};

/// Wraps `f` to run over `mesh` (MeshShardingHelper::sjit does the same with its mesh).
template <class F>
Sjit<F> sjit(const Mesh& mesh, F f, SjitOptions options = {}) {
  return Sjit<F>(std::move(f), mesh, std::move(options));
}

template <class F>
Sjit<F> MeshShardingHelper::sjit(F f, SjitOptions options) const {
  return Sjit<F>(std::move(f), mesh_, std::move(options));
}
template <class F>
Sjit<F> MeshShardingHelper::sjit(F f) const {
  return Sjit<F>(std::move(f), mesh_, SjitOptions{});
}

/// jax.eval_shape: the shapes and dtypes `f` returns for these arguments (arrays or TensorSpec
/// trees), found by tracing it; nothing is allocated or run.
template <class F, class... Args>
Tree<TensorSpec> eval_shape(const Mesh& mesh, F f, const Args&... args) {
  SjitOptions options;
  options.allow_unknown_annotations = true;
  return sjit(mesh, std::move(f), std::move(options)).lower(args...).output_specs();
}

/// with_sharding_constraint on every leaf of a tree, the specs resolved from a rule tree (a
/// prefix of `tree`; Unspecified leaves are left alone).
Tree<Array> with_sharding_constraint(const Tree<Array>& tree, const RuleTree& rules);
/// with_sharding_annotation on every leaf of a tree: inside sjit, the rule given for `name` is
/// resolved against the tree.
Tree<Array> with_sharding_annotation(const Tree<Array>& tree, const std::string& name);

}  // namespace shardplan
