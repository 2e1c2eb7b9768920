#include "shardplan/tensor.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <new>
#include <numbers>

#include "numeric.hpp"

namespace shardplan {
namespace {

// SplitMix64's finaliser: a bijective 64-bit mix.
std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t counter_bits(std::uint64_t seed, std::uint64_t index) {
  return mix64(mix64(seed) ^ index);
}

double to_unit(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kF64:
      return f(double{});
    case DType::kBF16:
      return f(bf16{});
    case DType::kI32:
      return f(std::int32_t{});
    case DType::kI64:
      return f(std::int64_t{});
    default:
      throw SpecError(
          fmt::format("[tensor] dtype {} is not supported here (f32, f64, bf16, i32, "
                      "i64 are)",
                      name(dtype)));
  }
}

std::byte* allocate_storage(std::int64_t bytes) {
  // In size_t: bytes <= INT64_MAX, so adding 63 cannot wrap.
  const auto rounded = (static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1)) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return static_cast<std::byte*>(p);
}

}  // namespace

bool is_computable(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kBF16 ||
         dtype == DType::kI32 || dtype == DType::kI64;
}

void store_value(DType dtype, std::byte* dst, double value) {
  if (const detail::F8Format* f = detail::f8_format(dtype)) {
    *dst = std::byte{detail::f8_encode(*f, value)};
    return;
  }
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = detail::from_double<T>(value);
    std::memcpy(dst, &v, sizeof v);
  });
}

double load_value(DType dtype, const std::byte* src) {
  if (const detail::F8Format* f = detail::f8_format(dtype)) {
    return detail::f8_decode(*f, std::to_integer<std::uint8_t>(*src));
  }
  return dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, src, sizeof v);
    return detail::to_double(v);
  });
}

double random_uniform(std::uint64_t seed, std::uint64_t index) {
  return to_unit(counter_bits(seed, index));
}

double random_normal(std::uint64_t seed, std::uint64_t index) {
  // Two independent uniforms per index: counters 2i and 2i+1.
  const double u1 = 1.0 - to_unit(counter_bits(seed, 2 * index));  // (0, 1]
  const double u2 = to_unit(counter_bits(seed, 2 * index + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double Generator::value_at(std::uint64_t index) const {
  switch (kind) {
    case Kind::kFull:
      return a;
    case Kind::kNormal:
      return a + b * random_normal(seed, index);
    case Kind::kUniform:
      return a + (b - a) * random_uniform(seed, index);
    case Kind::kIota:
      return a + b * static_cast<double>(index);
  }
  return 0;
}

void Tensor::Free::operator()(std::byte* p) const noexcept { std::free(p); }

Tensor::Tensor(Shape shape, DType dtype) : shape_(std::move(shape)), dtype_(dtype) {
  data_.reset(allocate_storage(nbytes()));
}

Tensor::Tensor(const Tensor& other) : shape_(other.shape_), dtype_(other.dtype_) {
  data_.reset(allocate_storage(nbytes()));
  if (nbytes() > 0) std::memcpy(data_.get(), other.data_.get(), static_cast<std::size_t>(nbytes()));
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = Tensor(other);
  return *this;
}

void generate_into(DType dtype, std::byte* out, std::int64_t count, std::uint64_t first,
                   const Generator& g) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = reinterpret_cast<T*>(out);
    for (std::int64_t i = 0; i < count; ++i) {
      p[i] = detail::from_double<T>(g.value_at(first + static_cast<std::uint64_t>(i)));
    }
  });
}

Tensor Tensor::generate(Shape shape, DType dtype, const Generator& g) {
  Tensor t(std::move(shape), dtype);
  generate_into(dtype, t.bytes(), t.numel(), 0, g);
  return t;
}

void Tensor::check_type(DType asked) const {
  if (asked != dtype_) {
    throw SpecError(fmt::format("[tensor] asked for {} elements of a {} tensor of shape {}",
                                name(asked), name(dtype_), shape_.to_string()));
  }
}

double Tensor::get(std::int64_t index) const {
  if (index < 0 || index >= numel()) {
    throw SpecError(
        fmt::format("[tensor] index {} out of range for shape {}", index, shape_.to_string()));
  }
  return load_value(dtype_, bytes() + index * static_cast<std::int64_t>(size_of(dtype_)));
}

void Tensor::set(std::int64_t index, double value) {
  if (index < 0 || index >= numel()) {
    throw SpecError(
        fmt::format("[tensor] index {} out of range for shape {}", index, shape_.to_string()));
  }
  store_value(dtype_, bytes() + index * static_cast<std::int64_t>(size_of(dtype_)), value);
}

std::vector<double> Tensor::to_doubles() const {
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) out[static_cast<std::size_t>(i)] = get(i);
  return out;
}

bool Tensor::bit_equal(const Tensor& other) const {
  return shape_ == other.shape_ && dtype_ == other.dtype_ &&
         std::memcmp(bytes(), other.bytes(), static_cast<std::size_t>(nbytes())) == 0;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  os << name(t.dtype()) << t.shape().to_string() << "{";
  const std::int64_t n = std::min<std::int64_t>(t.numel(), 16);
  for (std::int64_t i = 0; i < n; ++i) {
    os << (i ? ", " : "");
    if (is_computable(t.dtype()) || detail::f8_format(t.dtype()) != nullptr) {
      os << t.get(i);
    } else {
      os << "?";
    }
  }
  if (t.numel() > n) os << ", ...";
  return os << "}";
}

}  // namespace shardplan
