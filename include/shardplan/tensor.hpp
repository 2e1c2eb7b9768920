#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/shape.hpp"
#include "shardplan/tensor_spec.hpp"

namespace shardplan {

/// bfloat16, stored as 16 bits: the upper half of an IEEE float32. Conversion from float rounds
/// to nearest, ties to even (NaN stays NaN).
struct bf16 {
  std::uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(round(f)) {}
  explicit operator float() const {
    const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static bf16 from_bits(std::uint16_t b) {
    bf16 x;
    x.bits = b;
    return x;
  }
  friend bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }

 private:
  static std::uint16_t round(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(u >> 16);
  }
};

/// The DType of a C++ element type (float, double, bf16, std::int32_t, std::int64_t,
/// std::uint8_t, bool).
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::kF32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::kF64;
  else if constexpr (std::is_same_v<T, bf16>)
    return DType::kBF16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DType::kI32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DType::kI64;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return DType::kU8;
  else if constexpr (std::is_same_v<T, bool>)
    return DType::kBool;
  else
    static_assert(!sizeof(T), "no DType for this element type");
}

/// True for the dtypes the runtime computes with (fills, reductions): f32, f64, bf16, i32, i64.
bool is_computable(DType dtype);
/// `value` converted to `dtype` (rounded to nearest even for floats; truncated toward zero and
/// saturated for integers, NaN giving 0: docs/runtime.md, "Numeric policy") and
/// stored at `dst`. Takes the computable dtypes and the float8 ones (f8_e4m3 past 448 gives NaN,
/// f8_e5m2 past 57344 inf, as PyTorch's casts). Throws SpecError for any other dtype.
void store_value(DType dtype, std::byte* dst, double value);
/// The element at `src` as a double (computable and float8 dtypes). Throws SpecError for any
/// other dtype.
double load_value(DType dtype, const std::byte* src);

/// Counter-based random numbers: the value depends only on (seed, index), never on the order of
/// calls, so a sharded fill gives exactly the numbers of an unsharded one. Uniform in [0, 1).
double random_uniform(std::uint64_t seed, std::uint64_t index);
/// Standard normal (Box-Muller on two counter-based uniforms).
double random_normal(std::uint64_t seed, std::uint64_t index);

/// What a generated tensor holds at each row-major index of its global shape.
struct Generator {
  enum class Kind { kFull, kNormal, kUniform, kIota };
  Kind kind = Kind::kFull;
  double a = 0;  // full: the value; normal: mean; uniform: low; iota: start
  double b = 1;  // normal: stddev; uniform: high; iota: step
  std::uint64_t seed = 0;

  static Generator full(double value) { return {Kind::kFull, value, 0, 0}; }
  static Generator normal(std::uint64_t seed, double mean = 0, double stddev = 1) {
    return {Kind::kNormal, mean, stddev, seed};
  }
  static Generator uniform(std::uint64_t seed, double low = 0, double high = 1) {
    return {Kind::kUniform, low, high, seed};
  }
  /// start + step * index.
  static Generator iota(double start = 0, double step = 1) { return {Kind::kIota, start, step, 0}; }

  double value_at(std::uint64_t index) const;
};

/// Writes the generator's values for row-major indices [first, first + count) to `out` as
/// `dtype`. Throws SpecError for a dtype that is not computable.
void generate_into(DType dtype, std::byte* out, std::int64_t count, std::uint64_t first,
                   const Generator& g);

/// An owning host tensor: shape, dtype and 64-byte-aligned row-major storage. A value type:
/// copies copy the elements; moves are cheap. Eigen views are in shardplan/eigen.hpp.
class Tensor {
 public:
  /// A f32 scalar 0.
  Tensor() : Tensor(Shape{}, DType::kF32) {}
  /// Zeros. Throws SpecError, before allocating, when the byte size does not fit in int64
  /// (see byte_size); std::bad_alloc when the host has no room.
  Tensor(Shape shape, DType dtype);
  /// From values in row-major order. Throws SpecError when their count is not the shape's.
  template <class T>
  static Tensor from(Shape shape, const std::vector<T>& values) {
    Tensor t(std::move(shape), dtype_of<T>());
    if (static_cast<std::int64_t>(values.size()) != t.numel()) {
      throw SpecError("[tensor] " + std::to_string(values.size()) + " values for shape " +
                      t.shape().to_string() + " (" + std::to_string(t.numel()) + " elements)");
    }
    if (!values.empty()) std::memcpy(t.bytes(), values.data(), values.size() * sizeof(T));
    return t;
  }
  /// Each element from the generator at its row-major index. Throws SpecError for a dtype that
  /// is not computable.
  static Tensor generate(Shape shape, DType dtype, const Generator& g);
  static Tensor zeros(Shape shape, DType dtype) { return Tensor(std::move(shape), dtype); }
  static Tensor ones(Shape shape, DType dtype) {
    return generate(std::move(shape), dtype, Generator::full(1));
  }
  static Tensor normal(Shape shape, DType dtype, std::uint64_t seed, double mean = 0,
                       double stddev = 1) {
    return generate(std::move(shape), dtype, Generator::normal(seed, mean, stddev));
  }
  static Tensor uniform(Shape shape, DType dtype, std::uint64_t seed, double low = 0,
                        double high = 1) {
    return generate(std::move(shape), dtype, Generator::uniform(seed, low, high));
  }

  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  ~Tensor() = default;

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::int64_t nbytes() const { return byte_size(shape_, dtype_); }
  std::byte* bytes() { return data_.get(); }
  const std::byte* bytes() const { return data_.get(); }

  /// Typed access. Throws SpecError when T is not this tensor's dtype.
  template <class T>
  T* data() {
    check_type(dtype_of<T>());
    return reinterpret_cast<T*>(data_.get());
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>());
    return reinterpret_cast<const T*>(data_.get());
  }
  template <class T>
  std::span<T> values() {
    return {data<T>(), static_cast<std::size_t>(numel())};
  }
  template <class T>
  std::span<const T> values() const {
    return {data<T>(), static_cast<std::size_t>(numel())};
  }
  /// Element `index` (row-major) as a double / set from a double (as load_value, store_value).
  double get(std::int64_t index) const;
  void set(std::int64_t index, double value);
  /// The elements as doubles, in row-major order.
  std::vector<double> to_doubles() const;

  /// Same shape, dtype and bytes.
  bool bit_equal(const Tensor& other) const;
  friend bool operator==(const Tensor& a, const Tensor& b) { return a.bit_equal(b); }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept;
  };
  void check_type(DType asked) const;

  Shape shape_;
  DType dtype_ = DType::kF32;
  std::unique_ptr<std::byte, Free> data_;
};

/// "f32[2, 3]{1, 2, 3, 4, 5, 6}" (at most 16 values, then "...").
std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace shardplan
