// Must not compile: a primitive defined without a VJP. Run by ctest
// (primitive.compile_fail.*), which expects the compiler to name the missing Required part.
#include "../../src/program/ir/primitives.hpp"

namespace shardplan::detail {
namespace {
TensorType same(const Node&, std::span<const TensorType> in) { return in[0]; }
OpFactors factors(const Node& n, std::span<const Shape> in) { return same_dims(n.type.shape, in); }
void kernel(const KernelArgs&) {}
}  // namespace
constinit const Primitive forgot_vjp{.name = "forgot_vjp",
                                     .arity = 1,
                                     .infer = same,
                                     .factors = factors,
                                     .kernel = kernel,
                                     .flops = no_flops};
}  // namespace shardplan::detail

int main() {}
