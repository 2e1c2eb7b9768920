#pragma once
// Equality and hashing derived from an aggregate's fields, so that a primitive's attributes are
// compared and hashed by every field they have, never by a list written by hand that can miss one.
// The fields are found with structured bindings; the count is checked by the binding itself (a
// wrong count does not compile). Floating-point fields compare and hash bitwise (0.0 and -0.0
// differ, a NaN equals the same NaN): a cache must never mistake one for the other.

#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardplan/detail/hash.hpp"
#include "shardplan/partition_spec.hpp"
#include "shardplan/shape.hpp"
#include "shardplan/tensor.hpp"

namespace shardplan::detail {

namespace fields_impl {

struct AnyField {
  template <class T>
  operator T() const;  // NOLINT: only named in unevaluated contexts
};

template <class T, std::size_t... I>
constexpr bool brace_init_with(std::index_sequence<I...>) {
  return requires { T{(void(I), AnyField{})...}; };
}

template <class T, std::size_t N = 6>
constexpr std::size_t count() {
  if constexpr (N == 0) {
    return 0;
  } else if constexpr (brace_init_with<T>(std::make_index_sequence<N>())) {
    return N;
  } else {
    return count<T, N - 1>();
  }
}

}  // namespace fields_impl

/// Calls f(fields...) with references to the fields of aggregate `v` (up to six).
template <class T, class F>
decltype(auto) apply_fields(T& v, F&& f) {
  using U = std::remove_cvref_t<T>;
  static_assert(std::is_aggregate_v<U>, "attributes are plain aggregates");
  constexpr std::size_t n = fields_impl::count<U>();
  if constexpr (n == 0) {
    return f();
  } else if constexpr (n == 1) {
    auto& [a] = v;
    return f(a);
  } else if constexpr (n == 2) {
    auto& [a, b] = v;
    return f(a, b);
  } else if constexpr (n == 3) {
    auto& [a, b, c] = v;
    return f(a, b, c);
  } else if constexpr (n == 4) {
    auto& [a, b, c, d] = v;
    return f(a, b, c, d);
  } else if constexpr (n == 5) {
    auto& [a, b, c, d, e] = v;
    return f(a, b, c, d, e);
  } else {
    auto& [a, b, c, d, e, g] = v;
    return f(a, b, c, d, e, g);
  }
}

// ---- Equality ---------------------------------------------------------------------------------

template <class T>
bool same(const T& a, const T& b);

inline bool same_value(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.bytes(), b.bytes(), static_cast<std::size_t>(a.nbytes())) == 0;
}

template <class T>
bool same(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    return a == b;
  } else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, Shape> ||
                       std::is_same_v<T, PartitionSpec>) {
    return a == b;
  } else if constexpr (std::is_same_v<T, std::shared_ptr<const Tensor>>) {
    // By value: a host tensor freed and another made at its address must not match.
    return a == b || (a && b && same_value(*a, *b));
  } else if constexpr (requires {
                         a.has_value();
                         *a;
                       }) {  // std::optional
    return a.has_value() == b.has_value() && (!a || same(*a, *b));
  } else if constexpr (requires {
                         a.size();
                         a.begin();
                       }) {  // std::vector
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!same(a[i], b[i])) return false;
    }
    return true;
  } else {
    return apply_fields(a, [&](const auto&... fa) {
      return apply_fields(b, [&](const auto&... fb) { return (same(fa, fb) && ...); });
    });
  }
}

// ---- Hashing ----------------------------------------------------------------------------------

template <class T>
std::size_t hash_of(const T& v) {
  if constexpr (std::is_floating_point_v<T>) {
    std::size_t h = 0;
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));
    for (const unsigned char c : bytes) h = hash_combine(h, c);
    return h;
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    return std::hash<std::int64_t>()(static_cast<std::int64_t>(v));
  } else if constexpr (std::is_same_v<T, std::string>) {
    return std::hash<std::string>()(v);
  } else if constexpr (std::is_same_v<T, Shape>) {  // as its dims() vector, without making it
    std::size_t h = static_cast<std::size_t>(v.rank());
    for (const std::int64_t d : v) h = hash_combine(h, hash_of(d));
    return h;
  } else if constexpr (std::is_same_v<T, PartitionSpec>) {
    return hash_of(v.dims());
  } else if constexpr (std::is_same_v<T, std::shared_ptr<const Tensor>>) {
    // Shape and dtype only: equal values must hash alike, and the bytes may be large.
    return v ? hash_combine(hash_of(v->shape()), static_cast<std::size_t>(v->dtype())) : 0;
  } else if constexpr (requires {
                         v.has_value();
                         *v;
                       }) {
    return v ? hash_combine(1, hash_of(*v)) : 0;
  } else if constexpr (requires {
                         v.size();
                         v.begin();
                       }) {
    std::size_t h = v.size();
    for (const auto& e : v) h = hash_combine(h, hash_of(e));
    return h;
  } else {
    return apply_fields(v, [](const auto&... f) {
      std::size_t h = 0;
      ((h = hash_combine(h, hash_of(f))), ...);
      return h;
    });
  }
}

}  // namespace shardplan::detail
