// ProgramCost::timeline: the memory pass's live bytes per step, the values live at the peak with
// their names, and where the phases of a training step begin. Expectations by hand.
#include "shardplan/program_cost.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/remat.hpp"
#include "shardplan/sjit.hpp"

namespace shardplan {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::int64_t timeline_max(const MemoryTimeline& t) {
  return std::max(t.start_bytes,
                  t.live_bytes.empty() ? 0 : *std::max_element(t.live_bytes.begin(), t.live_bytes.end()));
}

// w [64, 64] f32 arrives split over data:4 (4 KiB per device), is gathered whole (16 KiB) and
// doubled (16 KiB, beside the f32 scalar 2): three steps (gather, constant, product) in some
// order, the product last. Not donated, the argument stays.
TEST(MemoryTimeline, LiveBytesAfterEachStepByHand) {
  const Mesh mesh = Mesh::parse("data:4", 4);
  auto f = sjit(
      mesh, [](const Array& w) { return with_sharding_constraint(w, P()) * 2.0; },
      SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("data"))})});
  const ProgramCost& c = f.lower(TensorSpec{Shape{64, 64}, DType::kF32}).cost();
  const MemoryTimeline& t = c.timeline;
  EXPECT_EQ(t.start_bytes, 4096);
  ASSERT_EQ(t.live_bytes.size(), 3u);
  // After the gather and the constant, in either order; then the product beside them.
  std::vector<std::int64_t> first_two(t.live_bytes.begin(), t.live_bytes.begin() + 2);
  EXPECT_TRUE(first_two == (std::vector<std::int64_t>{4096 + 16384, 4096 + 16384 + 4}) ||
              first_two == (std::vector<std::int64_t>{4096 + 4, 4096 + 4 + 16384}));
  EXPECT_EQ(t.live_bytes[2], 4096 + 16384 + 16384 + 4);
  EXPECT_EQ(t.peak_step, 2u);
  EXPECT_EQ(timeline_max(t), c.peak_bytes[0]);
  EXPECT_TRUE(t.phases.empty());  // nothing recorded phases
  // Largest first: the gathered argument and the product (16 KiB each), the argument's shard,
  // the scalar; adding up to the peak.
  ASSERT_EQ(t.live_at_peak.size(), 4u);
  std::vector<std::int64_t> bytes;
  for (const LiveValue& v : t.live_at_peak) bytes.push_back(v.bytes);
  EXPECT_THAT(bytes, ElementsAre(16384, 16384, 4096, 4));
  const auto find = [&](bool resharded, int input) {
    return std::find_if(t.live_at_peak.begin(), t.live_at_peak.end(), [&](const LiveValue& v) {
      return v.resharded == resharded && v.input == input;
    });
  };
  const auto gathered = find(true, 0), held = find(false, 0);
  ASSERT_NE(gathered, t.live_at_peak.end());
  ASSERT_NE(held, t.live_at_peak.end());
  EXPECT_EQ(gathered->bytes, 16384);
  EXPECT_EQ(held->bytes, 4096);
  EXPECT_EQ(held->what, "argument 0");
  EXPECT_EQ(held->type, "f32[64, 64]");
  EXPECT_FALSE(held->phase.has_value());
  const auto product = find(false, -1);
  ASSERT_NE(product, t.live_at_peak.end());
  EXPECT_EQ(product->bytes, 16384);
  EXPECT_THAT(product->what, HasSubstr("mul"));
}

// A training step: value_and_grad records its forward and backward passes, begin_phase the
// update; the phases come in that order from step 0, and the names checkpoint_name gave survive
// the replay into the step's trace.
TEST(MemoryTimeline, PhasesOfATrainingStepInOrderAndNamesKept) {
  const Mesh mesh = Mesh::parse("data:2", 2);
  auto step = sjit(mesh, [](const Array& w, const Array& x) {
    const auto loss = [&](const Array& p) {
      return sum(checkpoint_name(tanh(matmul(x, p)), "hidden"));
    };
    auto [l, g] = value_and_grad(loss)(w);
    begin_phase(StepPhase::kUpdate);
    return w - g * 0.1;
  }, SjitOptions{.in_shardings = RuleTree::list({RuleTree(P()), RuleTree(P("data"))})});
  const ProgramCost& c =
      step.lower(TensorSpec{Shape{32, 256}, DType::kF32}, TensorSpec{Shape{64, 32}, DType::kF32})
          .cost();
  const MemoryTimeline& t = c.timeline;
  EXPECT_EQ(timeline_max(t), c.peak_bytes[0]);
  ASSERT_LT(t.peak_step, t.live_bytes.size());
  EXPECT_EQ(t.live_bytes[t.peak_step], c.peak_bytes[0]);
  ASSERT_EQ(t.phases.size(), 3u);
  EXPECT_EQ(t.phases[0].phase, StepPhase::kForward);
  EXPECT_EQ(t.phases[1].phase, StepPhase::kBackward);
  EXPECT_EQ(t.phases[2].phase, StepPhase::kUpdate);
  EXPECT_EQ(t.phases[0].step, 0u);
  EXPECT_LT(t.phases[0].step, t.phases[1].step);
  EXPECT_LT(t.phases[1].step, t.phases[2].step);
  EXPECT_LT(t.phases[2].step, t.live_bytes.size());
  // The hidden activation [64, 256] over data:2 (32 KiB per device) is kept for tanh's
  // gradient: live at the peak, named, made in the forward pass.
  const auto hidden = std::find_if(t.live_at_peak.begin(), t.live_at_peak.end(),
                                   [](const LiveValue& v) { return v.what.find("'hidden'") != std::string::npos; });
  ASSERT_NE(hidden, t.live_at_peak.end());
  EXPECT_EQ(hidden->bytes, 32 * 256 * 4);
  EXPECT_EQ(hidden->phase, StepPhase::kForward);
  EXPECT_EQ(name(StepPhase::kBackward), "backward");
}

TEST(MemoryTimeline, BeginPhaseOutsideATraceDoesNothing) {
  begin_phase(StepPhase::kUpdate);  // no trace: nothing to record, nothing thrown
  SUCCEED();
}

}  // namespace
}  // namespace shardplan

namespace shardplan {
namespace {

// ProgramCost::reserved_bytes: the caching allocator model over the steps as FSDP2 runs them
// (docs/training.md, "Reserved bytes"). w [1536, 2048] f32 arrives split over data:4 (3 MiB a
// device), is gathered whole (12 MiB) and added to itself (12 MiB). By hand, a segment per
// cudaMalloc: the shard takes a 20 MiB segment (17 MiB left); the gather stages 12 MiB on the
// all-gather stream (a 12 MiB segment) and the gathered weight takes 12 of the 17 MiB; the sum
// needs a new 12 MiB segment: 44 MiB. Expandable: one 20 MiB page for the shard, one on the
// all-gather stream, the gathered weight in the first page's free 17 MiB, then the sum past the
// 5 MiB left: one more page: 60 MiB.
TEST(ReservedBytes, AGatheredWeightAndASumByHand) {
  constexpr std::int64_t kMiB = std::int64_t{1} << 20;
  const Mesh mesh = Mesh::parse("data:4", 4);
  auto f = sjit(
      mesh,
      [](const Array& w) {
        const Array g = with_sharding_constraint(w, P());
        return g + g;
      },
      SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("data"))})});
  const ProgramCost& c = f.lower(TensorSpec{Shape{1536, 2048}, DType::kF32}).cost();
  ASSERT_EQ(c.timeline.live_bytes.size(), 2u);  // the gather, the sum
  EXPECT_EQ(c.peak_bytes[0], 27 * kMiB);
  EXPECT_EQ(c.reserved_bytes, 44 * kMiB);
  EXPECT_EQ(c.reserved_bytes_expandable, 60 * kMiB);
}

}  // namespace
}  // namespace shardplan
