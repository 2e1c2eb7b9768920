#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "shardplan/detail/checked.hpp"

namespace shardplan {

/// The dimensions of a tensor; rank 0 is a scalar. Dimensions are non-negative, and the product
/// of the non-zero ones (the element count, and every row-major stride) fits in int64.
/// Up to kInlineRank dimensions are stored inline (no allocation), so copying the shape of a
/// tensor, as plans do for every tensor, is cheap and stays close to the tree node holding it.
class Shape {
 public:
  static constexpr int kInlineRank = 6;

  Shape() = default;
  /// Throws SpecError on a negative dimension or an element count past int64 (naming the shape).
  Shape(std::initializer_list<std::int64_t> dims);
  /// Throws SpecError on a negative dimension or an element count past int64 (naming the shape).
  explicit Shape(const std::vector<std::int64_t>& dims);

  int rank() const { return rank_; }
  std::int64_t operator[](int i) const { return data()[i]; }
  std::int64_t& operator[](int i) { return data()[i]; }
  /// The dimensions as a vector (a copy).
  std::vector<std::int64_t> dims() const { return std::vector<std::int64_t>(begin(), end()); }
  const std::int64_t* begin() const { return data(); }
  const std::int64_t* end() const { return data() + rank_; }
  /// Product of the dimensions (1 for a scalar). A constructed shape's count fits; one grown
  /// past int64 through operator[] throws SpecError naming it.
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) {
      if (!detail::checked_mul(n, data()[i], &n)) throw_numel_overflow();
    }
    return n;
  }
  /// "[4096, 11008]".
  std::string to_string() const;
  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i) {
      if (a.data()[i] != b.data()[i]) return false;
    }
    return true;
  }

 private:
  void assign(const std::int64_t* first, std::size_t n);
  [[noreturn]] void throw_numel_overflow() const;
  const std::int64_t* data() const { return rank_ <= kInlineRank ? inline_ : heap_.data(); }
  std::int64_t* data() { return rank_ <= kInlineRank ? inline_ : heap_.data(); }

  int rank_ = 0;
  std::int64_t inline_[kInlineRank] = {};
  std::vector<std::int64_t> heap_;  // used only above kInlineRank
};

std::ostream& operator<<(std::ostream& os, const Shape& shape);

}  // namespace shardplan
