// Must not compile: a primitive whose kernel is given as nullptr (Required has no constructor
// from nullptr). Run by ctest (primitive.compile_fail.*).
#include "../../src/program/ir/primitives.hpp"

namespace shardplan::detail {
namespace {
TensorType same(const Node&, std::span<const TensorType> in) { return in[0]; }
OpFactors factors(const Node& n, std::span<const Shape> in) { return same_dims(n.type.shape, in); }
}  // namespace
constinit const Primitive null_kernel{.name = "null_kernel",
                                      .arity = 1,
                                      .infer = same,
                                      .factors = factors,
                                      .kernel = nullptr,
                                      .flops = no_flops,
                                      .vjp = no_gradient};
}  // namespace shardplan::detail

int main() {}
