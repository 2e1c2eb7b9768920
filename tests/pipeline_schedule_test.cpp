// Pipeline schedules (issue 42): each generator's schedule completes, and its simulated bubble in
// unit time is its paper's closed form; bad sizes and schedules that cannot complete are errors
// naming what is wrong.
#include "shardplan/pipeline_schedule.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include <string>
#include <tuple>
#include <vector>

#include "shardplan/error.hpp"

namespace shardplan::pipeline {
namespace {

using ::testing::HasSubstr;

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Time each rank computes: every stage it holds runs a forward and a whole backward per
// micro-batch.
double work(const Schedule& s, double f, double b) {
  return (s.stages / s.ranks) * s.microbatches * (f + b);
}

const std::vector<std::tuple<int, int>> kSizes = {{2, 2}, {2, 4}, {3, 7},  {4, 4},
                                                  {4, 8}, {4, 12}, {8, 8}, {8, 16}};

TEST(PipelineSchedule, GpipeAnd1f1bBubbleIsPMinusOneOverMPlusPMinusOne) {
  // (p-1)/(m+p-1): GPipe (Huang et al. 2019) and 1F1B (Narayanan et al. 2021) in unit time.
  for (const auto& [p, m] : kSizes) {
    for (const Schedule& s : {gpipe(p, m), one_f_one_b(p, m)}) {
      SCOPED_TRACE(s.name + " p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Timeline t = simulate(s, unit_costs());
      EXPECT_EQ(t.makespan, 3.0 * (m + p - 1));
      EXPECT_NEAR(t.bubble_fraction(), double(p - 1) / (m + p - 1), 1e-12);
    }
  }
}

TEST(PipelineSchedule, InterleavedBubbleIsDividedByTheVirtualStages) {
  // Narayanan et al. 2021, section 2.2: the bubble of v chunks per rank is (p-1)/v of a whole
  // rank's forward and backward, so (p-1)/(v*m+p-1) of the step.
  for (const auto& [p, m] : kSizes) {
    if (m % p) continue;
    for (const int v : {2, 3, 4}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" +
                   std::to_string(m));
      const Schedule s = interleaved_1f1b(p, v, m);
      EXPECT_EQ(s.stages, p * v);
      const Timeline t = simulate(s, unit_costs());
      EXPECT_EQ(t.makespan, 3.0 * v * m + 3.0 * (p - 1));
      EXPECT_NEAR(t.bubble_fraction(), double(p - 1) / (v * m + p - 1), 1e-12);
    }
  }
}

TEST(PipelineSchedule, ZeroBubbleH1BubbleIsFPlusBMinusWPerStage) {
  // Qi et al. 2023, table 1: ZB-H1's bubble is (p-1)(T_F + T_B - T_W), B the input backward;
  // 1F1B's is (p-1)(T_F + T_B + T_W).
  for (const auto& [p, m] : kSizes) {
    SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
    const Schedule s = zero_bubble_h1(p, m);
    const Timeline t = simulate(s, unit_costs());
    EXPECT_EQ(t.makespan - work(s, 1, 2), (p - 1) * (1.0 + 1.0 - 1.0));
    const Timeline base = simulate(one_f_one_b(p, m), unit_costs());
    EXPECT_EQ(base.makespan - work(s, 1, 2), (p - 1) * (1.0 + 1.0 + 1.0));
  }
}

TEST(PipelineSchedule, ZeroBubbleH1BubbleHoldsForOtherCosts) {
  // The same closed form with the weight backward cheaper than the forward and the input
  // backward dearer (T_W <= T_F, the paper's assumption), and transfers free.
  for (const auto& [f, i, w] : {std::tuple{1.0, 1.0, 0.5}, std::tuple{2.0, 3.0, 1.0},
                                std::tuple{1.0, 1.5, 0.75}}) {
    Costs c{[f = f](int) { return f; }, [i = i](int) { return i; }, [w = w](int) { return w; },
            {}, {}};
    for (const auto& [p, m] : kSizes) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) + " F,B,W=" +
                   std::to_string(f) + "," + std::to_string(i) + "," + std::to_string(w));
      const Schedule s = zero_bubble_h1(p, m);
      const Timeline t = simulate(s, c);
      EXPECT_NEAR(t.makespan - work(s, f, i + w), (p - 1) * (f + i - w), 1e-9);
    }
  }
}

TEST(PipelineSchedule, DualPipeVBubbleIsDeepSeeksFormula) {
  // deepseek-ai/DualPipe's README: (PP/2-1)(F&B + B - 3W) with PP stages (2 per rank), B a
  // whole backward and F&B an overlapped forward and backward, here in unit time (F&B = F + B).
  // Every rank computes 2 stages x m x (F + B).
  for (const auto& [p, m] : kSizes) {
    if (m < 2 * p) continue;
    SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
    const Schedule s = dualpipe_v(p, m);
    EXPECT_EQ(s.stages, 2 * p);
    const Timeline t = simulate(s, unit_costs());
    for (int r = 0; r < p; ++r) EXPECT_EQ(t.busy[r], work(s, 1, 2));
    EXPECT_EQ(t.makespan - work(s, 1, 2), (p - 1) * (3.0 + 2.0 - 3.0));
  }
}

TEST(PipelineSchedule, DualPipeVsPairsNotItsWaitsGiveItsPublishedBubble) {
  // The same steps with torch's transfers (not waited) keep the bubble 2(p-1); with each F&B
  // pair split into two steps (the backward no longer waits for the forward's input), it is p-1.
  for (const int p : {2, 4, 8}) {
    Schedule s = dualpipe_v(p, 4 * p);
    for (auto& steps : s.steps)
      std::erase_if(steps, [](const Step& st) { return st.kind == Step::Kind::kTransfers; });
    const Schedule paired = with_transfers(s);
    EXPECT_EQ(simulate(paired, unit_costs()).makespan - work(paired, 1, 2), 2.0 * (p - 1));
    for (auto& steps : s.steps) {
      std::vector<Step> split;
      for (const Step& st : steps)
        for (const Action& a : st.actions)
          split.push_back(Step{Step::Kind::kCompute, {a}, false});
      steps = std::move(split);
    }
    const Schedule unpaired = with_transfers(s);
    EXPECT_EQ(simulate(unpaired, unit_costs()).makespan - work(unpaired, 1, 2), p - 1.0);
  }
}

TEST(PipelineSchedule, OverlappedStepsTakeTheirOwnCost) {
  // F&B at 80% of F + B: each rank's busy time counts its overlapped steps at that cost.
  const Schedule s = dualpipe_v(4, 12);
  Costs c = unit_costs();
  c.overlapped = [](const Action& f, const Action& b) {
    EXPECT_EQ(f.op, Op::kForward);
    EXPECT_EQ(b.op, Op::kBackward);
    return 0.8 * 3.0;
  };
  const Timeline t = simulate(s, c);
  const Timeline unit = simulate(s, unit_costs());
  for (int r = 0; r < s.ranks; ++r) {
    int pairs = 0;
    for (const Step& step : s.steps[r]) pairs += step.kind == Step::Kind::kOverlapped;
    EXPECT_GT(pairs, 0);
    EXPECT_NEAR(t.busy[r], work(s, 1, 2) - pairs * 0.2 * 3.0, 1e-9);
  }
  EXPECT_LT(t.makespan, unit.makespan);
}

TEST(PipelineSchedule, ActivationsInFlightAreEachSchedulesOwn) {
  // 1F1B: rank r holds at most p-r micro-batches; GPipe all m; DualPipeV at most PP+1 stage
  // micro-batches per device (DualPipe's README), ZB-H1 as 1F1B plus its deferred weights.
  const int p = 4;
  const int m = 12;
  const Timeline gp = simulate(gpipe(p, m), unit_costs());
  const Timeline fb = simulate(one_f_one_b(p, m), unit_costs());
  const Timeline dv = simulate(dualpipe_v(p, m), unit_costs());
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(gp.peak_in_flight[r], m);
    EXPECT_EQ(fb.peak_in_flight[r], p - r);
    EXPECT_LE(dv.peak_in_flight[r], 2 * p + 1);
  }
  EXPECT_EQ(dv.peak_in_flight[0], 2 * p + 1);
}

TEST(PipelineSchedule, TransfersAreAddedWhereStagesChangeRank) {
  const Schedule s = one_f_one_b(2, 2);
  EXPECT_EQ(to_text(s),
            "1f1b: 2 ranks, 2 stages, 2 micro-batches\n"
            "rank 0: 0F0 {0SEND_F0} 0F1 {0SEND_F1} {0RECV_B0} 0B0 {0RECV_B1} 0B1\n"
            "rank 1: {1RECV_F0} 1F0 1B0 {1SEND_B0} {1RECV_F1} 1F1 1B1 {1SEND_B1}\n");
  const Timeline t = simulate(s, unit_costs());
  EXPECT_EQ(timeline_text(s, t, 9),
            "1f1b: makespan 9, bubble 33.3% (F forward, B backward, I input backward, W weight "
            "backward, X forward and backward overlapped, . waiting)\n"
            "rank   0 |FF..BB.BB|\n"
            "rank   1 |.FBBFBB..|\n");
}

TEST(PipelineSchedule, TransferTimesDelayTheReceiver) {
  // GPipe on 2 ranks, 1 micro-batch, each transfer 0.5: F0 [0,1], across, F1 [1.5,2.5],
  // B1 [2.5,4.5], across, B0 [5,7].
  Costs c = unit_costs();
  c.transfer = [](Op, int) { return 0.5; };
  const Timeline t = simulate(gpipe(2, 1), c);
  EXPECT_DOUBLE_EQ(t.makespan, 7.0);
}

TEST(PipelineSchedule, TooFewMicroBatchesAreRefusedNamingTheSchedule) {
  EXPECT_THAT(error_of([] { one_f_one_b(4, 2); }),
              HasSubstr("1f1b: 2 micro-batches for 4 stages"));
  EXPECT_THAT(error_of([] { interleaved_1f1b(4, 2, 6); }),
              HasSubstr("6 micro-batches over 4 ranks"));
  EXPECT_THAT(error_of([] { dualpipe_v(4, 7); }), HasSubstr("at least 2 x ranks = 8"));
  EXPECT_THAT(error_of([] { make_schedule("zb", 4, 8); }),
              HasSubstr("unknown schedule 'zb'; the schedules are gpipe, 1f1b, interleaved, "
                        "zbh1, dualpipev"));
  EXPECT_THAT(error_of([] { make_schedule("1f1b", 4, 8, 2); }),
              HasSubstr("only 'interleaved' has virtual stages"));
  EXPECT_THAT(error_of([] { gpipe(0, 8); }), HasSubstr("0 ranks"));
  EXPECT_THAT(error_of([] { gpipe(2, -1); }), HasSubstr("-1 micro-batches"));
}

Schedule two_ranks() {
  Schedule s{"hand", 2, 2, 1, {0, 1}, {}};
  s.steps.resize(2);
  return s;
}
Step transfer(Op op, int stage, bool wait) {
  return Step{Step::Kind::kTransfers, {Action{op, stage, 0}}, wait};
}
Step compute(Op op, int stage) { return Step{Step::Kind::kCompute, {Action{op, stage, 0}}, false}; }

TEST(PipelineSchedule, RanksWaitingOnEachOtherAreNamed) {
  // Each rank first waits for what the other sends only after it.
  Schedule s = two_ranks();
  s.steps[0] = {transfer(Op::kRecvBackward, 0, true), compute(Op::kForward, 0),
                transfer(Op::kSendForward, 0, false), compute(Op::kBackward, 0)};
  s.steps[1] = {transfer(Op::kRecvForward, 1, true), compute(Op::kForward, 1),
                compute(Op::kBackward, 1), transfer(Op::kSendBackward, 1, false)};
  const std::string e = error_of([&] { check(s); });
  EXPECT_THAT(e, HasSubstr("hand: the schedule does not complete"));
  EXPECT_THAT(e, HasSubstr("rank 0 at step 0 (0RECV_B0) waits for 1SEND_B0 of rank 1 (its step "
                           "3; it is at step 0)"));
  EXPECT_THAT(e, HasSubstr("rank 1 at step 0 (1RECV_F0) waits for 0SEND_F0 of rank 0 (its step "
                           "2; it is at step 0)"));
  // Sent before it is computed.
  s.steps[1] = {transfer(Op::kSendBackward, 1, false), transfer(Op::kRecvForward, 1, false),
                compute(Op::kForward, 1), compute(Op::kBackward, 1)};
  EXPECT_THAT(error_of([&] { check(s); }),
              HasSubstr("rank 1 posts 1SEND_B0 before it computes what it sends"));
}

TEST(PipelineSchedule, AComputeWithoutItsReceiveOrASendNeverMatchedIsAnError) {
  Schedule s = two_ranks();
  s.steps[0] = {compute(Op::kForward, 0), transfer(Op::kSendForward, 0, false),
                transfer(Op::kRecvBackward, 0, false), compute(Op::kBackward, 0)};
  s.steps[1] = {compute(Op::kForward, 1), compute(Op::kBackward, 1)};
  EXPECT_THAT(error_of([&] { check(s); }),
              HasSubstr("rank 1 runs 1F0, whose input from stage 0 on rank 0 no earlier step of "
                        "rank 1 receives (1RECV_F0 missing)"));
  s.steps[1] = {transfer(Op::kRecvForward, 1, false), compute(Op::kForward, 1),
                compute(Op::kBackward, 1), transfer(Op::kSendBackward, 1, false)};
  EXPECT_NO_THROW(check(s));
  s.steps[0].erase(s.steps[0].begin() + 2);
  EXPECT_THAT(error_of([&] { check(s); }),
              HasSubstr("rank 0 runs 0B0, whose input from stage 1 on rank 1 no earlier step of "
                        "rank 0 receives (0RECV_B0 missing)"));
  s.steps[0].push_back(transfer(Op::kRecvBackward, 0, false));
  EXPECT_THAT(error_of([&] { check(s); }),
              HasSubstr("rank 0 runs 0B0, whose input from stage 1 on rank 1 no earlier step"));
  s.steps[0] = {compute(Op::kForward, 0), transfer(Op::kSendForward, 0, false),
                transfer(Op::kRecvBackward, 0, false), compute(Op::kBackward, 0)};
  s.steps[1].insert(s.steps[1].begin(), transfer(Op::kRecvForward, 1, false));
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("rank 1 posts 1RECV_F0 a second time"));
  s.steps[1].erase(s.steps[1].begin());
  s.steps[1].push_back(transfer(Op::kSendForward, 1, false));
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("1SEND_F0 has no stage to match it"));
}

TEST(PipelineSchedule, MisplacedRepeatedOrMissingActionsAreErrors) {
  Schedule s = two_ranks();
  s.steps[0] = {compute(Op::kForward, 1)};
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("rank 0 runs 1F0, but stage 1 is on rank 1"));
  s.steps[0] = {compute(Op::kForward, 0), compute(Op::kForward, 0)};
  s.steps[1] = {};
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("rank 0 runs 0F0 a second time"));
  s.steps[0] = {compute(Op::kForward, 0)};
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("stage 0 never runs its input backward"));
  s.steps[0] = {compute(Op::kBackwardWeight, 0)};
  EXPECT_THAT(error_of([&] { check(s); }),
              HasSubstr("rank 0 runs 0W0 before the input backward of its micro-batch"));
}

TEST(PipelineSchedule, MalformedSchedulesAndCostsAreRefusedNamingWhat) {
  Schedule s = two_ranks();
  s.steps.pop_back();
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("hand: 2 ranks but steps for 1"));
  s = two_ranks();
  s.stage_rank = {0, 5};
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("stage 1 is on rank 5, not one of the 2"));
  s = two_ranks();
  s.microbatches = 0;
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("2 stages x 0 micro-batches"));
  s = two_ranks();
  s.steps[0] = {Step{Step::Kind::kOverlapped, {Action{Op::kForward, 0, 0}}, false}};
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("rank 0: a step of 1 actions"));
  s.steps[0] = {Step{Step::Kind::kTransfers, {Action{Op::kForward, 0, 0}}, false}};
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("rank 0: 0F0 in a transfer step"));
  s.steps[0] = {compute(Op::kSendForward, 0)};
  EXPECT_THAT(error_of([&] { check(s); }), HasSubstr("rank 0: 0SEND_F0 in a compute step"));
  s.steps[0] = {Step{Step::Kind::kCompute, {Action{Op::kForward, 0, 3}}, false}};
  EXPECT_THAT(error_of([&] { check(s); }),
              HasSubstr("rank 0: 0F3 names a stage or micro-batch the schedule does not have (2 "
                        "stages, 1 micro-batches)"));
  s = Schedule{"v", 1, 2, 1, {0, 0}, {{transfer(Op::kSendForward, 0, false)}}};
  EXPECT_THAT(error_of([&] { check(s); }),
              HasSubstr("rank 0: 0SEND_F0 is a transfer to its own rank (stages 0 and 1"));
  // Costs: a negative or NaN time, or a missing one.
  Costs c = unit_costs();
  c.forward = [](int) { return std::nan(""); };
  EXPECT_THAT(error_of([&] { simulate(gpipe(2, 1), c); }), HasSubstr("a cost of nan"));
  c = unit_costs();
  c.transfer = [](Op, int) { return -1.0; };
  EXPECT_THAT(error_of([&] { simulate(gpipe(2, 1), c); }),
              HasSubstr("a transfer time of -1 for 0SEND_F0"));
  c.forward = nullptr;
  EXPECT_THAT(error_of([&] { simulate(gpipe(2, 1), c); }), HasSubstr("the costs need a forward"));
  // Sizes past the bounds.
  EXPECT_THAT(error_of([] { gpipe(1000, 1001); }),
              HasSubstr("1000 stages x 1001 micro-batches = 1001000 stage micro-batches; at most "
                        "1000000"));
  EXPECT_THAT(error_of([] { interleaved_1f1b(4, 1, 8); }), HasSubstr("1 virtual stages per rank"));
}

TEST(PipelineSchedule, EveryGeneratedScheduleCompletes) {
  for (const std::string& which : schedule_names())
    for (const int p : {1, 2, 3, 5, 8})
      for (const int m : {2 * p, 4 * p, 4 * p + 1}) {
        const int v = which == "interleaved" ? 2 : 1;
        if (which == "interleaved" && m % p) continue;
        SCOPED_TRACE(which + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const Schedule s = make_schedule(which, p, m, v);
        EXPECT_NO_THROW(check(s));
      }
}

TEST(PipelineSchedule, MutatedSchedulesCompleteOrAreRefusedNeverHang) {
  // Random edits of valid schedules (a step moved, dropped or repeated, a wait flipped, an
  // action's micro-batch changed): check() either completes, with every rank's time at least
  // its work, or throws an Error; never anything else.
  std::mt19937 rng(42);
  const std::vector<Schedule> bases = {one_f_one_b(3, 4), dualpipe_v(2, 4),
                                       interleaved_1f1b(2, 2, 4), zero_bubble_h1(3, 3)};
  int completed = 0;
  int refused = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Schedule s = bases[trial % bases.size()];
    auto& steps = s.steps[rng() % s.ranks];
    const std::size_t i = rng() % steps.size();
    const std::size_t j = rng() % steps.size();
    switch (rng() % 5) {
      case 0: std::swap(steps[i], steps[j]); break;
      case 1: steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(i)); break;
      case 2: steps.insert(steps.begin() + static_cast<std::ptrdiff_t>(j), steps[i]); break;
      case 3: steps[i].wait = !steps[i].wait; break;
      default: steps[i].actions[0].microbatch = static_cast<int>(rng() % 6) - 1; break;
    }
    try {
      const Timeline t = simulate(s, unit_costs());
      for (int r = 0; r < s.ranks; ++r) EXPECT_GE(t.makespan, t.busy[r]);
      ++completed;
    } catch (const Error&) {
      ++refused;
    }
  }
  // Both outcomes occur (a swap of two independent steps keeps a schedule valid).
  EXPECT_GT(completed, 20);
  EXPECT_GT(refused, 100);
}

}  // namespace
}  // namespace shardplan::pipeline
