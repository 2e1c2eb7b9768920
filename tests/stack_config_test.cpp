// A stack's own config file as train-plan options (stack_config.hpp): each key planned, ignored
// with the reason or refused; bad files named with their line; the writer's refusals. The
// expected options are read off the stacks' code by hand (each dialect's source comment).
#include "shardplan/stack_config.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "test_util.hpp"

namespace shardplan {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

StackConfig parse(std::string_view text, std::string_view stack,
                  std::string_view source = "job.toml") {
  return parse_stack_config(text, source, find_training_stack(stack));
}

// "--opt value" of every setting, in order.
std::vector<std::string> options_of(const StackConfig& f) {
  std::vector<std::string> out;
  for (const auto& s : f.settings) {
    if (!s.option.empty()) out.push_back(s.value.empty() ? s.option : s.option + " " + s.value);
  }
  return out;
}

TEST(StackConfig, TorchtitanKeysBecomeOptionsAndTheBatchSplitsAsItsRanks) {
  const StackConfig f = parse(R"(
[training]
local_batch_size = 2
global_batch_size = 32
seq_len = 4096
[parallelism]
data_parallel_shard_degree = 4
tensor_parallel_degree = 2
[activation_checkpoint]
mode = "selective"
selective_ac_option = "3"
[model]
converters = ["float8"]
[metrics]
log_freq = 5
)",
                              "torchtitan-2025-08");
  const auto o = options_of(f);
  EXPECT_THAT(o, Contains("--seq 4096"));
  EXPECT_THAT(o, Contains("--float8"));
  // Selective layer AC every 3rd block: whole blocks 2, 5, ... (apply_ac's ac_freq).
  EXPECT_THAT(o, Contains("--remat torchtitan:full"));
  EXPECT_THAT(o, Contains("--remat-blocks every:3"));
  EXPECT_EQ(f.mesh_text(), "fsdp:4,tp:2");
  // 2 sequences per data-parallel rank (4 of them: fsdp) = 8 a micro-batch; 32 = 4 of them.
  const auto [batch, accum] = f.batch_on(Mesh::parse("fsdp:4,tp:2", 8), {});
  EXPECT_EQ(batch, 32);
  EXPECT_EQ(accum, 4);
  EXPECT_THAT(f.ignored, Contains(HasSubstr("metrics.log_freq = 5 (not part of")));
}

TEST(StackConfig, KeysLeftOutTakeTheStacksDefaults) {
  // job_config.py at 07c00d9: mode "selective", selective_ac_option "2", local_batch_size 8,
  // seq_len 2048, data_parallel_shard_degree -1.
  const StackConfig f = parse("", "torchtitan-2025-08");
  EXPECT_THAT(options_of(f), Contains("--remat-blocks every:2"));
  EXPECT_THAT(options_of(f), Contains("--seq 2048"));
  EXPECT_EQ(f.mesh_text(), "fsdp:-1");
  EXPECT_EQ(f.batch_on(Mesh::parse("fsdp:4", 4), {}).first, 32);
}

TEST(StackConfig, RefusesUnknownKeysAndKeysOfAnotherVersionNamingFileLineAndKey) {
  EXPECT_THROW_WITH(parse("[training]\nseq_len = 8\nfoo = 1\n", "torchtitan-2025-08"), IoError,
                    "job.toml:3", "training.foo = 1", "not a key torchtitan-2025-08");
  // batch_size became local_batch_size in 2025.
  EXPECT_THROW_WITH(parse("[training]\nbatch_size = 8\n", "torchtitan-2025-08"), IoError,
                    "job.toml:2", "training.batch_size = 8");
  EXPECT_NO_THROW(parse("[training]\nbatch_size = 8\n", "torchtitan-2024-12"));
}

TEST(StackConfig, RefusesAValueOfTheWrongTypeOrOneNotPlanned) {
  EXPECT_THROW_WITH(parse("[training]\nseq_len = \"long\"\n", "torchtitan-2025-08"), IoError,
                    "job.toml:2", "training.seq_len = long", "expected an integer");
  EXPECT_THROW_WITH(parse("[parallelism]\npipeline_parallel_degree = 2\n", "torchtitan-2025-08"),
                    IoError, "job.toml:2", "pipeline_parallel_degree = 2",
                    "pipeline parallelism is not planned");
  EXPECT_THROW_WITH(parse("[activation_checkpoint]\nmode = \"sometimes\"\n", "torchtitan-2025-08"),
                    IoError, "job.toml:2", "mode = sometimes", "expected none, selective or full");
  EXPECT_THROW_WITH(parse("[training]\nmixed_precision_param = 16\n", "torchtitan-2025-08"),
                    IoError, "expected a string");
}

TEST(StackConfig, MalformedFilesAreNamedWithTheirLine) {
  EXPECT_THROW_WITH(parse("[training]\nseq_len = 8\n[parallelism\n", "torchtitan-2025-08"), IoError,
                    "job.toml:3", "not valid TOML");
  // Texts toml++ 3.3 asserted on (found by fuzz_stack_config): an error, not an abort.
  EXPECT_THROW_WITH(parse("[#\n", "torchtitan-2025-08"), IoError, "job.toml", "not valid TOML");
  EXPECT_THROW_WITH(parse("a = 1\n[\x11\n", "torchtitan-2025-08"), IoError, "job.toml:2",
                    "not valid TOML: control character 0x11");
  // U+00A1 where toml++ 3.3 looks for whitespace reaches its __builtin_unreachable (UBSan found
  // it): every non-ASCII byte is refused before the parser sees it, named with its line.
  EXPECT_THROW_WITH(parse("a = 1\n# \xc2\xa1\n", "torchtitan-2025-08"), IoError, "job.toml:2",
                    "a non-ASCII byte 0xc2");
  EXPECT_THROW_WITH(parse("steps: 1\nremat_policy: [full\n", "maxtext", "job.yml"), IoError,
                    "job.yml:", "not valid YAML");
  EXPECT_THROW_WITH(parse("--seq-length 8 --micro-batch-size 'open\n", "megatron-core", "a.args"),
                    IoError, "a.args:1", "does not close");
  EXPECT_THROW_WITH(parse("python pretrain_gpt.py --seq-length 8\n", "megatron-core", "a.args"),
                    IoError, "a.args:1", "'python' before the first argument");
}

TEST(StackConfig, MegatronArgumentsByArgumentsPy) {
  const StackConfig f = parse(R"(# a comment
--tensor-model-parallel-size 2 \
--seq-length 1024 --micro-batch-size 2 --global-batch-size 32 \
--bf16 --sequence-parallel
--recompute-granularity full --recompute-method block --recompute-num-layers 2
--num-layers 32 --lr 3e-4
)",
                              "megatron-core", "a.args");
  const auto o = options_of(f);
  EXPECT_THAT(o, Contains("--seq 1024"));
  EXPECT_THAT(o, Contains("--grad-dtype bf16"));  // main grads in bf16 without the fp32 flag
  EXPECT_THAT(o, Contains("--sequence-parallel on"));
  EXPECT_THAT(o, Contains("--remat megatron:full"));
  EXPECT_THAT(o, Contains("--remat-blocks layers:0-1"));  // block: the first 2 layers
  EXPECT_EQ(f.mesh_text(), "dp:-1,tp:2");                 // replicated (DDP) data parallel
  // 2 per data-parallel rank x 4 ranks = 8; 32 is 4 micro-batches.
  const auto [batch, accum] = f.batch_on(Mesh::parse("dp:4,tp:2", 8), {});
  EXPECT_EQ(batch, 32);
  EXPECT_EQ(accum, 4);
  EXPECT_THAT(f.ignored, Contains(HasSubstr("--num-layers = 32 (the model is --config's)")));
  // Sequence parallelism is off with tp 1 (arguments.py); no --bf16 is float32.
  const auto g = options_of(parse("--micro-batch-size 1 --sequence-parallel", "megatron-core"));
  EXPECT_THAT(g, Contains("--sequence-parallel off"));
  EXPECT_THAT(g, Contains("--param-dtype f32"));
  // The distributed optimizer: ZeRO-1 over the data-parallel ranks (an fsdp axis for the
  // rules to shard the state over); off by default (Megatron's), replicated data parallelism.
  const StackConfig z = parse("--micro-batch-size 1 --use-distributed-optimizer", "megatron-core");
  EXPECT_THAT(options_of(z), Contains("--optimizer-sharding zero1"));
  EXPECT_EQ(z.mesh_text(), "fsdp:-1");
  EXPECT_THAT(options_of(f), Not(Contains(HasSubstr("--optimizer-sharding"))));
}

// --cp-comm-type (transformer_config.py's cp_comm_type): p2p is the ring, all_gather Llama 3's
// all-gather of K/V, a2a Ulysses; one type a layer only when all are the same.
TEST(StackConfig, MegatronCpCommTypeIsTheContextKernel) {
  const auto kernel = [](std::string_view type) {
    return options_of(parse(fmt::format("--micro-batch-size 1 --context-parallel-size 2 "
                                        "--cp-comm-type {}",
                                        type),
                            "megatron-core", "a.args"));
  };
  EXPECT_THAT(kernel("p2p"), Contains("--cp-kernel ring"));
  EXPECT_THAT(kernel("all_gather"), Contains("--cp-kernel allgather-kv"));
  EXPECT_THAT(kernel("a2a"), Contains("--cp-kernel ulysses"));
  EXPECT_THAT(kernel("a2a a2a"), Contains("--cp-kernel ulysses"));  // a list, one per layer
  EXPECT_THAT(options_of(parse("--micro-batch-size 1", "megatron-core")),
              Not(Contains(HasSubstr("--cp-kernel"))));  // the stack's choice: p2p
  EXPECT_THROW_WITH(kernel("a2a+p2p"), IoError, "--cp-comm-type = a2a+p2p", "hierarchical",
                    "--hierarchical-context-parallel-sizes", "not planned");
  EXPECT_THROW_WITH(kernel("p2p a2a"), IoError, "--cp-comm-type = [p2p, a2a]", "per layer");
  EXPECT_THROW_WITH(kernel("ring"), IoError, "--cp-comm-type = ring",
                    "expected p2p, all_gather, a2a or a2a+p2p");
}

// --overlap-grad-reduce, --overlap-param-gather, --ddp-bucket-size (DistributedDataParallel-
// Config at d98e8a6; arguments.py's asserts): off by default; the reduction's overlap is
// buckets, with the distributed optimizer and no gather overlap grad-buckets; a bucket size is
// dropped without the reduction's overlap (bucket_size None).
TEST(StackConfig, MegatronDataParallelOverlap) {
  const auto options = [](std::string_view args) {
    return options_of(parse(fmt::format("--micro-batch-size 1 {}", args), "megatron-core"));
  };
  EXPECT_THAT(options(""), Contains("--dp-overlap off"));
  EXPECT_THAT(options("--overlap-grad-reduce --ddp-bucket-size 1000"),
              Contains("--dp-overlap buckets"));
  EXPECT_THAT(options("--overlap-grad-reduce --ddp-bucket-size 1000"),
              Contains("--dp-bucket-size 1000"));
  EXPECT_THAT(options("--use-distributed-optimizer --overlap-grad-reduce"),
              Contains("--dp-overlap grad-buckets"));
  EXPECT_THAT(options("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"),
              Contains("--dp-overlap buckets"));
  const StackConfig dropped = parse("--micro-batch-size 1 --ddp-bucket-size 1000", "megatron-core");
  EXPECT_THAT(options_of(dropped), Not(Contains(HasSubstr("--dp-bucket-size"))));
  EXPECT_THAT(dropped.ignored, Contains(HasSubstr("--ddp-bucket-size = 1000 (no buckets")));
  EXPECT_THROW_WITH(options("--use-distributed-optimizer --overlap-param-gather"), IoError,
                    "--overlap-param-gather", "asserts --overlap-grad-reduce");
  EXPECT_THROW_WITH(options("--overlap-grad-reduce --overlap-param-gather"), IoError,
                    "--overlap-param-gather", "asserts the distributed optimizer");
  EXPECT_THROW_WITH(options("--overlap-grad-reduce --ddp-bucket-size 0"), IoError,
                    "--ddp-bucket-size = 0", "expected at least 1 element");
  // The writer: FSDP's pipeline has no key; the buckets and their size have.
  const TrainingStack& megatron = find_training_stack("megatron-core");
  TrainPlanOptions m;
  apply_stack(megatron, m);
  m.optimizer_sharding = OptimizerSharding::kZero1;
  const Mesh mesh = Mesh::parse("fsdp:4", 4);
  EXPECT_THAT(emit_stack_config(megatron, m, mesh, {}, false),
              Not(HasSubstr("--overlap-grad-reduce")));
  m.dp_overlap = DpOverlap::kBuckets;
  m.dp_bucket_size = 1000;
  EXPECT_THAT(emit_stack_config(megatron, m, mesh, {}, false),
              HasSubstr("--overlap-grad-reduce\n--overlap-param-gather\n--ddp-bucket-size 1000\n"));
  m.dp_overlap = DpOverlap::kFsdp;
  EXPECT_THROW_WITH(emit_stack_config(megatron, m, mesh, {}, false), SpecError, "--dp-overlap fsdp",
                    "has no key");
  const TrainingStack& titan = find_training_stack("torchtitan-2025-08");
  TrainPlanOptions t;
  apply_stack(titan, t);
  t.dp_overlap = DpOverlap::kOff;
  EXPECT_THROW_WITH(emit_stack_config(titan, t, mesh, {}, false), SpecError,
                    "--dp-overlap off has no key");
}

TEST(StackConfig, MegatronRefusesWhatIsNotPlanned) {
  EXPECT_THROW_WITH(parse("--micro-batch-size 1 --fp16", "megatron-core", "a.args"), IoError,
                    "a.args:1", "--fp16", "fp16 with loss scaling is not planned");
  EXPECT_THROW_WITH(parse("--seq-length 8", "megatron-core", "a.args"), IoError,
                    "--micro-batch-size", "missing");
  EXPECT_THROW_WITH(parse("--micro-batch-size 1 --recompute-granularity full "
                          "--recompute-num-layers 4",
                          "megatron-core", "a.args"),
                    IoError, "--recompute-num-layers = 4", "uniform recomputation");
  EXPECT_THROW_WITH(
      parse("--micro-batch-size 1\n--recompute-granularity selective\n", "megatron-core", "a.args"),
      IoError, "a.args:2", "megatron:selective", "cannot be planned");
  EXPECT_THROW_WITH(parse("--micro-batch-size 1 --bf16 yes", "megatron-core", "a.args"), IoError,
                    "--bf16 = yes", "a flag takes no value");
}

TEST(StackConfig, MaxTextKeysOfBaseYml) {
  const StackConfig f = parse(R"(
per_device_batch_size: 0.5
gradient_accumulation_steps: 2
max_target_length: 4096
ici_fsdp_parallelism: 4
ici_tensor_parallelism: 2
remat_policy: "minimal"
weight_dtype: "bfloat16"
run_name: "x"
)",
                              "maxtext", "m.yml");
  const auto o = options_of(f);
  EXPECT_THAT(o, Contains("--remat maxtext:minimal"));
  EXPECT_THAT(o, Contains("--param-dtype bf16"));
  EXPECT_THAT(o, Contains("--optimizer-dtype bf16"));  // mu_dtype '' inherits weight_dtype
  EXPECT_EQ(f.mesh_text(), "fsdp:4,tp:2");
  // int(8 devices x 0.5) = 4 a micro-batch, x 2 (types.py: calculate_global_batch_sizes).
  const auto [batch, accum] = f.batch_on(Mesh::parse("fsdp:4,tp:2", 8), {});
  EXPECT_EQ(batch, 8);
  EXPECT_EQ(accum, 2);
  EXPECT_THROW_WITH(parse("remat_policy: \"sometimes\"\n", "maxtext", "m.yml"), IoError, "m.yml:1",
                    "remat_policy = sometimes", "maxtext:sometimes");
  EXPECT_THROW_WITH(parse("ici_fsdp_parallelism: four\n", "maxtext", "m.yml"), IoError, "m.yml:1",
                    "ici_fsdp_parallelism = four", "expected an integer");
  EXPECT_THROW_WITH(parse("learning_rate: 1\nbogus_key: 2\n", "maxtext", "m.yml"), IoError,
                    "m.yml:2", "bogus_key = 2", "not a key maxtext");
  EXPECT_THROW_WITH(parse("per_device_batch_size: 0.3\n", "maxtext", "m.yml")
                        .batch_on(Mesh::parse("fsdp:4", 4), {}),
                    IoError, "m.yml", "per_device_batch_size = 0.3", "not a whole batch");
}

TEST(StackConfig, StacksWithoutAFormatAndExtensions) {
  EXPECT_THROW_WITH(parse("", "llm-foundry"), SpecError, "llm-foundry", "no config format",
                    "megatron-core");
  EXPECT_EQ(stack_for_config_file("a/job.toml").name, "torchtitan-2025-08");
  EXPECT_EQ(stack_for_config_file("job.yml").name, "maxtext");
  EXPECT_EQ(stack_for_config_file("run.args").name, "megatron-core");
  EXPECT_THROW_WITH(stack_for_config_file("job.json"), SpecError, "'.json'", ".toml",
                    "give --stack");
}

TEST(StackConfig, ReadsRegularFilesOnly) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("stack_config_test." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto fifo = dir / "fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const TrainingStack& s = find_training_stack("torchtitan-2025-08");
  EXPECT_THROW_WITH(read_stack_config(fifo, s), IoError, "fifo.toml", "FIFO");
  EXPECT_THROW_WITH(read_stack_config(dir / "none.toml", s), IoError, "none.toml");
  std::ofstream(dir / "ok.toml") << "[training]\nseq_len = 16\n";
  EXPECT_THAT(options_of(read_stack_config(dir / "ok.toml", s)), Contains("--seq 16"));
  std::filesystem::remove_all(dir);
}

TEST(StackConfig, TheWriterRefusesWhatTheConfigCannotSay) {
  const TrainingStack& s = find_training_stack("torchtitan-2025-08");
  TrainPlanOptions o;
  apply_stack(s, o);
  const Mesh mesh = Mesh::parse("fsdp:4", 4);
  EXPECT_NO_THROW(emit_stack_config(s, o, mesh, {}, false));
  TrainPlanOptions fused = o;
  fused.fused_loss = true;  // torchtitan's loss takes the whole logits: no key says otherwise
  EXPECT_THROW_WITH(emit_stack_config(s, fused, mesh, {}, false), SpecError, "torchtitan-2025-08",
                    "--loss fused has no key");
  TrainPlanOptions odd = o;
  odd.batch = 6;  // 6 sequences over 4 ranks
  EXPECT_THROW_WITH(emit_stack_config(s, odd, mesh, {}, false), SpecError,
                    "the batch of 6 does not split over 4 data-parallel ranks");
  EXPECT_THROW_WITH(emit_stack_config(s, o, Mesh::parse("ep:4", 4), {}, false), SpecError,
                    "the mesh axis 'ep' has no degree");
  // Megatron's arguments say nothing of torch.compile or float8 (the stack runs TE's kernels).
  const TrainingStack& megatron = find_training_stack("megatron-core");
  TrainPlanOptions m;
  apply_stack(megatron, m);
  // Megatron shards no parameter over its data-parallel ranks: an fsdp axis is its distributed
  // optimizer's (ZeRO-1), and ZeRO-1 needs that axis.
  EXPECT_THROW_WITH(emit_stack_config(megatron, m, mesh, {}, false), SpecError, "megatron-core",
                    "an fsdp axis with --optimizer-sharding rules (FSDP) has no key");
  m.optimizer_sharding = OptimizerSharding::kZero1;
  EXPECT_THROW_WITH(emit_stack_config(megatron, m, Mesh::parse("dp:4", 4), {}, false),
                    SpecError, "--optimizer-sharding zero1", "only on an fsdp axis");
  EXPECT_THAT(emit_stack_config(megatron, m, mesh, {}, false),
              HasSubstr("--use-distributed-optimizer\n"));
  TrainPlanOptions zero1 = o;  // torchtitan has no distributed optimizer
  zero1.optimizer_sharding = OptimizerSharding::kZero1;
  EXPECT_THROW_WITH(emit_stack_config(s, zero1, mesh, {}, false), SpecError,
                    "--optimizer-sharding zero1 has no key");
  m.eager = true;
  EXPECT_THROW_WITH(emit_stack_config(megatron, m, mesh, {}, false), SpecError, "megatron-core",
                    "--eager", "has no key");
  const TrainingStack& old = find_training_stack("torchtitan-2024-12");
  TrainPlanOptions kept;
  apply_stack(old, kept);
  kept.reshard_after_forward = false;  // fsdp_reshard_after_forward came in 2025
  EXPECT_THROW_WITH(emit_stack_config(old, kept, mesh, {}, false), SpecError,
                    "--no-reshard-after-forward", "has no key");
  TrainPlanOptions accum;
  apply_stack(old, accum);
  accum.grad_accum = 2;  // gradient accumulation came to torchtitan's config in 2025
  EXPECT_THROW_WITH(emit_stack_config(old, accum, mesh, {}, false), SpecError,
                    "--grad-accum 2 has no key");
}

// float8's recipe and all-gather (torchtitan's Float8Converter at 07c00d9): recipe_name as
// --float8-recipe; enable_fsdp_float8_all_gather (default false) as --float8-all-gather; the
// two together are torchtitan's assertion; neither means anything without the converter.
TEST(StackConfig, Float8RecipeAndAllGatherKeys) {
  const StackConfig rows = parse(
      "[model]\nconverters = [\"float8\"]\n[float8]\nrecipe_name = \"rowwise\"\n",
      "torchtitan-2025-08");
  EXPECT_THAT(options_of(rows), Contains("--float8-recipe rowwise"));
  EXPECT_THAT(options_of(rows), Contains("--float8-all-gather bf16"));
  const StackConfig gathered = parse(
      "[model]\nconverters = [\"float8\"]\n[float8]\nenable_fsdp_float8_all_gather = true\n",
      "torchtitan-2025-08");
  EXPECT_THAT(options_of(gathered), Contains("--float8-all-gather float8"));
  EXPECT_THAT(options_of(gathered), Not(Contains(HasSubstr("--float8-recipe"))));
  EXPECT_THROW_WITH(parse("[model]\nconverters = [\"float8\"]\n[float8]\n"
                          "enable_fsdp_float8_all_gather = true\nrecipe_name = \"tensorwise\"\n",
                          "torchtitan-2025-08"),
                    IoError, "job.toml:4", "enable_fsdp_float8_all_gather = true",
                    "not used together with recipe_name");
  EXPECT_THROW_WITH(parse("[model]\nconverters = [\"float8\"]\n[float8]\nrecipe_name = \"rows\"\n",
                          "torchtitan-2025-08"),
                    IoError, "job.toml:4", "unknown float8 recipe 'rows'");
  const StackConfig off = parse("[float8]\nenable_fsdp_float8_all_gather = true\n",
                                "torchtitan-2025-08");
  EXPECT_THAT(options_of(off), Not(Contains(HasSubstr("--float8"))));
  EXPECT_THAT(off.ignored,
              Contains(HasSubstr("float8.enable_fsdp_float8_all_gather = true (no float8)")));
  // 2024's config has no recipe_name: the writer refuses a rowwise plan for it.
  const TrainingStack& old = find_training_stack("torchtitan-2024-12");
  TrainPlanOptions o;
  o.float8 = true;
  apply_stack(old, o);
  o.float8_recipe = Float8Scaling::kRowwise;
  o.float8_all_gather = Float8Gather::kBf16;
  EXPECT_THROW_WITH(emit_stack_config(old, o, Mesh::parse("fsdp:4", 4), {}, false), SpecError,
                    "torchtitan-2024-12", "--float8-recipe rowwise has no key",
                    "pytorch/torchtitan#808");
}

}  // namespace
}  // namespace shardplan
