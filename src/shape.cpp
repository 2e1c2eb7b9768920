#include "shardplan/shape.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "shardplan/error.hpp"
#include "shardplan/tensor_spec.hpp"

namespace shardplan {
namespace {
void check(const std::vector<std::int64_t>& dims) {
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      throw SpecError(fmt::format("[shape] dimension {} of [{}] is negative", i,
                                  fmt::join(dims, ", ")));
    }
  }
}
}  // namespace

Shape::Shape(std::initializer_list<std::int64_t> dims) : dims_(dims) { check(dims_); }
Shape::Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) { check(dims_); }

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (auto d : dims_) n *= d;
  return n;
}

std::string Shape::to_string() const { return fmt::format("[{}]", fmt::join(dims_, ", ")); }

std::ostream& operator<<(std::ostream& os, const Shape& shape) { return os << shape.to_string(); }

std::ostream& operator<<(std::ostream& os, const TensorSpec& spec) {
  os << spec.dtype << spec.shape;
  if (!spec.logical_axes.empty()) os << "(" << fmt::format("{}", fmt::join(spec.logical_axes, ", ")) << ")";
  return os;
}

}  // namespace shardplan
