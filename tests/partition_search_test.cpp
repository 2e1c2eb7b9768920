// The partitioner's choice against a brute-force search over the same candidates (issue 40,
// item 1): on random programs of up to 8 nodes on one-, two- and three-axis meshes, the cost of
// the program choose() picks equals the least cost of any consistent assignment of candidates
// when every value has one use (chains and trees, where its dynamic programming is exact), and
// is within 5% of it otherwise. The search and the cost function are independent of the choice:
// the search tries every assignment, and the cost of one is computed from scratch (each node's
// compute and each value's reads, CandidateSpace::cost).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../src/program/compiler/partition_space.hpp"
#include "partition_search_test.hpp"
#include "test_util.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

using search::brute_force;
using search::Built;
using search::random_program;
using search::Rng;

struct Tally {
  int programs = 0;
  int above = 0;
  double worst = 1;
};

void check(const Mesh& mesh, std::uint64_t seed, int programs, bool tree, Tally& tally) {
  Rng rng(seed);
  for (int p = 0; p < programs; ++p) {
    const Built b = random_program(mesh, rng, 2 + rng.below(4), tree);
    const CandidateSpace space = partition_candidates(b.graph, b.spec);
    const double chosen = space.cost(space.chosen);
    const double least = brute_force(space);
    ++tally.programs;
    ASSERT_TRUE(std::isfinite(chosen)) << b.text;
    ASSERT_LE(least, chosen * (1 + 1e-9)) << b.text;  // the search sees the chosen assignment
    const double ratio = least > 0 ? chosen / least : (chosen > 0 ? 2.0 : 1.0);
    tally.worst = std::max(tally.worst, ratio);
    if (tree) {
      EXPECT_NEAR(chosen, least, 1e-9 * std::max(1.0, least))
          << "mesh " << mesh.to_string() << ": " << b.text;
    } else {
      EXPECT_LE(ratio, 1.05) << "mesh " << mesh.to_string() << ": " << b.text << ": chosen "
                             << chosen << ", least " << least;
    }
    if (ratio > 1 + 1e-9) ++tally.above;
  }
}

const std::vector<Mesh>& meshes() {
  static const std::vector<Mesh> m{Mesh::parse("x:2", 2), Mesh::parse("x:2,y:2", 4),
                                   Mesh::parse("x:2,y:2,z:2", 8)};
  return m;
}

TEST(PartitionSearch, TheChoiceIsTheLeastCostOnChainsAndTrees) {
  Tally tally;
  for (std::size_t m = 0; m < meshes().size(); ++m) check(meshes()[m], 10 + m, 60, true, tally);
  EXPECT_EQ(tally.programs, 180);
}

TEST(PartitionSearch, TheChoiceIsWithinFivePercentOfTheLeastCostOnOtherPrograms) {
  Tally tally;
  for (std::size_t m = 0; m < meshes().size(); ++m) check(meshes()[m], 20 + m, 60, false, tally);
  EXPECT_EQ(tally.programs, 180);
  RecordProperty("worst_ratio", fmt::format("{:.4f}", tally.worst));
  RecordProperty("above_least", tally.above);
}

}  // namespace
}  // namespace shardplan::detail

namespace shardplan::detail {
namespace {

// The cost formula by hand: per collective, the slowest axis's latency plus the bytes a device
// receives over that axis's bandwidth; slices cost nothing.
TEST(PartitionCostModel, ACollectiveCostsItsSlowestAxisLatencyPlusBytesOverBandwidth) {
  const Mesh mesh = Mesh::parse("x:2,y:2", 4);
  LinkFigures links;
  links.axes["x"] = AxisLink{.bytes_per_second = 100e9, .latency_seconds = 1e-6};
  links.axes["y"] = AxisLink{.bytes_per_second = 10e9, .latency_seconds = 5e-6};
  const PartitionCost timed(mesh, links);
  const PartitionCost bytes(mesh, std::nullopt);
  CollectiveRecord over_x{.kind = CollectiveKind::kAllGather, .axes = {"x"}, .bytes_in = {1000, 1000, 1000, 1000}};
  CollectiveRecord over_xy{.kind = CollectiveKind::kAllReduce, .axes = {"x", "y"}, .bytes_in = {0, 4000, 0, 0}};
  CollectiveRecord slice{.kind = CollectiveKind::kSlice, .axes = {"x"}, .bytes_in = {0, 0, 0, 0}};
  EXPECT_DOUBLE_EQ(timed.of({over_x}).value, 1e-6 + 1000 / 100e9);
  EXPECT_DOUBLE_EQ(timed.of({over_xy}).value, 5e-6 + 4000 / 10e9);
  EXPECT_DOUBLE_EQ(timed.of({over_x, slice, over_xy}).value, 1e-6 + 1e-8 + 5e-6 + 4e-7);
  EXPECT_EQ(timed.of({over_x, slice, over_xy}).collectives, 2);
  EXPECT_DOUBLE_EQ(bytes.of({over_x, slice, over_xy}).value, 5000);
  LinkFigures missing;
  missing.axes["x"] = links.axes["x"];
  EXPECT_THROW(
      {
        try {
          const PartitionCost bad(mesh, missing);
        } catch (const SpecError& e) {
          EXPECT_NE(std::string(e.what()).find("mesh axis 'y'"), std::string::npos) << e.what();
          throw;
        }
      },
      SpecError);
  // A bandwidth not above 0 (or NaN) and a latency below 0 (or NaN) are refused, naming the axis.
  for (const AxisLink bad : {AxisLink{0, 1e-6}, AxisLink{std::nan(""), 1e-6}, AxisLink{1e9, -1},
                             AxisLink{1e9, std::nan("")}}) {
    LinkFigures f = links;
    f.axes["y"] = bad;
    EXPECT_THROW_WITH(PartitionCost(mesh, f), SpecError, "mesh axis 'y'", "bandwidth");
  }
}

// The collectives of exp(w - g), w f32[8, 4] whole, g pending over x (the sharded weight update):
// by bytes, a reduce-scatter and an all-gather of 64 B each (the same bytes as an all-reduce of
// 128 B, and half the work); with a link whose latency dominates, one all-reduce.
std::vector<std::string> update_collectives(const std::optional<LinkFigures>& links) {
  const Mesh mesh = Mesh::parse("x:2", 2);
  const Executor exec = Executor::process_local(2);
  TraceContext ctx(exec, mesh);
  std::vector<Array> outs;
  {
    TraceScope scope(&ctx);
    const Array w = ctx.add_argument(TensorType{{8, 4}, DType::kF32});
    const Array g = ctx.add_argument(TensorType{{8, 4}, DType::kF32});
    outs = {exp(w - g)};
  }
  CompileSpec spec{.mesh = mesh};
  spec.inputs.push_back(InputSpec{.spec = P(), .origin = "w"});
  spec.inputs.push_back(
      InputSpec{.spec = P(), .pending = Pending{ReduceOp::kSum, {"x"}}, .origin = "g"});
  spec.links = links;
  const Program prog = compile(ctx.finish(outs), spec);
  std::vector<std::string> out;
  for (const Step& st : prog.steps()) {
    for (const CollectiveRecord& rec : st.cost) {
      if (rec.kind != CollectiveKind::kSlice) out.emplace_back(to_string(rec.kind));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(PartitionCostModel, LinkLatencyPrefersOneCollectiveWhereBytesTie) {
  EXPECT_EQ(update_collectives(std::nullopt),
            (std::vector<std::string>{"all_gather", "reduce_scatter"}));
  LinkFigures slow_start;
  slow_start.axes["x"] = AxisLink{.bytes_per_second = 100e9, .latency_seconds = 1e-3};
  EXPECT_EQ(update_collectives(slow_start), (std::vector<std::string>{"all_reduce"}));
}

// The choice's specs are interned (SpecTable): equal specs are one handle however they were made,
// so handles compare as the specs do (PartitionSpec's ==: dimension by dimension, the order of a
// dimension's axes included); intern_dims drops trailing whole dimensions as spec_of_dims does.
TEST(PartitionSpecTable, EqualSpecsAreOneHandleHoweverTheyWereMade) {
  SpecTable table;
  const Spec x = table.intern(PartitionSpec{"x"});
  EXPECT_EQ(x, table.intern(PartitionSpec{"x"}));
  EXPECT_EQ(x, table.intern_dims({{"x"}, {}, {}}));
  EXPECT_EQ(*x, PartitionSpec{"x"});
  const Spec x_whole = table.intern(PartitionSpec{"x", nullptr});  // not equal to P("x")
  EXPECT_FALSE(x_whole == x);
  EXPECT_EQ(x_whole, table.intern(PartitionSpec{"x", nullptr}));
  const Spec whole = table.intern(PartitionSpec());
  EXPECT_EQ(whole, table.intern_dims({{}, {}}));
  const Spec yx = table.intern_dims({{}, {"y", "x"}});
  EXPECT_EQ(*yx, (PartitionSpec{nullptr, AxisNames{"y", "x"}}));
  const Spec xy = table.intern_dims({{}, {"x", "y"}});
  EXPECT_FALSE(xy == yx);
  EXPECT_EQ((std::vector<int>{x.id(), x_whole.id(), whole.id(), yx.id(), xy.id()}),
            (std::vector<int>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace shardplan::detail
