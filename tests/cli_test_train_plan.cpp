// `shardplan train-plan` on Hugging Face configs: memory, time, comparisons, options and errors.
#include "cli_test.hpp"

namespace shardplan {
namespace {

using namespace test;

TEST_F(TrainPlanCli, PrintsMemoryPerDeviceAndWhetherItFits) {
  const Result r = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:4,tp:2 --batch 8 --seq 128 --device-memory 80GiB",
      llama().string()));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* part : {"Mesh('fsdp': 4, 'tp': 2) (8 devices)", "rules preset:llama_fsdp_tp",
                           "parameters", "gradients", "optimizer state", "peak",
                           "(72.00 GiB with 10% headroom): fits", "all_gather", "adamw"}) {
    EXPECT_THAT(r.out, ::testing::HasSubstr(part)) << r.out;
  }
  // A checkpoint directory holding config.json is read the same way.
  const Result d = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:4,tp:2 --batch 8 --seq 128", dir_.string()));
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_THAT(d.out, ::testing::HasSubstr("parameters"));
  // Too little memory: said, with by how much.
  const Result small = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:4,tp:2 --batch 8 --seq 128 --device-memory 100MB",
      llama().string()));
  ASSERT_EQ(small.code, 0) << small.err;
  EXPECT_THAT(small.out, ::testing::HasSubstr("does NOT fit"));
}

// --hardware: the time split in the text and the JSON (the JSON's step time is the sum of its
// compute and exposed communication), the hardware's memory as the device memory; bad names and
// files are refused naming them; --mixed-precision fsdp2 says what it changed.
TEST_F(TrainPlanCli, HardwareGivesTheStepTimeAndBadHardwareIsNamed) {
  const std::string base = fmt::format(
      "train-plan --config '{}' --mesh fsdp:4,tp:2 --batch 8 --seq 128", llama().string());
  const Result r = run(base + " --hardware h100-sxm --mixed-precision fsdp2");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* part : {"step time on h100-sxm", "compute", "tokens/s per device", "MFU",
                           "tensor: exposed", "data: overlapped with compute",
                           "80.00 GiB  (72.00 GiB with 10% headroom)",
                           "parameters f32 held, cast to bf16 for use (gathered in it), gradients "
                           "f32 (reduced in f32)"}) {
    EXPECT_THAT(r.out, ::testing::HasSubstr(part)) << r.out;
  }
  const Result j = run(base + " --hardware a100-80g --json");
  ASSERT_EQ(j.code, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  const auto& t = doc.at("time");
  EXPECT_EQ(t.at("hardware"), "a100-80g");
  EXPECT_NEAR(t.at("step_seconds").get<double>(),
              t.at("compute_seconds").get<double>() + t.at("exposed_seconds").get<double>(), 1e-12);
  EXPECT_GT(t.at("tokens_per_second_per_device").get<double>(), 0);
  EXPECT_FALSE(t.at("communication").empty());
  EXPECT_EQ(doc.at("master_dtype"), "bf16");
  // Bad usage: exit 2, naming what was wrong.
  const Result unknown = run(base + " --hardware h100");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err, ::testing::HasSubstr("unknown hardware 'h100'"));
  EXPECT_THAT(unknown.err, ::testing::HasSubstr("h100-sxm"));
  const Result both = run(base + " --mixed-precision fsdp2 --master-dtype f32");
  EXPECT_EQ(both.code, 2);
  EXPECT_THAT(both.err, ::testing::HasSubstr("--mixed-precision fsdp2 sets the dtypes itself"));
  const Result other = run(base + " --mixed-precision amp");
  EXPECT_EQ(other.code, 2);
  EXPECT_THAT(other.err, ::testing::HasSubstr("unknown 'amp' (known: fsdp2)"));
  // A hardware file without a figure: exit 1 naming the file and the figure.
  const fs::path yaml = dir_ / "lab.yaml";
  std::ofstream(yaml) << "name: lab\nbf16_flops: 1e15\n";
  const Result missing = run(fmt::format("{} --hardware '{}'", base, yaml.string()));
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err, ::testing::HasSubstr("lab.yaml"));
  EXPECT_THAT(missing.err, ::testing::HasSubstr("no figure 'fp8_flops'"));
}

TEST_F(TrainPlanCli, SequenceParallelIsOnWithTpAndCanBeTurnedOff) {
  const std::string base = fmt::format(
      "train-plan --config '{}' --mesh fsdp:4,tp:2 --batch 8 --seq 128", llama().string());
  const Result on = run(base);
  ASSERT_EQ(on.code, 0) << on.err;
  EXPECT_THAT(on.out, ::testing::HasSubstr("sequence parallel on (over tp)"));
  const Result off = run(base + " --sequence-parallel off --json");
  ASSERT_EQ(off.code, 0) << off.err;
  EXPECT_EQ(nlohmann::json::parse(off.out)["sequence_parallel"], false);
  // No tp axis: the default rules (llama_fsdp) split no sequence.
  const Result fsdp = run(
      fmt::format("train-plan --config '{}' --mesh fsdp:8 --batch 8 --seq 128", llama().string()));
  ASSERT_EQ(fsdp.code, 0) << fsdp.err;
  EXPECT_THAT(fsdp.out, ::testing::HasSubstr("sequence parallel off"));
  const Result bad = run(base + " --sequence-parallel maybe");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, ::testing::HasSubstr("--sequence-parallel 'maybe': expected on or off"));
}

TEST_F(TrainPlanCli, JsonAddsUp) {
  const Result r = run(
      fmt::format("train-plan --config '{}' --mesh fsdp:4,tp:2 --batch 8 --seq 128 --optimizer sgd "
                  "--param-dtype f32 --device-memory 80GiB --json",
                  llama().string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& d = j["per_device"];
  EXPECT_EQ(d["peak_bytes"].get<std::int64_t>(),
            d["parameter_bytes"].get<std::int64_t>() + d["optimizer_bytes"].get<std::int64_t>() +
                d["batch_bytes"].get<std::int64_t>() + d["transient_bytes"].get<std::int64_t>());
  EXPECT_EQ(d["peak_bytes"].get<std::int64_t>(), d["peak_held_bytes"].get<std::int64_t>() +
                                                     d["peak_gathered_bytes"].get<std::int64_t>() +
                                                     d["peak_computed_bytes"].get<std::int64_t>());
  EXPECT_EQ(d["optimizer_bytes"], 4);  // sgd without momentum keeps only its step count
  EXPECT_EQ(d["gradient_bytes"], d["parameter_bytes"]);  // f32 like the parameters
  EXPECT_EQ(j["devices"], 8);
  EXPECT_EQ(j["param_dtype"], "f32");
  EXPECT_EQ(j["fits"], true);
  std::int64_t moved = 0;
  for (const auto& [kind, bytes] : j["bytes_received_per_device"].items())
    moved += bytes.get<std::int64_t>();
  EXPECT_EQ(j["bytes_moved_per_device"], moved);
}

TEST_F(TrainPlanCli, CompareNamesTheCheapestThatFits) {
  const Result r = run(fmt::format(
      "train-plan --config '{}' --compare --mesh fsdp:8,tp:1 --mesh fsdp:4,tp:2 --mesh fsdp:2,tp:4 "
      "--batch 8 --seq 128 --device-memory 4GiB --json",
      llama().string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["plans"].size(), 3u);
  // Worked out here from the rows: among those that fit, the fewest bytes moved.
  int best = -1;
  for (int i = 0; i < 3; ++i) {
    const auto& p = j["plans"][static_cast<std::size_t>(i)];
    if (p["fits"] != true) continue;
    if (best < 0 || p["bytes_moved_per_device"] <
                        j["plans"][static_cast<std::size_t>(best)]["bytes_moved_per_device"]) {
      best = i;
    }
  }
  ASSERT_GE(best, 0) << r.out;
  EXPECT_EQ(j["cheapest_fitting"], best);
  const Result t = run(fmt::format(
      "train-plan --config '{}' --compare --mesh fsdp:8,tp:1 --mesh fsdp:4,tp:2 --mesh fsdp:2,tp:4 "
      "--batch 8 --seq 128 --device-memory 4GiB",
      llama().string()));
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_THAT(t.out, ::testing::HasSubstr(fmt::format("cheapest that fits: #{}", best)));
  const Result none =
      run(fmt::format("train-plan --config '{}' --compare --mesh fsdp:8,tp:1 --mesh fsdp:4,tp:2 "
                      "--batch 8 --seq 128 "
                      "--device-memory 10MB",
                      llama().string()));
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_THAT(none.out, ::testing::HasSubstr("none of these fits"));
  // A mesh the batch does not split over is a row that says why, and the others still plan.
  const Result bad =
      run(fmt::format("train-plan --config '{}' --compare --mesh fsdp:8,tp:1 --mesh fsdp:4,tp:2 "
                      "--batch 4 --seq 128",
                      llama().string()));
  ASSERT_EQ(bad.code, 0) << bad.err;
  EXPECT_THAT(bad.out, ::testing::HasSubstr("cannot be planned: [train] a batch of 4"));
  EXPECT_THAT(bad.out, ::testing::HasSubstr("cheapest that fits: #1"));
}

TEST_F(TrainPlanCli, Gpt2AndT5UseTheirOwnPresets) {
  const fs::path c = config(R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768,
    "n_layer": 2, "n_head": 12, "n_positions": 1024})");
  const Result r = run(
      fmt::format("train-plan --config '{}' --mesh fsdp:4,tp:2 --batch 8 --seq 256", c.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("rules preset:gpt2"));
  // T5 too, with the decoder's own length.
  const fs::path t5 = config(R"({"model_type": "t5", "vocab_size": 32128, "d_model": 512,
    "d_kv": 64, "d_ff": 2048, "num_layers": 2, "num_heads": 8})",
                             "t5.json");
  const Result t = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:4,tp:2 --batch 8 --seq 256 --target-seq 64 --json",
      t5.string()));
  ASSERT_EQ(t.code, 0) << t.err;
  const auto j = nlohmann::json::parse(t.out);
  EXPECT_EQ(j["rules"], "preset:t5");
  EXPECT_EQ(j["target_seq"], 64);
  EXPECT_EQ(j["per_device"]["batch_bytes"], (8 / 4) * (256 + 64 + 64) * 4);
}

// Configs the tracer could not hold (10,000 layers ended in "internal error: std::bad_alloc",
// 32,768 experts ran out of memory, 8,192 micro-batches took gigabytes): planned from a few small
// traced steps, or refused before tracing with the limit stated.
TEST_F(TrainPlanCli, LargeStepsArePlannedOrRefusedWithTheLimit) {
  const std::string deep = config(R"({"model_type": "llama", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 10000,
    "num_attention_heads": 4, "num_key_value_heads": 2})",
                                  "deep.json")
                               .string();
  const Result r = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:8 --rules preset:llama_fsdp --batch 8 --seq 16", deep));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("extrapolated from steps of 2, 3, 4, 8 layers"));
  const Result accum = run(
      fmt::format("train-plan --config '{}' --mesh fsdp:8 --rules preset:llama_fsdp --batch 65536 "
                  "--seq 16 --grad-accum 8192 --recompute --json",
                  deep));
  ASSERT_EQ(accum.code, 0) << accum.err;
  EXPECT_THAT(accum.out, ::testing::HasSubstr(R"("extrapolated": true)"));
  for (const int layers : {1, 32}) {
    const std::string experts =
        config(fmt::format(R"({{"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32,
          "intermediate_size": 24, "num_hidden_layers": {}, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_local_experts": 32768, "num_experts_per_tok": 2}})",
                           layers),
               "experts.json")
            .string();
    const Result e = run(
        fmt::format("train-plan --config '{}' --mesh ep:8,fsdp:1 --batch 8192 --seq 16", experts));
    EXPECT_EQ(e.code, 1) << e.err;
    EXPECT_THAT(e.err, ::testing::Not(::testing::HasSubstr("internal error")));
    EXPECT_THAT(e.err, ::testing::HasSubstr(layers == 1 ? "over the limit of 512" : "more than"));
  }
}

TEST_F(TrainPlanCli, BadInputIsAClearError) {
  const std::string cfg = llama().string();
  const auto check = [&](const std::string& args, int code, std::vector<std::string> parts) {
    const Result r = run("train-plan " + args);
    EXPECT_EQ(r.code, code) << args << "\n" << r.err;
    for (const std::string& p : parts) EXPECT_THAT(r.err, ::testing::HasSubstr(p)) << args;
  };
  check("--config /no/such/config.json --mesh fsdp:8", 2, {"/no/such/config.json"});
  const std::string bert = config(R"({"model_type": "bert"})", "bert.json").string();
  check(fmt::format("--config '{}' --mesh fsdp:8", bert), 1, {"bert.json", "'bert'", "llama"});
  check(fmt::format("--config '{}' --mesh fsdp:8 --device-memory lots", cfg), 2,
        {"--device-memory", "'lots'"});
  check(fmt::format("--config '{}' --mesh fsdp:8 --mesh fsdp:4,tp:2", cfg), 2, {"--compare"});
  check(fmt::format("--config '{}' --mesh fsdp:-1,tp:2", cfg), 2, {"--devices"});
  check(fmt::format("--config '{}' --mesh fsdp:4,tp:2 --batch 6", cfg), 1,
        {"batch of 6", "multiple of 4"});
  check(fmt::format("--config '{}' --mesh fsdp:4,tp:2 --param-dtype i32", cfg), 2,
        {"--param-dtype", "i32"});
  check(fmt::format("--config '{}' --mesh fsdp:4,tp:2 --optimizer lion", cfg), 2, {"lion"});
  check(fmt::format("--config '{}' --mesh fsdp:4,tp:2 --batch-axes data --batch 8", cfg), 1,
        {"data"});
  const fs::path no_mesh = dir_ / "no_mesh.yaml";
  std::ofstream(no_mesh) << "strict: false\nrules:\n  - {match: \"norm\", spec: []}\n";
  check(fmt::format("--config '{}' --rules '{}'", cfg, no_mesh.string()), 2,
        {"no_mesh.yaml", "names no mesh", "--mesh"});
}

// A newcomer's first run: a LLaMA config on an FSDP-only mesh, no --rules. The family's
// FSDP x TP preset names a tp axis the mesh lacks; its FSDP-only preset is chosen, and said.
TEST_F(TrainPlanCli, TheDefaultRulesFitTheMesh) {
  const Result r =
      run(fmt::format("train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 128", llama().string()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("rules preset:llama_fsdp (the default for llama on a "
                                           "mesh without a model axis)"));
  const Result j = run(
      fmt::format("train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 128 --json", llama().string()));
  ASSERT_EQ(j.code, 0) << j.err;
  const auto plan = nlohmann::json::parse(j.out);
  EXPECT_EQ(plan["rules"], "preset:llama_fsdp");
  EXPECT_EQ(plan["rules_note"], "the default for llama on a mesh without a model axis");
  // With tp, the FSDP x TP preset as before.
  const Result tp = run(
      fmt::format("train-plan -c '{}' --mesh fsdp:4,tp:2 --batch 8 --seq 128", llama().string()));
  ASSERT_EQ(tp.code, 0) << tp.err;
  EXPECT_THAT(tp.out, ::testing::HasSubstr("rules preset:llama_fsdp_tp (the default for llama)"));
  // A model axis by another default name (mp: docs/rule-files.md "Axis roles") takes tp's place
  // in the preset: the same plan as on fsdp:4,tp:2, byte for byte.
  const auto json_of = [&](const std::string& mesh) {
    const Result m = run(fmt::format("train-plan -c '{}' --mesh {} --batch 8 --seq 128 --json",
                                     llama().string(), mesh));
    EXPECT_EQ(m.code, 0) << m.err;
    return nlohmann::json::parse(m.out);
  };
  const auto mp = json_of("fsdp:4,mp:2");
  const auto with_tp = json_of("fsdp:4,tp:2");
  EXPECT_EQ(mp["rules"], "preset:llama_fsdp_tp");
  EXPECT_EQ(mp["rules_note"], "the default for llama; its tp is the mesh's model axis mp");
  EXPECT_EQ(mp["per_device"], with_tp["per_device"]);
  EXPECT_GT(mp["per_device"]["peak_bytes"], 0);
  // A family with one preset: the axes the mesh lacks are left out of its specs, and said.
  const fs::path gpt2 = config(R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768,
    "n_layer": 2, "n_head": 12, "n_positions": 1024})",
                               "gpt2.json");
  const Result g =
      run(fmt::format("train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 64", gpt2.string()));
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_THAT(g.out,
              ::testing::HasSubstr("rules preset:gpt2 (the default for gpt2; the mesh has "
                                   "no tp axis: left out of the preset's specs, as size 1)"));
}

// --eager plans the step as eager PyTorch runs it: the same products and FLOPs, each elementwise
// op's result written (more bytes read and written, a peak no lower), said in the step line and
// the JSON.
TEST_F(TrainPlanCli, EagerWritesEveryOpsResult) {
  const std::string cfg = llama().string();
  const auto plan = [&](const std::string& args) {
    const Result r = run(fmt::format(
        "train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 256 --hardware h100-sxm {}", cfg, args));
    EXPECT_EQ(r.code, 0) << args << r.err;
    return r.out;
  };
  const auto compiled = nlohmann::json::parse(plan("--json"));
  const auto eager = nlohmann::json::parse(plan("--json --eager"));
  EXPECT_EQ(compiled["eager"], false);
  EXPECT_EQ(eager["eager"], true);
  EXPECT_EQ(eager["per_device"]["flops"], compiled["per_device"]["flops"]);
  EXPECT_GT(eager["per_device"]["memory_traffic_bytes"].get<double>(),
            1.2 * compiled["per_device"]["memory_traffic_bytes"].get<double>());
  EXPECT_GE(eager["per_device"]["peak_bytes"], compiled["per_device"]["peak_bytes"]);
  EXPECT_GT(eager["time"]["memory_seconds"], compiled["time"]["memory_seconds"]);
  EXPECT_THAT(plan("--eager"), ::testing::HasSubstr(
                                   ", eager (no torch.compile: each elementwise op writes its result)"));
  EXPECT_THAT(plan(""), ::testing::Not(::testing::HasSubstr("eager")));
}

// --fsdp-root: the root module's weights and the last layer's stay gathered (more gathered and
// live at the peak), the step line and the JSON say it, and it does not apply on one device.
TEST_F(TrainPlanCli, FsdpRootIsSaidAndHoldsTheRootsWeights) {
  const std::string cfg = llama().string();
  const auto plan = [&](const std::string& mesh, const std::string& args) {
    const Result r = run(fmt::format(
        "train-plan -c '{}' --mesh {} --batch 8 --seq 256 --mixed-precision fsdp2 {}", cfg, mesh,
        args));
    EXPECT_EQ(r.code, 0) << args << r.err;
    return r.out;
  };
  const auto units = nlohmann::json::parse(plan("fsdp:8", "--json"));
  const auto root = nlohmann::json::parse(plan("fsdp:8", "--json --fsdp-root"));
  EXPECT_EQ(units["fsdp_root"], false);
  EXPECT_EQ(root["fsdp_root"], true);
  // (The bytes by hand: PlanTraining.FsdpRootHoldsTheRootsWeightsAndTheLastLayers.)
  EXPECT_GT(root["per_device"]["peak_gathered_bytes"], units["per_device"]["peak_gathered_bytes"]);
  EXPECT_GT(root["per_device"]["peak_bytes"], units["per_device"]["peak_bytes"]);
  EXPECT_THAT(plan("fsdp:8", "--fsdp-root"),
              ::testing::HasSubstr(", FSDP root module (embedding and head gathered from the "
                                   "forward's start to the backward's end; the last block kept "
                                   "gathered)"));
  EXPECT_THAT(plan("fsdp:8", ""), ::testing::Not(::testing::HasSubstr("FSDP root module")));
  const auto alone = nlohmann::json::parse(plan("fsdp:1", "--json --fsdp-root"));
  EXPECT_EQ(alone["fsdp_root"], false);
}

// --remat-blocks and --[no-]reshard-last-block reach the plan (their effects by hand:
// train_plan_test_remat_blocks.cpp); a form that is none is exit 2 naming it, a choice without
// a policy the refusal.
TEST_F(TrainPlanCli, RematBlocksAndTheLastBlockAreSettingsOfTheirOwn) {
  const std::string cfg = llama().string();
  const auto plan = [&](const std::string& args) {
    return run(fmt::format("train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 256 {}", cfg, args));
  };
  const auto json = [&](const std::string& args) {
    const Result r = plan("--json " + args);
    EXPECT_EQ(r.code, 0) << args << r.err;
    return nlohmann::json::parse(r.out);
  };
  const auto every2 = json("--remat full --remat-blocks every:2");
  EXPECT_EQ(every2["remat_blocks"], "every:2");
  EXPECT_EQ(every2["remat_layers"], 1);  // layer 1 of 2
  EXPECT_EQ(json("--remat full")["remat_layers"], 2);
  EXPECT_EQ(json("")["last_block_kept_gathered"], false);
  EXPECT_EQ(json("--no-reshard-last-block")["last_block_kept_gathered"], true);
  EXPECT_EQ(json("--fsdp-root")["last_block_kept_gathered"], true);
  const auto root_alone = json("--fsdp-root --reshard-last-block");
  EXPECT_EQ(root_alone["fsdp_root"], true);
  EXPECT_EQ(root_alone["last_block_kept_gathered"], false);
  const Result bad = plan("--remat full --remat-blocks every:x");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, ::testing::HasSubstr("--remat-blocks 'every:x': K is not a whole number"));
  const Result alone = plan("--remat-blocks layers:0");
  EXPECT_EQ(alone.code, 2);
  EXPECT_THAT(alone.err, ::testing::HasSubstr("--remat-blocks is refused: no recomputation"));
}

// --remat and --loss are what the step runs: the header says them, the JSON carries them, a
// name no layer gives is an error listing the names there are, and recomputation adds FLOPs
// (one more forward pass of the layers for full, less for dots) while the fused loss changes
// nothing but where the logits are made.
TEST_F(TrainPlanCli, RematAndLossAreTheStepsOwn) {
  const std::string cfg = llama().string();
  const auto plan = [&](const std::string& args) {
    const Result r =
        run(fmt::format("train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 64 --json {}", cfg, args));
    EXPECT_EQ(r.code, 0) << args << r.err;
    return nlohmann::json::parse(r.out);
  };
  const auto none = plan(""), full = plan("--remat full"), dots = plan("--remat dots");
  const auto names = plan("--remat names:mlpwi_0,context"), recompute = plan("--recompute");
  EXPECT_EQ(none["remat"], "none");
  EXPECT_EQ(none["recompute"], false);
  EXPECT_EQ(none["reshard_after_forward"], true);
  EXPECT_EQ(full["reshard_after_forward"], false);
  // --float8: the blocks' products move to the float8 figure; refused on hardware without it.
  const auto f8 = plan("--float8");
  EXPECT_EQ(f8["float8"], true);
  EXPECT_EQ(none["float8"], false);
  EXPECT_EQ(none["per_device"]["matmul_fp8_flops"], 0.0);
  EXPECT_GT(f8["per_device"]["matmul_fp8_flops"].get<double>(), 0.0);
  EXPECT_LT(f8["per_device"]["matmul_flops"].get<double>(),
            none["per_device"]["matmul_flops"].get<double>());
  const Result no_fp8 = run(fmt::format(
      "train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 64 --float8 --hardware a100-80g", cfg));
  EXPECT_EQ(no_fp8.code, 2);  // a refusal (train_plan_refusals()): bad usage
  EXPECT_THAT(no_fp8.err, ::testing::HasSubstr("'a100-80g' has no float8 matrix units"));
  // The recipe and all-gather dtype: as the program ran them; bad values and combinations exit 2.
  EXPECT_EQ(f8["float8_recipe"], "tensorwise");
  EXPECT_EQ(f8["float8_all_gather"], "float8");
  EXPECT_TRUE(none["float8_recipe"].is_null());
  const auto rows = plan("--float8 --float8-recipe rowwise");
  EXPECT_EQ(rows["float8_recipe"], "rowwise");
  EXPECT_EQ(rows["float8_all_gather"], "bf16");
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--float8 --float8-recipe rows", "--float8-recipe: [train] unknown float8 recipe 'rows'"},
           {"--float8 --float8-all-gather fp8",
            "--float8-all-gather: [train] unknown float8 all-gather dtype 'fp8'"},
           {"--float8-recipe rowwise", "is refused: without --float8"},
           {"--float8 --float8-recipe rowwise --float8-all-gather float8",
            "--float8-all-gather float8 is refused"}}) {
    const Result bad =
        run(fmt::format("train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 64 {}", cfg, args));
    EXPECT_EQ(bad.code, 2) << args;
    EXPECT_THAT(bad.err, ::testing::HasSubstr(says)) << args;
  }
  EXPECT_EQ(full["remat"], "full");
  EXPECT_EQ(recompute["remat"], "full");
  EXPECT_EQ(full["recompute"], true);
  EXPECT_EQ(names["remat"], "names:mlpwi_0,context");
  EXPECT_EQ(full["per_device"]["flops"], recompute["per_device"]["flops"]);
  EXPECT_GT(full["per_device"]["flops"], dots["per_device"]["flops"]);
  EXPECT_GT(dots["per_device"]["flops"], none["per_device"]["flops"]);
  EXPECT_LT(full["per_device"]["peak_bytes"], none["per_device"]["peak_bytes"]);
  EXPECT_EQ(none["loss"], "fused");
  EXPECT_EQ(plan("--loss naive")["loss"], "naive");
  const Result text =
      run(fmt::format("train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 64 --remat dots", cfg));
  EXPECT_THAT(text.out, ::testing::HasSubstr("remat dots, attention fused, loss fused"));
  // Naive attention keeps each layer's [b, heads, t, t] probabilities for the backward pass (the
  // softmax's result, all PyTorch's softmax keeps): more memory where they matter (1,024 tokens:
  // 32 heads x 1024 x 1024 bf16, 64 MiB a layer a device, where the fused kernel keeps its
  // output, 8 MiB; both layers' are live at the peak, in the head's backward pass), and the JSON
  // says which.
  const auto naive = plan("--attention naive");
  EXPECT_EQ(naive["attention"], "naive");
  EXPECT_EQ(none["attention"], "fused");
  const auto long_plan = [&](const std::string& extra) {
    const Result r = run(fmt::format(
        "train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 1024 --json {}", cfg, extra));
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  EXPECT_GT(long_plan("--attention naive")["per_device"]["peak_bytes"].get<std::int64_t>(),
            long_plan("")["per_device"]["peak_bytes"].get<std::int64_t>() + (std::int64_t{64} << 20));
  // Without recomputation the weights are gathered again for the backward pass unless
  // --no-reshard-after-forward keeps them: more gathered at the peak, fewer bytes received.
  // (With 1,024 tokens a device: with fewer, moving activations is cheaper than gathering
  // weights, and neither gathers them.)
  const auto again = long_plan(""), kept = long_plan("--no-reshard-after-forward");
  EXPECT_EQ(again["reshard_after_forward"], true);
  EXPECT_EQ(kept["reshard_after_forward"], false);
  EXPECT_GT(kept["per_device"]["peak_gathered_bytes"], again["per_device"]["peak_gathered_bytes"]);
  EXPECT_LT(kept["bytes_received_per_device"]["all_gather"],
            again["bytes_received_per_device"]["all_gather"]);
  const Result bad = run(fmt::format(
      "train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 64 --remat names:attn_out", cfg));
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, ::testing::HasSubstr("'attn_out'"));
  EXPECT_THAT(bad.err, ::testing::HasSubstr("'mlpwi_0'"));
}

// Only regular files are read, and their content is checked field by field.
TEST_F(TrainPlanCli, ConfigFilesAreReadSafely) {
  const auto check = [&](const std::string& path, std::vector<std::string> parts) {
    const Result r = run(fmt::format("train-plan --config '{}' --mesh fsdp:8", path));
    EXPECT_EQ(r.code, 1) << path << "\n" << r.err;
    EXPECT_THAT(r.err, ::testing::Not(::testing::HasSubstr("internal error"))) << path;
    for (const std::string& p : parts) EXPECT_THAT(r.err, ::testing::HasSubstr(p)) << path;
  };
  ASSERT_EQ(::mkfifo((dir_ / "pipe.json").c_str(), 0600), 0);
  check((dir_ / "pipe.json").string(), {"pipe.json", "FIFO"});
  fs::create_directories(dir_ / "ckpt");
  ASSERT_EQ(::mkfifo((dir_ / "ckpt" / "config.json").c_str(), 0600), 0);
  check((dir_ / "ckpt").string(), {"config.json", "FIFO"});
  check("/dev/zero", {"/dev/zero", "character device"});
  fs::create_directories(dir_ / "odd" / "config.json");
  check((dir_ / "odd").string(), {"config.json", "a directory"});
  const std::string head = R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": )";
  check(config(head + std::string(100'000, '[') + std::string(100'000, ']') + "}", "deep.json")
            .string(),
        {"deep.json", "nesting deeper than 256"});
  check(config(head + "1e400}", "huge.json").string(), {"huge.json", "'vocab_size' is 1e400"});
  check(config(head + R"(8, "vocab_size": 16})", "dup.json").string(),
        {"dup.json", "'vocab_size' appears twice"});
}

TEST_F(TrainPlanCli, BadOptionsAreUsageErrors) {
  const std::string cfg = llama().string();
  const auto check = [&](const std::string& args, std::vector<std::string> parts) {
    const Result r = run(fmt::format("train-plan --config '{}' {}", cfg, args));
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_THAT(r.err, ::testing::Not(::testing::HasSubstr("internal error"))) << args;
    for (const std::string& p : parts) EXPECT_THAT(r.err, ::testing::HasSubstr(p)) << args;
  };
  check("--mesh fsdp:8 --headroom nan", {"--headroom nan"});
  check("--mesh fsdp:8 --headroom inf", {"--headroom"});
  check("--mesh fsdp:8 --device-memory " + std::string(400, '9'),
        {"--device-memory", "out of range"});
  check("--mesh fsdp:8 --device-memory ''", {"--device-memory", "the value is empty"});
  for (const char* option : {"--param-dtype", "--grad-dtype", "--optimizer-dtype"}) {
    check(fmt::format("--mesh fsdp:8 {} f16", option), {option, "f16", "bf16, f32 or f64"});
  }
  check("--mesh fsdp:8 --batch-axes ,", {"--batch-axes", "empty axis name"});
  check("--mesh fsdp:8 --remat some", {"--remat", "'some'", "none, full, dots, names:"});
  check("--mesh fsdp:8 --remat names:", {"--remat", "'names:'"});
  check("--mesh fsdp:8 --remat names:a,,b", {"--remat", "'names:a,,b'"});
  check("--mesh fsdp:8 --remat ''", {"--remat", "the value is empty"});
  check("--mesh fsdp:8 --recompute --remat none", {"--recompute", "--remat none"});
  check("--mesh fsdp:8 --loss chunked", {"--loss", "'chunked'", "fused, naive"});
  check("--mesh fsdp:8 --attention flash", {"--attention", "'flash'", "fused, naive"});
  check("--mesh fsdp:8 --batch-axes ''", {"--batch-axes", "the value is empty"});
  check("--mesh fsdp:8 --batch-axes fsdp,fsdp", {"--batch-axes", "'fsdp' is named twice"});
  check("--mesh fsdp:1048576,tp:2", {"2097152 devices", "limit of 1048576"});
  check("--mesh fsdp:1048576,tp:2 --devices 8",
        {"--mesh", "multiply to 2097152 devices", "limit of 1048576"});
  // The help offers only the dtypes a step can be planned in.
  const Result help = run("train-plan --help");
  EXPECT_THAT(help.out, ::testing::Not(::testing::ContainsRegex("[^b]f16")));
  EXPECT_THAT(help.out, ::testing::HasSubstr("bf16, f32 or f64"));
}

// Issue 39: an option that cannot apply is refused (exit 2, naming it), never dropped.
TEST_F(TrainPlanCli, OptionsThatCannotApplyAreRefused) {
  const std::string cfg = llama().string();
  const auto refused = [&](const std::string& args, std::vector<std::string> parts) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
    for (const std::string& p : parts) EXPECT_THAT(r.err, ::testing::HasSubstr(p)) << args;
  };
  const std::string base = fmt::format("train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 64", cfg);
  // An empty value was "not given": --rules '' planned the llama_fsdp_tp preset.
  for (const char* option : {"--hardware", "--master-dtype", "--reduce-dtype", "--grad-dtype",
                             "--mixed-precision", "--rules", "--mesh", "--optimizer-dtype",
                             "--param-dtype", "--attention", "--loss", "--sequence-parallel",
                             "--device-memory", "--remat", "--batch-axes"}) {
    refused(fmt::format("{} {} ''", base, option), {option, "the value is empty"});
  }
  refused(base + " --optimizer ''", {"--optimizer", "not in {sgd,adam,adamw}"});
  // --optimizer-dtype bf16 with FSDP2's mixed precision was silently f32.
  refused(base + " --mixed-precision fsdp2 --optimizer-dtype bf16",
          {"--optimizer-dtype bf16", "--mixed-precision fsdp2"});
  // --headroom without a memory to keep it in changed nothing.
  refused(base + " --headroom 0.2", {"--headroom 0.2", "--device-memory or --hardware"});
  EXPECT_EQ(run(base + " --headroom 0.2 --device-memory 80GiB").code, 0);
  // --target-seq on a decoder-only model was ignored.
  refused(base + " --target-seq 32", {"--target-seq", "decoder-only", "llama"});
  // T5 on a cp mesh: its cp devices repeated the same work under a "context parallel" line.
  const std::string t5 = config(R"({"model_type": "t5", "vocab_size": 40, "d_model": 16,
    "d_kv": 6, "d_ff": 24, "num_layers": 1, "num_decoder_layers": 1, "num_heads": 2,
    "relative_attention_num_buckets": 8, "feed_forward_proj": "relu"})", "t5.json").string();
  refused(fmt::format("train-plan -c '{}' --mesh fsdp:2,cp:2 --batch 4 --seq 8", t5),
          {"--mesh with a cp or context axis", "T5"});
  refused(fmt::format("train-plan -c '{}' --mesh fsdp:2,tp:2 --batch 4 --seq 8 --attention fused",
                      t5),
          {"--attention fused", "T5"});
  // Not given, T5's attention and loss are what its step runs.
  const Result plain = run(fmt::format("train-plan -c '{}' --mesh fsdp:2,tp:2 --batch 4 --seq 8", t5));
  EXPECT_EQ(plain.code, 0) << plain.err;
  EXPECT_THAT(plain.out, ::testing::HasSubstr("attention naive, loss naive"));
  // seq 3 over tp:2: the sequence cannot split.
  refused(fmt::format("train-plan -c '{}' --mesh fsdp:4,tp:2 --batch 8 --seq 3 "
                      "--sequence-parallel on",
                      cfg),
          {"--sequence-parallel on", "3 tokens", "[tp]"});
}

// With --compare, a configuration that cannot be planned (a mesh that does not fit --devices)
// is a row saying why; mesh axes and rule file names that are not UTF-8 still make JSON.
TEST_F(TrainPlanCli, CompareKeepsGoingAndWritesJsonForAnyName) {
  const std::string cfg = llama().string();
  const Result r =
      run(fmt::format("train-plan -c '{}' --compare --devices 8 --mesh fsdp:4,tp:2 --mesh fsdp:16 "
                      "--batch 8 --seq 128",
                      cfg));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("cannot be planned"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("multiply to 16, not the device count 8"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("cheapest that fits: #0"));
  const Result j = run(fmt::format(
      "train-plan -c '{}' --compare --json --mesh 'f\xffsdp:8' --mesh fsdp:8 --batch 8 --seq 128 "
      "--device-memory 4GiB",
      cfg));
  ASSERT_EQ(j.code, 0) << j.err;
  const auto plans = nlohmann::json::parse(j.out);
  ASSERT_EQ(plans["plans"].size(), 2u);
  // The rules name no axis 'f\xffsdp': that plan holds the whole model and its optimizer state
  // on each device (0.67B parameters x (2 + 2 + 8) bytes = 7.5 GiB, over 4 GiB), so the FSDP
  // plan is the cheapest that fits.
  EXPECT_EQ(plans["plans"][0]["fits"], false);
  EXPECT_EQ(plans["cheapest_fitting"], 1);
  // A rule file whose name is not UTF-8.
  const fs::path rules = dir_ / "r\xff.yaml";
  std::ofstream(rules) << preset_text("llama_fsdp");
  const Result f = run(fmt::format(
      "train-plan -c '{}' --compare --json --rules '{}' --mesh fsdp:8 --batch 8 --seq 128", cfg,
      rules.string()));
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_EQ(nlohmann::json::parse(f.out)["plans"][0]["rules"],
            (dir_ / "r\xef\xbf\xbd.yaml").string());
}

// What the config says that the step does not model is reported.
TEST_F(TrainPlanCli, FieldsNotModelledAreReported) {
  const fs::path c = config(R"({"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
      "intermediate_size": 11008, "num_hidden_layers": 2, "num_attention_heads": 32,
      "hidden_act": "gelu", "some_new_width": 64})");
  const Result r = run(fmt::format("train-plan -c '{}' --mesh fsdp:8 --seq 64", c.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("not modelled: hidden_act 'gelu' (the step's MLP is "
                                          "SwiGLU, with silu); some_new_width 64 (a field this "
                                          "planner does not know)"));
  const Result j = run(fmt::format("train-plan -c '{}' --mesh fsdp:8 --seq 64 --json", c.string()));
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_EQ(nlohmann::json::parse(j.out)["not_modelled"].size(), 2u);
}

// --html writes the page beside the usual output; a path that cannot be written fails naming
// it and leaves nothing; an empty path and --compare are bad usage.
TEST_F(TrainPlanCli, HtmlWritesThePageOrNamesThePathItCannotWrite) {
  const fs::path page = dir_ / "train.html";
  const Result r = run(fmt::format(
      "train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 64 --hardware h100-sxm --html '{}'",
      llama().string(), page.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("step time on h100-sxm"));  // the text, as without
  std::ifstream in(page);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string html = buffer.str();
  for (const char* part : {"<title>shardplan train-plan: llama (llama)", "Live bytes over the step",
                           "the whole step", "Step time on h100-sxm", "Live at the peak"}) {
    EXPECT_THAT(html, ::testing::HasSubstr(part)) << part;
  }
  EXPECT_TRUE(html.ends_with("</html>\n"));

  const fs::path missing = dir_ / "no_such_dir" / "train.html";
  const Result bad = run(fmt::format("train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 64 --html '{}'",
                                     llama().string(), missing.string()));
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, ::testing::HasSubstr(missing.string()));
  EXPECT_THAT(bad.err, ::testing::HasSubstr("No such file or directory"));
  EXPECT_TRUE(bad.out.empty());  // the page fails the command before its text
  EXPECT_FALSE(fs::exists(missing.parent_path()));

  const Result empty = run(fmt::format("train-plan -c '{}' --mesh fsdp:8 --html ''", llama().string()));
  EXPECT_EQ(empty.code, 2);
  EXPECT_THAT(empty.err, ::testing::HasSubstr("the path is empty"));
  const Result compare = run(fmt::format(
      "train-plan -c '{}' --mesh fsdp:8 --mesh fsdp:4,tp:2 --compare --html x.html", llama().string()));
  EXPECT_EQ(compare.code, 2);
  EXPECT_THAT(compare.err, ::testing::HasSubstr("--html draws one plan"));
  EXPECT_FALSE(fs::exists(dir_ / "x.html"));
}

// FSDP over devices that do not divide the weights plans by default, the padded blocks' bytes
// (4416 bf16 elements per device, worked out in train_plan_test_padded.cpp); --strict-shards
// refuses, exit 1 naming the tensor, shape and axis.
TEST_F(TrainPlanCli, UnevenShardsArePaddedUnlessStrictShards) {
  const std::string cfg = config(R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2})").string();
  const std::string args =
      fmt::format("train-plan --config '{}' --mesh fsdp:5 --batch 5 --seq 8", cfg);
  const Result padded = run(args + " --json");
  ASSERT_EQ(padded.code, 0) << padded.err;
  EXPECT_EQ(nlohmann::json::parse(padded.out)["per_device"]["parameter_bytes"], 4416 * 2);
  const Result strict = run(args + " --strict-shards");
  EXPECT_EQ(strict.code, 1);
  EXPECT_THAT(strict.err, ::testing::HasSubstr("(shape [64, 32]) is not divisible by mesh axis "
                                               "'fsdp' (size 5); 32 is not a multiple of 5"));
}

}  // namespace
}  // namespace shardplan
