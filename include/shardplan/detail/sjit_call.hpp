#pragma once
// sjit's machinery (shardplan/sjit.hpp is what users call): how a call's arguments are collected
// (array leaves, statics kept by value for the cache key), how the function is run on tracers,
// and the non-template core that traces, compiles, caches and runs.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/detail/array_tree.hpp"
#include "shardplan/detail/hash.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/tensor_spec.hpp"
#include "shardplan/tree.hpp"
#include "shardplan/tree_struct.hpp"

namespace shardplan {

struct SjitOptions;

namespace detail {

struct Compiled;

/// The most bytes per device all kept constants of one program hold together by default
/// (SjitOptions::kept_constant_bytes): beyond it, the later ones are made again each run (a step
/// whose many per-layer constants each fit kMaxCachedConstantBytes, once split over many devices,
/// would otherwise keep all of them resident).
inline constexpr std::int64_t kDefaultKeptConstantBytes = std::int64_t{4} << 20;

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

/// How sjit treats an argument: kept by value in the cache key, or traced (an Array, a tree or a
/// registered struct of them; TensorSpecs and their trees are traced without data).
enum class ArgKind { kStatic, kArray, kArrayTree, kStruct, kSpec, kSpecTree };

template <class T>
constexpr ArgKind arg_kind() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, Array>) {
    return ArgKind::kArray;
  } else if constexpr (std::is_same_v<U, Tree<Array>>) {
    return ArgKind::kArrayTree;
  } else if constexpr (std::is_same_v<U, TensorSpec>) {
    return ArgKind::kSpec;
  } else if constexpr (std::is_same_v<U, Tree<TensorSpec>>) {
    return ArgKind::kSpecTree;
  } else if constexpr (TreeStruct<U>) {
    return ArgKind::kStruct;
  } else {
    return ArgKind::kStatic;
  }
}

/// What the function receives for an argument of type A: tracers in the same shape (an Array
/// for a TensorSpec), statics by const reference.
template <class A>
using traced_t = std::conditional_t<
    arg_kind<A>() == ArgKind::kSpec, Array,
    std::conditional_t<arg_kind<A>() == ArgKind::kSpecTree, Tree<Array>,
                       std::conditional_t<arg_kind<A>() == ArgKind::kStatic,
                                          const std::remove_cvref_t<A>&, std::remove_cvref_t<A>>>>;

void add_array_arg(CallArgs& call, int position, const Tree<Array>& tree);
void add_spec_arg(CallArgs& call, int position, const Tree<TensorSpec>& tree);

template <class A>
void add_arg(CallArgs& call, int position, const A& arg) {
  constexpr ArgKind kind = arg_kind<A>();
  if constexpr (kind == ArgKind::kArrayTree) {
    add_array_arg(call, position, arg);
  } else if constexpr (kind == ArgKind::kArray || kind == ArgKind::kStruct) {
    add_array_arg(call, position, to_array_tree(arg));
  } else if constexpr (kind == ArgKind::kSpec) {
    add_spec_arg(call, position, Tree<TensorSpec>(arg));
  } else if constexpr (kind == ArgKind::kSpecTree) {
    add_spec_arg(call, position, arg);
  } else {
    call.statics.push_back(StaticValue::of(position, arg));
  }
}

/// The call's arguments: array leaves (with their types) in argument order, and statics.
template <class... Args>
CallArgs collect_args(const Args&... args) {
  CallArgs call;
  int position = 0;
  (add_arg(call, position++, args), ...);
  call.num_args = position;
  return call;
}

template <class A>
traced_t<A> make_param(const A& arg, const std::vector<Tree<Array>>& tracers, std::size_t& next) {
  constexpr ArgKind kind = arg_kind<A>();
  if constexpr (kind == ArgKind::kArray || kind == ArgKind::kSpec) {
    return tracers[next++].leaf();
  } else if constexpr (kind == ArgKind::kArrayTree || kind == ArgKind::kSpecTree) {
    return tracers[next++];
  } else if constexpr (kind == ArgKind::kStruct) {
    return from_array_tree<std::remove_cvref_t<A>>(tracers[next++]);
  } else {
    return arg;
  }
}

/// What `f` returns when called with tracers for `Args`.
template <class F, class... Args>
using sjit_result_t = std::remove_cvref_t<std::invoke_result_t<F&, traced_t<Args>...>>;

/// Runs the function on tracers (one tree per array-like argument, in order) and returns its
/// output as a tree.
using TraceFn = std::function<Tree<Array>(const std::vector<Tree<Array>>&)>;

/// A TraceFn calling `f` with tracers for the array-like `args` and the statics themselves.
/// `f` and `args` must outlive it.
template <class F, class... Args>
TraceFn trace_fn(F& f, const Args&... args) {
  return [&f, &args...](const std::vector<Tree<Array>>& tracers) {
    std::size_t next = 0;
    // Braced initialisation evaluates left to right: tracers are taken in argument order.
    auto params = std::tuple<traced_t<Args>...>{make_param(args, tracers, next)...};
    const sjit_result_t<F, Args...> r = std::apply(f, params);
    return to_array_tree(r);
  };
}

/// The non-template part of an Sjit: traces on a cache miss, compiles, caches, runs.
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
}  // namespace shardplan
