// plan_concurrently (train_plan.hpp): plans made on several threads at once are, field for field,
// the plans made one after another (a data race in tracing, compiling or the rules would show as
// a figure that differs, or under the tsan preset as a report), and failures are the ones a loop
// gives.
#include <gtest/gtest.h>

#include <atomic>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardplan/error.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/train_plan.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

constexpr const char* kTinyLlama = R"({"model_type": "llama", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 22,
  "num_attention_heads": 4, "num_key_value_heads": 2})";
constexpr const char* kTinyMixtral = R"({"model_type": "mixtral", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
  "num_experts_per_tok": 2})";
constexpr const char* kTinyGpt2 = R"({"model_type": "gpt2", "vocab_size": 40, "n_embd": 16,
  "n_layer": 3, "n_head": 2, "n_positions": 16})";
constexpr const char* kTinyT5 = R"({"model_type": "t5", "vocab_size": 40, "d_model": 16,
  "d_kv": 6, "d_ff": 24, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 2,
  "relative_attention_num_buckets": 8, "relative_attention_max_distance": 12,
  "feed_forward_proj": "gated-gelu", "tie_word_embeddings": true})";

// "fsdp:4,tp:2": a mesh of as many devices as its axes make.
Mesh mesh_of(const std::string& text) {
  std::int64_t devices = 1;
  for (std::size_t at = text.find(':'); at != std::string::npos; at = text.find(':', at + 1)) {
    devices *= std::stoll(text.substr(at + 1));
  }
  return Mesh::parse(text, devices);
}

struct Job {
  ModelConfig config;
  Mesh mesh;
  RulePtr rules;
  TrainPlanOptions options;
};

TrainPlanOptions options(std::int64_t batch, int accum, bool recompute) {
  TrainPlanOptions o;
  o.batch = batch;
  o.seq = 8;
  o.grad_accum = accum;
  o.recompute = recompute;
  o.device_memory = 1 << 30;
  return o;
}

// Every family; extrapolated by layers, by micro-batches, and traced whole; meshes of 4 to 64
// devices (about 10 s in Debug one after another); the preset's activations (sequence
// parallelism); one rule object shared by several jobs (as `train-plan --compare --rules FILE`
// shares it across meshes).
std::vector<Job> jobs() {
  const RuleFile llama_tp = load_preset("llama_fsdp_tp");
  const RulePtr shared = llama_tp.make_rule();
  const ModelConfig llama = ModelConfig::parse(kTinyLlama);
  ModelConfig two_layers = llama;
  two_layers.layers = 2;
  std::vector<Job> out;
  out.push_back({llama, mesh_of("fsdp:4,tp:2"), shared, options(8, 1, true)});
  out.push_back({two_layers, mesh_of("fsdp:2,tp:2"), shared, options(40, 20, true)});
  out.push_back({llama, mesh_of("fsdp:16,tp:4"), shared, options(16, 1, false)});
  TrainPlanOptions sp = options(32, 1, true);
  sp.activations = llama_tp;
  out.push_back({llama, mesh_of("fsdp:8,tp:2"), shared, sp});
  out.push_back({ModelConfig::parse(kTinyMixtral), mesh_of("ep:2,fsdp:2"),
                 load_preset("mixtral_ep").make_rule(), options(8, 2, true)});
  out.push_back({ModelConfig::parse(kTinyGpt2), mesh_of("fsdp:2,tp:2"),
                 load_preset("gpt2").make_rule(), options(4, 1, false)});
  out.push_back({ModelConfig::parse(kTinyT5), mesh_of("fsdp:2,tp:2"), load_preset("t5").make_rule(),
                 options(4, 1, false)});
  return out;
}

std::string json_of(TrainPlan p) {
  p.seconds_to_plan = 0;
  std::ostringstream os;
  p.write_json(os);
  return os.str();
}

// Every field but seconds_to_plan, exactly (the doubles too: the same sums in the same order).
void expect_identical(const TrainPlan& a, const TrainPlan& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.mesh, b.mesh);
  EXPECT_EQ(a.devices, b.devices);
  EXPECT_EQ(a.parameter_count, b.parameter_count);
  EXPECT_EQ(a.batch_axes, b.batch_axes);
  EXPECT_EQ(a.sequence_parallel, b.sequence_parallel);
  EXPECT_EQ(a.sequence_axes, b.sequence_axes);
  EXPECT_EQ(a.parameter_bytes, b.parameter_bytes);
  EXPECT_EQ(a.gradient_bytes, b.gradient_bytes);
  EXPECT_EQ(a.optimizer_bytes, b.optimizer_bytes);
  EXPECT_EQ(a.batch_bytes, b.batch_bytes);
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.transient_bytes, b.transient_bytes);
  EXPECT_EQ(a.peak_held_bytes, b.peak_held_bytes);
  EXPECT_EQ(a.peak_gathered_bytes, b.peak_gathered_bytes);
  EXPECT_EQ(a.peak_computed_bytes, b.peak_computed_bytes);
  EXPECT_EQ(a.reserved_bytes, b.reserved_bytes);
  EXPECT_EQ(a.reserved_bytes_expandable, b.reserved_bytes_expandable);
  EXPECT_EQ(a.bytes_by_collective, b.bytes_by_collective);
  EXPECT_EQ(a.flops, b.flops);
  EXPECT_EQ(a.total_flops, b.total_flops);
  EXPECT_EQ(a.extrapolated, b.extrapolated);
  EXPECT_EQ(a.traced, b.traced);
  EXPECT_EQ(json_of(a), json_of(b));
  TrainPlan ta = a, tb = b;
  ta.seconds_to_plan = tb.seconds_to_plan = 0;
  EXPECT_EQ(ta.table(), tb.table());
}

TEST(PlanConcurrently, PlansAreThoseMadeOneAfterAnother) {
  const std::vector<Job> js = jobs();
  std::vector<TrainPlan> one_by_one;
  for (const Job& j : js) one_by_one.push_back(plan_training(j.config, j.mesh, j.rules, j.options));
  // The cases cover what they claim: some extrapolated, one by micro-batches, one whole.
  EXPECT_TRUE(one_by_one[0].extrapolated) << one_by_one[0].traced;
  EXPECT_EQ(one_by_one[1].traced, "steps of 2, 3, 4, 8 micro-batches");
  EXPECT_TRUE(one_by_one[3].sequence_parallel);
  EXPECT_EQ(one_by_one[6].traced, "the whole step");
  const auto plan = [&](std::size_t i) {
    return plan_training(js[i].config, js[i].mesh, js[i].rules, js[i].options);
  };
  for (const int threads : {2, 3}) {
    const std::vector<TrainPlan> together = plan_concurrently(js.size(), plan, threads);
    ASSERT_EQ(together.size(), js.size());
    for (std::size_t i = 0; i < js.size(); ++i) {
      expect_identical(together[i], one_by_one[i],
                       "job " + std::to_string(i) + " on " + std::to_string(threads) + " threads");
    }
  }
}

// A failure is the first a loop would meet: the later failure is not the one rethrown, even
// when it comes first in time, and every call before the first failure ran.
TEST(PlanConcurrently, TheFirstFailureInOrderIsRethrown) {
  std::atomic<int> ran_before{0};
  const auto plan = [&](std::size_t i) -> TrainPlan {
    if (i == 5) throw SpecError("[test] call 5 fails");
    if (i == 1) throw std::runtime_error("call 1 fails too");  // never the one rethrown
    if (i < 5) ++ran_before;
    TrainPlan p;
    p.devices = static_cast<std::int64_t>(i);
    return p;
  };
  for (const int threads : {1, 2, 3}) {
    ran_before = 0;
    const auto only_5 = [&](std::size_t i) { return i == 1 ? TrainPlan{} : plan(i); };
    EXPECT_THROW_WITH(plan_concurrently(8, only_5, threads), SpecError, "call 5 fails");
    EXPECT_EQ(ran_before.load(), 4) << threads << " threads";  // calls 0, 2, 3, 4
    EXPECT_THROW_WITH(plan_concurrently(8, plan, threads), std::runtime_error, "call 1 fails too");
  }
  const std::vector<TrainPlan> none = plan_concurrently(0, plan, 2);
  EXPECT_TRUE(none.empty());
  const std::vector<TrainPlan> ok = plan_concurrently(
      3, [&](std::size_t i) { return plan(i == 1 ? 0 : i); }, 2);
  ASSERT_EQ(ok.size(), 3u);
  EXPECT_EQ(ok[2].devices, 2);
}

}  // namespace
}  // namespace shardplan
