#pragma once
// What the registry test (tests/primitive_registry_test.cpp) needs to check a primitive, declared
// next to its definition (`Primitive::tests`): the cases to run (attributes, operand types, where
// operand values are sampled), the dtypes, a reference computed in double on host values (naive,
// written apart from the kernel), whether a gradient flows (the VJP is then checked against
// central finite differences of the reference) and the public functions that docs/sjit.md must
// list. The test also runs every case sharded over 4 devices and compares it with one device. A
// primitive without a declaration fails that test, by name.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>
#include <vector>

#include "graph.hpp"
#include "shardplan/tensor.hpp"

namespace shardplan::detail {

struct Primitive;

/// Where an operand's values are sampled: uniform in [low, high], at least `min_abs` away from 0
/// (a divisor), whole numbers when `whole` (ties for comparisons). Integer dtypes always take
/// whole numbers; bool operands are 0 or 1 whatever the domain.
struct Domain {
  double low = -2, high = 2;
  double min_abs = 0;
  bool whole = false;
};
inline constexpr Domain kAnyReal{};
inline constexpr Domain kPositive{.low = 0.25, .high = 4};
inline constexpr Domain kNonzero{.min_abs = 0.5};
inline constexpr Domain kSmallWhole{.low = -3, .high = 3, .whole = true};

/// One operand of a case: its type and where its values come from.
struct CaseOperand {
  TensorType type;
  Domain domain = kAnyReal;
};
/// One node to check: its attributes and operands.
struct TestCase {
  Attrs attrs;
  std::vector<CaseOperand> operands;
};

/// An operand's values on the host, row-major, in double.
struct HostValues {
  Shape shape;
  std::vector<double> v;
};

/// The dtypes a primitive is checked in.
class DTypeSet {
 public:
  constexpr DTypeSet(std::initializer_list<DType> dtypes) {
    for (const DType d : dtypes) bits_ |= std::uint32_t{1} << static_cast<unsigned>(d);
  }
  constexpr bool contains(DType d) const { return ((bits_ >> static_cast<unsigned>(d)) & 1u) != 0; }
  /// In DType order.
  std::vector<DType> list() const;

 private:
  std::uint32_t bits_ = 0;
};
inline constexpr DTypeSet kFloatTypes{DType::kF32, DType::kF64, DType::kBF16};
inline constexpr DTypeSet kNumericTypes{DType::kF32, DType::kF64, DType::kBF16, DType::kI32,
                                        DType::kI64};
inline constexpr DTypeSet kMovedTypes{DType::kF32, DType::kF64, DType::kBF16,
                                      DType::kI32, DType::kI64, DType::kBool};

/// What the test does with the declaration.
enum class TestKind {
  /// Forward against the reference per dtype, the VJP against finite differences (in f64),
  /// sharded against one device.
  kReference,
  /// random: the same attributes give the same values, sharded equals one device, the values lie
  /// in the range and have the moments `moments` gives.
  kRandom,
  /// input (no kernel: an sjit argument): the argument comes back unchanged, sharded or not.
  kArgument,
  /// shard_map's boundaries and collectives: what each device computes depends on the others, which
  /// a one-device reference cannot state. Checked by tests/shard_map_test.cpp, which the registry
  /// test requires to call every public function listed (declared in shardplan/shard_map.hpp).
  kShardMap,
};

/// The cases of primitive `p` whose (first) operands or result are of `dtype`.
using CasesFn = std::vector<TestCase>(const Primitive& p, DType dtype);
/// The result's values, row-major, for these operands (the node's attributes and result type set).
using ReferenceFn = std::vector<double>(const Node& node, std::span<const HostValues> operands);
/// The result element of a pointwise op from the operands' elements at that index.
using ElementFn = double(std::span<const double> x);
/// A random node's distribution: mean and standard deviation, and the range of its values.
struct Moments {
  double mean = 0, stddev = 1, low = 0, high = 0;
};
using MomentsFn = Moments(const Node& node);

struct PrimitiveTests {
  /// Its public functions, space-separated (declared in include/shardplan/ops.hpp, listed in
  /// docs/sjit.md's "Ops"); empty only for kArgument.
  std::string_view public_ops;
  DTypeSet dtypes;
  CasesFn* cases = nullptr;
  /// The reference: per element (pointwise ops) or of the whole node.
  ElementFn* elementwise = nullptr;
  ReferenceFn* reference = nullptr;
  /// A cotangent flows to the float operands (of a float result).
  bool gradient = false;
  /// Without a gradient: differentiating it is refused (its VJP throws SpecError) rather than
  /// giving no cotangent, because one does flow mathematically (a second derivative through a
  /// backward kernel) and a silent zero would be a wrong answer.
  bool gradient_refused = false;
  /// The operands' domains, for cases made by `pointwise_cases`.
  std::array<Domain, 3> domains = {};
  TestKind kind = TestKind::kReference;
  MomentsFn* moments = nullptr;
};

// ---- Shared by declarations -----------------------------------------------------------------

/// Operands of `dtype` (operand i from domains[i]) of shapes [8, 6], [] and [3, 5].
std::vector<TestCase> pointwise_cases(const Primitive& p, DType dtype);
/// The multi-index of row-major element `i` of shape `s`, and back.
std::vector<std::int64_t> unravel(std::int64_t i, const Shape& s);
std::int64_t ravel(std::span<const std::int64_t> index, const Shape& s);
/// A host tensor's elements as doubles, and one set from a double: as Tensor::to_doubles and
/// Tensor::set, and bool too (0 or 1).
std::vector<double> host_doubles(const Tensor& t);
void set_host_value(Tensor& t, std::int64_t i, double v);

}  // namespace shardplan::detail
