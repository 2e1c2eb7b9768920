#pragma once

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardplan/detail/tree_struct_impl.hpp"
#include "shardplan/tree.hpp"

/// Registers a struct as a tree node: its named members become dict entries, so
///
///   struct TrainState { Tree<TensorSpec> step; Tree<TensorSpec> params, opt_state; };
///   SHARDPLAN_TREE_STRUCT(TrainState, step, params, opt_state)
///
/// gives `to_tree<TensorSpec>(state)` with paths `step`, `params/...`, `opt_state/...`, and
/// `from_tree<TrainState>(tree)` back. Members may be a leaf T, a Tree<T>, or another registered
/// struct. Use at namespace scope, in the struct's namespace or the global one (up to 16 members).
#define SHARDPLAN_TREE_STRUCT(Type, ...)                                                    \
  [[maybe_unused]] inline auto shardplan_tree_fields(const Type*) {                         \
    using ShardplanSelf = Type;                                                             \
    return std::make_tuple(SHARDPLAN_DETAIL_FOR_EACH(SHARDPLAN_DETAIL_FIELD, __VA_ARGS__)); \
  }

namespace shardplan {

/// True for types registered with SHARDPLAN_TREE_STRUCT.
template <class S>
concept TreeStruct = requires(const S* s) {
  shardplan_tree_fields(s);
};

namespace detail {

template <class T, class M>
Tree<T> member_to_tree(const M& m) {
  if constexpr (std::is_same_v<M, Tree<T>>) {
    return m;
  } else if constexpr (TreeStruct<M>) {
    return to_tree_impl<T>(m);
  } else {
    return Tree<T>(m);
  }
}

template <class T, class M>
void member_from_tree(M& m, const Tree<T>& t, const std::string& path) {
  if constexpr (std::is_same_v<M, Tree<T>>) {
    m = t;
  } else if constexpr (TreeStruct<M>) {
    from_tree_impl<T>(m, t, path);
  } else {
    if (!t.is_leaf()) {
      throw TreeError("[tree] struct member '" + path + "' expects a leaf but the tree has a " +
                      std::string(to_string(t.kind())));
    }
    m = t.leaf();
  }
}

template <class T, class S>
Tree<T> to_tree_impl(const S& s) {
  std::vector<typename Tree<T>::DictEntry> entries;
  std::apply(
      [&](const auto&... field) {
        (entries.emplace_back(field.first, member_to_tree<T>(s.*(field.second))), ...);
      },
      shardplan_tree_fields(static_cast<const S*>(nullptr)));
  return Tree<T>::dict(std::move(entries));
}

template <class T, class S>
void from_tree_impl(S& s, const Tree<T>& t, const std::string& path) {
  std::apply(
      [&](const auto&... field) {
        (member_from_tree<T>(s.*(field.second), t.at(field.first),
                             path.empty() ? std::string(field.first) : path + "/" + field.first),
         ...);
      },
      shardplan_tree_fields(static_cast<const S*>(nullptr)));
}

}  // namespace detail

/// The tree of a registered struct: a dict of its members (sorted by name, like any dict).
template <class T, TreeStruct S>
Tree<T> to_tree(const S& s) {
  return detail::to_tree_impl<T>(s);
}

/// A registered struct from a tree of the shape `to_tree` makes. Throws TreeError naming the
/// member path when a key is missing or a leaf is not where the struct expects one.
template <TreeStruct S, class T>
S from_tree(const Tree<T>& t) {
  S s{};
  if (!t.is_dict()) {
    throw TreeError("[tree] a registered struct needs a dict but the tree has a " +
                    std::string(to_string(t.kind())));
  }
  detail::from_tree_impl<T>(s, t, "");
  return s;
}

}  // namespace shardplan
