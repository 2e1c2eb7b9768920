#pragma once
// Helpers shared by the runtime tests (array, collectives): every spec of a mesh, a block of a
// host tensor computed element by element (the independent expectation for shards), and the
// devices of a mesh this process holds (all of them unless the test runs under mpirun).
#include <functional>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/executor.hpp"

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

// The devices of `mesh` held by this process, in mesh order: a test that runs under mpirun
// checks these shards, and every device's shard is checked by the process holding it.
inline std::vector<int> local(const Mesh& mesh, const Executor& exec) {
  std::vector<int> out;
  for (const int d : mesh.devices()) {
    if (exec.is_local(d)) out.push_back(d);
  }
  return out;
}

// The bytes a collective's record counts for this process's devices of `mesh` (over processes a
// record counts only those; a plan counts every device).
inline std::vector<std::int64_t> local_bytes(const CollectiveRecord& r, const Mesh& mesh,
                                             const Executor& exec) {
  std::vector<std::int64_t> out;
  for (const int d : local(mesh, exec)) out.push_back(r.bytes_in.at(static_cast<std::size_t>(d)));
  return out;
}

// The bytes a collective's record stages (CollectiveRecord::staging_bytes) on this process's
// devices of `mesh`, 0 where it lists none.
inline std::vector<std::int64_t> local_staging(const CollectiveRecord& r, const Mesh& mesh,
                                               const Executor& exec) {
  std::vector<std::int64_t> out;
  for (const int d : local(mesh, exec)) {
    const auto at = static_cast<std::size_t>(d);
    out.push_back(at < r.staging_bytes.size() ? r.staging_bytes[at] : 0);
  }
  return out;
}

// plan_reshard's devices_per_process for arrays of `exec` on `mesh`: this process's devices when
// the mesh spans processes, else 0.
inline int devices_per_process(const Executor& exec, const Mesh& mesh) {
  return exec.holds_all(mesh.devices()) ? 0 : static_cast<int>(exec.local_devices().size());
}

// True when `devices` can be spread evenly over this run's processes (an executor of that many
// devices exists here); a test under mpirun skips the meshes for which it is false.
inline bool divides_over_processes(int devices) {
  return devices % distributed::process_count() == 0;
}

}  // namespace shardplan::test
