#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "shardplan/dtype.hpp"
#include "shardplan/detail/hash.hpp"
#include "shardplan/shape.hpp"

namespace shardplan {

/// numel * size_of(dtype). Throws SpecError naming the dtype and shape when the product of the
/// non-zero dimensions times the element size (the largest byte stride) does not fit in int64,
/// e.g. "[shape] byte size of f32[2305843009213693952, 2] (4 bytes per element) overflows int64".
std::int64_t byte_size(const Shape& shape, DType dtype);

/// What a leaf of a model is, without its values: shape, dtype and, optionally, one logical axis
/// name per dimension (Flax style: "embed", "mlp", "heads"; "" for a dimension with no name).
struct TensorSpec {
  Shape shape;
  DType dtype = DType::kF32;
  std::vector<std::string> logical_axes;

  TensorSpec() = default;
  /// Throws SpecError when the tensor's byte size does not fit in int64 (see byte_size).
  TensorSpec(Shape s, DType d, std::vector<std::string> axes = {})
      : shape(std::move(s)), dtype(d), logical_axes(std::move(axes)) {
    bytes();
  }

  /// Total bytes of the tensor. Throws SpecError when they do not fit in int64 (possible only
  /// for a spec whose fields were assigned after construction).
  std::int64_t bytes() const { return byte_size(shape, dtype); }

  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

/// "f32[4096, 11008]", with logical axes appended as "(embed, mlp)" when present.
std::ostream& operator<<(std::ostream& os, const TensorSpec& spec);

}  // namespace shardplan

/// Hashes shape, dtype and logical axes (for Tree::share_equal_subtrees and hash maps).
template <>
struct std::hash<shardplan::TensorSpec> {
  std::size_t operator()(const shardplan::TensorSpec& t) const noexcept {
    using shardplan::detail::hash_combine;
    std::size_t h = hash_combine(static_cast<std::size_t>(t.dtype), t.shape.rank());
    for (const std::int64_t d : t.shape) h = hash_combine(h, static_cast<std::size_t>(d));
    for (const auto& a : t.logical_axes) h = hash_combine(h, std::hash<std::string>()(a));
    return h;
  }
};
