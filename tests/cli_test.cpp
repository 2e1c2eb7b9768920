// The `shardplan` command, run as a user runs it: exit codes, text and JSON output of plan,
// explain, visualize and presets (train-plan, trace and the files it reads and writes: the
// other cli_test_*.cpp).
#include "cli_test.hpp"

namespace shardplan {
namespace {

using namespace test;

TEST_F(CliTest, CheckpointInspectReshardAndConsolidate) {
  // A Hugging Face checkpoint, written as any tool would: header, then the tensors' bytes.
  const Tensor emb = Tensor::normal(Shape{32, 16}, DType::kF32, 1);
  const Tensor norm = Tensor::normal(Shape{16}, DType::kBF16, 2);
  fs::create_directories(dir_ / "hf");
  {
    std::ofstream out(dir_ / "hf" / "model.safetensors", std::ios::binary);
    out << safetensors_header_bytes("model.safetensors",
                                    {{"model.embed_tokens.weight", {emb.shape(), emb.dtype()}},
                                     {"model.norm.weight", {norm.shape(), norm.dtype()}}},
                                    {{"format", "pt"}});
    out.write(reinterpret_cast<const char*>(emb.bytes()), emb.nbytes());
    out.write(reinterpret_cast<const char*>(norm.bytes()), norm.nbytes());
  }
  std::ofstream(dir_ / "rules.yaml") << "rules:\n  - {match: embed_tokens, spec: [fsdp, tp]}\n"
                                        "  - {match: norm, spec: []}\n";
  const std::string hf = (dir_ / "hf").string(), sp = (dir_ / "sp").string(),
                    back = (dir_ / "back").string(), rules = (dir_ / "rules.yaml").string();
  Result r = run("checkpoint inspect '" + hf + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("model.embed_tokens.weight"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("[32, 16]"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("Hugging Face safetensors"));

  r = run(
      fmt::format("checkpoint reshard '{}' '{}' --mesh fsdp:4,tp:2 --rules '{}'", hf, sp, rules));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("checkpoint inspect --json '" + sp + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "shardplan");
  EXPECT_THAT(j["tensors"][0]["sharding"].get<std::string>(), ::testing::HasSubstr("'fsdp', 'tp'"));
  EXPECT_EQ(j["tensors"][0]["name"], "model.embed_tokens.weight");
  EXPECT_EQ(j["files"][0]["xxh3"].get<std::string>().size(), 16u);

  r = run(fmt::format("checkpoint consolidate '{}' '{}'", sp, back));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(read_checkpoint_info(back).shardplan);
  const auto want = test::checkpoint_tensor_bytes(hf);
  EXPECT_EQ(want.size(), 2u);
  EXPECT_TRUE(test::checkpoint_tensor_bytes(sp) == want);
  EXPECT_TRUE(test::checkpoint_tensor_bytes(back) == want);

  // A mesh that does not divide: exit 1 naming the tensor, shape and axis; nothing written.
  r = run(fmt::format("checkpoint reshard '{}' '{}/x' --mesh fsdp:3,tp:2 --rules '{}'", hf,
                      dir_.string(), rules));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr("model/embed_tokens/weight"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("'fsdp' (size 3)"));
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  r = run(fmt::format("checkpoint consolidate '{}' '{}'", sp, back));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr("already exists"));
  // A missing input is bad usage, as a missing --config or --rules (issue 39: was exit 1).
  r = run("checkpoint inspect '" + (dir_ / "missing").string() + "'");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, ::testing::HasSubstr("checkpoint inspect DIR: no such file or directory"));
}

TEST_F(CliTest, DemoPlansTheEmbeddedModel) {
  const Result r = run("plan");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("model/layers/31/mlp/down_proj/weight"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("fsdp:4,tp:2 (8 devices)"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("bytes per device"));
}

TEST_F(CliTest, JsonHasTheDocumentedSchemaAndSplitsLargeWeightsEightWays) {
  const Result r = run("plan --json --mesh fsdp:4,tp:2 --devices 8");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["mesh"]["axes"], (nlohmann::json{"fsdp", "tp"}));
  EXPECT_EQ(j["mesh"]["shape"], (nlohmann::json{4, 2}));
  ASSERT_EQ(j["leaves"].size(), 2u + 32u * 9u + 1u);
  for (const auto& leaf : j["leaves"]) {
    for (const char* f :
         {"path", "shape", "dtype", "spec", "shard_shape", "bytes_per_device", "rule"}) {
      ASSERT_TRUE(leaf.contains(f)) << f;
    }
    std::int64_t numel = 1;
    for (const auto& d : leaf["shape"]) numel *= d.get<std::int64_t>();
    if (numel >= (1 << 20)) {
      EXPECT_EQ(leaf["bytes_per_device"].get<std::int64_t>() * 8, numel * 2) << leaf["path"];
    }
  }
  ASSERT_EQ(j["devices"].size(), 8u);
  EXPECT_EQ(j["devices"][7]["id"], 7);
  EXPECT_TRUE(j.contains("total_bytes"));
  EXPECT_TRUE(j.contains("unmatched_rules"));
}

TEST_F(CliTest, PlansASafetensorsCheckpointWithThePresetFile) {
  const fs::path model = llama_checkpoint(2);
  const std::string preset =
      std::string(SHARDPLAN_SOURCE_DIR) + "/rules/presets/llama_fsdp_tp.yaml";
  const Result r =
      run(fmt::format("plan --model '{}' --rules '{}' --mesh fsdp:4,tp:2 --devices 8 --json",
                      model.string(), preset));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  int large = 0;
  for (const auto& leaf : j["leaves"]) {
    if (leaf["shape"].size() != 2) continue;
    ++large;
    // Both axes appear in the spec, and each device holds an eighth.
    const std::string spec = leaf["spec"].dump();
    EXPECT_THAT(spec, ::testing::HasSubstr("\"fsdp\"")) << leaf["path"];
    EXPECT_THAT(spec, ::testing::HasSubstr("\"tp\"")) << leaf["path"];
    const std::int64_t bytes =
        leaf["shape"][0].get<std::int64_t>() * leaf["shape"][1].get<std::int64_t>() * 2;
    EXPECT_EQ(leaf["bytes_per_device"].get<std::int64_t>(), bytes / 8) << leaf["path"];
  }
  EXPECT_EQ(large, 2 + 2 * 7);
}

TEST_F(CliTest, ACheckpointDirectoryIsReadThroughItsSafetensorsFile) {
  const fs::path model = llama_checkpoint(1);  // dir_/model.safetensors
  const Result by_file = run(fmt::format("plan --model '{}' --json", model.string()));
  const Result by_dir = run(fmt::format("plan --model '{}' --json", dir_.string()));
  ASSERT_EQ(by_dir.code, 0) << by_dir.err;
  EXPECT_EQ(by_dir.out, by_file.out);
  const fs::path empty = dir_ / "empty";
  fs::create_directories(empty);
  const Result none = run(fmt::format("plan --model '{}'", empty.string()));
  EXPECT_EQ(none.code, 2);
  EXPECT_THAT(none.err, ::testing::HasSubstr("neither model.safetensors.index.json nor "
                                             "model.safetensors"));
}

TEST_F(CliTest, TheDeviceCountDefaultsToTheMeshsSize) {
  const Result r = run("plan --mesh fsdp:8,tp:2 --summary");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("(16 devices)"));
  // With an axis left to infer, the documented default of 8.
  EXPECT_THAT(run("plan --mesh fsdp:-1,tp:2 --summary").out, ::testing::HasSubstr("(8 devices)"));
  // '=' instead of ':' is answered with the spelling meant.
  const Result eq = run("plan --mesh fsdp=4,tp=2");
  EXPECT_EQ(eq.code, 1);
  EXPECT_THAT(eq.err, ::testing::HasSubstr("did you mean 'fsdp:4,tp:2'?"));
}

TEST_F(CliTest, SummaryLeavesOutTheRowPerTensor) {
  const Result full = run("plan");
  const Result summary = run("plan --summary");
  ASSERT_EQ(summary.code, 0) << summary.err;
  EXPECT_THAT(full.out, ::testing::HasSubstr("bytes/device"));
  EXPECT_THAT(summary.out, ::testing::Not(::testing::HasSubstr("bytes/device")));
  EXPECT_THAT(full.out, ::testing::HasSubstr("model/layers/31/input_layernorm/weight"));
  EXPECT_THAT(summary.out,
              ::testing::Not(::testing::HasSubstr("model/layers/31/input_layernorm/weight")));
  // The summary is the end of the full output, word for word.
  const std::size_t at = summary.out.find("rules:");
  ASSERT_NE(at, std::string::npos);
  const std::string tail = summary.out.substr(at);
  ASSERT_GE(full.out.size(), tail.size());
  EXPECT_EQ(full.out.substr(full.out.size() - tail.size()), tail);
  EXPECT_LT(std::count(summary.out.begin(), summary.out.end(), '\n'), 30);
}

TEST_F(CliTest, ExplainTakesTheCheckpointsNameAndPrintsJson) {
  const fs::path model = llama_checkpoint(1);
  const Result by_path = run(
      fmt::format("plan --model '{}' --explain model/layers/0/mlp/up_proj/weight", model.string()));
  const Result by_name = run(
      fmt::format("plan --model '{}' --explain model.layers.0.mlp.up_proj.weight", model.string()));
  ASSERT_EQ(by_name.code, 0) << by_name.err;
  // The same steps and result; only the name in the first line differs.
  EXPECT_EQ(by_name.out.substr(by_name.out.find('\n')), by_path.out.substr(by_path.out.find('\n')));
  const Result json = run(fmt::format(
      "plan --model '{}' --explain model.layers.0.mlp.up_proj.weight --json", model.string()));
  ASSERT_EQ(json.code, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["path"], "model/layers/0/mlp/up_proj/weight");
  EXPECT_EQ(j["shard_shape"], nlohmann::json::array({5504, 1024}));
  int decided = 0;
  for (const auto& s : j["steps"]) decided += s["decided"].get<bool>() ? 1 : 0;
  EXPECT_EQ(decided, 1);
  EXPECT_GE(j["steps"].size(), 2u);
  // A rule file whose name, and a mesh axis whose name, are not UTF-8 (before: "internal
  // error: [json.exception.type_error.316]", no output): shown with U+FFFD.
  const fs::path rules = dir_ / "r\xff.yaml";
  std::ofstream(rules) << "rules:\n  - {match: up_proj, spec: [a\xff]}\n"
                          "  - {match: '.*', spec: []}\n";
  const Result odd =
      run(fmt::format("plan --model '{}' --rules '{}' --mesh \"$(printf 'a\\377:2')\" --explain "
                      "model.layers.0.mlp.up_proj.weight --json",
                      model.string(), rules.string()));
  ASSERT_EQ(odd.code, 0) << odd.err;
  const auto k = nlohmann::json::parse(odd.out);
  EXPECT_THAT(k["mesh"].get<std::string>(), ::testing::HasSubstr("a\ufffd"));
  EXPECT_THAT(k["steps"][0]["rule"].get<std::string>(), ::testing::HasSubstr("r\ufffd.yaml"));
  EXPECT_EQ(k["shard_shape"], nlohmann::json::array({5504, 4096}));
}

TEST_F(CliTest, HtmlWritesThePageBesideTheUsualOutput) {
  const fs::path page = dir_ / "plan.html";
  const Result r = run(fmt::format("plan --summary --mesh fsdp:4,tp:2 --html '{}'", page.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("bytes per device"));  // the summary, as without --html
  std::ifstream in(page);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string html = buffer.str();
  EXPECT_THAT(html, ::testing::HasSubstr("<title>shardplan: LLaMA-2-7B (embedded example) on "
                                         "Mesh(&#39;fsdp&#39;: 4, &#39;tp&#39;: 2)</title>"));
  EXPECT_THAT(html, ::testing::HasSubstr("lm_head/weight"));
  EXPECT_EQ(std::count(html.begin(), html.end(), '\0'), 0);
  EXPECT_TRUE(html.ends_with("</html>\n"));
  EXPECT_FALSE(fs::exists(page.string() + ".partial"));
  // With --json the JSON on stdout is untouched.
  const fs::path page2 = dir_ / "plan2.html";
  const Result j = run(fmt::format("plan --json --html '{}'", page2.string()));
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_TRUE(nlohmann::json::accept(j.out));
  EXPECT_TRUE(fs::exists(page2));
}

TEST_F(CliTest, HtmlToAPathThatCannotBeWrittenFailsNamingItAndLeavesNothing) {
  const fs::path page = dir_ / "no_such_dir" / "plan.html";
  const Result r = run(fmt::format("plan --summary --html '{}'", page.string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr(page.string()));
  EXPECT_THAT(r.err, ::testing::HasSubstr("No such file or directory"));
  EXPECT_FALSE(fs::exists(page.parent_path()));
  // --html draws a plan; --explain prints no plan.
  EXPECT_EQ(run("plan --explain lm_head/weight --html x.html").code, 2);
}

TEST_F(CliTest, ForgettingRulesOnAnotherModelNamesTheOtherPresets) {
  const fs::path model = dir_ / "gpt2.json";
  std::ofstream(model) << R"({"wte.weight": {"shape": [50257, 768], "dtype": "F32"},
                             "h.0.attn.c_attn.bias": {"shape": [2304], "dtype": "F32"}})";
  const Result r = run(fmt::format("plan --model '{}'", model.string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr("h/0/attn/c_attn/bias"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("default preset llama_fsdp_tp is for LLaMA"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("gpt2"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("t5"));
  // With the right preset it plans; with rules given, the error is the rule's alone.
  EXPECT_EQ(
      run(fmt::format("plan --model '{}' --rules preset:gpt2 --summary", model.string())).code, 0);
  const Result given =
      run(fmt::format("plan --model '{}' --rules preset:llama_fsdp_tp", model.string()));
  EXPECT_EQ(given.code, 1);
  EXPECT_THAT(given.err, ::testing::Not(::testing::HasSubstr("default preset")));
}

TEST_F(CliTest, ExplainShowsEveryRuleTried) {
  const Result r = run("plan --explain model/layers/0/mlp/down_proj/weight");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("rule 0 'embed_tokens/weight$': no match"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("=> rule 5 'mlp/down_proj/weight$': matched"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("[1024, 5504]"));
}

TEST_F(CliTest, PlanFailuresExitOneNamingPathShapeAndAxis) {
  const Result r = run("plan --mesh fsdp:3,tp:2 --devices 6");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr("'fsdp' (size 3)"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("[32000, 4096]"));
  const Result bad_mesh = run("plan --mesh fsdp:3,tp:2 --devices 8");
  EXPECT_EQ(bad_mesh.code, 1);
  EXPECT_THAT(bad_mesh.err, ::testing::HasSubstr("8"));
  const Result unknown_axis = run("plan --mesh data:-1,tp:2");
  EXPECT_EQ(unknown_axis.code, 1);
  EXPECT_THAT(unknown_axis.err, ::testing::HasSubstr("'fsdp'"));
}

TEST_F(CliTest, CorruptSafetensorsExitsOneWithAClearMessage) {
  const fs::path model = dir_ / "bad.safetensors";
  std::ofstream(model, std::ios::binary)
      << std::string("\x10\x00\x00\x00\x00\x00\x00\x00{\"w\": [1, 2", 19);
  const Result r = run(fmt::format("plan --model '{}'", model.string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr("bad.safetensors"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("header length 16"));
}

TEST_F(CliTest, TensorNamesThatMakeNoTreeAreErrorsNamingTheFile) {
  // An empty part, a name that is also a prefix of another: before, "[model] tensor name 'a..b'
  // has an empty part", naming no file.
  for (const auto& [names, what] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"a..b"}, "tensor name 'a..b' has an empty part"},
           {{"a", "a.b"}, "'a' is both a tensor and a prefix of 'a.b'"}}) {
    std::vector<std::pair<std::string, TensorSpec>> specs;
    for (const auto& n : names) specs.push_back({n, {Shape{4}, DType::kF32}});
    const fs::path file = dir_ / "m.safetensors";
    fs::remove(file);
    write_safetensors_skeleton(file, specs);
    for (const std::string& args : {fmt::format("plan --model '{}'", file.string()),
                                    fmt::format("checkpoint reshard '{}' '{}' --mesh fsdp:1",
                                                file.string(), (dir_ / "out").string())}) {
      const Result r = run(args);
      EXPECT_EQ(r.code, 1) << args;
      EXPECT_THAT(r.err, ::testing::HasSubstr(file.string() + ": " + what)) << args;
    }
    EXPECT_FALSE(fs::exists(dir_ / "out"));
  }
}

TEST_F(CliTest, ModelWhoseTensorSizeOverflowsExitsOneNamingTensorAndShape) {
  const fs::path model = dir_ / "huge.json";
  // 2^32 * 2^32 * 16 elements = 2^68: past int64.
  std::ofstream(model) << R"({"model.layers.0.mlp.w": {"shape": [4294967296, 4294967296, 16],)"
                       << R"( "dtype": "F32"}, "b": {"shape": [4], "dtype": "F32"}})";
  const Result r = run(fmt::format("plan --model '{}'", model.string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr("model.layers.0.mlp.w"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("element count of [4294967296, 4294967296, 16] "
                                          "overflows int64"));

  // 2^61 elements fit, their 2^63 bytes do not.
  std::ofstream(model) << R"({"w": {"shape": [2305843009213693952], "dtype": "F32"}})";
  const Result bytes = run(fmt::format("plan --model '{}'", model.string()));
  EXPECT_EQ(bytes.code, 1);
  EXPECT_THAT(bytes.err, ::testing::HasSubstr("'w'"));
  EXPECT_THAT(bytes.err, ::testing::HasSubstr("byte size of f32[2305843009213693952]"));
}

TEST_F(CliTest, SafetensorsHeaderWhoseTensorSizeOverflowsExitsOneNamingTensorAndShape) {
  const std::string header =
      R"({"model.embed.weight":{"dtype":"BF16","shape":[4294967296,4294967296,16],)"
      R"("data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  const fs::path model = dir_ / "huge.safetensors";
  std::ofstream(model, std::ios::binary) << bytes << header;
  const Result r = run(fmt::format("plan --model '{}'", model.string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr("huge.safetensors"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("'model.embed.weight'"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("element count of [4294967296, 4294967296, 16] "
                                          "overflows int64"));
}

TEST_F(CliTest, ModelWhoseTotalBytesOverflowExitsOneNamingTheTensorWhereTheSumPasses) {
  const fs::path model = dir_ / "many.json";
  // Tensors of 2^62 bytes each: each fits, but a + b = 2^63 is past INT64_MAX.
  std::ofstream(model) << R"({"a": {"shape": [4611686018427387904], "dtype": "U8"},)"
                       << R"( "b": {"shape": [4611686018427387904], "dtype": "U8"},)"
                       << R"( "c": {"shape": [4611686018427387904], "dtype": "U8"}})";
  const Result r =
      run(fmt::format("plan --model '{}' --rules preset:llama_fsdp --devices 8", model.string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr("total bytes overflow int64 at 'b'"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("u8[4611686018427387904]"));
}

TEST_F(CliTest, BadUsageExitsTwo) {
  EXPECT_EQ(run("plan --bogus").code, 2);
  EXPECT_EQ(run("").code, 2);
  EXPECT_EQ(run("plan --devices 0").code, 2);
  const Result missing = run("plan --model /nonexistent/model.safetensors");
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.err, ::testing::HasSubstr("/nonexistent/model.safetensors"));
  EXPECT_EQ(run("plan --rules preset:nope").code, 2);
  EXPECT_EQ(run("visualize --shape 8x8 --mesh x:2 --spec x").code, 2);
}

TEST_F(CliTest, HelpExplainsOptionsWithExamples) {
  const Result r = run("plan --help");
  EXPECT_EQ(r.code, 0);
  for (const char* opt :
       {"--model", "--mesh", "--devices", "--rules", "--json", "--explain", "Example"}) {
    EXPECT_THAT(r.out, ::testing::HasSubstr(opt));
  }
}

TEST_F(CliTest, VisualizeDrawsTheGrid) {
  const Result r = run("visualize --shape 8192,8192 --mesh x:4,y:2 --spec x,y");
  ASSERT_EQ(r.code, 0) << r.err;
  for (int d = 0; d < 8; ++d) EXPECT_THAT(r.out, ::testing::HasSubstr(fmt::format("device {}", d)));
  // 8192 x 8192 f32 over 4 x 2: [2048, 4096] blocks of 32 MiB, of 256 MiB in all.
  EXPECT_THAT(r.out,
              ::testing::HasSubstr("each device holds a [2048, 4096] block of f32: 32.00 MiB "
                                   "(256.00 MiB in all)"));
  EXPECT_THAT(run("visualize --shape 8192,8192 --mesh x:4,y:2 --spec x,y --dtype bf16").out,
              ::testing::HasSubstr("[2048, 4096] block of bf16: 16.00 MiB"));
  const Result bad_dtype = run("visualize --shape 8 --mesh x:2 --spec x --dtype f33");
  EXPECT_EQ(bad_dtype.code, 2);
  EXPECT_THAT(bad_dtype.err, ::testing::HasSubstr("--dtype"));
  const Result multi = run("visualize --shape 64 --mesh x:4,y:2 --spec x+y");
  ASSERT_EQ(multi.code, 0) << multi.err;
  EXPECT_THAT(multi.out, ::testing::HasSubstr("device 7"));
  const Result bad = run("visualize --shape 10,10 --mesh x:4,y:2 --spec x,y");
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, ::testing::HasSubstr("'x'"));
}

TEST_F(CliTest, PresetsListsEveryPreset) {
  const Result r = run("presets");
  ASSERT_EQ(r.code, 0);
  for (const char* p :
       {"llama_fsdp.yaml", "llama_fsdp_tp.yaml", "mixtral_ep.yaml", "gpt2.yaml", "t5.yaml"}) {
    EXPECT_THAT(r.out, ::testing::HasSubstr(p));
  }
}

TEST_F(CliTest, DeviceCountsHaveABoundNamedInTheError) {
  for (const char* args : {"plan --devices 100000000", "plan --devices 99999999999999999999",
                           "visualize --shape 8 --mesh x:-1 --devices 100000000 --spec x"}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_THAT(r.err, ::testing::HasSubstr("--devices")) << args;
    EXPECT_THAT(r.err, ::testing::Not(::testing::HasSubstr("internal error"))) << args;
  }
  EXPECT_THAT(run("plan --devices 100000000").err, ::testing::HasSubstr("1048576"));
  for (const char* mesh : {"x:100000000", "x:99999999999999999999", "x:1024,y:2048"}) {
    const Result r = run(fmt::format("visualize --shape 8 --mesh {} --spec x", mesh));
    EXPECT_EQ(r.code, 2) << mesh;
    EXPECT_THAT(r.err, ::testing::HasSubstr("limit of 1048576 devices")) << mesh;
  }
  // reshard's --mesh as plan's (was "not the device count 1", and -1 exit 1).
  for (const char* mesh : {"x:100000000", "x:99999999999999999999", "fsdp:1048576,tp:2"}) {
    const Result r = run(fmt::format("checkpoint reshard '{}' '{}' --mesh {}", dir_.string(),
                                     (dir_ / "out").string(), mesh));
    EXPECT_EQ(r.code, 2) << mesh << ": " << r.err;
    EXPECT_THAT(r.err, ::testing::HasSubstr("--mesh")) << mesh;
    EXPECT_THAT(r.err, ::testing::HasSubstr("limit of 1048576 devices")) << mesh;
  }
  // The count named is the sizes' product so far, exact: a -1 or a word after them is not
  // multiplied in (it once printed -2147483648 and 0 devices).
  for (const char* mesh : {"x:1024,y:2048,z:-1", "x:1024,y:2048,z:abc"}) {
    const Result r = run(fmt::format("checkpoint reshard '{}' '{}' --mesh {}", dir_.string(),
                                     (dir_ / "out").string(), mesh));
    EXPECT_EQ(r.code, 2) << mesh << ": " << r.err;
    EXPECT_THAT(r.err, ::testing::HasSubstr("at least 2097152 devices")) << mesh;
  }
  const Result infer = run(fmt::format("checkpoint reshard '{}' '{}' --mesh fsdp:-1,tp:2",
                                       dir_.string(), (dir_ / "out").string()));
  EXPECT_EQ(infer.code, 2) << infer.err;
  EXPECT_THAT(infer.err, ::testing::HasSubstr("--devices"));
  EXPECT_FALSE(fs::exists(dir_ / "out"));
  const Result mesh = run("plan --mesh x:100000000,y:-1 --devices 8");
  EXPECT_EQ(mesh.code, 1);
  EXPECT_THAT(mesh.err, ::testing::HasSubstr("axis 'x' has size 100000000"));
  EXPECT_THAT(mesh.err, ::testing::HasSubstr("limit of 1048576 devices"));
}

TEST_F(CliTest, PatternsThatAreNotUtf8AreAClearError) {
  // A rule pattern means what Python's re means on a str, so it must be UTF-8: a clear error
  // naming the file, the rule and the pattern's position, never an internal error.
  const fs::path rules = dir_ / "rules.yaml";
  std::ofstream(rules)
      << "rules:\n  - {match: \"never\xff\", spec: []}\n  - {match: \".*\", spec: []}\n";
  const Result r = run(fmt::format("plan --rules '{}' --json", rules.string()));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, ::testing::HasSubstr("rules.yaml"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("at position 5: the pattern is not valid UTF-8"));
  EXPECT_THAT(r.err, ::testing::Not(::testing::HasSubstr("internal error")));
  EXPECT_TRUE(r.out.empty());
}

TEST_F(CliTest, DeeplyNestedModelIsAClearError) {
  const fs::path model = dir_ / "deep.json";
  std::ofstream(model) << R"({"w": {"dtype": "F32", "shape": )" << std::string(65'536, '[')
                       << std::string(65'536, ']') << "}}";
  const Result r = run(fmt::format("plan --model '{}'", model.string()));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr("deep.json"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("nesting deeper than 256 levels"));
}

// ---- Outputs: unique temporaries, no-replace renames, file size limits, bad destinations -----

// A tensor name with an escape sequence is printed escaped, not sent to the terminal.
TEST_F(CliTest, TensorNamesAreEscapedInTextOutput) {
  fs::create_directories(dir_ / "esc");
  const fs::path file = dir_ / "esc" / "model.safetensors";
  write_safetensors_skeleton(file, {{"a\x1b[2Jb", {Shape{4, 4}, DType::kF32}},
                                    {"c\xc2\x9b"
                                     "d",
                                     {Shape{4}, DType::kF32}}});
  std::ofstream(dir_ / "all.yaml") << "strict: false\nrules:\n  - {match: \".\", spec: []}\n";
  const Result plan = run(fmt::format("plan --model '{}' --rules '{}' --mesh fsdp:2 --devices 2",
                                      file.string(), (dir_ / "all.yaml").string()));
  const Result inspect = run(fmt::format("checkpoint inspect '{}'", (dir_ / "esc").string()));
  for (const Result* r : {&plan, &inspect}) {
    ASSERT_EQ(r->code, 0) << r->err;
    EXPECT_EQ(r->out.find('\x1b'), std::string::npos) << r->out;
    EXPECT_EQ(r->out.find("\xc2\x9b"), std::string::npos) << r->out;
    EXPECT_THAT(r->out, ::testing::HasSubstr("a\\x1b[2Jb"));
    EXPECT_THAT(r->out, ::testing::HasSubstr("c\\u009bd"));
  }
}

// Error messages quote names from the files too (here the tensor whose shape does not divide):
// escaped the same way, the message's own line breaks kept.
TEST_F(CliTest, TensorNamesAreEscapedInErrorMessages) {
  fs::create_directories(dir_ / "esc");
  const fs::path file = dir_ / "esc" / "model.safetensors";
  write_safetensors_skeleton(file, {{"a\x1b[2Jb", {Shape{3}, DType::kF32}}});
  std::ofstream(dir_ / "split.yaml") << "rules:\n  - {match: \".\", spec: [fsdp]}\n";
  const Result r = run(fmt::format("plan --model '{}' --rules '{}' --mesh fsdp:2 --devices 2",
                                   file.string(), (dir_ / "split.yaml").string()));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  EXPECT_THAT(r.err, ::testing::HasSubstr("a\\x1b[2Jb"));
  EXPECT_THAT(r.err, ::testing::HasSubstr("fsdp"));
}

}  // namespace
}  // namespace shardplan
