#pragma once
// What dot_general (dot.cpp) shares with scaled_dot (scaled_dot.cpp), so that both read their
// dimensions one way: the shape rule, the factors, the FLOPs, the [batch, m, n, k] view of the
// operands, and the test cases and reference of the registry test.

#include <string_view>
#include <vector>

#include "../../ir/factors.hpp"
#include "../../ir/primitive.hpp"
#include "../../ir/primitive_tests.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

/// The result shape of a dot over `d` of operands `a` and `b`: batch, lhs free, rhs free
/// dimensions. Throws SpecError "[op] a and b: why" when the dimensions do not pair up.
Shape dot_shape(std::string_view op, const DotDims& d, const TensorType& a, const TensorType& b);
/// Batch dimensions pass; contracting dimensions are reduce factors; free dimensions pass.
OpFactors dot_factors_of(const DotDims& d, const Shape& lhs, const Shape& rhs);
/// An operand's shape without its contracting dimensions (its batch and free dimensions, in its
/// own order): the shape of a per-row scale of it (scaled_dot).
Shape dot_kept_shape(const DotDims& d, const Shape& operand, int which);
/// For each element of the result (row-major), the row-major offset of the element of operand
/// `which` (0: lhs, 1: rhs) kept-dimension array (dot_kept_shape) that it scales.
std::vector<std::int64_t> dot_kept_offsets(const DotDims& d, const Shape& lhs, const Shape& rhs,
                                           int which);
/// 2 * batch * m * n * k.
double dot_flops_of(const DotDims& d, const Shape& lhs, const Shape& rhs);
/// Batched (a score) or not (a weight's matmul), for remat policies.
Contraction dot_contraction_of(const DotDims& d);

/// Each operand seen as [batch, free, contract] (batch and contracting dims in the order of
/// their pairs), so that out[b] = lhs[b] (m x k) * rhs[b]^T (k x n).
struct DotLayout {
  std::vector<int> lhs_perm, rhs_perm;  // the operand dims in [batch, free, contract] order
  std::int64_t batch = 1, m = 1, n = 1, k = 1;
};
DotLayout dot_layout(const DotDims& dims, const Shape& lhs, const Shape& rhs);

/// The registry test's dots: a matmul, a batched one, both operands contracted on their other
/// side, and two contracting dimensions paired out of order.
struct DotTestCase {
  DotDims dims;
  Shape lhs, rhs;
};
std::vector<DotTestCase> dot_test_cases();
/// The dot in double, naively: each result element summed over every contracting index.
std::vector<double> dot_reference_of(const DotDims& d, const Shape& result, const HostValues& lhs,
                                     const HostValues& rhs);

}  // namespace shardplan::detail
