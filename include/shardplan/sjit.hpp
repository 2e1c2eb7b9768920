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

#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
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
  TensorSpec type;
  Array array;  // empty for an abstract (TensorSpec) argument
};

// Static arguments are kept by value and compared exactly: floating point bitwise (0.0 and -0.0
// differ, a NaN equals the same NaN bits), strings by content, ranges and tuples element by
// element, anything else with its operator==. The hash only picks candidates.
template <class T>
bool static_equal(const T& a, const T& b);
template <class T>
std::size_t static_hash(const T& v);

inline std::size_t hash_combine(std::size_t seed, std::size_t h) {
  return seed ^ (h + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

template <class T>
concept StaticString = std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view>;
template <class T>
concept StaticRange = !StaticString<T> && requires(const T& v) {
  std::begin(v);
  std::end(v);
  std::size(v);
};
template <class T>
concept StaticTuple = !StaticRange<T> && requires {
  std::tuple_size<T>::value;
};

template <class T, std::size_t... I>
bool static_tuple_equal(const T& a, const T& b, std::index_sequence<I...>) {
  return (static_equal(std::get<I>(a), std::get<I>(b)) && ...);
}
template <class T, std::size_t... I>
std::size_t static_tuple_hash(const T& v, std::index_sequence<I...>) {
  std::size_t h = 0;
  ((h = hash_combine(h, static_hash(std::get<I>(v)))), ...);
  return h;
}

template <class T>
bool static_equal(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
  } else if constexpr (StaticString<T>) {
    return a == b;
  } else if constexpr (StaticRange<T>) {
    if (std::size(a) != std::size(b)) return false;
    auto j = std::begin(b);
    for (auto i = std::begin(a); i != std::end(a); ++i, ++j) {
      if (!static_equal(*i, *j)) return false;
    }
    return true;
  } else if constexpr (StaticTuple<T>) {
    return static_tuple_equal(a, b, std::make_index_sequence<std::tuple_size_v<T>>());
  } else if constexpr (requires { static_cast<bool>(a == b); }) {
    return static_cast<bool>(a == b);
  } else {
    static_assert(!sizeof(T),
                  "a static sjit argument is part of the cache key and needs an exact "
                  "operator== (std::hash is optional); give the type one, or pass it as an Array");
    return false;
  }
}

template <class T>
std::size_t static_hash(const T& v) {
  if constexpr (std::is_floating_point_v<T>) {
    // Bitwise, as the equality: 0.0 and -0.0 hash apart.
    std::size_t h = 0;
    const auto* bytes = reinterpret_cast<const unsigned char*>(&v);
    for (std::size_t i = 0; i < sizeof(T); ++i) h = hash_combine(h, bytes[i]);
    return h;
  } else if constexpr (StaticString<T>) {
    return std::hash<std::string_view>()(std::string_view(v));
  } else if constexpr (StaticRange<T>) {
    std::size_t h = std::size(v);
    for (const auto& e : v) h = hash_combine(h, static_hash(e));
    return h;
  } else if constexpr (StaticTuple<T>) {
    return static_tuple_hash(v, std::make_index_sequence<std::tuple_size_v<T>>());
  } else if constexpr (requires { std::hash<T>()(v); }) {
    return std::hash<T>()(v);
  } else {
    return 0;  // no hash: the equality alone decides
  }
}

/// The type a static argument is stored as: C strings become std::string (their text, not their
/// address, is the key).
template <class T>
using static_storage_t = std::conditional_t<std::is_same_v<std::decay_t<T>, const char*> ||
                                                std::is_same_v<std::decay_t<T>, char*>,
                                            std::string, std::remove_cvref_t<T>>;

/// One static argument, by value: its position, its type (typeid) and a copy of it. Two are equal
/// when position, type and value are (static_equal); the hash is only a hint.
class StaticValue {
 public:
  template <class T>
  static StaticValue of(int position, const T& v) {
    using S = static_storage_t<T>;
    static_assert(!std::is_pointer_v<S> || std::is_function_v<std::remove_pointer_t<S>>,
                  "a pointer as a static sjit argument would be keyed by its address, which can "
                  "be reused: pass the value it points to");
    static_assert(!std::is_array_v<S>, "pass a static array argument as a std::array or vector");
    StaticValue out;
    auto h = std::make_shared<Holder<S>>(S(v));
    out.hash_ =
        hash_combine(hash_combine(static_cast<std::size_t>(position), typeid(S).hash_code()),
                     static_hash(h->value));
    out.position_ = position;
    out.holder_ = std::move(h);
    return out;
  }
  std::size_t hash() const { return hash_; }
  friend bool operator==(const StaticValue& a, const StaticValue& b) {
    return a.hash_ == b.hash_ && a.position_ == b.position_ && a.holder_->equals(*b.holder_);
  }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual bool equals(const Base& other) const = 0;
  };
  template <class S>
  struct Holder final : Base {
    explicit Holder(S v) : value(std::move(v)) {}
    bool equals(const Base& other) const override {
      const auto* o = dynamic_cast<const Holder<S>*>(&other);  // same type (typeid) or not equal
      return o != nullptr && static_equal(value, o->value);
    }
    S value;
  };
  int position_ = 0;
  std::size_t hash_ = 0;
  std::shared_ptr<const Base> holder_;
};

struct CallArgs {
  std::vector<Tree<int>> structures;  // per array-like argument: leaf indices into `leaves`
  std::vector<int> positions;         // the argument position of each array-like argument
  std::vector<ArgLeaf> leaves;
  std::vector<StaticValue> statics;
  int num_args = 0;
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
    call.statics.push_back(StaticValue::of(position, arg));
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
  /// True when both are the same compiled program (the same cache entry).
  friend bool operator==(const Lowered& a, const Lowered& b) { return a.c_ == b.c_; }

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
  /// Called while another sjit (or grad) traces: `trace` is recorded into that trace, the
  /// shardings of this sjit's options becoming constraints (as a nested jax.jit).
  Tree<Array> trace_inline(const CallArgs& call, const TraceFn& trace);
  std::size_t cache_size() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

/// True while this thread traces a function (inside sjit or grad).
bool tracing();

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
    if (detail::tracing()) {  // nested in another sjit: traced inline, as a nested jax.jit
      return detail::from_output_tree<R>(core_->trace_inline(call, tracer(args...)));
    }
    auto compiled = core_->get(call, tracer(args...));
    return detail::from_output_tree<R>(core_->run(*compiled, call));
  }

  template <class... Args>
  Lowered lower(const Args&... args) {
    detail::CallArgs call = collect(args...);
    return Lowered(core_->get(call, tracer(args...)));
  }

  /// The compiled program a call with these arguments runs: the cache entry the call would use
  /// (compiled now when missing). Throws as a call does before running.
  template <class... Args>
  Lowered compiled(const Args&... args) {
    return lower(args...);
  }
  /// scalax's name for compiled().
  template <class... Args>
  Lowered get_jitted_function_by_args(const Args&... args) {
    return compiled(args...);
  }

  /// Programs compiled so far (one per signature).
  std::size_t cache_size() const { return core_->cache_size(); }

 private:
  template <class... Args>
  detail::CallArgs collect(const Args&... args) {
    detail::CallArgs call;
    int position = 0;
    (detail::add_arg(call, position++, args), ...);
    call.num_args = position;
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

/// Wraps `f` to run over the mesh of this thread's MeshContext (scalax's global mesh). Throws
/// SpecError when no context is active.
template <class F>
Sjit<F> sjit(F f, SjitOptions options = {}) {
  return Sjit<F>(std::move(f), get_global_mesh(), std::move(options));
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
/// resolved against the tree; outside, the active MeshContext's rule for `name` (if any) is.
Tree<Array> with_sharding_annotation(const Tree<Array>& tree, const std::string& name);

}  // namespace shardplan
