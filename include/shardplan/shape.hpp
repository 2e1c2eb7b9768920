#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace shardplan {

/// The dimensions of a tensor; rank 0 is a scalar. Dimensions are non-negative.
class Shape {
 public:
  Shape() = default;
  /// Throws SpecError on a negative dimension.
  Shape(std::initializer_list<std::int64_t> dims);
  /// Throws SpecError on a negative dimension.
  explicit Shape(std::vector<std::int64_t> dims);

  int rank() const { return static_cast<int>(dims_.size()); }
  std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }
  const std::vector<std::int64_t>& dims() const { return dims_; }
  auto begin() const { return dims_.begin(); }
  auto end() const { return dims_.end(); }
  /// Product of the dimensions (1 for a scalar).
  std::int64_t numel() const;
  /// "[4096, 11008]".
  std::string to_string() const;

  friend bool operator==(const Shape&, const Shape&) = default;

 private:
  std::vector<std::int64_t> dims_;
};

std::ostream& operator<<(std::ostream& os, const Shape& shape);

}  // namespace shardplan
