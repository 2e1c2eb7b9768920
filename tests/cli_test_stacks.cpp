// `shardplan train-plan --stack NAME`: a declared stack plans as its settings spelled out, the
// options given override it, --explain lists its choices, bad names are refused.
#include <sstream>
#include <string_view>

#include "cli_test.hpp"
#include "shardplan/training_stack.hpp"

namespace shardplan {
namespace {

using namespace test;

class StackCli : public TrainPlanCli {
 protected:
  // The small LLaMA on `mesh`.
  std::string base(std::string_view mesh = "fsdp:4") const {
    return fmt::format("train-plan --config '{}' --mesh {} --batch 8 --seq 64 --json",
                       small_llama().string(), mesh);
  }
  nlohmann::json plan_of(const std::string& args) const { return plan_json(args); }
};

// The flags a choice's setting names ("--remat names:a,b", "--master-dtype f32 --grad-dtype
// bf16"); none for a setting in words ("train-plan's default (no --eager)").
std::string flags_of(const StackChoice& c) {
  return c.setting.starts_with("--") ? std::string(c.setting) : std::string();
}

// Every stack plans exactly the program its settings, given as options, plan: each choice's
// apply does what its setting (what --explain shows) says. On a mesh with data, context and
// tensor-parallel axes, where every setting applies (given without a model or context axis,
// --tp-plan modules and --cp-rotate allgather are refused; set by a stack they are its default).
TEST_F(StackCli, EachStackPlansAsItsSettingsSpelledOut) {
  const std::string b = base("fsdp:2,cp:2,tp:2");
  for (const TrainingStack& s : training_stacks()) {
    SCOPED_TRACE(std::string(s.name));
    std::string spelled;
    for (const StackChoice& c : s.choices) {
      if (c.modelled() && !flags_of(c).empty()) spelled += " " + flags_of(c);
    }
    const nlohmann::json via_stack = plan_of(fmt::format("{} --stack {}", b, s.name));
    const nlohmann::json via_flags = plan_of(b + spelled);
    EXPECT_EQ(via_stack, via_flags) << spelled;
  }
}

// Options given override the choices they set, and the report says which; the rest of the
// stack still applies; what the stack does that is not planned is named.
TEST_F(StackCli, OptionsGivenOverrideTheStacksChoices) {
  const std::string b = base() + " --stack torchtitan-2024-12";
  const Result r = run(b);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("eager"), true);
  EXPECT_EQ(j.at("fsdp_root"), true);
  EXPECT_EQ(j.at("loss"), "naive");
  EXPECT_EQ(j.at("master_dtype"), "f32");
  EXPECT_EQ(j.at("remat"), "torchtitan:op");
  EXPECT_EQ(j.at("stack").at("name"), "torchtitan-2024-12");
  EXPECT_EQ(j.at("stack").at("validated"), true);
  EXPECT_TRUE(j.at("stack").at("overridden").empty());
  // Its foreach AdamW is planned as torch's passes, read from the program.
  EXPECT_EQ(j.at("optimizer_kernel"), "foreach");
  EXPECT_TRUE(j.at("stack").at("not_modelled").empty());

  const Result o = run(b + " --compile --no-fsdp-root --remat full --loss fused");
  ASSERT_EQ(o.code, 0) << o.err;
  const auto k = nlohmann::json::parse(o.out);
  EXPECT_EQ(k.at("eager"), false);
  EXPECT_EQ(k.at("fsdp_root"), false);
  EXPECT_EQ(k.at("remat"), "full");
  EXPECT_EQ(k.at("loss"), "fused");
  EXPECT_EQ(k.at("master_dtype"), "f32");  // not overridden: still the stack's
  EXPECT_EQ(k.at("stack").at("overridden"),
            nlohmann::json::array({"activation checkpointing (by --remat)", "loss (by --loss)",
                                   "torch.compile (by --compile)",
                                   "FSDP wrapping (by --no-fsdp-root)"}));
  // One dtype option given replaces the stack's whole precision choice.
  const auto p = nlohmann::json::parse(run(b + " --param-dtype f32").out);
  EXPECT_EQ(p.at("param_dtype"), "f32");
  EXPECT_EQ(p.at("master_dtype"), "f32");
  EXPECT_EQ(p.at("grad_dtype"), "f32");
  EXPECT_EQ(p.at("reduce_dtype"), "f32");

  // The text names the stack, that another is unvalidated, and what is not modelled.
  const Result t = run(fmt::format("train-plan --config '{}' --mesh fsdp:4 --batch 8 --seq 64 "
                                   "--stack megatron-core --remat full",
                                   llama().string()));
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_THAT(t.out, ::testing::HasSubstr(
                         "stack megatron-core (unvalidated: fewer than 2 published runs planned "
                         "through it); overridden: activation checkpointing (by --remat)\n"));
  // Megatron's FusedAdam is planned as the fused kernel, and the report says the program ran it.
  EXPECT_THAT(t.out, ::testing::HasSubstr("optimizer kernel fused"));
  const auto mj = nlohmann::json::parse(
      run(fmt::format("train-plan --config '{}' --mesh fsdp:4 --batch 8 --seq 64 "
                      "--stack megatron-core --json",
                      llama().string()))
          .out);
  EXPECT_EQ(mj.at("optimizer_kernel"), "fused");
  EXPECT_EQ(nlohmann::json::parse(run(fmt::format("train-plan --config '{}' --mesh fsdp:4 --batch "
                                                  "8 --seq 64 --stack megatron-core "
                                                  "--optimizer-kernel ops --json",
                                                  llama().string()))
                                      .out)
                .at("optimizer_kernel"),
            "ops");
}

// --explain lists every choice with its source, marks the overridden ones, plans nothing (no
// --config needed).
TEST_F(StackCli, ExplainListsEveryChoiceWithItsSource) {
  for (const TrainingStack& s : training_stacks()) {
    SCOPED_TRACE(std::string(s.name));
    const Result r = run(fmt::format("train-plan --stack {} --explain --loss fused", s.name));
    ASSERT_EQ(r.code, 0) << r.err;
    for (const StackChoice& c : s.choices) {
      EXPECT_THAT(r.out, ::testing::HasSubstr(fmt::format(
                             "\n{}\n  runs:    {}\n  planned: {}", c.topic, c.what, c.setting)));
      EXPECT_THAT(r.out, ::testing::HasSubstr(fmt::format("  source:  {}\n", c.source)));
    }
    const bool sets_loss = std::any_of(s.choices.begin(), s.choices.end(), [](const auto& c) {
      return c.modelled() && c.topic == "loss";
    });
    EXPECT_EQ(r.out.find("(overridden by --loss)") != std::string::npos, sets_loss);
    EXPECT_THAT(r.out, ::testing::HasSubstr(s.validated() ? "validated on" : "unvalidated"));
  }
  // The stacks that run torch's foreach AdamW list it as planned.
  for (const char* name : {"torchtitan-2024-07", "torchtitan-2024-12", "fms-fsdp"}) {
    const Result r = run(fmt::format("train-plan --stack {} --explain", name));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.out, ::testing::HasSubstr("\noptimizer kernel\n"));
    EXPECT_THAT(r.out, ::testing::HasSubstr("  planned: --optimizer-kernel foreach")) << name;
  }
}

TEST_F(StackCli, BadStacksAreRefusedNamingThem) {
  const Result unknown = run(base() + " --stack torchtitan");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err, ::testing::HasSubstr(
                               "--stack: [train] unknown stack 'torchtitan' (known: "
                               "torchtitan-2024-07, torchtitan-2024-12, torchtitan-2025-06"));
  const Result empty = run(base() + " --stack ''");
  EXPECT_EQ(empty.code, 2);
  EXPECT_THAT(empty.err, ::testing::HasSubstr("--stack"));
  const Result alone = run("train-plan --explain");
  EXPECT_EQ(alone.code, 2);
  EXPECT_THAT(alone.err, ::testing::HasSubstr("--explain lists a stack's choices: give --stack"));
  const Result no_config = run("train-plan --mesh fsdp:4 --stack maxtext");
  EXPECT_EQ(no_config.code, 2);
  EXPECT_THAT(no_config.err, ::testing::HasSubstr("--config is required"));
  // A choice the model cannot take: the error is the option's, and names the stack and what it
  // set (T5 has no recomputation; maxtext sets --remat maxtext:full).
  const fs::path t5 = config(R"({"model_type": "t5", "vocab_size": 512, "d_model": 64,
    "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4})", "t5.json");
  const Result cannot = run(fmt::format(
      "train-plan --config '{}' --mesh fsdp:4 --batch 8 --seq 32 --stack maxtext", t5.string()));
  EXPECT_EQ(cannot.code, 2);
  EXPECT_THAT(cannot.err, ::testing::HasSubstr("train-plan --stack maxtext (which sets"));
  EXPECT_THAT(cannot.err, ::testing::HasSubstr("activation checkpointing: --remat maxtext:full"));
  EXPECT_THAT(cannot.err, ::testing::HasSubstr("--recompute, --remat is refused"));
}

// --tp-plan takes partitioner or modules; anything else is bad usage naming the option and the
// known plans.
TEST_F(StackCli, AnUnknownTensorParallelPlanIsRefusedNamingIt) {
  const Result r = run(base() + " --tp-plan megatron");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, ::testing::HasSubstr("--tp-plan: [train] unknown tensor-parallel plan "
                                          "'megatron' (known: partitioner, modules)"));
  const Result empty = run(base() + " --tp-plan ''");
  EXPECT_EQ(empty.code, 2);
  EXPECT_THAT(empty.err, ::testing::HasSubstr("--tp-plan"));
}

// A torchtitan stack runs eager unless --compile, and its async TP needs torch.compile
// (torchtitan 2025 raises "Async TP requires --training.compile"): --async-tp alone is refused
// (exit 2) naming --eager; with --compile it is planned, the stack's choice reported overridden.
TEST_F(StackCli, TorchtitansAsyncTpNeedsCompile) {
  std::string args = base();
  args.replace(args.find("fsdp:4"), 6, "fsdp:2,tp:2");
  args += " --stack torchtitan-2025-08 --async-tp";
  const Result eager = run(args);
  EXPECT_EQ(eager.code, 2);
  EXPECT_THAT(eager.err, ::testing::HasSubstr("--async-tp is refused: --eager"));
  const Result compiled = run(args + " --compile");
  ASSERT_EQ(compiled.code, 0) << compiled.err;
  const nlohmann::json j = nlohmann::json::parse(compiled.out);
  EXPECT_FALSE(j["tp_overlaps"].empty());
  EXPECT_THAT(j["stack"]["overridden"].dump(), ::testing::HasSubstr("async TP (by --async-tp)"));
}

}  // namespace
}  // namespace shardplan
