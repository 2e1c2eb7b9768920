// Sharding propagation (src/program/compiler/propagate.hpp): where two fixed shardings propose
// different shardings for one value, the rule propagate.hpp documents decides (a fixed sharding,
// then the larger tensor, then the axes first in mesh order, then the more major dimension),
// whichever of them was traced first; within one node, its factors' order. Random programs in every order of their uses:
// partition_property_test.cpp.
#include "../src/program/compiler/propagate.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../src/program/frontend/trace.hpp"
#include "../src/program/ir/primitives.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail {
namespace {

// v = -p (p: f32[8, 8], nothing fixed) and one sharding constraint of v per spec of `uses`, in
// that order; returns v's propagated spec.
PartitionSpec propagated_spec_of_v(const Mesh& mesh, const std::vector<PartitionSpec>& uses) {
  const Executor exec = Executor::process_local(static_cast<int>(mesh.size()));
  TraceContext ctx(exec, mesh);
  std::vector<Array> results;
  {
    TraceScope scope(&ctx);
    const Array v = neg(ctx.add_argument(TensorType{{8, 8}, DType::kF32}));
    for (const PartitionSpec& spec : uses) results.push_back(with_sharding_constraint(v, spec));
  }
  const Graph g = ctx.finish(results);
  Propagator prop(g, mesh);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.is(prim::sharding_constraint)) {
      prop.fix(value_id(i), *n.attr<ConstraintAttrs>().spec, "with_sharding_constraint");
    }
  }
  prop.run();
  return spec_of_dims(prop.at(value_id(1)).dims);
}

// Before propagation ran in rounds, the constraint traced first gave v its sharding: P(None, 'x')
// in the first order below.
TEST(Propagate, OfTwoConstraintsOverOneAxisTheMoreMajorDimensionWinsInEitherOrder) {
  const Mesh mesh = Mesh::parse("x:2", 2);
  EXPECT_EQ(propagated_spec_of_v(mesh, {P(nullptr, "x"), P("x")}), P("x"));
  EXPECT_EQ(propagated_spec_of_v(mesh, {P("x"), P(nullptr, "x")}), P("x"));
}

TEST(Propagate, OfTwoConstraintsOnOneDimensionTheAxisFirstInMeshOrderWinsInEitherOrder) {
  const Mesh mesh = Mesh::parse("x:2,y:2", 4);
  EXPECT_EQ(propagated_spec_of_v(mesh, {P("y"), P("x")}), P("x"));
  EXPECT_EQ(propagated_spec_of_v(mesh, {P("x"), P("y")}), P("x"));
  // Where they do not conflict, both are taken: the columns from the other.
  EXPECT_EQ(propagated_spec_of_v(mesh, {P(nullptr, "y"), P("x")}), P("x", "y"));
}

// Within one node the factors keep their declared order (rows, then columns, for a product):
// x @ w with x split by rows and w, the larger, by columns over the same axis gives the result
// x's rows, as before propagation took proposals by their data (Float8Linear's sharded step
// relies on it).
TEST(Propagate, WithinOneNodeTheEarlierFactorWins) {
  const Mesh mesh = Mesh::parse("x:2", 2);
  const Executor exec = Executor::process_local(2);
  TraceContext ctx(exec, mesh);
  Array y;
  {
    TraceScope scope(&ctx);
    const Array x = ctx.add_argument(TensorType{{8, 32}, DType::kF32});
    const Array w = ctx.add_argument(TensorType{{32, 12}, DType::kF32});
    y = matmul(x, w);
  }
  const Graph g = ctx.finish({y});
  Propagator prop(g, mesh);
  prop.fix(value_id(0), P("x"), "input 0");
  prop.fix(value_id(1), P(nullptr, "x"), "input 1");
  prop.run();
  EXPECT_EQ(spec_of_dims(prop.at(g.outputs[0]).dims), P("x"));
}

}  // namespace
}  // namespace shardplan::detail
