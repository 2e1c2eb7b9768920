// shard_map and the collectives of shardplan::lax (shard_map.hpp): each collective's result
// against values worked out by hand, replication checking, gradients of each collective against
// central finite differences, eager against sjit, nested in automatic partitioning, errors.
#include "shardplan/shard_map.hpp"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

// arange(n) reshaped, as float32.
Tensor arange(Shape shape, double start = 0) {
  Tensor t(shape, DType::kF32);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, start + static_cast<double>(i));
  return t;
}

std::vector<double> values(const Array& a) { return a.to_host().to_doubles(); }

struct Mesh1 {  // 1-D: i:4
  Executor exec{4};
  Mesh mesh = Mesh::parse("i:4", 4);
  Array put(const Tensor& t, const PartitionSpec& s) const {
    return device_put(t, NamedSharding(mesh, s), exec);
  }
};

struct Mesh2 {  // 2-D: x:4, y:2
  Executor exec{8};
  Mesh mesh = Mesh::parse("x:4,y:2", 8);
  Array put(const Tensor& t, const PartitionSpec& s) const {
    return device_put(t, NamedSharding(mesh, s), exec);
  }
};

// JAX's first example: a matmul with the contraction split over y, summed with psum.
TEST(ShardMap, MatmulBasicEqualsTheProduct) {
  Mesh2 m;
  const Tensor a = arange(Shape{8, 16}), b = arange(Shape{16, 4});
  auto f = shard_map(
      [](const Array& ab, const Array& bb) {
        EXPECT_EQ(ab.shape(), (Shape{2, 8}));
        EXPECT_EQ(bb.shape(), (Shape{8, 4}));
        return lax::psum(matmul(ab, bb), "y");
      },
      m.mesh, {P("x", "y"), P("y", nullptr)}, {P("x", nullptr)});
  const Array c = f(m.put(a, P()), m.put(b, P()));
  EXPECT_EQ(c.shape(), (Shape{8, 4}));
  EXPECT_EQ(c.sharding().spec(), P("x", nullptr));
  const Tensor want = matmul(m.put(a, P()), m.put(b, P())).to_host();
  EXPECT_EQ(values(c), want.to_doubles());
}

// shard_map does not take padded arrays (NamedSharding's Uneven::kPad: its body would see the pad
// rows): refused by name, even where its in_spec (here replicated) divides.
TEST(ShardMap, APaddedInputIsRefusedNamingItsShapeAndAxis) {
  Mesh1 m;
  const Array x = device_put(arange(Shape{6}), NamedSharding(m.mesh, P("i"), Uneven::kPad), m.exec);
  auto f = shard_map([](const Array& b) { return b; }, m.mesh, {P()}, {P()});
  EXPECT_THROW_WITH(f(x), SpecError, "[shard_map] dim 0 of 'input 0' (shape [6])",
                    "mesh axis 'i' (size 4)", "shard_map does not take padded arrays");
}

TEST(ShardMap, PsumOfBlocksIsTheSameOnEveryDevice) {
  Mesh1 m;
  auto f = shard_map([](const Array& x) { return lax::psum(x, "i"); }, m.mesh, {P("i")}, {P()});
  const Array y = f(m.put(arange(Shape{4}, 1), P()));  // blocks [1], [2], [3], [4]
  EXPECT_EQ(y.shape(), (Shape{1}));
  EXPECT_EQ(values(y), (std::vector<double>{10}));
}

// pmax / pmin / pmean over the blocks [1], [2], [3], [4]; a replicated value psum'd counts once
// per device (4x), made to vary explicitly (pvary) or not.
TEST(ShardMap, ReductionsAndPvary) {
  Mesh1 m;
  const Array x = m.put(arange(Shape{4}, 1), P());
  const auto over_i = [&](std::function<Array(const Array&)> body, const PartitionSpec& in) {
    return values(shard_map(body, m.mesh, {in}, {P()})(x));
  };
  EXPECT_EQ(over_i([](const Array& b) { return lax::pmax(b, "i"); }, P("i")), (std::vector<double>{4}));
  EXPECT_EQ(over_i([](const Array& b) { return lax::pmin(b, "i"); }, P("i")), (std::vector<double>{1}));
  EXPECT_EQ(over_i([](const Array& b) { return lax::pmean(b, "i"); }, P("i")), (std::vector<double>{2.5}));
  EXPECT_EQ(over_i([](const Array& b) { return lax::psum(b, "i"); }, P()),
            (std::vector<double>{4, 8, 12, 16}));
  EXPECT_EQ(over_i([](const Array& b) { return lax::psum(lax::pvary(b, "i"), "i"); }, P()),
            (std::vector<double>{4, 8, 12, 16}));
}

TEST(ShardMap, AllGatherTiledAndStacked) {
  Mesh1 m;
  Tensor x(Shape{4}, DType::kF32);
  for (int i = 0; i < 4; ++i) x.set(i, std::vector<double>{3, 9, 5, 2}[static_cast<std::size_t>(i)]);
  auto tiled = shard_map([](const Array& b) { return lax::all_gather(b, "i", 0, true); }, m.mesh,
                         {P("i")}, {P("i")});
  const Array y = tiled(m.put(x, P("i")));
  EXPECT_EQ(y.shape(), (Shape{16}));
  EXPECT_EQ(values(y), (std::vector<double>{3, 9, 5, 2, 3, 9, 5, 2, 3, 9, 5, 2, 3, 9, 5, 2}));
  auto stacked = shard_map([](const Array& b) { return lax::all_gather(b, "i"); }, m.mesh,
                           {P("i")}, {P("i")});
  const Array z = stacked(m.put(x, P("i")));
  EXPECT_EQ(z.shape(), (Shape{16, 1}));
  EXPECT_EQ(values(z), values(y));
}

TEST(ShardMap, AnOutputThatMayDifferIsRefusedByTheCheck) {
  Mesh1 m;
  auto f = shard_map([](const Array& b) { return lax::all_gather(b, "i", 0, true); }, m.mesh,
                     {P("i")}, {P()});
  EXPECT_THROW_WITH(f(m.put(arange(Shape{4}), P("i"))), SpecError, "output 0", "'i'",
                    "out_specs[0] = PartitionSpec()");
  auto unchecked = shard_map([](const Array& b) { return lax::all_gather(b, "i", 0, true); },
                             m.mesh, {P("i")}, {P()}, /*check=*/false);
  EXPECT_EQ(values(unchecked(m.put(arange(Shape{4}), P("i")))), (std::vector<double>{0, 1, 2, 3}));
}

TEST(ShardMap, PsumScatterPpermuteAllToAllAxisIndex) {
  Mesh1 m;
  // Each device holds [0..3] + 10 * its index; psum_scatter tiled: device j keeps element j of
  // the sum over devices: 4 * j + 10 * (0 + 1 + 2 + 3).
  auto scatter = shard_map(
      [](const Array& b) {
        const Array mine = b + astype(lax::axis_index("i"), DType::kF32) * 10.0;
        return lax::psum_scatter(reshape(mine, Shape{4}), "i", 0, true);
      },
      m.mesh, {P()}, {P("i")});
  EXPECT_EQ(values(scatter(m.put(arange(Shape{4}), P()))), (std::vector<double>{60, 64, 68, 72}));
  // A ring shift: device i sends to i + 1; and a permutation missing a receiver gives zeros.
  auto shift = shard_map(
      [](const Array& b) { return lax::ppermute(b, "i", {{0, 1}, {1, 2}, {2, 3}, {3, 0}}); },
      m.mesh, {P("i")}, {P("i")});
  EXPECT_EQ(values(shift(m.put(arange(Shape{4}, 1), P("i")))), (std::vector<double>{4, 1, 2, 3}));
  auto partial = shard_map([](const Array& b) { return lax::ppermute(b, "i", {{0, 2}}); }, m.mesh,
                           {P("i")}, {P("i")});
  EXPECT_EQ(values(partial(m.put(arange(Shape{4}, 1), P("i")))), (std::vector<double>{0, 0, 1, 0}));
  // all_to_all: device d holds row d of a 4x4 matrix, split over its columns: afterwards device
  // d holds column d (the transpose, as rows of [4, 1] blocks).
  auto a2a = shard_map([](const Array& b) { return lax::all_to_all(b, "i", 1, 0, true); },
                       m.mesh, {P("i")}, {P(nullptr, "i")});
  const Array t = a2a(m.put(arange(Shape{4, 4}), P("i")));
  EXPECT_EQ(t.shape(), (Shape{4, 4}));
  EXPECT_EQ(values(t), values(m.put(arange(Shape{4, 4}), P())));
}

// grad of sum(f(x)) by central differences of the (eager) function in f64.
std::vector<double> numeric_grad(const std::function<Array(const Array&)>& f, const Tensor& x0,
                                 const std::function<Array(const Tensor&)>& put) {
  std::vector<double> g;
  for (std::int64_t i = 0; i < x0.numel(); ++i) {
    Tensor hi = x0, lo = x0;
    hi.set(i, x0.get(i) + 1e-4);
    lo.set(i, x0.get(i) - 1e-4);
    g.push_back((sum(f(put(hi))).to_host().get(0) - sum(f(put(lo))).to_host().get(0)) / 2e-4);
  }
  return g;
}

TEST(ShardMap, GradientsOfEachCollectiveMatchFiniteDifferences) {
  Mesh1 m;
  const Tensor x0 = Tensor::uniform(Shape{8, 4}, DType::kF64, 3, -1, 1);
  const auto put = [&](const Tensor& t) { return m.put(t, P()); };
  const std::vector<std::pair<std::string, std::function<Array(const Array&)>>> cases = {
      {"psum", shard_map([](const Array& b) { return lax::psum(b * b, "i"); }, m.mesh, {P("i")}, {P()})},
      {"pmean", shard_map([](const Array& b) { return lax::pmean(sin(b), "i"); }, m.mesh, {P("i")}, {P()})},
      {"pmax", shard_map([](const Array& b) { return lax::pmax(b * 3.0, "i"); }, m.mesh, {P("i")}, {P()})},
      {"all_gather", shard_map([](const Array& b) { return exp(lax::all_gather(b, "i", 1, true)); },
                               m.mesh, {P("i")}, {P("i")})},
      {"psum_scatter", shard_map([](const Array& b) { return lax::psum_scatter(b * b, "i", 1, true); },
                                 m.mesh, {P()}, {P("i")})},
      {"ppermute", shard_map([](const Array& b) {
                     return lax::ppermute(b * b, "i", {{0, 1}, {1, 2}, {2, 3}, {3, 0}}) * b;
                   }, m.mesh, {P("i")}, {P("i")})},
      {"all_to_all", shard_map([](const Array& b) { return sin(lax::all_to_all(b, "i", 1, 0, true)) * 2.0; },
                               m.mesh, {P("i")}, {P("i")})},
      {"replicated input", shard_map([](const Array& b) {
                             return lax::psum(b * astype(lax::axis_index("i"), DType::kF64), "i");
                           }, m.mesh, {P()}, {P()})},
  };
  for (const auto& named : cases) {
    const std::string& name = named.first;
    const std::function<Array(const Array&)>& f = named.second;
    const auto [value, grad] = value_and_grad([&](const Array& x) { return sum(f(x)); })(put(x0));
    const std::vector<double> want = numeric_grad(f, x0, put);
    const std::vector<double> got = grad.to_host().to_doubles();
    ASSERT_EQ(got.size(), want.size()) << name;
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << name << " " << i;
  }
}

TEST(ShardMap, InsideSjitWithAutomaticPartitioningAround) {
  Mesh2 m;
  const Tensor a = Tensor::uniform(Shape{8, 16}, DType::kF32, 1, -1, 1);
  const Tensor w = Tensor::uniform(Shape{16, 4}, DType::kF32, 2, -1, 1);
  auto body = shard_map([](const Array& x) { return lax::psum(x * x, "y"); }, m.mesh,
                        {P("x", "y")}, {P("x")});
  auto step2 = sjit(m.mesh, [&](const Array& x) { return tanh(body(tanh(x))) * 2.0; });
  const Array got = step2(m.put(a, P()));
  const Array want = body(tanh(m.put(a, P())));
  EXPECT_EQ(values(got), values(tanh(want) * 2.0));
}

TEST(ShardMap, BadInputIsAnErrorNamingIt) {
  Mesh1 m;
  const Array x = m.put(arange(Shape{6}), P());
  auto two = shard_map([](const Array& b) { return b; }, m.mesh, {P("i"), P()}, {P("i")});
  EXPECT_THROW_WITH(two(x), SpecError, "2 in_specs for 1 arguments");
  auto undivided = shard_map([](const Array& b) { return b; }, m.mesh, {P("i")}, {P("i")});
  EXPECT_THROW_WITH(undivided(x), SpecError, "argument 0", "6");
  auto unknown = shard_map([](const Array& b) { return b; }, m.mesh, {P("z")}, {P("i")});
  EXPECT_THROW_WITH(unknown(m.put(arange(Shape{8}), P())), SpecError, "'z'");
  auto bad_axis = shard_map([](const Array& b) { return lax::psum(b, "z"); }, m.mesh, {P("i")}, {P()});
  EXPECT_THROW_WITH(bad_axis(m.put(arange(Shape{8}), P())), SpecError, "lax.psum", "'z'");
  EXPECT_THROW_WITH(lax::psum(x, "i"), SpecError, "outside a shard_map");
}

// The rest of the call's errors, each naming what is wrong.
TEST(ShardMap, MoreBadCallsAreNamed) {
  Mesh1 m;
  const Array x = m.put(arange(Shape{8}), P());
  auto none = shard_map([] { return std::vector<Array>{}; }, m.mesh, {}, {});
  EXPECT_THROW_WITH(none(), SpecError, "no arguments");
  const Mesh other = Mesh::parse("j:4", 4);
  auto elsewhere = shard_map([](const Array& b) { return b; }, other, {P("j")}, {P("j")});
  EXPECT_THROW_WITH(elsewhere(x), ArrayError, "argument 0", "Mesh('i': 4)", "Mesh('j': 4)");
  EXPECT_THROW_WITH(sjit(m.mesh, elsewhere)(x), SpecError, "Mesh('j': 4)", "Mesh('i': 4)");
  auto nested = shard_map(
      [&](const Array& b) {
        return shard_map([](const Array& c) { return c; }, m.mesh, {P()}, {P()})(b);
      },
      m.mesh, {P("i")}, {P("i")});
  EXPECT_THROW_WITH(nested(x), SpecError, "inside another shard_map");
  auto constrained = shard_map([](const Array& b) { return with_sharding_constraint(b, P("i")); },
                               m.mesh, {P("i")}, {P("i")});
  EXPECT_THROW_WITH(constrained(x), SpecError, "with_sharding_constraint", "f32[2]", "per-device");
  const auto body_error = [&](std::function<Array(const Array&)> body, const char* a, const char* b) {
    EXPECT_THROW_WITH(shard_map(body, m.mesh, {P("i")}, {P("i")}, false)(x), SpecError, a, b);
  };
  body_error([](const Array& b) { return lax::psum(b, std::vector<std::string>{}); }, "lax.psum",
             "names no mesh axis");
  body_error([](const Array& b) { return lax::psum(b, {"i", "i"}); }, "lax.psum", "'i' is named twice");
  body_error([](const Array& b) { return lax::all_gather(b, "i", 2, true); }, "lax.all_gather",
             "dimension 2");
  std::string axes;
  for (int a = 0; a < 63; ++a) axes += (a ? "," : "") + ("a" + std::to_string(a)) + ":1";
  const Mesh wide = Mesh::parse(axes, 1);
  const Executor one = Executor::process_local(1);
  const Array y = device_put(arange(Shape{2}), NamedSharding(wide, P()), one);
  EXPECT_THROW_WITH(shard_map([](const Array& b) { return b; }, wide, {P()}, {P()})(y), SpecError,
                    "63 axes", "at most 62");
}

// An annotation on a per-device value (a model's layer called inside the body) changes nothing;
// a gradient's "like" constraint on a per-device parameter neither.
TEST(ShardMap, AnnotationsInsideTheBodyPassThrough) {
  Mesh1 m;
  const Array x = m.put(arange(Shape{8}, 1), P());
  auto f = shard_map(
      [](const Array& b) {
        const Array g = value_and_grad([](const Array& v) { return sum(v * v); })(b).second;
        return with_sharding_annotation(g, "anything") + b;
      },
      m.mesh, {P("i")}, {P("i")});
  SjitOptions o;
  o.allow_unknown_annotations = true;
  std::vector<double> want;
  for (int i = 1; i <= 8; ++i) want.push_back(3.0 * i);
  EXPECT_EQ(values(f(x)), want);
  EXPECT_EQ(values(sjit(m.mesh, f, o)(x)), want);
}

}  // namespace
}  // namespace shardplan
