#pragma once
// What the sjit tests share (sjit_test*.cpp): meshes, a two-matmul function, the largest
// difference of two tensors.
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "../examples/mlp.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/rules/tree_path_sharding_rule.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan::test {

inline double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.get(i) - b.get(i)));
  return m;
}

struct Meshes {
  Executor exec{8};
  Mesh mesh = Mesh::parse("data:4,model:2", 8);
  Executor one = Executor::process_local(1);       // each process's own reference device
  int first = exec.local_devices().front();        // a device of this process
  Mesh single = Mesh::parse("data:1,model:1", 1);  // same axis names, one device
  Array put(const Tensor& t, const PartitionSpec& s) const {
    return device_put(t, NamedSharding(mesh, s), exec);
  }
  Array put1(const Tensor& t) const { return device_put(t, NamedSharding(single, P()), one); }
};

inline Array dot_relu_dot(const Array& x, const Array& w1, const Array& w2) {
  Array h = relu(matmul(x, w1));
  h = with_sharding_constraint(h, P("data", "model"));
  return matmul(h, w2);
}

}  // namespace shardplan::test
