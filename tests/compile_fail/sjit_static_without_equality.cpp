// Must not compile: a static sjit argument whose type has no operator== cannot be a cache key.
// Run by ctest (sjit.compile_fail.*), which expects the static_assert's message.
#include "shardplan/sjit.hpp"

struct NoEquality {
  int value = 0;
};

int main() {
  using namespace shardplan;
  const Mesh mesh = Mesh::parse("x:1", 1);
  const Executor exec(1);
  auto f = sjit(mesh, [](const Array& x, const NoEquality&) { return x; });
  f(Array::ones(Shape{2}, DType::kF32, NamedSharding(mesh, P()), exec), NoEquality{1});
}
