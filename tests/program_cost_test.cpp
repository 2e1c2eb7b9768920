// ProgramCost::timeline: the memory pass's live bytes per step, the values live at the peak with
// their names, and where the phases of a training step begin; values that share buffers (views,
// an array passed twice) against the bytes a run measures. Expectations by hand.
#include "shardplan/program_cost.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "shardplan/autodiff.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/profiler.hpp"
#include "shardplan/remat.hpp"
#include "shardplan/shard_map.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

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

// Device 0's bytes as a run measured them (MemoryDebugMode): the start, then after each step.
std::vector<std::int64_t> measured(const profiler::MemoryRun& r) {
  std::vector<std::int64_t> out{r.start_bytes.at(0)};
  for (const auto& per_device : r.live_bytes) out.push_back(per_device.at(0));
  return out;
}

std::vector<std::int64_t> planned(const MemoryTimeline& t) {
  std::vector<std::int64_t> out{t.start_bytes};
  out.insert(out.end(), t.live_bytes.begin(), t.live_bytes.end());
  return out;
}

// x of `spec`, normal from seed 1, split over the mesh's axis i.
Array normal_over_i(const TensorSpec& spec, const Mesh& mesh, const Executor& exec) {
  return device_put(Tensor::normal(spec.shape, DType::kF32, 1), NamedSharding(mesh, P("i")), exec);
}

// x f32[16, 64] over i:4 (1 KiB per device, kept: not donated). shard_map's boundaries are views:
// its block in is x's buffer while x stays live, its result out is the sum's buffer. Steps: in
// (x's 1 KiB, nothing new), the sum (+1 KiB; the block in dies after it, x's buffer stays), out
// (the sum's buffer). Counting each value's bytes, the plan said 1, 2, 3, 2 KiB: the block in
// counted again beside x. The run holds 1, 1, 2, 2 KiB.
TEST(MemoryTimeline, AViewOfAValueStillLiveHoldsNoBytesOfItsOwn) {
  const Mesh mesh = Mesh::parse("i:4", 4);
  auto f = sjit(mesh, [mesh](const Array& x) {
    return shard_map([](const Array& b) { return b + b; }, mesh, {P("i")}, {P("i")})(x);
  }, SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("i"))})});
  const TensorSpec spec{Shape{16, 64}, DType::kF32};
  const ProgramCost& c = f.lower(spec).cost();
  EXPECT_THAT(planned(c.timeline), ElementsAre(1024, 1024, 2048, 2048)) << f.lower(spec).text();
  EXPECT_EQ(c.peak_bytes[0], 2048);
  EXPECT_EQ(c.timeline.peak_step, 1u);  // the first peak: the sum beside x
  EXPECT_EQ(c.peak_by_kind, (PeakByKind{.inputs = 1024, .resharded_inputs = 0, .computed = 1024}));
  ASSERT_EQ(c.timeline.live_at_peak.size(), 2u);  // x named once: its block is its buffer
  EXPECT_EQ(c.timeline.live_at_peak[0].what, "argument 0");
  EXPECT_EQ(c.timeline.live_at_peak[0].bytes, 1024);
  EXPECT_EQ(c.timeline.live_at_peak[1].what, "add");
  Executor exec{4};
  const Array x = normal_over_i(spec, mesh, exec);
  profiler::MemoryDebugMode memory;
  (void)f(x);
  const std::vector<profiler::MemoryRun> runs = memory.runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(measured(runs[0]), planned(c.timeline));
  EXPECT_EQ(runs[0].peak_bytes, c.peak_bytes[0]);
  // Counted per value, the block in and x count twice.
  EXPECT_EQ(runs[0].value_bytes[0][0], 2048);
}

// The block in is a view of a sum that dies at it (its last read): the buffer stays while the
// view lives, to the step that reads the view last. x (1 KiB, kept); a = x + x (+1 KiB); in (a's
// buffer); b = in + in (+1 KiB; in, a's buffer, let go after it); out (b's buffer), the result.
TEST(MemoryTimeline, AViewThatOutlivesItsOperandHoldsItsBufferUntilItDies) {
  const Mesh mesh = Mesh::parse("i:4", 4);
  auto f = sjit(mesh, [mesh](const Array& x) {
    return shard_map([](const Array& v) { return v + v; }, mesh, {P("i")}, {P("i")})(x + x);
  }, SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("i"))})});
  const TensorSpec spec{Shape{16, 64}, DType::kF32};
  const ProgramCost& c = f.lower(spec).cost();
  EXPECT_THAT(planned(c.timeline), ElementsAre(1024, 2048, 2048, 3072, 2048))
      << f.lower(spec).text();
  EXPECT_EQ(c.timeline.peak_step, 2u);
  // At the peak: x, a's buffer (named by a, which made it, though only its view is live) and b.
  ASSERT_EQ(c.timeline.live_at_peak.size(), 3u);
  EXPECT_EQ(c.timeline.live_at_peak[1].what, "add");
  EXPECT_EQ(c.timeline.live_at_peak[2].what, "add");
  Executor exec{4};
  const Array x = normal_over_i(spec, mesh, exec);
  profiler::MemoryDebugMode memory;
  (void)f(x);
  ASSERT_EQ(memory.runs().size(), 1u);
  EXPECT_EQ(measured(memory.runs()[0]), planned(c.timeline));
}

// keep_alive holds what it reads to its step, as autograd holds a node's saved tensors until the
// node has run. x f32[16, 64] split over i (1 KiB per device, kept); a = exp(x); b = a + a;
// c = b + b. Without keep_alive a dies at b (its last read): 1 KiB at the start, then 2, 3, 3.
// With c read through keep_alive(c, {a}), a lives to that step: 2, 3, 4 KiB (x, a, b, c), then
// 3 (b let go) at the view, which holds no bytes of its own. A run measures the same bytes.
TEST(MemoryTimeline, KeepAliveHoldsWhatItReadsUntilItsStep) {
  const Mesh mesh = Mesh::parse("i:4", 4);
  const auto step = [](bool keep) {
    return [keep](const Array& x) {
      const Array a = exp(x);
      const Array b = a + a;
      const Array c = b + b;
      return keep ? keep_alive(c, {a}) : c;
    };
  };
  const SjitOptions options{.in_shardings = RuleTree::list({RuleTree(P("i"))})};
  const TensorSpec spec{Shape{16, 64}, DType::kF32};
  auto plain = sjit(mesh, step(false), options);
  auto kept = sjit(mesh, step(true), options);
  EXPECT_THAT(planned(plain.lower(spec).cost().timeline), ElementsAre(1024, 2048, 3072, 3072))
      << plain.lower(spec).text();
  const ProgramCost& c = kept.lower(spec).cost();
  EXPECT_THAT(planned(c.timeline), ElementsAre(1024, 2048, 3072, 4096, 3072)) << kept.lower(spec).text();
  EXPECT_EQ(c.peak_bytes[0], 4096);
  Executor exec{4};
  const Array x = normal_over_i(spec, mesh, exec);
  profiler::MemoryDebugMode memory;
  const Tensor got = kept(x).to_host();
  ASSERT_EQ(memory.runs().size(), 1u);
  EXPECT_EQ(measured(memory.runs()[0]), planned(c.timeline));
  EXPECT_TRUE(got == plain(x).to_host());  // the value is c's
}

// keep_alive's held arrays must have the value's shape: another is an error naming both shapes
// and the operand; outside sjit, or with nothing held, it is the value itself.
TEST(MemoryTimeline, KeepAliveRefusesAHeldArrayOfAnotherShape) {
  const Mesh mesh = Mesh::parse("i:4", 4);
  auto f = sjit(mesh, [](const Array& x, const Array& y) { return keep_alive(x, {x, y}); });
  EXPECT_THROW_WITH(f.lower(TensorSpec{Shape{16, 64}, DType::kF32},
                            TensorSpec{Shape{16, 8}, DType::kF32}),
                    SpecError, "[keep_alive]", "[16, 64]", "operand 2 is [16, 8]");
  Executor exec{4};
  const Array x = normal_over_i(TensorSpec{Shape{16, 64}, DType::kF32}, mesh, exec);
  EXPECT_TRUE(keep_alive(x, {x}).to_host() == x.to_host());
  EXPECT_TRUE(keep_alive(x, {}).to_host() == x.to_host());
}

// keep_alive adds no collective: a bf16 pending sum flows through it to the f32 conversion
// after it (convert_pending) and is reduced there, in f32, as without it, and the held array is
// read as it is, split over i where the pending sum is whole (not gathered to its layout: 12 KiB).
// x [64, 32] and y [64, 256] bf16 split over i:4 along their rows: x^T y [32, 256] is a pending
// sum, reduce-scattered to its rows in f32: 32 x 256 x 4 bytes x 3/4 received per device. (That
// the sum is carried even where reducing it first in bf16 is cheaper:
// PlanTraining.FsdpRootHoldsTheRootsWeightsAndTheLastLayers.)
TEST(MemoryTimeline, KeepAliveCarriesAPendingSumAndReadsWhatItHoldsAsItIs) {
  const Mesh mesh = Mesh::parse("i:4", 4);
  const auto step = [](bool keep) {
    return [keep](const Array& x, const Array& y, const Array& z) {
      const Array g = dot_general(x, y, DotDims{{}, {}, {0}, {0}});
      const Array held = keep ? keep_alive(g, {z}) : g;
      return with_sharding_constraint(convert_pending(held, DType::kF32), P("i"));
    };
  };
  const SjitOptions options{
      .in_shardings = RuleTree::list({RuleTree(P("i")), RuleTree(P("i")), RuleTree(P("i"))})};
  const TensorSpec x{Shape{64, 32}, DType::kBF16}, y{Shape{64, 256}, DType::kBF16};
  const TensorSpec z{Shape{32, 256}, DType::kBF16};  // held: split, unlike the pending sum
  const ProgramCost plain = sjit(mesh, step(false), options).lower(x, y, z).cost();
  const ProgramCost kept = sjit(mesh, step(true), options).lower(x, y, z).cost();
  EXPECT_EQ(plain.bytes_by_kind.at(CollectiveKind::kReduceScatter), 32 * 256 * 4 * 3 / 4);
  EXPECT_EQ(kept.bytes_by_kind, plain.bytes_by_kind);
}

// A collective over an axis of one device moves nothing: reshard() gives its operand's buffers
// back under the new name, and the memory pass counts them once (shares_operand_buffers: its
// cost lists no collective). On i:4 x j:1, x f32[16, 64] split over i (1 KiB per device, kept);
// in the body all_gather over j, then its double (varying over j: out_specs names it).
TEST(MemoryTimeline, ACollectiveOverOneDeviceHoldsItsOperandsBuffer) {
  const Mesh mesh = Mesh::parse("i:4,j:1", 4);
  auto f = sjit(mesh, [mesh](const Array& x) {
    return shard_map([](const Array& b) {
      const Array g = lax::all_gather(b, "j", 0, true);
      return g + g;
    }, mesh, {P("i")}, {P("i", "j")})(x);
  }, SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("i"))})});
  const TensorSpec spec{Shape{16, 64}, DType::kF32};
  const std::string text = f.lower(spec).text();
  // Steps: in (x's buffer), all_gather (the same buffer), the sum (+1 KiB), out (its buffer).
  EXPECT_THAT(planned(f.lower(spec).cost().timeline), ElementsAre(1024, 1024, 1024, 2048, 2048))
      << text;
  Executor exec{4};
  const Array x = normal_over_i(spec, mesh, exec);
  profiler::MemoryDebugMode memory;
  (void)f(x);
  ASSERT_EQ(memory.runs().size(), 1u);
  EXPECT_EQ(measured(memory.runs()[0]), planned(f.lower(spec).cost().timeline));
}

// Kept constants read through shard_map's block in: the iota (i32 [16, 64], 4 KiB per device,
// replicated), its f32 copy (4 KiB), that sliced to P('i') (1 KiB) and the block in of the slice,
// all kept (memory.hpp's bounds), the view with the slice it views. x f32[16, 64] over i:4 (1 KiB,
// kept). Steps: iota, convert, in(x) (x's buffer), the slice, in(slice) (its buffer), the sum
// (+1 KiB), out (the sum's buffer). The first run makes them: 1, 5, 9, 9, 10, 10, 11, 11 KiB
// (counted per value, the two views added 1 KiB each). A later run takes the constants from the
// cache, the view and the slice one buffer still: 9 KiB of them held from the first step on.
TEST(MemoryTimeline, AKeptConstantAndItsViewAreOneBufferInEveryRun) {
  const Mesh mesh = Mesh::parse("i:4", 4);
  auto f = sjit(mesh, [mesh](const Array& x) {
    const Array c = astype(iota_like(x, 1), DType::kF32);
    return shard_map([](const Array& b, const Array& k) { return b + k; }, mesh,
                     {P("i"), P("i")}, {P("i")})(x, c);
  }, SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("i"))})});
  const TensorSpec spec{Shape{16, 64}, DType::kF32};
  const MemoryTimeline& t = f.lower(spec).cost().timeline;
  EXPECT_THAT(planned(t), ElementsAre(1024, 5120, 9216, 9216, 10240, 10240, 11264, 11264))
      << f.lower(spec).text();
  Executor exec{4};
  const Array x = normal_over_i(spec, mesh, exec);
  profiler::MemoryDebugMode memory;
  (void)f(x);
  (void)f(x);
  const std::vector<profiler::MemoryRun> runs = memory.runs();
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_FALSE(runs[0].took_constants);
  EXPECT_EQ(measured(runs[0]), planned(t));
  EXPECT_TRUE(runs[1].took_constants);
  EXPECT_THAT(measured(runs[1]),
              ElementsAre(1024, 10240, 10240, 10240, 10240, 10240, 11264, 11264));
}

// One array passed as both arguments: the plan counts each argument (the compiler cannot know
// they are one), the run holds one buffer (the check of every run credits it by name:
// tests/support/check_runs.cpp). x f32[16, 64] over i:4: 1 KiB per device; x * x adds 1 KiB.
TEST(MemoryTimeline, OneArrayPassedTwiceIsPlannedTwiceAndHeldOnce) {
  const Mesh mesh = Mesh::parse("i:4", 4);
  auto f = sjit(mesh, [](const Array& a, const Array& b) { return a * b; },
                SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("i")), RuleTree(P("i"))})});
  const TensorSpec spec{Shape{16, 64}, DType::kF32};
  EXPECT_THAT(planned(f.lower(spec, spec).cost().timeline), ElementsAre(2048, 3072));
  Executor exec{4};
  const Array x = normal_over_i(spec, mesh, exec);
  profiler::MemoryDebugMode memory;
  (void)f(x, x);
  (void)(x * x);  // eagerly: a one-op program, the same
  const std::vector<profiler::MemoryRun> runs = memory.runs();
  ASSERT_EQ(runs.size(), 2u);
  for (const profiler::MemoryRun& r : runs) {
    EXPECT_EQ(measured(r), (std::vector<std::int64_t>{1024, 2048}));
    ASSERT_EQ(r.live_at_peak.size(), 2u);  // the argument's buffer named once, by the first
    EXPECT_EQ(r.live_at_peak[0].what, "input 0");
    EXPECT_EQ(r.live_at_peak[1].what, "mul");
  }
}

// begin_phase outside a trace records nothing (sjit.hpp): a phase begun eagerly does not carry
// into the next trace on the thread, whose timeline then has no phases, as one traced without
// it; and inside a trace the phase is still recorded from its first step.
TEST(MemoryTimeline, BeginPhaseOutsideATraceRecordsNothing) {
  const Mesh mesh = Mesh::parse("data:2", 2);
  const TensorSpec x{Shape{4, 2}, DType::kF32};
  begin_phase(StepPhase::kUpdate);
  auto plain = sjit(mesh, [](const Array& a) { return a * a; });
  EXPECT_TRUE(plain.lower(x).cost().timeline.phases.empty());
  begin_phase(StepPhase::kUpdate);
  auto marked = sjit(mesh, [](const Array& a) {
    begin_phase(StepPhase::kBackward);
    return a * a;
  });
  EXPECT_EQ(marked.lower(x).cost().timeline.phases,
            (std::vector<PhaseStart>{{StepPhase::kBackward, 0}}));
}

}  // namespace
}  // namespace shardplan
