// train-plan with a context axis: ring attention (context parallelism) planned, said in the
// header and the JSON, and how its key/value blocks move (--cp-rotate); the other kernels
// (--cp-kernel allgather-kv, ulysses), their bytes and memory counted by hand.
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

// --cp-kernel, on LLaMA-2-7B's widths (two layers), fsdp:2 x cp:4, batch 2 x 256 tokens: a
// device's block of q, k or v is [1 example, 64 tokens, 32 heads, 128] bf16 = 0.5 MiB.
// All-gather of K/V, per layer: k and v gathered (3 blocks of 0.5 MiB received for each: 3 MiB),
// dk and dv reduce-scattered (the same 3 MiB), no ppermute (the ring's 10 x 1 MiB); it keeps the
// whole sequence's k and v [1, 256, 32, 128] (2 MiB each) for the backward pass where the ring
// keeps its packed k, v block (1 MiB): 3 MiB more per layer at the peak (the start of the
// backward pass). Ulysses, per layer: 8 all-to-alls (q, k, v, the output and their transposes)
// of a 0.5 MiB block, each keeping 1/4 and receiving 3/4: 3 MiB; what it keeps (q, k, v split
// over the heads) is the size of the ring's q and packed k, v: the same peak.
TEST_F(TrainPlanCli, CpKernelsMoveAndHoldWhatEachKernelDoes) {
  const std::string base = fmt::format(
      "train-plan --config '{}' --mesh fsdp:2,cp:4 --batch 2 --seq 256 --json", llama().string());
  const auto plan = [&](const std::string& extra) {
    const Result r = run(base + extra);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json ring = plan(""), gather = plan(" --cp-kernel allgather-kv"),
                       ulysses = plan(" --cp-kernel ulysses");
  EXPECT_EQ(ring["context_kernel"], "ring");
  EXPECT_EQ(gather["context_kernel"], "allgather-kv");
  EXPECT_EQ(ulysses["context_kernel"], "ulysses");
  EXPECT_TRUE(gather["context_rotate"].is_null());
  EXPECT_EQ(gather["context_axes"], nlohmann::json::array({"cp"}));
  const auto moved = [](const nlohmann::json& j, const char* kind) {
    const auto& b = j["bytes_received_per_device"];
    return b.contains(kind) ? b[kind].get<std::int64_t>() : 0;
  };
  const std::int64_t mib = 1 << 20, layers = 2;
  EXPECT_EQ(moved(ring, "permute"), 10 * mib * layers);
  EXPECT_EQ(moved(gather, "permute"), 0);
  EXPECT_EQ(moved(gather, "all_gather") - moved(ring, "all_gather"), 3 * mib * layers);
  EXPECT_EQ(moved(gather, "reduce_scatter") - moved(ring, "reduce_scatter"), 3 * mib * layers);
  EXPECT_EQ(moved(ulysses, "all_to_all") - moved(ring, "all_to_all"), 3 * mib * layers);
  EXPECT_EQ(moved(ulysses, "permute"), 0);
  const auto peak = [](const nlohmann::json& j) {
    return j["per_device"]["peak_bytes"].get<std::int64_t>();
  };
  EXPECT_EQ(peak(gather) - peak(ring), 3 * mib * layers);
  EXPECT_EQ(peak(ulysses), peak(ring));
  const std::string text_base = fmt::format(
      "train-plan --config '{}' --mesh fsdp:2,cp:4 --batch 2 --seq 256", llama().string());
  EXPECT_THAT(run(text_base + " --cp-kernel allgather-kv").out,
              ::testing::HasSubstr("(keys and values all-gathered, load-balanced order)"));
  EXPECT_THAT(run(text_base + " --cp-kernel ulysses").out,
              ::testing::HasSubstr("(Ulysses: q, k, v and the output by all-to-all over the "
                                   "heads, load-balanced order)"));
  // No context axis: no kernel (null), and one given is refused.
  const Result flat = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:2 --batch 2 --seq 256 --json", llama().string()));
  ASSERT_EQ(flat.code, 0) << flat.err;
  EXPECT_TRUE(nlohmann::json::parse(flat.out)["context_kernel"].is_null());
  const Result given = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:2 --batch 2 --seq 256 --cp-kernel ulysses",
      llama().string()));
  EXPECT_EQ(given.code, 2);
  EXPECT_THAT(given.err, ::testing::HasSubstr("--cp-kernel allgather-kv, ulysses is refused"));
  EXPECT_THAT(given.err, ::testing::HasSubstr("has no cp or context axis"));
}

TEST_F(TrainPlanCli, CpKernelBadInputIsNamed) {
  const std::string base = fmt::format(
      "train-plan --config '{}' --mesh fsdp:2,cp:4 --batch 2 --seq 256", llama().string());
  const Result unknown = run(base + " --cp-kernel a2a");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err, ::testing::HasSubstr("--cp-kernel"));
  EXPECT_THAT(unknown.err, ::testing::HasSubstr("'a2a'"));
  EXPECT_THAT(unknown.err, ::testing::HasSubstr("known: ring, allgather-kv, ulysses"));
  // The rotation is the ring's.
  const Result rotate = run(base + " --cp-kernel allgather-kv --cp-rotate allgather");
  EXPECT_EQ(rotate.code, 2);
  EXPECT_THAT(rotate.err, ::testing::HasSubstr("--cp-rotate is refused"));
  EXPECT_THAT(rotate.err,
              ::testing::HasSubstr("--cp-rotate allgather with --cp-kernel allgather-kv"));
  // 32 query heads and 2 key/value heads: the key/value heads do not split over cp:4.
  const fs::path gqa = config(R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
      "intermediate_size": 11008, "num_hidden_layers": 2, "num_attention_heads": 32,
      "num_key_value_heads": 2})",
                              "gqa.json");
  const Result heads = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:2,cp:4 --batch 2 --seq 256 --cp-kernel ulysses",
      gqa.string()));
  EXPECT_EQ(heads.code, 2);
  EXPECT_THAT(heads.err, ::testing::HasSubstr("--cp-kernel ulysses is refused"));
  EXPECT_THAT(heads.err, ::testing::HasSubstr("32 query heads and 2 key/value heads"));
  EXPECT_THAT(heads.err, ::testing::HasSubstr("the 4 devices of 'cp'"));
  // With tp:2 a device holds 16 query heads and 1 key/value head, which cp:2 does not split.
  const Result tp = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:2,cp:2,tp:2 --batch 2 --seq 256 "
      "--cp-kernel ulysses",
      gqa.string()));
  EXPECT_EQ(tp.code, 2);
  EXPECT_THAT(tp.err, ::testing::HasSubstr("(16 and 1 per device over 2 model-parallel devices)"));
}

}  // namespace
}  // namespace shardplan
