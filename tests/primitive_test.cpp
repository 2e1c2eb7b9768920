// The primitive definitions and what depends on them: the list of primitives, attributes compared
// by every field (the eager cache's key), the eager programs owned by the executor (its memory
// back to the baseline), and dtype checks at the op instead of inside a device task.
#include <atomic>
#include <cmath>
#include <cstring>

#include "../src/program/compiler/compile.hpp"
#include "../src/program/ir/primitives.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan::detail {
namespace {

TEST(Primitives, EachIsListedOnceWithItsOwnName) {
  std::set<std::string_view> names;
  for (const Primitive* p : all_primitives()) {
    EXPECT_TRUE(names.insert(p->name).second) << p->name << " is listed twice";
    EXPECT_TRUE(p->arity == kVariadic || p->arity >= 0) << p->name;
    EXPECT_FALSE(p->sharding_identity && !p->pointwise) << p->name;
    EXPECT_TRUE(p->infer.is_set() && p->factors.is_set() && p->kernel.is_set() &&
                p->flops.is_set() && p->vjp.is_set())
        << p->name << " has a null required function";
  }
  // The ops the compiler itself names.
  for (const std::string_view n : {"input", "sharding_constraint", "sharding_annotation",
                                   "constant", "dot_general", "reduce_sum", "concatenate"}) {
    EXPECT_EQ(names.count(n), 1u) << n;
  }
  EXPECT_EQ(names.size(), all_primitives().size());
}

// Two attribute types of the same fields.
struct WithDouble {
  int k;
  double v;
};
struct Other {
  int k;
  double v;
};
std::string format_attrs(const WithDouble&) { return {}; }
std::string format_attrs(const Other&) { return {}; }

// Attributes are equal when every field is, floats bitwise: 0.0 and -0.0 differ (a fill value of
// -0.0 is not one of 0.0), a NaN equals the same NaN.
TEST(Primitives, AttributesCompareEveryFieldFloatsBitwise) {
  EXPECT_EQ(Attrs(InputAttrs{3, TensorType{Shape{2}, DType::kF32}}),
            Attrs(InputAttrs{3, TensorType{Shape{2}, DType::kF32}}));
  EXPECT_FALSE(Attrs(InputAttrs{3, TensorType{Shape{2}, DType::kF32}}) ==
               Attrs(InputAttrs{3, TensorType{Shape{2}, DType::kF64}}));
  const Attrs zero = WithDouble{1, 0.0}, negzero = WithDouble{1, -0.0};
  EXPECT_FALSE(zero == negzero);
  EXPECT_NE(zero.hash(), negzero.hash());
  const double nan = std::nan("");
  EXPECT_EQ(Attrs(WithDouble{1, nan}), Attrs(WithDouble{1, nan}));
  EXPECT_FALSE(Attrs(WithDouble{1, 2.0}) == Attrs(WithDouble{2, 2.0}));
  // Of another type: never equal, whatever the fields.
  EXPECT_FALSE(Attrs(WithDouble{1, 2.0}) == Attrs(Other{1, 2.0}));
  // Host tensors by value, not by address.
  auto t1 = std::make_shared<Tensor>(Shape{2}, DType::kF32);
  t1->set(0, 1.5);
  auto t2 = std::make_shared<Tensor>(Shape{2}, DType::kF32);
  t2->set(0, 1.5);
  EXPECT_EQ(Attrs(ConstantAttrs{t1}), Attrs(ConstantAttrs{t2}));
  EXPECT_EQ(Attrs(ConstantAttrs{t1}).hash(), Attrs(ConstantAttrs{t2}).hash());
  t2->set(1, 7);
  EXPECT_FALSE(Attrs(ConstantAttrs{t1}) == Attrs(ConstantAttrs{t2}));
  // Every field of a constraint counts, its origin text included.
  EXPECT_FALSE(Attrs(ConstraintAttrs{.spec = P("x")}) == Attrs(ConstraintAttrs{.spec = P("y")}));
  EXPECT_FALSE(Attrs(ConstraintAttrs{.spec = P("x")}) ==
               Attrs(ConstraintAttrs{.spec = P("x"), .like = value_id(0)}));
}

Tensor filled(const Shape& shape, DType dtype, double v) {
  return Tensor::generate(shape, dtype, Generator::full(v));
}

struct Eager {
  Executor exec{4};
  Mesh mesh = Mesh::parse("x:4", 4);
  Array put(const Tensor& t, const PartitionSpec& spec = P()) const {
    return device_put(t, NamedSharding(mesh, spec), exec);
  }
};

// grad outside sjit replays its traced forward pass one op at a time: a random op with another
// seed is another program. (The text key of the old process-wide cache left the generator out.)
TEST(EagerCache, ARandomOpWithAnotherSeedIsAnotherProgram) {
  Eager e;
  const Array p = e.put(filled(Shape{8}, DType::kF32, 1.0), P("x"));
  for (int round = 0; round < 2; ++round) {
    for (const std::uint64_t seed : {1u, 2u}) {
      SCOPED_TRACE(seed);
      const auto [value, grads] = value_and_grad(
          [&](const Array& q) { return sum(q * random_normal(Shape{8}, DType::kF32, seed)); })(p);
      // d/dp sum(p * r) = r: the seed's own numbers, as Tensor::normal makes them.
      const Tensor want = Tensor::normal(Shape{8}, DType::kF32, seed);
      EXPECT_EQ(grads.to_host().to_doubles(), want.to_doubles());
    }
  }
}

// Constants are compared by value: a scalar made, freed, and another made (maybe at the same
// address) with another value never reuses the first one's program.
TEST(EagerCache, ConstantsAreComparedByValueNotAddress) {
  Eager e;
  const Array p = e.put(filled(Shape{4}, DType::kF32, 1.0), P("x"));
  for (int round = 0; round < 3; ++round) {
    for (const double k : {2.0, 3.0, -0.0}) {
      SCOPED_TRACE(k);
      const auto [value, grads] = value_and_grad([&](const Array& q) { return sum(q * k); })(p);
      for (const double g : grads.to_host().to_doubles()) {
        EXPECT_EQ(std::signbit(g), std::signbit(k));
        EXPECT_EQ(g, k);
      }
    }
  }
}

// The eager programs belong to the executor and hold no arrays: once the user's arrays are gone,
// the devices hold nothing (the old process-wide cache kept constant steps' buffers alive).
TEST(EagerCache, MemoryReturnsToTheBaselineWhenTheArraysAreGone) {
  Eager e;
  const auto in_use = [&] {
    std::int64_t total = 0;
    for (const DeviceMemory& m : e.exec.memory()) total += m.in_use;
    return total;
  };
  const std::int64_t baseline = in_use();
  {
    const Array x = e.put(filled(Shape{8, 4}, DType::kF32, 2.0), P("x"));
    const Array y = softmax(x * 3.0 + 1.0) - full_like(x, 0.5);
    const auto [value, grads] = value_and_grad(
        [&](const Array& a) { return sum(a * iota_like(a, 1, DType::kF32) + 4.0); })(x);
    EXPECT_GT(in_use(), baseline);
    EXPECT_EQ(grads.to_host().get(5), 1.0);  // d/da of a * iota: the column index
    EXPECT_EQ(y.shape(), x.shape());
  }
  EXPECT_EQ(in_use(), baseline);
}

// Full, the cache drops the program used least recently, one at a time: a program used again
// since the others were made stays (no compile), the oldest unused one is made again. (It was
// cleared whole: every program was made again.)
std::atomic<int> eager_compiles{0};
CompileObserver previous_observer = nullptr;
void count_compile(const Program& p) {
  ++eager_compiles;
  if (previous_observer != nullptr) previous_observer(p);
}
TEST(EagerCache, FullItDropsTheLeastRecentlyUsedProgram) {
  const Executor exec(1);
  const Mesh mesh = Mesh::parse("x:1", 1);
  const auto ones = [&](std::int64_t n) {
    return Array::ones(Shape{n}, DType::kF32, NamedSharding(mesh, P()), exec);
  };
  std::vector<Array> xs;  // x[k] of shape [k + 1]: kEagerProgramsKept programs, one per shape
  for (std::size_t k = 0; k < kEagerProgramsKept; ++k) {
    xs.push_back(ones(static_cast<std::int64_t>(k) + 1));
  }
  previous_observer = set_compile_observer(&count_compile);
  for (const Array& x : xs) (void)neg(x);
  EXPECT_EQ(eager_compiles.load(), static_cast<int>(kEagerProgramsKept));
  (void)neg(xs[0]);  // found: now the most recently used
  (void)neg(ones(static_cast<std::int64_t>(kEagerProgramsKept) + 1));  // one more: drops xs[1]'s
  EXPECT_EQ(eager_compiles.load(), static_cast<int>(kEagerProgramsKept) + 1);
  EXPECT_EQ(neg(xs[0]).to_host().get(0), -1.0);  // kept
  EXPECT_EQ(eager_compiles.load(), static_cast<int>(kEagerProgramsKept) + 1);
  (void)neg(xs[1]);  // dropped: made again
  EXPECT_EQ(eager_compiles.load(), static_cast<int>(kEagerProgramsKept) + 2);
  set_compile_observer(previous_observer);
}

// Two executors do not share eager programs: each has its own.
TEST(EagerCache, EachExecutorHasItsOwnPrograms) {
  Eager a, b;
  const Array x = a.put(filled(Shape{4}, DType::kF32, 2.0), P("x"));
  const Array y = b.put(filled(Shape{4}, DType::kF32, 3.0), P("x"));
  EXPECT_EQ(exp(x).to_host().get(0), std::exp(2.0f));
  EXPECT_EQ(exp(y).to_host().get(0), std::exp(3.0f));
  EXPECT_TRUE(exp(y).executor() == b.exec);
}

// A dtype an op does not take is an error at the op, naming it, inside sjit and out; before, some
// compiled and failed inside a device task.
TEST(PrimitiveTypes, DtypesAreCheckedAtTheOp) {
  Eager e;
  const Array i = e.put(filled(Shape{4}, DType::kI32, 2));
  const Array b = equal(i, i);
  EXPECT_THROW_WITH(power(i, i), SpecError, "[pow]", "i32[4]", "does not take i32");
  EXPECT_THROW_WITH(sum(b, {0}), SpecError, "[reduce_sum]", "bool[4]", "cannot reduce bool");
  EXPECT_THROW_WITH(max(b, {0}), SpecError, "[reduce_max]", "bool[4]");
  EXPECT_THROW_WITH(equal(b, b), SpecError, "[eq]", "does not take bool");
  EXPECT_THROW_WITH(exp(i), SpecError, "[exp] needs a float array, got i32[4]");
  EXPECT_THROW_WITH(iota_like(i, 0, DType::kBool), SpecError, "[iota]", "bool");
  // Inside sjit the same errors come from tracing, before anything runs.
  auto f = sjit(e.mesh, [](const Array& x) { return power(x, x); });
  EXPECT_THROW_WITH(f.lower(i), SpecError, "[pow]", "does not take i32");
  auto g = sjit(e.mesh, [](const Array& x) { return sum(equal(x, x)); });
  EXPECT_THROW_WITH(g.lower(i), SpecError, "[reduce_sum]", "cannot reduce bool");
}

// erf, the primitive added to prove the design: one definition (elementwise.cpp), one line in
// primitives.hpp, its public function. Values against Python's math.erf, its gradient against
// finite differences, a sharded run against the unsharded one.
TEST(Erf, MatchesPythonsMathErf) {
  Eager e;
  Tensor x(Shape{3}, DType::kF64);
  const std::vector<double> xs = {0.5, -1.25, 2};
  const std::vector<double> want = {0.5204998778130465, -0.9229001282564582, 0.9953222650189527};
  for (std::size_t i = 0; i < xs.size(); ++i) x.set(static_cast<std::int64_t>(i), xs[i]);
  const Tensor got = erf(e.put(x)).to_host();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    EXPECT_NEAR(got.get(static_cast<std::int64_t>(i)), want[i], 1e-15);
  }
  EXPECT_THROW_WITH(erf(e.put(filled(Shape{2}, DType::kI32, 1))), SpecError, "[erf]", "i32[2]");
}

TEST(Erf, GradientMatchesFiniteDifferences) {
  Eager e;
  const Tensor x = Tensor::uniform(Shape{8}, DType::kF64, 5, -2, 2);
  const auto [value, grads] =
      value_and_grad([](const Array& a) { return sum(erf(a)); })(e.put(x, P("x")));
  const Tensor g = grads.to_host();
  for (std::int64_t i = 0; i < 8; ++i) {
    const double h = 1e-6, v = x.get(i);
    EXPECT_NEAR(g.get(i), (std::erf(v + h) - std::erf(v - h)) / (2 * h), 1e-8);
  }
}

TEST(Erf, ShardedEqualsUnshardedInsideSjit) {
  Eager e;
  const Tensor x = Tensor::uniform(Shape{8, 4}, DType::kF32, 6, -3, 3);
  auto f = sjit(e.mesh, [](const Array& a) { return erf(a) * 2.0; });
  const Tensor sharded = f(e.put(x, P("x"))).to_host();
  const Tensor whole = f(e.put(x)).to_host();
  EXPECT_TRUE(sharded == whole);
  EXPECT_NEAR(sharded.get(3), 2 * std::erf(static_cast<double>(x.get(3))), 1e-6);
}

// Exact GELU is x * Phi(x); expected values from Python's statistics.NormalDist (PyTorch's
// F.gelu default).
TEST(Erf, ExactGeluIsXTimesTheNormalCdf) {
  Eager e;
  const std::vector<double> xs = {-2, -0.5, 0, 1, 3};
  const std::vector<double> want = {-0.04550026389635842, -0.15426876936299344, 0.0,
                                    0.8413447460685429, 2.99595030590511};
  Tensor x(Shape{5}, DType::kF64);
  for (std::size_t i = 0; i < xs.size(); ++i) x.set(static_cast<std::int64_t>(i), xs[i]);
  const Tensor exact = gelu(e.put(x), false).to_host();
  const Tensor approx = gelu(e.put(x), true).to_host();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    EXPECT_NEAR(exact.get(static_cast<std::int64_t>(i)), want[i], 1e-15);
    EXPECT_NEAR(approx.get(static_cast<std::int64_t>(i)), want[i], 1e-3);  // the approximation
  }
  EXPECT_TRUE(approx == gelu(e.put(x)).to_host());
}

}  // namespace
}  // namespace shardplan::detail
