// `shardplan trace` (summarize, memory), `shardplan example` and the JSON schemas of the outputs.
#include "cli_test.hpp"

namespace shardplan {
namespace {

using namespace test;

// `trace summarize` on a trace written by hand (tests/data/traces/small.trace.json): every
// figure below worked out from its events.
TEST_F(CliTest, TraceSummarizeOfAHandWrittenTrace) {
  const std::string file = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/data/traces/small.trace.json";
  const Result r = run(fmt::format("trace summarize '{}'", file));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // Spans 0 to 30 us; dot_general 10 + 20 + 10 us on three devices.
  EXPECT_THAT(r.out, ::testing::HasSubstr("9 complete events over 30.0 us"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("kernel +dot_general +3 +40.0 us +13.3 us"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("collective +all_reduce +2 +15.0 us +7.5 us"));
  // The order: by total time.
  EXPECT_LT(r.out.find("dot_general"), r.out.find("all_reduce"));
  EXPECT_LT(r.out.find("all_gather"), r.out.find("tanh"));
  // Device 0: busy 0-20 (its wait is idle), its all-reduce exposed. Device 2: the all-gather
  // (0-10) half under the kernel (5-15): 5 us exposed.
  EXPECT_THAT(r.out, ::testing::ContainsRegex("device 0 +20.0 us +66.7% +10.0 us +5.0 us +5.0 us"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("device 1 +30.0 us +100.0% +0 ns +10.0 us +10.0 us"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("device 2 +15.0 us +50.0% +15.0 us +10.0 us +5.0 us"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("host +2.0 us +6.7% +28.0 us"));
  // --top cuts the list.
  const Result top = run(fmt::format("trace summarize --top 1 '{}'", file));
  EXPECT_THAT(top.out, ::testing::HasSubstr("(1 of 4)"));
  EXPECT_EQ(top.out.find("all_reduce"), std::string::npos);
}

// A merged trace of two processes (tests/data/traces/two_ranks.trace.json, by hand): each row is
// named by its process and thread; the two hosts are two rows.
TEST_F(CliTest, TraceSummarizeOfAMergedTraceNamesEachRowByRank) {
  const std::string file =
      std::string(SHARDPLAN_SOURCE_DIR) + "/tests/data/traces/two_ranks.trace.json";
  const Result r = run(fmt::format("trace summarize '{}'", file));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("6 complete events over 15.0 us"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("kernel +dot_general +2 +20.0 us +10.0 us"));
  // Rank 0's device: 0-15 busy, its all-reduce (10-15) exposed; rank 1's: 2-15, 3 us exposed.
  EXPECT_THAT(r.out,
              ::testing::ContainsRegex("rank 0 device 0 +15.0 us +100.0% +0 ns +5.0 us +5.0 us"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("rank 0 host +2.0 us +13.3% +13.0 us"));
  EXPECT_THAT(r.out,
              ::testing::ContainsRegex("rank 1 device 1 +13.0 us +86.7% +2.0 us +3.0 us +3.0 us"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("rank 1 host +1.0 us +6.7% +14.0 us"));
  EXPECT_LT(r.out.find("rank 0 host"), r.out.find("rank 1 device 1"));  // by rank, then thread
}

TEST_F(CliTest, TraceSummarizeOfAFileThatIsNotATraceExitsOneNamingItAndWhatIsMissing) {
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {write("obj.json", R"({"events": []})"), "has no 'traceEvents'"},
      {write("dup.json", R"({"traceEvents": [], "traceEvents": []})"), "'traceEvents' twice"},
      {write("none.json", R"({"traceEvents": []})"), "no complete ('ph': 'X') events"},
      {write("nodur.json", R"([{"ph": "X", "name": "a", "ts": 1, "pid": 0, "tid": 0}])"),
       "event 0 has no 'dur'"},
      {write("badts.json", R"([{"ph": "X", "name": "a", "ts": "1", "dur": 1, "pid": 0, "tid": 0}])"),
       "event 0: 'ts' is string, not a number"},
      {write("dupev.json", R"([{"ph": "X", "ph": "X"}])"), "event 0 has the key 'ph' twice"},
      {write("huge.json", R"([{"ph": "X", "name": "a", "ts": 1, "dur": 1e308, "pid": 0, "tid": 0}])"),
       "event 0: 'ts' 1 or 'dur' 1e+308 is past 2^53 us"},
      {write("text.json", "not json"), "not valid JSON"},
      {write("deep.json", std::string(300, '[') + std::string(300, ']')), "not valid JSON"},
  };
  for (const auto& [file, missing] : cases) {
    const Result r = run(fmt::format("trace summarize '{}'", file));
    EXPECT_EQ(r.code, 1) << file;
    EXPECT_THAT(r.err, ::testing::HasSubstr(file));
    EXPECT_THAT(r.err, ::testing::HasSubstr(missing));
    EXPECT_EQ(r.out, "");
  }
  // A missing input is bad usage, as a missing --config or --rules (issue 39: was exit 1).
  const Result gone = run(fmt::format("trace summarize '{}'", (dir_ / "missing.json").string()));
  EXPECT_EQ(gone.code, 2);
  EXPECT_THAT(gone.err, ::testing::HasSubstr("trace FILE: no such file or directory"));
  EXPECT_THAT(gone.err, ::testing::HasSubstr("missing.json"));
  EXPECT_EQ(run("trace summarize").code, 2);  // no file: bad usage
}

// `trace memory` on the hand-written trace (tests/data/traces/memory.trace.json: two runs, every
// figure there by hand): the text, and the page and JSON it writes.
TEST_F(CliTest, TraceMemoryOfAHandWrittenTrace) {
  const std::string file = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/data/traces/memory.trace.json";
  const std::string html = (dir_ / "m.html").string(), json_out = (dir_ / "m.json").string();
  const Result r = run(fmt::format("trace memory '{}' --html '{}' --json '{}'", file, html, json_out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, ::testing::HasSubstr("2 program runs with memory measured"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("run 0: 3 steps on devices [0, 1]\n"
                                          "  measured peak 256 B on device 0 after step 1 (tanh "
                                          "'h', scope mlp)\n  planned peak  256 B after step 1"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("dot_general +mlp +32 B"));
  // Run 1: a view below its plan; its peak is the arguments alone.
  EXPECT_THAT(r.out, ::testing::HasSubstr("measured peak 128 B on device 0 at the start\n"
                                          "  planned peak  256 B after step 0 (reshape, scope "
                                          "flat)"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("wrote " + html));
  std::ifstream page_in(html);
  const std::string page((std::istreambuf_iterator<char>(page_in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(page, ::testing::HasSubstr(">peak 256 B</text>"));
  EXPECT_THAT(page, ::testing::HasSubstr("<dt>Runs</dt><dd>2</dd>"));
  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(json_out));
  ASSERT_EQ(doc["runs"].size(), 2u);
  EXPECT_EQ(doc["runs"][0]["planned_bytes"], nlohmann::json::array({224, 256, 240}));
  EXPECT_TRUE(doc["runs"][1]["peak"]["step"].is_null());
  // --top cuts each list.
  const Result top = run(fmt::format("trace memory --top 1 '{}'", file));
  EXPECT_THAT(top.out, ::testing::HasSubstr("... and 3 more"));
}

// The workflow: a program run with the profiler on, the trace written, then `trace memory`.
// On data:2, x f32[4, 8] by rows (64 B a device), w f32[8, 8] replicated (256 B): the product
// by rows (2 x 8 x 4 = 64 B) gives 384 B a device after its step, the peak.
TEST_F(CliTest, TraceMemoryOfATraceTheProfilerWrote) {
  Executor exec(2);
  const Mesh mesh = Mesh::parse("data:2", 2);
  const Array x = device_put(Tensor::normal(Shape{4, 8}, DType::kF32, 1),
                             NamedSharding(mesh, P("data", nullptr)), exec);
  const Array w = device_put(Tensor::normal(Shape{8, 8}, DType::kF32, 2), NamedSharding(mesh, P()), exec);
  auto f = sjit(mesh, [](const Array& a, const Array& b) {
    auto s = named_scope("proj");
    return matmul(a, b);
  });
  {
    profiler::ProfileSession session({.memory = true});
    (void)f(x, w);
  }
  const std::string trace = (dir_ / "step.trace.json").string();
  profiler::write_trace(trace);
  const Result r = run(fmt::format("trace memory '{}' --json '{}'", trace, (dir_ / "m.json").string()));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("1 program run with memory measured"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("run 0: 1 step on devices [0, 1]\n  measured peak 384 B "
                                          "on device 0 after step 0 (dot_general, scope proj)\n"
                                          "  planned peak  384 B after step 0"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("input 1 +256 B"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("dot_general +proj +64 B"));
}

TEST_F(CliTest, TraceMemoryOfABadTraceOrOutputExitsOneNamingIt) {
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {write("text.json", "not json"), "not a trace: not valid JSON"},
      {write("obj.json", R"({"events": []})"), "has no 'traceEvents'"},
      {std::string(SHARDPLAN_SOURCE_DIR) + "/tests/data/traces/small.trace.json",
       "no memory runs: it has no 'memory peak' instant events"},
      {write("broken.json", R"([{"ph": "i", "name": "memory peak", "args": {"devices": [0]}}])"),
       "event 0 'args': has no 'steps'"},
  };
  for (const auto& [file, missing] : cases) {
    const Result r = run(fmt::format("trace memory '{}'", file));
    EXPECT_EQ(r.code, 1) << file;
    EXPECT_THAT(r.err, ::testing::HasSubstr(file));
    EXPECT_THAT(r.err, ::testing::HasSubstr(missing));
    EXPECT_EQ(r.out, "");
  }
  const std::string good = std::string(SHARDPLAN_SOURCE_DIR) + "/tests/data/traces/memory.trace.json";
  const std::string unwritable = (dir_ / "no_dir" / "m.html").string();
  const Result r = run(fmt::format("trace memory '{}' --html '{}'", good, unwritable));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, ::testing::HasSubstr(unwritable));
  EXPECT_THAT(r.err, ::testing::HasSubstr("No such file or directory"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "no_dir"));
  EXPECT_EQ(run(fmt::format("trace memory '{}' --json ''", good)).code, 2);  // an empty path
  EXPECT_EQ(run("trace memory").code, 2);
}

// `example trace` makes a trace the trace commands read: the MLP's products on all 8 devices in
// the scopes it names, and both runs' memory.
TEST_F(CliTest, ExampleTraceWritesATraceTheTraceCommandsRead) {
  const std::string file = (dir_ / "step.trace.json").string();
  const Result r = run(fmt::format("example trace '{}'", file));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, ::testing::HasSubstr("wrote " + file + ": two training steps"));
  const Result summary = run(fmt::format("trace summarize '{}'", file));
  ASSERT_EQ(summary.code, 0) << summary.err;
  EXPECT_THAT(summary.out, ::testing::ContainsRegex("kernel +dot_general"));
  for (int d = 0; d < 8; ++d) {
    EXPECT_THAT(summary.out, ::testing::HasSubstr(fmt::format("device {} ", d)));
  }
  const Result memory = run(fmt::format("trace memory '{}'", file));
  ASSERT_EQ(memory.code, 0) << memory.err;
  EXPECT_THAT(memory.out, ::testing::HasSubstr("2 program runs with memory measured"));
  EXPECT_THAT(memory.out, ::testing::ContainsRegex("scope mlp_(in|out)"));
  // The trace is an output: an empty path is bad usage.
  EXPECT_EQ(run("example trace ''").code, 2);
  // ... and so is a directory, as for every output (docs/cli.md "Outputs"), naming it.
  const Result dir = run(fmt::format("example trace '{}'", dir_.string()));
  EXPECT_EQ(dir.code, 2);
  EXPECT_THAT(dir.err, ::testing::HasSubstr(dir_.string()));
}

// `example checkpoint` saves a small LLaMA by the preset: every tensor with its shape and the
// preset's spec (by hand from rules/presets/llama_fsdp_tp.yaml), readable by `plan --model`
// (the record's tree-path names, not read as dotted names) and by `checkpoint reshard`; a
// second save into the same directory is refused, naming it.
TEST_F(CliTest, ExampleCheckpointIsAShardplanCheckpointTheOtherCommandsRead) {
  const std::string ckpt = (dir_ / "ckpt").string();
  const Result r = run(fmt::format("example checkpoint '{}'", ckpt));
  ASSERT_EQ(r.code, 0) << r.err;
  const Result inspect = run(fmt::format("checkpoint inspect --json '{}'", ckpt));
  ASSERT_EQ(inspect.code, 0) << inspect.err;
  const auto j = nlohmann::json::parse(inspect.out);
  EXPECT_EQ(j["format"], "shardplan");
  std::map<std::string, std::pair<std::vector<std::int64_t>, std::string>> tensors;
  for (const auto& t : j["tensors"]) {
    tensors[t["name"]] = {t["shape"].get<std::vector<std::int64_t>>(), t["sharding"]};
  }
  // 1 embedding + 2 layers x (4 attention + 3 MLP matrices + 2 norms) + final norm + head.
  EXPECT_EQ(tensors.size(), 21u);
  const std::string on = " on Mesh('fsdp': 4, 'tp': 2)";
  using Row = std::pair<std::vector<std::int64_t>, std::string>;
  EXPECT_EQ(tensors["model/embed_tokens/weight"],
            (Row{{512, 64}, "PartitionSpec('tp', 'fsdp')" + on}));
  EXPECT_EQ(tensors["model/layers/1/self_attn/q_proj/weight"],
            (Row{{64, 64}, "PartitionSpec('tp', 'fsdp')" + on}));
  EXPECT_EQ(tensors["model/layers/0/mlp/down_proj/weight"],
            (Row{{64, 128}, "PartitionSpec('fsdp', 'tp')" + on}));
  EXPECT_EQ(tensors["model/norm/weight"], (Row{{64}, "PartitionSpec()" + on}));
  const Result plan = run(fmt::format("plan --model '{}' --json", ckpt));
  ASSERT_EQ(plan.code, 0) << plan.err;
  const auto p = nlohmann::json::parse(plan.out);
  EXPECT_EQ(p["leaves"].size(), 21u);
  const Result reshard =
      run(fmt::format("checkpoint reshard '{}' '{}-tp4' --mesh fsdp:2,tp:4", ckpt, ckpt));
  EXPECT_EQ(reshard.code, 0) << reshard.err;
  const Result again = run(fmt::format("example checkpoint '{}'", ckpt));
  EXPECT_EQ(again.code, 1);
  EXPECT_THAT(again.err, ::testing::HasSubstr(ckpt + ": already exists"));
}

// The --json outputs keep the keys and types docs/schemas/ pins (issue 39: keys keep their
// meaning, additions only). A key removed, renamed or of another type fails here, naming it.
TEST_F(CliTest, JsonOutputsHaveTheKeysTheirSchemasPin) {
  const std::string src = SHARDPLAN_SOURCE_DIR;
  const std::string cfg = src + "/tests/data/hf_configs/Meta-Llama-3-8B";
  const std::string ckpt = (dir_ / "ckpt").string();
  ASSERT_EQ(run(fmt::format("example checkpoint '{}'", ckpt)).code, 0);
  const std::string memory = (dir_ / "memory.json").string();
  struct Case {
    std::string schema, args, file;  // file: the output, "" for stdout
  };
  const std::vector<Case> cases = {
      {"plan", "plan --json", ""},
      {"plan_explain", "plan --explain model/layers/0/mlp/up_proj/weight --json", ""},
      {"train_plan",
       fmt::format("train-plan -c '{}' --mesh fsdp:8 --batch 8 --seq 1024 --hardware h100-sxm "
                   "--json",
                   cfg),
       ""},
      {"train_plan",  // with async TP's pairs (tp_overlaps, time.tp_overlap)
       fmt::format("train-plan -c '{}' --mesh fsdp:2,tp:4 --batch 8 --seq 256 --tp-plan modules "
                   "--async-tp --hardware h100-sxm --json",
                   cfg),
       ""},
      {"train_plan",  // with a stack's config read (stack.config)
       fmt::format("train-plan -c '{}' --from-config '{}/tests/data/stack_configs/llama3_8b.toml' "
                   "--devices 8 --seq 128 --hardware h100-sxm --json",
                   cfg, src),
       ""},
      {"train_plan_compare",
       fmt::format("train-plan -c '{}' --mesh fsdp:8 --mesh fsdp:4,tp:2 --batch 8 --seq 1024 "
                   "--hardware h100-sxm --compare --json --stack torchtitan-2025-08",
                   cfg),
       ""},
      {"checkpoint_inspect", fmt::format("checkpoint inspect --json '{}'", ckpt), ""},
      {"trace_memory",
       fmt::format("trace memory '{}/tests/data/traces/memory.trace.json' --json '{}'", src,
                   memory),
       memory},
  };
  nlohmann::json plan_doc;
  for (const Case& c : cases) {
    const Result r = run(c.args);
    ASSERT_EQ(r.code, 0) << c.args << "\n" << r.err;
    std::string text = r.out;
    if (!c.file.empty()) {
      std::ifstream in(c.file);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const auto doc = nlohmann::json::parse(text);
    std::ifstream schema_file(src + "/docs/schemas/" + c.schema + ".schema.json");
    ASSERT_TRUE(schema_file) << c.schema;
    const auto schema = nlohmann::json::parse(schema_file);
    const auto errors = test::json_schema_errors(schema, doc);
    EXPECT_TRUE(errors.empty()) << c.args << ":\n" << fmt::format("{}", fmt::join(errors, "\n"));
    if (c.schema == "plan") plan_doc = doc;
  }
  // The check fails on what it is for: a key gone, a type changed, inside an array's items.
  std::ifstream schema_file(src + "/docs/schemas/plan.schema.json");
  const auto schema = nlohmann::json::parse(schema_file);
  plan_doc.erase("total_bytes");
  plan_doc["leaves"][3]["shape"] = "[4096]";
  EXPECT_EQ(test::json_schema_errors(schema, plan_doc),
            (std::vector<std::string>{"/: the key 'total_bytes' is missing",
                                      "/leaves/3/shape/: expected \"array\", got string"}));
}

}  // namespace
}  // namespace shardplan
