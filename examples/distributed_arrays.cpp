// The opening of JAX's "Distributed arrays and automatic parallelization" guide, with shardplan's
// runtime: an 8192 x 8192 array put on 8 devices arranged as a 4 x 2 mesh, its picture, what each
// device holds, and reshards between shardings with the collectives they ran.
//
//   build/examples/example_distributed_arrays
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "shardplan/collectives.hpp"
#include "shardplan/plan_report.hpp"  // format_bytes

using namespace shardplan;

int main() {
  const Executor exec(8);  // 8 virtual devices, like --xla_force_host_platform_device_count=8
  const Mesh mesh = Mesh::parse("a:4,b:2", 8);

  // x = jax.random.normal(key, (8192, 8192)); y = jax.device_put(x, NamedSharding(mesh, P('a',
  // 'b')))
  // SHARDPLAN_EXAMPLE_SMALL=1 (set by ctest) shrinks the array to 1024 x 1024.
  const std::int64_t n = std::getenv("SHARDPLAN_EXAMPLE_SMALL") != nullptr ? 1024 : 8192;
  const Tensor x = Tensor::normal(Shape{n, n}, DType::kF32, 0);
  const Array y = device_put(x, NamedSharding(mesh, P("a", "b")), exec);
  std::cout << "y = device_put(x, P('a', 'b')): " << y << "\n" << visualize(y) << "\n";
  std::cout << "each device holds " << y.shard_shape().to_string() << " = "
            << format_bytes(y.shard_nbytes()) << " of " << format_bytes(y.nbytes()) << "\n"
            << exec.memory_report() << "\n";

  // Other shardings of the same array, and what it takes to get there.
  const struct {
    const char* name;
    PartitionSpec spec;
  } targets[] = {
      {"P('a', 'b') -> P('a')      (merge b)", P("a")},
      {"P('a', 'b') -> P('b', 'a') (swap)", P("b", "a")},
      {"P('a', 'b') -> P()         (replicate)", P()},
  };
  for (const auto& t : targets) {
    const ReshardResult r = reshard(y, NamedSharding(mesh, t.spec));
    std::cout << t.name << "\n" << visualize(r.array);
    for (const auto& step : r.steps) std::cout << "  " << step << "\n";
    if (!(r.array.to_host() == x)) {
      std::cerr << "values changed by the reshard\n";
      return 1;
    }
    std::cout << "\n";
  }
  // Splitting an array that is replicated only slices locally: no device receives anything.
  const Array z = device_put(x, NamedSharding(mesh, P()), exec);
  const ReshardResult r = reshard(z, NamedSharding(mesh, P("a", "b")));
  std::cout << "P() -> P('a', 'b')\n  " << r.steps.front() << "\n";
  std::cout << "every reshard kept the values bit for bit\n";
  return 0;
}
