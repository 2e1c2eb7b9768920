// Values without operands: iota, constant, random, input. Any sharding of them is made where the
// blocks are (each device makes only its block); none carries a gradient.
#include "../../../runtime/box_copy.hpp"
#include "kernel_util.hpp"
#include "../../ir/primitive_tests.hpp"
#include "../../ir/primitives.hpp"
#include "../../frontend/trace.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {

/// iota: the index along `axis`, as `dtype`, of a value of `shape`.
struct IotaAttrs {
  Shape shape;
  DType dtype = DType::kI32;
  int axis = 0;
};
/// random: counter-based values of `generator` at each global index of `shape`.
struct RandomAttrs {
  Shape shape;
  DType dtype = DType::kF32;
  Generator generator;
};
std::string format_attrs(const IotaAttrs& a) { return fmt::format(" axis={}", a.axis); }
std::string format_attrs(const RandomAttrs&) { return {}; }
std::string format_attrs(const InputAttrs&) { return {}; }
std::string format_attrs(const ConstantAttrs&) { return {}; }

namespace {

OpFactors source_factors(const Node& n, std::span<const Shape>) {
  return result_only(n.type.shape);
}

// ---- iota -------------------------------------------------------------------------------------

TensorType iota_type(const Node& n, std::span<const TensorType>) {
  const IotaAttrs& a = n.attr<IotaAttrs>();
  if (!is_computable(a.dtype)) {
    throw SpecError(fmt::format("[iota] cannot count in {}", name(a.dtype)));
  }
  if (a.axis < 0 || a.axis >= a.shape.rank()) {
    throw SpecError(
        fmt::format("[iota] axis {} is out of range for {}", a.axis, a.shape.to_string()));
  }
  return TensorType{a.shape, a.dtype};
}

void iota_kernel(const KernelArgs& k) {
  dispatch_if<IsNumeric>(k, k.out.dtype, [&]<class T>(Tag<T>) {
    const Shape& s = k.out.shape;
    const int axis = k.node.attr<IotaAttrs>().axis;
    std::int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= s[d];
    for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
    const std::int64_t start = k.out_offset[static_cast<std::size_t>(axis)];
    T* y = elems<T>(k.out);
    for (std::int64_t o = 0; o < outer; ++o) {
      for (std::int64_t j = 0; j < s[axis]; ++j) {
        y = std::fill_n(y, inner, convert_one<T>(start + j));
      }
    }
  });
}

// ---- constant ---------------------------------------------------------------------------------

TensorType constant_type(const Node& n, std::span<const TensorType>) {
  const Tensor& t = *n.attr<ConstantAttrs>().value;
  return TensorType{t.shape(), t.dtype()};
}

void constant_kernel(const KernelArgs& k) {
  const Tensor& t = *k.node.attr<ConstantAttrs>().value;
  if (t.dtype() != k.out.dtype) {
    throw SpecError(fmt::format("[kernel] constant: the host tensor is {}, the result {}",
                                describe(t.dtype(), t.shape()),
                                describe(k.out.dtype, k.out.shape)));
  }
  const std::vector<std::int64_t> zeros(static_cast<std::size_t>(t.shape().rank()), 0);
  copy_box(t.bytes(), t.shape().begin(), k.out_offset.data(), k.out.data, k.out.shape.begin(),
           zeros.data(), k.out.shape.begin(), t.shape().rank(), size_of(t.dtype()));
}

// ---- random -----------------------------------------------------------------------------------

TensorType random_type(const Node& n, std::span<const TensorType>) {
  const RandomAttrs& a = n.attr<RandomAttrs>();
  return TensorType{a.shape, a.dtype};
}

// Each element from the generator at its global row-major index (the global shape is the
// attributes'), the block's place given by out_offset.
void random_kernel(const KernelArgs& k) {
  const Shape& s = k.out.shape;
  const RandomAttrs& a = k.node.attr<RandomAttrs>();
  const int rank = s.rank();
  const std::int64_t n = s.numel();
  if (n == 0) return;
  const std::vector<std::int64_t> stride = row_major_strides(a.shape);
  const std::int64_t inner = rank == 0 ? 1 : s[rank - 1];
  const auto elem = static_cast<std::int64_t>(size_of(k.out.dtype));
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rank), 0);
  for (std::int64_t done = 0; done < n; done += inner) {
    std::int64_t base = 0;
    for (int d = 0; d < rank; ++d) {
      const auto i = static_cast<std::size_t>(d);
      base += (k.out_offset[i] + idx[i]) * stride[i];
    }
    generate_into(k.out.dtype, k.out.data + done * elem, inner, static_cast<std::uint64_t>(base),
                  a.generator);
    for (int d = rank - 2; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < s[d]) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
  }
}

// ---- input ------------------------------------------------------------------------------------

TensorType input_type(const Node& n, std::span<const TensorType>) {
  return n.attr<InputAttrs>().type;
}

// ---- Test declarations (primitive_tests.hpp) --------------------------------------------------

std::vector<TestCase> iota_cases(const Primitive&, DType t) {
  return {{IotaAttrs{Shape{8, 6}, t, 0}, {}},
          {IotaAttrs{Shape{8, 6}, t, 1}, {}},
          {IotaAttrs{Shape{2, 4, 6}, t, 2}, {}}};
}
std::vector<double> iota_reference(const Node& n, std::span<const HostValues>) {
  const auto axis = static_cast<std::size_t>(n.attr<IotaAttrs>().axis);
  std::vector<double> y(static_cast<std::size_t>(n.type.shape.numel()));
  for (std::size_t i = 0; i < y.size(); ++i) {
    y[i] = static_cast<double>(unravel(static_cast<std::int64_t>(i), n.type.shape)[axis]);
  }
  return y;
}
constexpr PrimitiveTests kIotaTests{.public_ops = "iota_like",
                                    .dtypes = kNumericTypes,
                                    .cases = iota_cases,
                                    .reference = iota_reference};

// Host tensors of whole numbers in [-8, 8) (any dtype holds them), a matrix and a scalar.
std::vector<TestCase> constant_cases(const Primitive&, DType t) {
  std::vector<TestCase> cases;
  for (const Shape& s : {Shape{8, 6}, Shape{}}) {
    auto value = std::make_shared<Tensor>(s, t);
    for (std::int64_t i = 0; i < s.numel(); ++i)
      set_host_value(*value, i, static_cast<double>((i * 7) % 16 - 8));
    cases.push_back({ConstantAttrs{std::move(value)}, {}});
  }
  return cases;
}
constexpr PrimitiveTests kConstantTests{
    .public_ops = "full full_like constant",
    .dtypes = kMovedTypes,
    .cases = constant_cases,
    .reference = [](const Node& n, std::span<const HostValues>) {
      return host_doubles(*n.attr<ConstantAttrs>().value);
    }};

std::vector<TestCase> random_cases(const Primitive&, DType t) {
  return {{RandomAttrs{Shape{64, 32}, t, Generator::normal(7, 1.5, 2)}, {}},
          {RandomAttrs{Shape{64, 32}, t, Generator::uniform(8, -1, 3)}, {}}};
}
Moments random_moments(const Node& n) {
  const Generator& g = n.attr<RandomAttrs>().generator;
  if (g.kind == Generator::Kind::kNormal) {
    const double inf = std::numeric_limits<double>::infinity();
    return {.mean = g.a, .stddev = g.b, .low = -inf, .high = inf};
  }
  return {
      .mean = (g.a + g.b) / 2, .stddev = (g.b - g.a) / std::sqrt(12.0), .low = g.a, .high = g.b};
}
constexpr PrimitiveTests kRandomTests{.public_ops = "random_normal random_uniform",
                                      .dtypes = kFloatTypes,
                                      .cases = random_cases,
                                      .kind = TestKind::kRandom,
                                      .moments = random_moments};

std::vector<TestCase> input_cases(const Primitive&, DType t) {
  return {{{}, {{{Shape{8, 6}, t}}}}, {{}, {{{Shape{}, t}}}}};
}
constexpr PrimitiveTests kInputTests{
    .dtypes = kMovedTypes, .cases = input_cases, .kind = TestKind::kArgument};

constexpr Primitive source(std::string_view name, InferFn* infer, KernelFn* kernel, bool cacheable,
                           const PrimitiveTests* tests) {
  return Primitive{.name = name,
                   .arity = 0,
                   .infer = infer,
                   .factors = source_factors,
                   .kernel = kernel,
                   .flops = no_flops,
                   .vjp = no_gradient,
                   .cacheable = cacheable,
                   .tests = tests};
}

Array random_array(const Shape& shape, DType dtype, const Generator& g, std::string_view what) {
  if (current_trace() == nullptr) {
    throw ArrayError(fmt::format(
        "[{}] outside sjit there is no sharding to make the shards of; use Array::{} with a "
        "NamedSharding",
        what, what == "random_normal" ? "normal" : "uniform"));
  }
  if (!is_computable(dtype)) {
    throw SpecError(fmt::format("[{}] cannot make {} values", what, name(dtype)));
  }
  return apply(prim::random, RandomAttrs{shape, dtype, g}, {});
}

}  // namespace

namespace prim {
// Iotas and constants are the same on every call: a program computes them once per executor.
constinit const Primitive iota = source("iota", iota_type, iota_kernel, true, &kIotaTests);
constinit const Primitive constant =
    source("constant", constant_type, constant_kernel, true, &kConstantTests);
constinit const Primitive random =
    source("random", random_type, random_kernel, false, &kRandomTests);
constinit const Primitive input = source("input", input_type, no_kernel, false, &kInputTests);
}  // namespace prim

}  // namespace shardplan::detail

namespace shardplan {

Array random_normal(const Shape& shape, DType dtype, std::uint64_t seed, double mean,
                    double stddev) {
  return detail::random_array(shape, dtype, Generator::normal(seed, mean, stddev), "random_normal");
}

Array random_uniform(const Shape& shape, DType dtype, std::uint64_t seed, double low, double high) {
  return detail::random_array(shape, dtype, Generator::uniform(seed, low, high), "random_uniform");
}

namespace detail {
Array traced_iota(const Shape& shape, DType dtype, int axis) {
  return apply(prim::iota, IotaAttrs{shape, dtype, axis}, {});
}
}  // namespace detail

Array iota_like(const Array& like, int axis, DType dtype) {
  if (like.shape().rank() == 0) {
    throw SpecError(
        fmt::format("[iota] needs an array with an axis, got {}", detail::type_str(like)));
  }
  axis = detail::normalize_axis(axis, like, "iota");
  return detail::apply(detail::prim::iota, detail::IotaAttrs{like.shape(), dtype, axis}, {}, &like);
}

}  // namespace shardplan
