// Schedules from torch.distributed.pipelining's CSV format (PipelineScheduleMulti._dump_csv).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "shardplan/error.hpp"
#include "shardplan/pipeline_schedule.hpp"

namespace shardplan::pipeline {
namespace {

using ::testing::HasSubstr;

std::string csv_error(std::string_view text) {
  try {
    parse_csv(text, "plan.csv");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// to_text without its first line (the name, which is the CSV's origin after a parse).
std::string steps_of(const Schedule& s) {
  const std::string text = to_text(s);
  return text.substr(text.find('\n') + 1);
}

TEST(PipelineScheduleCsv, GeneratedSchedulesRoundTrip) {
  for (const Schedule& s : {gpipe(3, 4), one_f_one_b(4, 8), interleaved_1f1b(2, 3, 4),
                            zero_bubble_h1(3, 5)}) {
    SCOPED_TRACE(s.name);
    const Schedule back = parse_csv(to_csv(s), "generated.csv");
    EXPECT_EQ(back.ranks, s.ranks);
    EXPECT_EQ(back.stages, s.stages);
    EXPECT_EQ(back.microbatches, s.microbatches);
    EXPECT_EQ(back.stage_rank, s.stage_rank);
    EXPECT_EQ(steps_of(back), steps_of(s));
  }
}

TEST(PipelineScheduleCsv, TorchsSpellingWithIdleCellsAndCrLf) {
  // Two ranks, rank 1's first slot idle, as torch's _dump_csv writes a 1F1B of 2 micro-batches.
  const Schedule s = parse_csv("0F0,0F1,,0B0,0B1\r\n,1F0,1B0,1F1,1B1\r\n", "hand.csv");
  EXPECT_EQ(s.name, "hand.csv");
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.stages, 2);
  EXPECT_EQ(s.microbatches, 2);
  EXPECT_EQ(steps_of(s),
            "rank 0: 0F0 {0SEND_F0} 0F1 {0SEND_F1} {0RECV_B0} 0B0 {0RECV_B1} 0B1\n"
            "rank 1: {1RECV_F0} 1F0 1B0 {1SEND_B0} {1RECV_F1} 1F1 1B1 {1SEND_B1}\n");
  EXPECT_EQ(simulate(s, unit_costs()).makespan, 9.0);
}

TEST(PipelineScheduleCsv, RowsWithTheirOwnTransfersKeepThem) {
  const Schedule s =
      parse_csv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n", "comms.csv");
  EXPECT_EQ(steps_of(s),
            "rank 0: 0F0 {0SEND_F0} {0RECV_B0} 0B0\n"
            "rank 1: {1RECV_F0} 1F0 1B0 {1SEND_B0}\n");
  EXPECT_THAT(csv_error("0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"),
              HasSubstr("plan.csv: the schedule does not complete: rank 0 at step 2 (0B0) waits "
                        "for 1SEND_B0 of rank 1 (its step 3; it is at step 1); rank 1 at step 1 "
                        "(1F0) waits for 0SEND_F0 of rank 0, which rank 0 never posts"));
}

TEST(PipelineScheduleCsv, BadCellsAreNamedWithLineAndColumn) {
  EXPECT_THAT(csv_error("0F0,0X0\n"), HasSubstr("plan.csv:1:5: '0X0' has no action type"));
  EXPECT_THAT(csv_error("F0\n"), HasSubstr("plan.csv:1:1: 'F0' is not an action"));
  EXPECT_THAT(csv_error("0F0,0B\n"), HasSubstr("'0B' does not end in its micro-batch number"));
  EXPECT_THAT(csv_error("0F0,0Fx\n"), HasSubstr("'0Fx' does not end in its micro-batch"));
  EXPECT_THAT(csv_error("0UNSHARD\n"), HasSubstr("FSDP's UNSHARD actions in a schedule are not "
                                                 "modelled"));
  EXPECT_THAT(csv_error("0F99999999999\n"), HasSubstr("micro-batches up to 999999"));
  EXPECT_THAT(csv_error("0F0,0B0\n0F1\n"),
              HasSubstr("plan.csv:2:1: stage 0 is in row 2 (rank 1) and in row 1 (line 1)"));
  EXPECT_THAT(csv_error("0F0,0B0\n2F0,2B0\n"), HasSubstr("stage 1 has no action, but stage 2 "
                                                         "has"));
  EXPECT_THAT(csv_error(""), HasSubstr("plan.csv: no actions"));
  EXPECT_THAT(csv_error("\n\n"), HasSubstr("no actions"));
  EXPECT_THAT(csv_error("0F\xff\n"), HasSubstr("'0F\\xff' does not end"));
  EXPECT_THAT(csv_error("0F0\n"), HasSubstr("stage 0 never runs its input backward of "
                                            "micro-batch 0"));
  EXPECT_THAT(csv_error("0F0,0F0,0B0\n"), HasSubstr("rank 0 runs 0F0 a second time"));
}

}  // namespace
}  // namespace shardplan::pipeline
