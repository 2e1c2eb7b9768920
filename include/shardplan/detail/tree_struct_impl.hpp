#pragma once

#include <string>

// Preprocessor helpers for SHARDPLAN_TREE_STRUCT: apply a macro to up to 16 arguments.
#define SHARDPLAN_DETAIL_FIELD(name) std::pair<const char*, decltype(&ShardplanSelf::name)>(#name, &ShardplanSelf::name)

#define SHARDPLAN_DETAIL_NARGS(...) \
  SHARDPLAN_DETAIL_NARGS_I(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define SHARDPLAN_DETAIL_NARGS_I(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, \
                                 _16, N, ...)                                                    \
  N
#define SHARDPLAN_DETAIL_CAT(a, b) SHARDPLAN_DETAIL_CAT_I(a, b)
#define SHARDPLAN_DETAIL_CAT_I(a, b) a##b
#define SHARDPLAN_DETAIL_FOR_EACH(m, ...) \
  SHARDPLAN_DETAIL_CAT(SHARDPLAN_DETAIL_FE_, SHARDPLAN_DETAIL_NARGS(__VA_ARGS__))(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_1(m, a) m(a)
#define SHARDPLAN_DETAIL_FE_2(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_1(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_3(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_2(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_4(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_3(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_5(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_4(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_6(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_5(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_7(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_6(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_8(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_7(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_9(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_8(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_10(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_9(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_11(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_10(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_12(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_11(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_13(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_12(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_14(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_13(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_15(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_14(m, __VA_ARGS__)
#define SHARDPLAN_DETAIL_FE_16(m, a, ...) m(a), SHARDPLAN_DETAIL_FE_15(m, __VA_ARGS__)

namespace shardplan {
template <class T>
class Tree;
namespace detail {
template <class T, class S>
Tree<T> to_tree_impl(const S& s);
template <class T, class S>
void from_tree_impl(S& s, const Tree<T>& t, const std::string& path);
}  // namespace detail
}  // namespace shardplan
