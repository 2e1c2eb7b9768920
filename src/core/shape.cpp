#include "shardplan/shape.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <fmt/ranges.h>

#include "shardplan/error.hpp"
#include "shardplan/tensor_spec.hpp"

namespace shardplan {
void Shape::assign(const std::int64_t* first, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (first[i] < 0) {
      throw SpecError(fmt::format("[shape] dimension {} of [{}] is negative", i,
                                  fmt::join(first, first + n, ", ")));
    }
  }
  if (std::int64_t count = 0; !detail::checked_nonzero_product(first, first + n, 1, &count)) {
    throw SpecError(fmt::format("[shape] element count of [{}] overflows int64",
                                fmt::join(first, first + n, ", ")));
  }
  rank_ = static_cast<int>(n);
  if (rank_ > kInlineRank) {
    heap_.assign(first, first + n);
  } else {
    std::copy(first, first + n, inline_);
  }
}

Shape::Shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.size()); }
Shape::Shape(const std::vector<std::int64_t>& dims) { assign(dims.data(), dims.size()); }

void Shape::throw_numel_overflow() const {
  throw SpecError(fmt::format("[shape] element count of {} overflows int64", to_string()));
}

std::int64_t byte_size(const Shape& shape, DType dtype) {
  std::int64_t bytes = 0;
  if (!detail::checked_nonzero_product(shape.begin(), shape.end(),
                                       static_cast<std::int64_t>(size_of(dtype)), &bytes)) {
    throw SpecError(fmt::format("[shape] byte size of {}{} ({} bytes per element) overflows int64",
                                name(dtype), shape.to_string(), size_of(dtype)));
  }
  return shape.numel() == 0 ? 0 : bytes;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (auto it = begin(); it != end(); ++it) {
    if (it != begin()) s += ", ";
    s += std::to_string(*it);
  }
  return s + "]";
}

std::ostream& operator<<(std::ostream& os, const Shape& shape) { return os << shape.to_string(); }

std::ostream& operator<<(std::ostream& os, const TensorSpec& spec) {
  os << spec.dtype << spec.shape;
  if (!spec.logical_axes.empty()) os << "(" << fmt::format("{}", fmt::join(spec.logical_axes, ", ")) << ")";
  return os;
}

}  // namespace shardplan
