// `train-plan --remat STACK:NAME`: a stack's own policy name saves what its list names, of the
// names the model's layer gives (as JAX's save_only_these_names ignores the others); bad names
// are refused naming the known ones, and a policy that cannot be planned says why.
#include "cli_test.hpp"

namespace shardplan {
namespace {

using namespace test;

class StackRematCli : public TrainPlanCli {
 protected:
  // A small LLaMA and a small GPT-2 (two layers each, planned in well under a second).
  std::string llama_cmd() const {
    return fmt::format("train-plan -c '{}' --mesh fsdp:4 --batch 8 --seq 64",
                       small_llama(2).string());
  }
  std::string gpt2_cmd() const {
    const fs::path c = config(R"({"model_type": "gpt2", "vocab_size": 1024, "n_embd": 256,
      "n_layer": 2, "n_head": 4, "n_positions": 256})",
                              "gpt2.json");
    return fmt::format("train-plan -c '{}' --mesh fsdp:4 --batch 8 --seq 64", c.string());
  }
  nlohmann::json plan(const std::string& cmd, const std::string& remat) const {
    const Result r = run(fmt::format("{} --json --remat {}", cmd, remat));
    EXPECT_EQ(r.code, 0) << remat << "\n" << r.err;
    return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json{};
  }
};

// MaxText's minimal_policy lists query_proj, value_proj, key_proj, kv_proj, qkv_proj, out_proj,
// mlpwi_0, mlpwi_1, mlpwi, mlpwo (decoders.py). The LLaMA layer gives seven of them (no kv_proj,
// qkv_proj, mlpwi), GPT-2's four (qkv_proj, out_proj, mlpwi, mlpwo): the step is the one those
// names alone, written out (and each checked to exist by names:), plan. The list is read: without
// the MLP's first product (mlpwi_0, GPT-2's mlpwi) its matmul is recomputed, 2 x 128 tokens a
// device x 256 x its width (512; GPT-2's 4 x 256) FLOPs in each of the 2 layers.
TEST_F(StackRematCli, MaxTextMinimalSavesTheNamesEachLayerGives) {
  const struct {
    std::string cmd, by_hand, without_wi;
    double wi_flops;
  } cases[] = {
      {llama_cmd(), "names:query_proj,key_proj,value_proj,out_proj,mlpwi_0,mlpwi_1,mlpwo",
       "names:query_proj,key_proj,value_proj,out_proj,mlpwi_1,mlpwo", 2.0 * 128 * 256 * 512 * 2},
      {gpt2_cmd(), "names:qkv_proj,out_proj,mlpwi,mlpwo", "names:qkv_proj,out_proj,mlpwo",
       2.0 * 128 * 256 * 1024 * 2},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.by_hand);
    const nlohmann::json stack = plan(c.cmd, "maxtext:minimal"), hand = plan(c.cmd, c.by_hand);
    EXPECT_EQ(stack["remat"], "maxtext:minimal");  // the form given
    EXPECT_EQ(stack["per_device"], hand["per_device"]);
    EXPECT_EQ(stack["bytes_received_per_device"], hand["bytes_received_per_device"]);
    EXPECT_EQ(plan(c.cmd, c.without_wi)["per_device"]["matmul_flops"].get<double>() -
                  stack["per_device"]["matmul_flops"].get<double>(),
              c.wi_flops);
  }
  // minimal_with_context saves the attention's output too: [2 sequences a device, 64, 256] bf16
  // in each of the 2 layers more at the peak (both layers' saved values are live there).
  const nlohmann::json with_context = plan(llama_cmd(), "maxtext:minimal_with_context");
  EXPECT_EQ(with_context["per_device"]["peak_computed_bytes"].get<std::int64_t>() -
                plan(llama_cmd(), "maxtext:minimal")["per_device"]["peak_computed_bytes"]
                    .get<std::int64_t>(),
            2 * 64 * 256 * 2 * 2);
  // The step line says the form given and what its list saves.
  const Result text = run(llama_cmd() + " --remat maxtext:save_out_proj");
  EXPECT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, ::testing::HasSubstr("remat maxtext:save_out_proj (saves those of out_proj "
                                             "the layer gives)"));
}

// torchtitan's op SAC is the five names docs/validation.md spells out; each stack's "full" is
// --remat full (each layer keeps its input).
TEST_F(StackRematCli, TorchtitanAndMegatronNamesPlanAsTheirSettings) {
  const nlohmann::json op = plan(llama_cmd(), "torchtitan:op");
  EXPECT_EQ(op["remat"], "torchtitan:op");
  EXPECT_EQ(op["per_device"],
            plan(llama_cmd(), "names:query_proj,value_proj,context,mlpwi_0,mlpwo")["per_device"]);
  const nlohmann::json full = plan(llama_cmd(), "full");
  for (const char* name : {"maxtext:full", "torchtitan:full", "megatron:full"}) {
    SCOPED_TRACE(name);
    const nlohmann::json p = plan(llama_cmd(), name);
    EXPECT_EQ(p["remat"], "full");
    EXPECT_EQ(p["per_device"], full["per_device"]);
  }
}

// An unknown stack name lists the known ones; megatron:selective is refused saying why; names:
// keeps refusing a name the layer does not give (a typo), which a stack's list ignores.
TEST_F(StackRematCli, BadNamesAreRefused) {
  const Result unknown = run(llama_cmd() + " --remat maxtext:minimall");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err, ::testing::HasSubstr("--remat"));
  EXPECT_THAT(unknown.err, ::testing::HasSubstr("unknown stack remat policy 'maxtext:minimall'"));
  EXPECT_THAT(unknown.err, ::testing::HasSubstr("maxtext:minimal, maxtext:minimal_with_context"));
  EXPECT_THAT(unknown.err, ::testing::HasSubstr("torchtitan:op"));
  const Result selective = run(llama_cmd() + " --remat megatron:selective");
  EXPECT_EQ(selective.code, 2);
  EXPECT_THAT(selective.err, ::testing::HasSubstr("'megatron:selective' cannot be planned"));
  EXPECT_THAT(selective.err, ::testing::HasSubstr("core attention only"));
  EXPECT_THAT(selective.err, ::testing::HasSubstr("recompute_modules ['core_attn']"));
  const Result typo = run(llama_cmd() + " --remat names:query_proj,kv_proj");
  EXPECT_EQ(typo.code, 1);
  EXPECT_THAT(typo.err, ::testing::HasSubstr("no checkpoint_name inside the checkpointed function "
                                             "gives 'kv_proj'"));
}

}  // namespace
}  // namespace shardplan
