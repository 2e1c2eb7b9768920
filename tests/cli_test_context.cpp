// train-plan with a context axis: ring attention (context parallelism) planned, said in the
// header and the JSON, and how its key/value blocks move (--cp-rotate).
#include "cli_test.hpp"

namespace shardplan {
namespace {

using namespace test;

// A cp axis: context parallelism (ring attention), said in the header and the JSON; the weights
// sharded over fsdp and cp together, so each device holds 1/8 of what fsdp:2 alone gives it
// (LLaMA-2-7B's widths, two layers: the parameters are bf16 [hidden or vocab, ...] matrices and
// norms; fsdp:2,cp:4 splits the matrices 8 ways where fsdp:2 splits them 2 ways: 1/4).
TEST_F(TrainPlanCli, ContextAxisPlansRingAttentionAndShardsTheWeightsOverIt) {
  const auto plan = [&](const char* mesh) {
    const Result r = run(fmt::format("train-plan --config '{}' --mesh {} --batch 2 --seq 256 --json",
                                     llama().string(), mesh));
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json cp = plan("fsdp:2,cp:4"), dp = plan("fsdp:2");
  EXPECT_EQ(cp["context_axes"], nlohmann::json::array({"cp"}));
  EXPECT_EQ(dp["context_axes"], nlohmann::json::array());
  EXPECT_THAT(cp["rules_note"].get<std::string>(),
              ::testing::HasSubstr("the weights sharded over fsdp and cp together"));
  const double ratio = cp["per_device"]["parameter_bytes"].get<double>() /
                       dp["per_device"]["parameter_bytes"].get<double>();
  EXPECT_NEAR(ratio, 0.25, 0.001);
  const Result text = run(fmt::format("train-plan --config '{}' --mesh fsdp:2,cp:4 --batch 2 --seq 256",
                                      llama().string()));
  EXPECT_THAT(text.out, ::testing::HasSubstr(
                            "context parallel over cp (ring attention, load-balanced order)"));
  const Result odd = run(fmt::format("train-plan --config '{}' --mesh fsdp:2,cp:4 --batch 2 --seq 100",
                                     llama().string()));
  EXPECT_EQ(odd.code, 1);
  EXPECT_THAT(odd.err, ::testing::HasSubstr("100 tokens"));
}

// --cp-rotate allgather: the ring's blocks all-gathered, read from the program. Per layer, on
// cp:4 (n = 4), one key/value block is [1 example, 64 tokens, 32 heads, k and v, 128] bf16 =
// 1 MiB; permuting sends it 10 times (3 forward, 3 + 3 backward with the gradients, 1 home),
// gathering sends 4 (the gradients' ring) and gathers twice 3 blocks: 6 MiB per layer moves from
// ppermute to all-gather.
TEST_F(TrainPlanCli, CpRotateAllGatherGathersTheBlocksOnceEachWay) {
  const std::string base = fmt::format(
      "train-plan --config '{}' --mesh fsdp:2,cp:4 --batch 2 --seq 256 --json", llama().string());
  const auto plan = [&](const std::string& extra) {
    const Result r = run(base + extra);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json permute = plan(""), gather = plan(" --cp-rotate allgather");
  EXPECT_EQ(permute["context_rotate"], "permute");
  EXPECT_EQ(gather["context_rotate"], "allgather");
  const auto moved = [](const nlohmann::json& j, const char* kind) {
    return j["bytes_received_per_device"][kind].get<std::int64_t>();
  };
  const std::int64_t block = 1 * 64 * 32 * 2 * 128 * 2, layers = 2;
  EXPECT_EQ(moved(permute, "permute") - moved(gather, "permute"), 6 * block * layers);
  EXPECT_EQ(moved(gather, "all_gather") - moved(permute, "all_gather"), 6 * block * layers);
  const Result text = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:2,cp:4 --batch 2 --seq 256 --cp-rotate allgather",
      llama().string()));
  EXPECT_THAT(text.out, ::testing::HasSubstr("(ring attention, key/value blocks all-gathered, "
                                             "load-balanced order)"));
  // No context axis: no ring to rotate. Given, the option would change nothing: refused by name
  // (exit 2); set by a stack (torchtitan's allgather), it is that stack's default there: planned,
  // and no rotation reported.
  const std::string flat = fmt::format(
      "train-plan --config '{}' --mesh fsdp:2 --batch 2 --seq 256 --json", llama().string());
  const Result given = run(flat + " --cp-rotate allgather");
  EXPECT_EQ(given.code, 2);
  EXPECT_THAT(given.err, ::testing::HasSubstr("--cp-rotate allgather is refused"));
  EXPECT_THAT(given.err, ::testing::HasSubstr("the mesh Mesh('fsdp': 2) has no cp or context axis"));
  const Result stacked = run(flat + " --stack torchtitan-2024-12");
  ASSERT_EQ(stacked.code, 0) << stacked.err;
  const nlohmann::json sj = nlohmann::json::parse(stacked.out);
  EXPECT_TRUE(sj["context_rotate"].is_null());
  EXPECT_THAT(sj["stack"]["applied"].dump(), ::testing::HasSubstr("--cp-rotate allgather"));
  const Result bad = run(base + " --cp-rotate alltoall");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, ::testing::HasSubstr("--cp-rotate"));
  EXPECT_THAT(bad.err, ::testing::HasSubstr("known: permute, allgather"));
}

}  // namespace
}  // namespace shardplan
