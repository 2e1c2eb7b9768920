// `shardplan train-plan --from-config` / `--emit-config` (stack_config.hpp): the config written
// for a plan plans the same step when read back, per stack; options given override the file;
// bad inputs and outputs are refused naming them.
#include <sys/stat.h>

#include <fstream>

#include "cli_test.hpp"
#include "shardplan/stack_config.hpp"
#include "shardplan/training_stack.hpp"

namespace shardplan {
namespace {

using namespace test;
using ::testing::HasSubstr;

class StackConfigCli : public TrainPlanCli {
 protected:
  std::string model() const {
    return fmt::format("train-plan --config '{}' --json", small_llama().string());
  }
  nlohmann::json plan_of(const std::string& args) const { return plan_json(args); }
  std::string read(const fs::path& p) const {
    std::ifstream in(p);
    return {std::istreambuf_iterator<char>(in), {}};
  }
};

// A plan's options under a stack; `devices` is what the file cannot say (Megatron's DP size).
struct RoundTrip {
  std::string stack, options, devices;
};

const std::vector<RoundTrip>& round_trips() {
  static const std::vector<RoundTrip> cases = {
      {"torchtitan-2024-07", "--mesh fsdp:4 --batch 8 --seq 64 --float8", ""},
      {"torchtitan-2024-12",
       "--mesh dp:2,fsdp:2,tp:2 --batch 8 --seq 64 --remat none --compile --async-tp", ""},
      {"torchtitan-2025-06",
       "--mesh fsdp:4 --batch 16 --seq 64 --grad-accum 2 --no-reshard-after-forward", ""},
      {"torchtitan-2025-08",
       "--mesh fsdp:2,tp:2 --batch 8 --seq 64 --remat full --remat-blocks every:2", ""},
      {"torchtitan-2025-06", "--mesh fsdp:2,tp:2 --batch 8 --seq 64 --compile --async-tp", ""},
      {"torchtitan-2024-07", "--mesh fsdp:2,tp:2 --batch 8 --seq 64 --compile --async-tp", ""},
      {"megatron-core",
       "--mesh dp:2,tp:2 --batch 8 --seq 64 --grad-accum 2 --remat full --remat-blocks layers:0-0",
       "--devices 4"},
      {"megatron-core", "--mesh dp:2,tp:2 --batch 8 --seq 64 --async-tp", "--devices 4"},
      {"megatron-core",
       "--mesh fsdp:4 --batch 8 --seq 64 --sequence-parallel off --optimizer-sharding zero1",
       "--devices 4"},
      {"megatron-core", "--mesh dp:2,cp:2 --batch 8 --seq 64 --cp-kernel allgather-kv",
       "--devices 4"},
      {"megatron-core", "--mesh dp:2,cp:2 --batch 8 --seq 64 --cp-kernel ulysses", "--devices 4"},
      // The data-parallel overlap (its time compared: --hardware on both sides).
      {"megatron-core",
       "--mesh fsdp:4 --batch 8 --seq 64 --sequence-parallel off --optimizer-sharding zero1 "
       "--hardware h100-sxm --dp-overlap buckets --dp-bucket-size 100000",
       "--devices 4 --hardware h100-sxm"},
      {"megatron-core",
       "--mesh fsdp:4 --batch 8 --seq 64 --sequence-parallel off --optimizer-sharding zero1 "
       "--hardware h100-sxm --dp-overlap grad-buckets",
       "--devices 4 --hardware h100-sxm"},
      {"megatron-core", "--mesh dp:4 --batch 8 --seq 64 --hardware h100-sxm --dp-overlap buckets",
       "--devices 4 --hardware h100-sxm"},
      {"megatron-core", "--mesh dp:4 --batch 8 --seq 64 --hardware h100-sxm",
       "--devices 4 --hardware h100-sxm"},
      {"maxtext", "--mesh fsdp:2,tp:2 --batch 8 --seq 64 --grad-accum 2 --remat maxtext:minimal",
       ""},
      // float8's recipe and all-gather dtype (recipe_name, enable_fsdp_float8_all_gather).
      {"torchtitan-2025-08", "--mesh fsdp:4 --batch 8 --seq 64 --float8 --float8-recipe rowwise",
       ""},
      {"torchtitan-2024-12", "--mesh fsdp:4 --batch 8 --seq 64 --float8 --float8-all-gather bf16",
       ""},
  };
  return cases;
}

class StackConfigRoundTrip : public StackConfigCli,
                             public ::testing::WithParamInterface<RoundTrip> {};

// The config written for a plan, read back under the same stack, plans the same step (each key
// the writer writes is one the reader plans, and nothing else moves).
TEST_P(StackConfigRoundTrip, TheConfigWrittenForAPlanPlansTheSameStep) {
  const RoundTrip& c = GetParam();
  const fs::path file = dir_ / ("emitted." + c.stack);
  const auto planned = plan_of(fmt::format("{} --stack {} {} --emit-config '{}'", model(), c.stack,
                                           c.options, file.string()));
  ASSERT_TRUE(fs::exists(file));
  const auto again = plan_of(fmt::format("{} --stack {} --from-config '{}' {}", model(), c.stack,
                                         file.string(), c.devices));
  EXPECT_EQ(planned, again) << read(file);
}

std::string round_trip_name(const ::testing::TestParamInfo<RoundTrip>& p) {
  std::string n = p.param.stack + "_" + std::to_string(p.index);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

INSTANTIATE_TEST_SUITE_P(EachStack, StackConfigRoundTrip, ::testing::ValuesIn(round_trips()),
                         round_trip_name);

// Every stack with a config format has a round trip.
TEST(StackConfigRoundTrips, CoverEveryStackWithAConfigFormat) {
  for (const TrainingStack& s : training_stacks()) {
    const bool covered = std::any_of(round_trips().begin(), round_trips().end(),
                                     [&](const RoundTrip& c) { return c.stack == s.name; });
    EXPECT_EQ(covered, !stack_config_format(s).empty()) << s.name;
  }
}

// The report lists each key: planned (as the option), overridden by an option given, ignored
// with the reason; options given override the file as they override a stack.
TEST_F(StackConfigCli, OptionsGivenOverrideTheFileAndTheReportListsEveryKey) {
  const std::string toml =
      std::string(SHARDPLAN_SOURCE_DIR) + "/tests/data/stack_configs/llama3_8b.toml";
  const Result r = run(
      fmt::format("{} --from-config '{}' --devices 4 --seq 128 --master-dtype f32", model(), toml));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("seq"), 128);  // the file's 8192 overridden
  // local_batch_size 1 on fsdp:4 (data_parallel_shard_degree -1 over 4 devices).
  EXPECT_EQ(j.at("batch"), 4);
  EXPECT_EQ(j.at("remat"), "torchtitan:op");
  const auto& s = j.at("stack");
  EXPECT_EQ(s.at("name"), "torchtitan-2025-08");  // from the extension
  const auto& cfg = s.at("config");
  EXPECT_EQ(cfg.at("file"), toml);
  EXPECT_THAT(cfg.at("applied").dump(), HasSubstr("stack torchtitan-2025-08 (from the extension"));
  EXPECT_THAT(cfg.at("applied").dump(), HasSubstr("compile.enable = false: --eager"));
  EXPECT_THAT(cfg.at("overridden").dump(), HasSubstr("training.seq_len = 8192 (by --seq)"));
  EXPECT_THAT(cfg.at("ignored").dump(), HasSubstr("model.flavor = 8B (the model is --config's)"));
  EXPECT_THAT(cfg.at("ignored").dump(), HasSubstr("optimizer.lr = 0.0003 (a value of the update"));
  // The stack's choices the file's keys set are overridden by them, named.
  EXPECT_THAT(s.at("overridden").dump(),
              HasSubstr("activation checkpointing (by " + toml + ": activation_checkpoint.mode"));
  // Every key of the file is somewhere in the record (never dropped silently).
  const std::string record = cfg.dump();
  for (const char* key :
       {"job.dump_folder", "job.description", "metrics.log_freq", "model.name", "model.flavor",
        "optimizer.name", "optimizer.lr", "training.local_batch_size", "training.seq_len",
        "training.max_norm", "training.steps", "parallelism.data_parallel_replicate_degree",
        "parallelism.data_parallel_shard_degree", "parallelism.tensor_parallel_degree",
        "compile.enable", "activation_checkpoint.mode",
        "activation_checkpoint.selective_ac_option"}) {
    EXPECT_THAT(record, HasSubstr(std::string(key) + " = ")) << key;
  }
}

// One dtype option given overrides all of the file's dtypes (as it does a stack's precision);
// --explain shows the stack's choices the file's keys override, and needs no --devices.
TEST_F(StackConfigCli, ADtypeGivenOverridesTheFilesPrecision) {
  const fs::path f32 = config(
      "[training]\nmixed_precision_param = \"float32\"\nlocal_batch_size = 2\n"
      "[parallelism]\ndata_parallel_shard_degree = 4\n",
      "f32.toml");
  const auto file =
      nlohmann::json::parse(run(fmt::format("{} --from-config '{}'", model(), f32.string())).out);
  EXPECT_EQ(file.at("param_dtype"), "f32");
  EXPECT_EQ(file.at("batch"), 8);  // 2 per rank x 4
  const Result r =
      run(fmt::format("{} --from-config '{}' --param-dtype bf16", model(), f32.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("param_dtype"), "bf16");
  EXPECT_EQ(j.at("optimizer_dtype"), "f32");  // the option's default, not the file's
  EXPECT_THAT(j.at("stack").at("config").at("overridden").dump(),
              HasSubstr("training.mixed_precision_param = float32 (by --param-dtype)"));
  const Result e = run(fmt::format("train-plan --from-config '{}' --explain", f32.string()));
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_THAT(e.out, HasSubstr("(overridden by " + f32.string() +
                               ": training.mixed_precision_param = float32)"));
}

TEST_F(StackConfigCli, ReadsEachStacksExampleFile) {
  const std::string data = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/data/stack_configs/";
  const auto m = nlohmann::json::parse(
      run(fmt::format("{} --from-config '{}llama3_8b.args' --devices 4 --seq 64", model(), data))
          .out);
  EXPECT_EQ(m.at("stack").at("name"), "megatron-core");
  EXPECT_EQ(m.at("mesh"), "Mesh('dp': 2, 'tp': 2)");
  EXPECT_EQ(m.at("batch"), 16);
  EXPECT_EQ(m.at("grad_accum"), 4);  // 16 / (2 per rank x 2 ranks)
  const auto x = nlohmann::json::parse(
      run(fmt::format("{} --from-config '{}llama3_8b.yml' --devices 4 --seq 64", model(), data))
          .out);
  EXPECT_EQ(x.at("stack").at("name"), "maxtext");
  EXPECT_EQ(x.at("batch"), 8);  // 2 per device x 4
}

TEST_F(StackConfigCli, BadInputsAndOutputsAreRefusedNamingThem) {
  const Result missing = run(model() + " --from-config /nonexistent/job.toml --devices 4");
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.err, HasSubstr("--from-config: no such file or directory "
                                     "'/nonexistent/job.toml'"));
  const fs::path fifo = dir_ / "fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Result f =
      run(fmt::format("{} --from-config '{}' --devices 4", model(), fifo.string()), 20);
  EXPECT_EQ(f.code, 1);
  EXPECT_THAT(f.err, HasSubstr("FIFO"));
  const fs::path bad = config("[training]\nseq_len = 64\n[parallelism\n", "bad.toml");
  const Result b = run(fmt::format("{} --from-config '{}' --devices 4", model(), bad.string()));
  EXPECT_EQ(b.code, 1);
  EXPECT_THAT(b.err, HasSubstr(bad.string() + ":3: not valid TOML"));
  const fs::path job = config("[training]\nseq_len = 64\n", "job.toml");
  const Result same = run(fmt::format("{} --from-config '{}' --devices 4 --emit-config '{}'",
                                      model(), job.string(), job.string()));
  EXPECT_EQ(same.code, 2);
  EXPECT_THAT(same.err, HasSubstr("--emit-config"));
  EXPECT_EQ(read(job), "[training]\nseq_len = 64\n");  // untouched
  const Result no_devices = run(fmt::format("{} --from-config '{}'", model(), job.string()));
  EXPECT_EQ(no_devices.code, 2);
  EXPECT_THAT(no_devices.err, HasSubstr("fsdp:-1 has a degree of -1"));
  EXPECT_THAT(no_devices.err, HasSubstr("give --devices"));
  const std::string out = (dir_ / "out.toml").string();
  const Result no_stack = run(fmt::format("{} --mesh fsdp:4 --emit-config '{}'", model(), out));
  EXPECT_EQ(no_stack.code, 2);
  EXPECT_THAT(no_stack.err, HasSubstr("--emit-config writes a stack's config: give --stack"));
  const Result foundry =
      run(fmt::format("{} --mesh fsdp:4 --stack llm-foundry --emit-config '{}'", model(), out));
  EXPECT_EQ(foundry.code, 2);
  EXPECT_THAT(foundry.err, HasSubstr("llm-foundry has no config format"));
  const Result fused = run(fmt::format(
      "{} --mesh fsdp:4 --stack torchtitan-2025-08 --loss fused --emit-config '{}'", model(), out));
  EXPECT_EQ(fused.code, 2);
  EXPECT_THAT(fused.err, HasSubstr("--loss fused has no key in its config"));
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace shardplan
