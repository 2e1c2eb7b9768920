#pragma once
// The helpers of the movement primitives' test declarations (primitive_tests.hpp), shared by
// movement.cpp and movement_index.cpp.

#include <initializer_list>
#include <vector>

#include "../../ir/primitive_tests.hpp"

namespace shardplan::detail {

inline TestCase movement_case(Attrs attrs, std::initializer_list<Shape> shapes, DType t) {
  TestCase c{std::move(attrs), {}};
  for (const Shape& s : shapes) c.operands.push_back({{s, t}});
  return c;
}

// y[i] = operand `from(result index)` of operand 0.
template <class F>
std::vector<double> gather_reference(const Node& n, const HostValues& x, F from) {
  std::vector<double> y(static_cast<std::size_t>(n.type.shape.numel()));
  for (std::size_t i = 0; i < y.size(); ++i) {
    const auto r = unravel(static_cast<std::int64_t>(i), n.type.shape);
    y[i] = x.v[static_cast<std::size_t>(ravel(from(r), x.shape))];
  }
  return y;
}

}  // namespace shardplan::detail
