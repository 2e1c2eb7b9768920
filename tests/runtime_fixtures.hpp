#pragma once
// Helpers shared by the runtime tests (array, collectives): every spec of a mesh, and a block of
// a host tensor computed element by element (the independent expectation for shards).
#include <functional>
#include <vector>

#include "shardplan/array.hpp"

namespace shardplan::test {

// Every PartitionSpec of `rank` entries over the axes of `mesh`: each axis unused or on one
// dimension, in every order within a dimension.
inline std::vector<PartitionSpec> all_specs(const Mesh& mesh, int rank) {
  std::vector<PartitionSpec> out;
  const auto& names = mesh.axis_names();
  std::vector<AxisNames> dims(static_cast<std::size_t>(rank));
  std::function<void(std::size_t)> place = [&](std::size_t k) {
    if (k == names.size()) {
      out.emplace_back(dims);
      return;
    }
    place(k + 1);  // unused
    for (int d = 0; d < rank; ++d) {
      auto& g = dims[static_cast<std::size_t>(d)];
      for (std::size_t at = 0; at <= g.size(); ++at) {
        g.insert(g.begin() + static_cast<std::ptrdiff_t>(at), names[k]);
        place(k + 1);
        g.erase(g.begin() + static_cast<std::ptrdiff_t>(at));
      }
    }
  };
  place(0);
  return out;
}

// The block of `global` at `block`, computed element by element from global indices.
inline Tensor slice_of(const Tensor& global, const Block& block) {
  std::vector<std::int64_t> dims;
  for (const auto& s : block) dims.push_back(s.size);
  Tensor out(Shape(dims), global.dtype());
  const int rank = global.shape().rank();
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    std::int64_t rest = i, g = 0, stride = 1;
    std::vector<std::int64_t> idx(static_cast<std::size_t>(rank));
    for (int d = rank - 1; d >= 0; --d) {
      idx[static_cast<std::size_t>(d)] = rest % dims[static_cast<std::size_t>(d)];
      rest /= dims[static_cast<std::size_t>(d)];
    }
    for (int d = rank - 1; d >= 0; --d) {
      g += (block[static_cast<std::size_t>(d)].start + idx[static_cast<std::size_t>(d)]) * stride;
      stride *= global.shape()[d];
    }
    out.set(i, global.get(g));
  }
  return out;
}

}  // namespace shardplan::test
