// Must not compile: a pointer as a static sjit argument would be keyed by a reusable address.
// Run by ctest (sjit.compile_fail.*), which expects the static_assert's message.
#include "shardplan/sjit.hpp"

int main() {
  using namespace shardplan;
  const Mesh mesh = Mesh::parse("x:1", 1);
  const Executor exec(1);
  int k = 3;
  auto f = sjit(mesh, [](const Array& x, const int*) { return x; });
  f(Array::ones(Shape{2}, DType::kF32, NamedSharding(mesh, P()), exec),
    static_cast<const int*>(&k));
}
