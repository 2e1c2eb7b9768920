#pragma once
// What the ported shard_map behaviours share (shard_map_jax_test*.cpp): tensors by hand, a mesh
// to run on eagerly and inside sjit, gradients checked by central differences.
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan::test {

using Fn = std::function<Array(const Array&)>;
using Fn2 = std::function<Array(const Array&, const Array&)>;
using V = std::vector<double>;

// arange(n) reshaped.
inline Tensor arange(Shape shape, DType dtype = DType::kF32, double start = 0) {
  Tensor t(shape, dtype);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, start + static_cast<double>(i));
  return t;
}
inline Tensor tensor(Shape shape, const V& v, DType dtype = DType::kF32) {
  Tensor t(shape, dtype);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, v.at(static_cast<std::size_t>(i)));
  return t;
}
inline V repeat(const V& v, int times) {
  V r;
  for (int k = 0; k < times; ++k) r.insert(r.end(), v.begin(), v.end());
  return r;
}

inline V values(const Array& a) {  // booleans as 0 / 1
  return (a.dtype() == DType::kBool ? astype(a, DType::kI32) : a).to_host().to_doubles();
}

// The mesh of a behaviour over 8 devices (under mpirun they span the processes): a mesh of fewer
// gets one more, minor axis 'r' that nothing names (every value is the same over it), so that
// every process holds part of every mesh.
struct On {
  Executor exec{8};
  Mesh mesh;
  On(const std::string& axes, int devices)
      : mesh(Mesh::parse(devices == 8 ? axes : axes + ",r:" + std::to_string(8 / devices), 8)) {}
  Array put(const Tensor& t, const PartitionSpec& s = P()) const {
    return device_put(t, NamedSharding(mesh, s), exec);
  }
  // An argument the function ignores: an eager shard_map needs one to know its devices (JAX's
  // in_specs=() has none).
  Array dummy() const { return put(Tensor(Shape{1}, DType::kF32)); }
};

// f eagerly and inside sjit: the same shape, sharding and values (bitwise); the eager result.
template <class F, class... A>
Array both(const On& m, F f, const A&... args) {
  const Array eager = f(args...);
  const Array jitted = sjit(m.mesh, f)(args...);
  EXPECT_EQ(jitted.shape(), eager.shape());
  EXPECT_EQ(values(jitted), values(eager)) << "eager and sjit differ";
  return eager;
}

// The gradient of sum(f(x) * c) (c all ones when absent): eagerly and inside sjit (bitwise
// equal), and against central differences of the eager function (x is f64).
inline V grad_checked(const On& m, const Fn& f, const Array& x,
                      const std::optional<Tensor>& c = {}) {
  const auto loss = [&m, f, c](const Array& v) {
    const Array y = f(v);
    return c ? sum(y * m.put(*c)) : sum(y);
  };
  const Array g = value_and_grad(loss)(x).second;
  const Array gj = sjit(m.mesh, [&](const Array& v) { return value_and_grad(loss)(v).second; })(x);
  EXPECT_EQ(values(gj), values(g)) << "eager and sjit gradients differ";
  const Tensor x0 = x.to_host();
  const PartitionSpec spec = x.sharding().spec();
  for (std::int64_t i = 0; i < x0.numel(); ++i) {
    Tensor hi = x0, lo = x0;
    hi.set(i, x0.get(i) + 1e-3);
    lo.set(i, x0.get(i) - 1e-3);
    const double fd =
        (loss(m.put(hi, spec)).to_host().get(0) - loss(m.put(lo, spec)).to_host().get(0)) / 2e-3;
    EXPECT_NEAR(g.to_host().get(i), fd, 1e-6) << "element " << i;
  }
  return values(g);
}

inline void expect_near(const V& got, const V& want, double tol = 1e-9) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

}  // namespace shardplan::test
