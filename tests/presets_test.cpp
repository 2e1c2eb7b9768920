// Every compiled-in preset, planned against a model of its family with published shapes.
#include <fmt/format.h>

#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/rule_file.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

using Named = std::vector<std::pair<std::string, TensorSpec>>;

void add(Named& n, std::string name, Shape s, DType d = DType::kBF16) {
  n.emplace_back(std::move(name), TensorSpec{std::move(s), d});
}

// LLaMA-2-7B (hidden 4096, intermediate 11008, vocab 32000) with `kv` rows in k/v (GQA).
Named llama(int layers, std::int64_t hidden = 4096, std::int64_t inter = 11008,
            std::int64_t vocab = 32000, std::int64_t kv = 4096) {
  Named n;
  add(n, "model.embed_tokens.weight", {vocab, hidden});
  for (int l = 0; l < layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(n, p + "self_attn.q_proj.weight", {hidden, hidden});
    add(n, p + "self_attn.k_proj.weight", {kv, hidden});
    add(n, p + "self_attn.v_proj.weight", {kv, hidden});
    add(n, p + "self_attn.o_proj.weight", {hidden, hidden});
    add(n, p + "mlp.gate_proj.weight", {inter, hidden});
    add(n, p + "mlp.up_proj.weight", {inter, hidden});
    add(n, p + "mlp.down_proj.weight", {hidden, inter});
    add(n, p + "input_layernorm.weight", {hidden});
    add(n, p + "post_attention_layernorm.weight", {hidden});
  }
  add(n, "model.norm.weight", {hidden});
  add(n, "lm_head.weight", {vocab, hidden});
  return n;
}

// Mixtral-8x7B: GQA attention (8 kv heads of 128), 8 experts of 14336.
Named mixtral(int layers) {
  Named n;
  add(n, "model.embed_tokens.weight", {32000, 4096});
  for (int l = 0; l < layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(n, p + "self_attn.q_proj.weight", {4096, 4096});
    add(n, p + "self_attn.k_proj.weight", {1024, 4096});
    add(n, p + "self_attn.v_proj.weight", {1024, 4096});
    add(n, p + "self_attn.o_proj.weight", {4096, 4096});
    add(n, p + "block_sparse_moe.gate.weight", {8, 4096});
    for (int e = 0; e < 8; ++e) {
      const std::string x = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
      add(n, x + "w1.weight", {14336, 4096});
      add(n, x + "w2.weight", {4096, 14336});
      add(n, x + "w3.weight", {14336, 4096});
    }
    add(n, p + "input_layernorm.weight", {4096});
    add(n, p + "post_attention_layernorm.weight", {4096});
  }
  add(n, "model.norm.weight", {4096});
  add(n, "lm_head.weight", {32000, 4096});
  return n;
}

// GPT-2 small (124M) as published: Conv1D weights [in, out], F32.
Named gpt2() {
  Named n;
  const DType f = DType::kF32;
  add(n, "wte.weight", {50257, 768}, f);
  add(n, "wpe.weight", {1024, 768}, f);
  for (int l = 0; l < 12; ++l) {
    const std::string p = fmt::format("h.{}.", l);
    add(n, p + "ln_1.weight", {768}, f);
    add(n, p + "ln_1.bias", {768}, f);
    add(n, p + "attn.bias", {1, 1, 1024, 1024}, f);
    add(n, p + "attn.c_attn.weight", {768, 2304}, f);
    add(n, p + "attn.c_attn.bias", {2304}, f);
    add(n, p + "attn.c_proj.weight", {768, 768}, f);
    add(n, p + "attn.c_proj.bias", {768}, f);
    add(n, p + "ln_2.weight", {768}, f);
    add(n, p + "ln_2.bias", {768}, f);
    add(n, p + "mlp.c_fc.weight", {768, 3072}, f);
    add(n, p + "mlp.c_fc.bias", {3072}, f);
    add(n, p + "mlp.c_proj.weight", {3072, 768}, f);
    add(n, p + "mlp.c_proj.bias", {768}, f);
  }
  add(n, "ln_f.weight", {768}, f);
  add(n, "ln_f.bias", {768}, f);
  return n;
}

// T5-small (d_model 512, d_ff 2048, 8 heads, 6+6 blocks, vocab 32128), F32.
Named t5_small() {
  Named n;
  const DType f = DType::kF32;
  add(n, "shared.weight", {32128, 512}, f);
  for (const char* stack : {"encoder", "decoder"}) {
    const bool dec = std::string(stack) == "decoder";
    for (int b = 0; b < 6; ++b) {
      const std::string p = fmt::format("{}.block.{}.layer.", stack, b);
      for (const char* w : {"q", "k", "v", "o"})
        add(n, p + "0.SelfAttention." + w + ".weight", {512, 512}, f);
      if (b == 0) add(n, p + "0.SelfAttention.relative_attention_bias.weight", {32, 8}, f);
      add(n, p + "0.layer_norm.weight", {512}, f);
      int ff = 1;
      if (dec) {
        for (const char* w : {"q", "k", "v", "o"})
          add(n, p + "1.EncDecAttention." + w + ".weight", {512, 512}, f);
        add(n, p + "1.layer_norm.weight", {512}, f);
        ff = 2;
      }
      add(n, fmt::format("{}{}.DenseReluDense.wi.weight", p, ff), {2048, 512}, f);
      add(n, fmt::format("{}{}.DenseReluDense.wo.weight", p, ff), {512, 2048}, f);
      add(n, fmt::format("{}{}.layer_norm.weight", p, ff), {512}, f);
    }
    add(n, std::string(stack) + ".final_layer_norm.weight", {512}, f);
    add(n, std::string(stack) + ".embed_tokens.weight", {32128, 512}, f);
  }
  add(n, "lm_head.weight", {32128, 512}, f);
  return n;
}

PlanReport plan_preset(const std::string& preset, const Named& model,
                       const std::string& mesh = "") {
  const RuleFile f = load_preset(preset);
  const MeshShardingHelper helper(Mesh::parse(mesh.empty() ? *f.mesh : mesh, 8));
  return helper.plan(RuleTree(f.make_rule()), tree_from_names(model));
}

/// Every weight of at least 2^20 elements is split over all 8 devices (`buffer` names a constant
/// buffer that is replicated on purpose).
void expect_large_split_eight_ways(const PlanReport& r, const std::string& buffer = "") {
  int large = 0;
  for (const LeafPlan& l : r.leaves) {
    EXPECT_FALSE(l.fell_through) << l.path;
    if (!buffer.empty() && l.path.ends_with(buffer)) {
      EXPECT_TRUE(l.spec->is_replicated()) << l.path;
      continue;
    }
    if (l.tensor.shape.numel() >= (1 << 20)) {
      ++large;
      EXPECT_EQ(l.bytes_per_device * 8, l.tensor.bytes()) << l.path << " " << *l.spec;
    }
  }
  EXPECT_GT(large, 0);
}

TEST(Presets, AllAreCompiledInAndParse) {
  const auto names = preset_names();
  for (const char* want :
       {"llama_fsdp.yaml", "llama_fsdp_tp.yaml", "mixtral_ep.yaml", "gpt2.yaml", "t5.yaml"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  for (const auto& n : names) {
    const RuleFile f = load_preset(n);
    EXPECT_TRUE(f.mesh.has_value()) << n;
    EXPECT_NE(f.make_rule(), nullptr);
  }
  EXPECT_EQ(preset_text("t5"), preset_text("t5.yaml"));
  EXPECT_THROW_WITH(preset_text("bert"), IoError, "'bert'", "llama_fsdp_tp.yaml");
}

TEST(Presets, LlamaFsdpTpPutsEveryLargeWeightOnBothAxes) {
  const PlanReport r = plan_preset("llama_fsdp_tp", llama(4), "fsdp:4,tp:2");
  expect_large_split_eight_ways(r);
  EXPECT_EQ(*r.find("model/layers/0/self_attn/q_proj/weight")->spec, P("tp", "fsdp"));
  EXPECT_EQ(*r.find("model/layers/0/self_attn/o_proj/weight")->spec, P("fsdp", "tp"));
  EXPECT_EQ(*r.find("model/layers/3/mlp/up_proj/weight")->spec, P("tp", "fsdp"));
  EXPECT_EQ(*r.find("model/layers/3/mlp/down_proj/weight")->spec, P("fsdp", "tp"));
  EXPECT_EQ(*r.find("lm_head/weight")->spec, P("tp", "fsdp"));
  EXPECT_TRUE(r.find("model/norm/weight")->spec->is_replicated());
}

TEST(Presets, LlamaFsdpTpFitsLlama3WithGqa) {
  // LLaMA-3-8B: hidden 4096, 8 kv heads of 128 (k/v [1024, 4096]), intermediate 14336, vocab
  // 128256.
  expect_large_split_eight_ways(plan_preset("llama_fsdp_tp", llama(2, 4096, 14336, 128256, 1024)));
}

TEST(Presets, LlamaFsdpSplitsOverEightDevices) {
  const PlanReport r = plan_preset("llama_fsdp", llama(2));
  expect_large_split_eight_ways(r);
  EXPECT_EQ(*r.find("model/layers/1/mlp/down_proj/weight")->spec, P("fsdp", nullptr));
}

TEST(Presets, MixtralSplitsExpertsOverEpAndFsdp) {
  const PlanReport r = plan_preset("mixtral_ep", mixtral(2));
  expect_large_split_eight_ways(r);
  EXPECT_EQ(*r.find("model/layers/1/block_sparse_moe/experts/5/w2/weight")->spec,
            P(nullptr, AxisNames{"ep", "fsdp"}));
  EXPECT_TRUE(r.find("model/layers/1/block_sparse_moe/gate/weight")->spec->is_replicated());
}

TEST(Presets, MixtralStackedExpertsGoWholeToEp) {
  Named stacked;
  add(stacked, "model.layers.0.block_sparse_moe.experts.w1", {8, 14336, 4096});
  add(stacked, "model.layers.0.block_sparse_moe.experts.w2", {8, 4096, 14336});
  const PlanReport r = plan_preset("mixtral_ep", stacked);
  EXPECT_EQ(*r.leaves[0].spec, P("ep", "fsdp", nullptr));
  EXPECT_EQ(r.leaves[0].shard_shape, Shape({2, 7168, 4096}));  // 2 whole experts per ep group
  EXPECT_EQ(*r.leaves[1].spec, P("ep", nullptr, "fsdp"));
}

TEST(Presets, Gpt2ShardsConv1DWeightsTheOtherWayRound) {
  const PlanReport r = plan_preset("gpt2", gpt2());
  // attn/bias is the causal-mask buffer older checkpoints carry: a constant, kept replicated.
  expect_large_split_eight_ways(r, "/attn/bias");
  EXPECT_EQ(*r.find("h/0/attn/c_attn/weight")->spec, P("fsdp", "tp"));
  EXPECT_EQ(*r.find("h/0/mlp/c_proj/weight")->spec, P("tp", "fsdp"));
  EXPECT_EQ(r.find("h/0/mlp/c_fc/weight")->shard_shape, Shape({192, 1536}));
}

TEST(Presets, T5CoversEncoderDecoderAndCrossAttention) {
  const PlanReport r = plan_preset("t5", t5_small());
  expect_large_split_eight_ways(r);
  EXPECT_EQ(*r.find("decoder/block/3/layer/1/EncDecAttention/k/weight")->spec, P("tp", "fsdp"));
  EXPECT_EQ(*r.find("encoder/block/2/layer/1/DenseReluDense/wo/weight")->spec, P("fsdp", "tp"));
  EXPECT_TRUE(r.find("encoder/block/0/layer/0/SelfAttention/relative_attention_bias/weight")
                  ->spec->is_replicated());
}

}  // namespace
}  // namespace shardplan
