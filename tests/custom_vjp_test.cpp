// custom_vjp (autodiff.hpp): the backward function replaces differentiation through the forward
// one (a gradient no op of the forward pass would give), eagerly, under sjit and inside a
// checkpoint; only the residuals are kept; a backward function giving the wrong number of
// cotangents, or one of another shape or dtype than its input, is refused with JAX's message.
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/remat.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

// y = x * x forward, but a backward pass that says dy/dx = 3 (not 2x): only the custom rule can
// give it. The residual is x.
Array odd_square(const Array& x) {
  return custom_vjp(
             [](const std::vector<Array>& in) {
               return CustomVjpForward{{in[0] * in[0]}, {in[0]}};
             },
             [](const std::vector<Array>& res, const std::vector<Array>& cts) {
               return std::vector<Array>{cts[0] * full_like(res[0], 3.0)};
             },
             {x})
      .at(0);
}

struct Devices {
  Executor exec{4};
  Mesh mesh = Mesh::parse("d:4", 4);
  Array x = device_put(Tensor::uniform(Shape{8, 4}, DType::kF32, 1, -1, 1),
                       NamedSharding(mesh, P("d")), exec);
};

std::vector<double> grad_of(const std::function<Array(const Array&)>& f, const Array& x) {
  return value_and_grad([&](const Array& a) { return sum(f(a) * 2.0); })(x).second.to_host().to_doubles();
}

TEST(CustomVjp, TheBackwardFunctionGivesTheGradient) {
  Devices s;
  const std::vector<double> want(32, 6.0);  // d(2 * y)/dx with dy/dx = 3
  EXPECT_EQ(grad_of(odd_square, s.x), want);
  EXPECT_EQ(grad_of([](const Array& a) { return checkpoint(odd_square)(a); }, s.x), want);
  auto jitted = sjit(s.mesh, [](const Array& a) {
    return value_and_grad([](const Array& b) { return sum(odd_square(b) * 2.0); })(a).second;
  });
  EXPECT_EQ(jitted(s.x).to_host().to_doubles(), want);
  // The forward value is the forward function's.
  const std::vector<double> x = s.x.to_host().to_doubles();
  const std::vector<double> y = odd_square(s.x).to_host().to_doubles();
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(y[i], x[i] * x[i]);
}

TEST(CustomVjp, AWrongNumberOfCotangentsIsNamed) {
  Devices s;
  const auto bad = [](const Array& a) {
    return custom_vjp([](const std::vector<Array>& in) { return CustomVjpForward{{in[0] + in[1]}, {}}; },
                      [](const std::vector<Array>&, const std::vector<Array>& cts) {
                        return std::vector<Array>{cts[0]};
                      },
                      {a, a * 2.0})
        .at(0);
  };
  EXPECT_THROW_WITH(grad_of(bad, s.x), SpecError, "custom_vjp",
                    "Custom VJP bwd rule must produce an output with the same shape/dtypes as "
                    "the args tuple of the primal function",
                    "1 cotangents for 2 inputs");
}

// A backward function whose cotangent for an f32[2,2] parameter is `wrong` (JAX: "Custom VJP
// bwd rule must produce an output with the same shape/dtypes as the args tuple of the primal
// function"): refused eagerly and under sjit, naming the input, what it got and what it needed.
TEST(CustomVjp, ACotangentOfAnotherShapeOrDtypeIsRefused) {
  Executor exec{1};
  const Array w = device_put(Tensor::uniform(Shape{2, 2}, DType::kF32, 3, -1, 1),
                             NamedSharding(Mesh::parse("d:1", 1), P()), exec);
  const std::vector<std::pair<Array (*)(const Array&), std::string>> wrongs{
      {[](const Array& g) { return sum(g); }, "f32[]"},
      {[](const Array& g) { return reshape(g, Shape{4}); }, "f32[4]"},
      {[](const Array& g) { return astype(g, DType::kF64); }, "f64[2, 2]"},
      {[](const Array& g) { return astype(g, DType::kI32); }, "i32[2, 2]"}};
  for (const auto& entry : wrongs) {
    Array (*const wrong)(const Array&) = entry.first;
    const std::string& got = entry.second;
    SCOPED_TRACE(got);
    const auto f = [wrong](const Array& a) {
      return sum(custom_vjp([](const std::vector<Array>& in) { return CustomVjpForward{{in[0] * 2.0}, {}}; },
                            [wrong](const std::vector<Array>&, const std::vector<Array>& cts) {
                              return std::vector<Array>{wrong(cts[0])};
                            },
                            {a})
                     .at(0));
    };
    const auto expect_refused = [&](const std::function<void()>& run) {
      EXPECT_THROW_WITH(run(), SpecError, std::string("[custom_vjp]"),
                        std::string("Custom VJP bwd rule must produce an output with the same "
                                    "shape/dtypes as the args tuple of the primal function"),
                        std::string("at input 0"), "cotangent " + got,
                        std::string("input f32[2, 2]"));
    };
    expect_refused([&] { (void)value_and_grad(f)(w); });
    auto jitted = sjit(w.mesh(), [f](const Array& a) { return value_and_grad(f)(a).second; });
    expect_refused([&] { (void)jitted(w); });
  }
}

}  // namespace
}  // namespace shardplan
