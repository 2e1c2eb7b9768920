#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "shardplan/dtype.hpp"
#include "shardplan/shape.hpp"

namespace shardplan {

/// What a leaf of a model is, without its values: shape, dtype and, optionally, one logical axis
/// name per dimension (Flax style: "embed", "mlp", "heads"; "" for a dimension with no name).
struct TensorSpec {
  Shape shape;
  DType dtype = DType::kF32;
  std::vector<std::string> logical_axes;

  TensorSpec() = default;
  TensorSpec(Shape s, DType d, std::vector<std::string> axes = {})
      : shape(std::move(s)), dtype(d), logical_axes(std::move(axes)) {}

  /// Total bytes of the tensor.
  std::int64_t bytes() const { return shape.numel() * static_cast<std::int64_t>(size_of(dtype)); }

  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

/// "f32[4096, 11008]", with logical axes appended as "(embed, mlp)" when present.
std::ostream& operator<<(std::ostream& os, const TensorSpec& spec);

}  // namespace shardplan
