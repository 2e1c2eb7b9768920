#pragma once
// The one conversion between what a traced function takes or returns (an Array, a Tree<Array>
// or a registered struct of Arrays) and the Tree<Array> that sjit and grad work on.

#include <type_traits>

#include "shardplan/array.hpp"
#include "shardplan/tree.hpp"
#include "shardplan/tree_struct.hpp"

namespace shardplan::detail {

/// An Array, a Tree<Array> or a registered struct of Arrays (cv and references removed).
template <class T>
concept ArrayTreeLike = std::is_same_v<T, Array> || std::is_same_v<T, Tree<Array>> || TreeStruct<T>;

/// `v` as a tree: a single leaf for an Array, itself for a tree, the struct's fields otherwise.
template <class T>
Tree<Array> to_array_tree(const T& v) {
  if constexpr (std::is_same_v<T, Array>) {
    return Tree<Array>(v);
  } else if constexpr (std::is_same_v<T, Tree<Array>>) {
    return v;
  } else {
    static_assert(TreeStruct<T>,
                  "sjit and grad functions take and return an Array, a Tree<Array> or a "
                  "registered struct of Arrays");
    return to_tree<Array>(v);
  }
}

/// The inverse of to_array_tree. Throws TreeError when `t` does not have T's structure.
template <class T>
T from_array_tree(const Tree<Array>& t) {
  if constexpr (std::is_same_v<T, Array>) {
    return t.leaf();
  } else if constexpr (std::is_same_v<T, Tree<Array>>) {
    return t;
  } else {
    return from_tree<T>(t);
  }
}

}  // namespace shardplan::detail
