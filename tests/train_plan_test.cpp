#include "shardplan/train_plan.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include "allocation_events.hpp"
#include "model_step.hpp"
#include "nlohmann/json.hpp"
#include "shardplan/autodiff.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/detail/utf8.hpp"
#include "shardplan/error.hpp"
#include "shardplan/executor.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/sjit.hpp"
#include "step_scaling.hpp"
#include "step_compare.hpp"
#include "test_util.hpp"

namespace shardplan {
namespace {

constexpr const char* kGpt2Small = R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768,
  "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_inner": null})";
constexpr const char* kLlama2_7b = R"({"model_type": "llama", "vocab_size": 32000,
  "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 32, "tie_word_embeddings": false})";
constexpr const char* kLlama3_70b = R"({"model_type": "llama", "vocab_size": 128256,
  "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
  "num_attention_heads": 64, "num_key_value_heads": 8, "tie_word_embeddings": false})";
// LLaMA-2-7B's widths with two layers: planned in well under a second.
constexpr const char* kLlama7bTwoLayers = R"({"model_type": "llama", "vocab_size": 32000,
  "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 2,
  "num_attention_heads": 32, "num_key_value_heads": 32})";
// Small enough to run: grouped-query attention (4 heads over 2 key/value heads).
constexpr const char* kTinyLlama = R"({"model_type": "llama", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2})";
// Mistral's sliding window on every layer (4 of the tests' 8 tokens), 22 layers.
constexpr const char* kTinyMistralWindow = R"({"model_type": "mistral", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 22,
  "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 4})";
constexpr const char* kMixtral8x7b = R"({"model_type": "mixtral", "vocab_size": 32000,
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
  "num_experts_per_tok": 2})";
constexpr const char* kTinyMixtral = R"({"model_type": "mixtral", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
  "num_experts_per_tok": 2})";
constexpr const char* kT5Small = R"({"model_type": "t5", "vocab_size": 32128, "d_model": 512,
  "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": 6, "num_heads": 8,
  "relative_attention_num_buckets": 32, "feed_forward_proj": "relu"})";
constexpr const char* kFlanT5Base = R"({"model_type": "t5", "vocab_size": 32128, "d_model": 768,
  "d_kv": 64, "d_ff": 2048, "num_layers": 12, "num_decoder_layers": 12, "num_heads": 12,
  "relative_attention_num_buckets": 32, "feed_forward_proj": "gated-gelu",
  "tie_word_embeddings": false})";
constexpr const char* kTinyT5 = R"({"model_type": "t5", "vocab_size": 40, "d_model": 16,
  "d_kv": 6, "d_ff": 24, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 2,
  "relative_attention_num_buckets": 8, "relative_attention_max_distance": 12,
  "feed_forward_proj": "gated-gelu", "tie_word_embeddings": true})";
constexpr const char* kTinyGpt2 = R"({"model_type": "gpt2", "vocab_size": 40, "n_embd": 16,
  "n_layer": 2, "n_head": 2, "n_positions": 16})";

RulePtr preset(const char* name) { return load_preset(name).make_rule(); }

TEST(ModelConfig, ParameterCountsAreThePublishedOnes) {
  // The sizes the model cards give (GPT-2 small with its tied embedding).
  EXPECT_EQ(ModelConfig::parse(kGpt2Small).parameter_count(), 124439808);
  EXPECT_EQ(ModelConfig::parse(kLlama2_7b).parameter_count(), 6738415616);
  EXPECT_EQ(ModelConfig::parse(kLlama3_70b).parameter_count(), 70553706496);
  EXPECT_EQ(ModelConfig::parse(kMixtral8x7b).parameter_count(), 46702792704);
  EXPECT_EQ(ModelConfig::parse(kT5Small).parameter_count(), 60506624);
  EXPECT_EQ(ModelConfig::parse(kFlanT5Base).parameter_count(), 247577856);
}

TEST(ModelConfig, ParametersUseTheCheckpointsNames) {
  const Tree<TensorSpec> p = ModelConfig::parse(kLlama3_70b).parameters(DType::kBF16);
  EXPECT_EQ(p.at_path("model/layers/79/self_attn/k_proj/weight").leaf(),
            (TensorSpec{Shape{1024, 8192}, DType::kBF16}));
  EXPECT_EQ(p.at_path("lm_head/weight").leaf().shape, (Shape{128256, 8192}));
  const Tree<TensorSpec> g = ModelConfig::parse(kGpt2Small).parameters(DType::kF32);
  EXPECT_EQ(g.at_path("h/11/attn/c_attn/weight").leaf().shape, (Shape{768, 2304}));
  EXPECT_EQ(g.find("lm_head"), nullptr);  // tied to wte
  // Qwen2 has q/k/v biases without saying so.
  const ModelConfig q = ModelConfig::parse(R"({"model_type": "qwen2", "vocab_size": 10,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1})");
  EXPECT_TRUE(q.attention_bias);
  EXPECT_EQ(q.parameters(DType::kF32).at_path("model/layers/0/self_attn/k_proj/bias").leaf().shape,
            (Shape{4}));
}

TEST(ModelConfig, BadConfigsNameTheFileAndTheField) {
  EXPECT_THROW_WITH(ModelConfig::parse("{", "cfg.json"), IoError, "cfg.json", "not JSON");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "bert"})", "cfg.json"), IoError,
                    "cfg.json", "'bert'", "llama", "gpt2", "t5");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "t5", "vocab_size": 8})", "t.json"),
                    IoError, "t.json", "'d_model' is missing");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"vocab_size": 3})", "cfg.json"), IoError, "model_type");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 8})", "c.json"),
                    IoError, "c.json", "'hidden_size' is missing");
  EXPECT_THROW_WITH(
      ModelConfig::parse(R"({"model_type": "gpt2", "vocab_size": -4, "n_embd": 8})", "c.json"),
      IoError, "'vocab_size' is -4", "positive integer");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 8,
    "hidden_size": 10, "intermediate_size": 8, "num_hidden_layers": 1,
    "num_attention_heads": 3})"),
                    IoError, "hidden size 10", "3 heads");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 8,
    "hidden_size": 12, "intermediate_size": 8, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 3})"),
                    IoError, "4 attention heads", "3 key/value heads");
  EXPECT_THROW_WITH(ModelConfig::load("/nonexistent/dir"), IoError, "/nonexistent/dir");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "t5", "vocab_size": 8, "d_model": 8,
    "d_kv": 4, "d_ff": 8, "num_layers": 1, "num_heads": 2, "relative_attention_num_buckets": 2})",
                                       "t.json"),
                    IoError, "t.json", "relative_attention_num_buckets 2");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "t5", "vocab_size": 8, "d_model": 8,
    "d_kv": 4, "d_ff": 8, "num_layers": 1, "num_heads": 2, "feed_forward_proj": 3})",
                                       "t.json"),
                    IoError, "'feed_forward_proj' is 3");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "mixtral", "vocab_size": 8,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_local_experts": 2, "num_experts_per_tok": 3})",
                                       "m.json"),
                    IoError, "m.json", "3 experts per token of only 2 experts");
  // Widths whose product overflows name the product and the fields.
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "gpt2", "vocab_size": 8,
    "n_embd": 4611686018427387904, "n_layer": 1, "n_head": 1, "n_positions": 8})",
                                       "g.json"),
                    IoError, "n_inner = 4 x 4611686018427387904", "64 bits");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "t5", "vocab_size": 8, "d_model": 8,
    "d_kv": 4294967296, "d_ff": 8, "num_layers": 1, "num_heads": 4294967296})")
                        .parameters(DType::kF32),
                    IoError, "num_heads x d_kv", "4294967296 x 4294967296");
  // A checkpoint directory without config.json says that is what it looked for.
  const auto dir = std::filesystem::temp_directory_path() / "shardplan_train_plan_test_empty";
  std::filesystem::create_directories(dir);
  EXPECT_THROW_WITH(ModelConfig::load(dir), IoError, "config.json",
                    "a checkpoint directory holds config.json");
  std::filesystem::remove_all(dir);
  // A layer count nobody means is refused before a tree of a billion tensors is built.
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 8,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1000000000,
    "num_attention_heads": 2})",
                                       "big.json"),
                    IoError, "big.json", "1000000000 layers", "1000000 tensors");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "mixtral", "vocab_size": 8,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 100,
    "num_attention_heads": 2, "num_local_experts": 10000, "num_experts_per_tok": 2})"),
                    IoError, "of 10000 experts");
  // Sizes whose tensors overflow are an error, not a wrapped number.
  EXPECT_THROW(ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 4611686018427387904,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
    "num_attention_heads": 2})")
                   .parameter_count(),
               Error);
}

// The published configs, every field as the Hub has them.
constexpr const char* kMistralNemo12b = R"({"architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 1024000, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0",
  "use_cache": true, "vocab_size": 131072})";
constexpr const char* kLlama31_8b = R"({"architectures": ["LlamaForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";
constexpr const char* kMistral7b01 = R"({"architectures": ["MistralForCausalLM"],
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})";
constexpr const char* kQwen2_7b = R"({"architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
  "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
  "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
  "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.37.2",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 152064})";
constexpr const char* kMixtral8x7bHub = R"({"architectures": ["MixtralForCausalLM"],
  "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
  "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "num_local_experts": 8, "output_router_logits": false, "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0",
  "use_cache": true, "vocab_size": 32000})";
constexpr const char* kGpt2Hub = R"({"activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256,
  "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true,
  "max_length": 50}}, "vocab_size": 50257})";

TEST(ModelConfig, HeadDimIsRead) {
  const ModelConfig c = ModelConfig::parse(kMistralNemo12b);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.parameter_count(), 12247782400);  // the published size
  const Tree<TensorSpec> p = c.parameters(DType::kBF16);
  EXPECT_EQ(p.at_path("model/layers/0/self_attn/q_proj/weight").leaf().shape, (Shape{4096, 5120}));
  EXPECT_EQ(p.at_path("model/layers/0/self_attn/k_proj/weight").leaf().shape, (Shape{1024, 5120}));
  EXPECT_EQ(p.at_path("model/layers/0/self_attn/o_proj/weight").leaf().shape, (Shape{5120, 4096}));
  // Without head_dim, hidden / heads as before; an odd head_dim is refused (rotary pairs).
  EXPECT_EQ(ModelConfig::parse(kLlama31_8b).head_dim, 128);
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "mistral", "vocab_size": 8,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "head_dim": 5})",
                                       "m.json"),
                    IoError, "m.json", "head size 5 is odd");
}

// The Hub's own config.json files: every field is read or known to change nothing.
TEST(ModelConfig, PublishedConfigsLeaveNothingOut) {
  for (const char* text :
       {kMistralNemo12b, kLlama31_8b, kMistral7b01, kQwen2_7b, kMixtral8x7bHub}) {
    const ModelConfig c = ModelConfig::parse(text);
    EXPECT_TRUE(c.not_modelled.empty()) << c.model_type << ": " << c.not_modelled.front();
  }
  // Mixtral-8x7B's published size from its full config.
  EXPECT_EQ(ModelConfig::parse(kMixtral8x7bHub).parameter_count(), 46702792704);
  EXPECT_EQ(ModelConfig::parse(kGpt2Hub).parameter_count(), 124439808);
  // T5's published configs: dropout is named, the rest read or known to change nothing.
  for (const char* text : {R"({"architectures": ["T5ForConditionalGeneration"], "d_ff": 2048,
      "d_kv": 64, "d_model": 512, "decoder_start_token_id": 0, "dropout_rate": 0.1,
      "eos_token_id": 1, "initializer_factor": 1.0, "is_encoder_decoder": true,
      "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512, "num_heads": 8,
      "num_layers": 6, "output_past": true, "pad_token_id": 0,
      "relative_attention_num_buckets": 32, "task_specific_params": {"summarization": {
      "early_stopping": true, "prefix": "summarize: "}}, "vocab_size": 32128})",
                           R"({"architectures": ["T5ForConditionalGeneration"], "d_ff": 2048,
      "d_kv": 64, "d_model": 768, "decoder_start_token_id": 0, "dense_act_fn": "gelu_new",
      "dropout_rate": 0.1, "eos_token_id": 1, "feed_forward_proj": "gated-gelu",
      "initializer_factor": 1.0, "is_encoder_decoder": true, "is_gated_act": true,
      "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512,
      "num_decoder_layers": 12, "num_heads": 12, "num_layers": 12, "output_past": true,
      "pad_token_id": 0, "relative_attention_max_distance": 128,
      "relative_attention_num_buckets": 32, "tie_word_embeddings": false, "torch_dtype": "float32",
      "transformers_version": "4.23.1", "use_cache": true, "vocab_size": 32128})"}) {
    EXPECT_EQ(ModelConfig::parse(text).not_modelled,
              (std::vector<std::string>{"dropout (dropout_rate 0.1)"}));
  }
  // GPT-2 trains with dropout, which the step does not model: said.
  const ModelConfig g = ModelConfig::parse(kGpt2Hub);
  ASSERT_EQ(g.not_modelled.size(), 1u);
  EXPECT_EQ(g.not_modelled[0], "dropout (attn_pdrop 0.1, embd_pdrop 0.1, resid_pdrop 0.1)");
}

TEST(ModelConfig, FieldsNotModelledAreNamed) {
  const std::string base = R"("model_type": "llama", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4)";
  const auto parse = [&](const std::string& more) {
    return ModelConfig::parse("{" + base + ", " + more + "}", "c.json");
  };
  const auto has = [](const ModelConfig& c, const std::string& part) {
    for (const std::string& s : c.not_modelled) {
      if (s.find(part) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has(parse(R"("hidden_act": "gelu")"), "hidden_act 'gelu'"));
  EXPECT_TRUE(has(parse(R"("attention_dropout": 0.1)"), "attention_dropout 0.1"));
  EXPECT_TRUE(has(parse(R"("some_new_width": 128)"),
                  "some_new_width 128 (a field this planner does not know)"));
  EXPECT_TRUE(has(parse(R"("quantization_config": {"bits": 4})"), "quantization_config"));
  EXPECT_TRUE(has(parse(R"("architectures": ["LlamaForSequenceClassification"])"),
                  "LlamaForSequenceClassification"));
  EXPECT_TRUE(parse(R"("attention_dropout": 0.0, "mlp_bias": false)").not_modelled.empty());
  // A field of another family is named: Mistral's attention has no biases whatever it says.
  EXPECT_TRUE(has(ModelConfig::parse(R"({"model_type": "mistral", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "attention_bias": true})"),
                  "attention_bias true"));
  // LLaMA's attention_bias puts biases on q, k, v and o; mlp_bias on the MLP.
  const Tree<TensorSpec> p =
      parse(R"("attention_bias": true, "mlp_bias": true)").parameters(DType::kF32);
  EXPECT_EQ(p.at_path("model/layers/1/self_attn/o_proj/bias").leaf().shape, (Shape{32}));
  EXPECT_EQ(p.at_path("model/layers/1/self_attn/q_proj/bias").leaf().shape, (Shape{32}));
  EXPECT_EQ(p.at_path("model/layers/1/mlp/gate_proj/bias").leaf().shape, (Shape{48}));
  EXPECT_EQ(p.at_path("model/layers/1/mlp/down_proj/bias").leaf().shape, (Shape{32}));
  // Qwen2's q/k/v biases but no o bias.
  const ModelConfig q = ModelConfig::parse(R"({"model_type": "qwen2", "vocab_size": 10,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})");
  EXPECT_EQ(
      q.parameters(DType::kF32).at_path("model/layers/0/self_attn").find("o_proj")->find("bias"),
      nullptr);
  // T5: the activation of feed_forward_proj beyond relu / gated-gelu is named; nonsense refused.
  const std::string t5 = R"("model_type": "t5", "vocab_size": 8, "d_model": 8, "d_kv": 4,
    "d_ff": 8, "num_layers": 1, "num_heads": 2)";
  EXPECT_TRUE(
      has(ModelConfig::parse("{" + t5 + R"(, "feed_forward_proj": "gated-silu"})"), "gated-silu"));
  EXPECT_THROW_WITH(
      ModelConfig::parse("{" + t5 + R"(, "feed_forward_proj": "fast-gelu"})", "t.json"), IoError,
      "t.json", "'feed_forward_proj' is 'fast-gelu'");
}

TEST(ModelConfig, SlidingWindowsAreRead) {
  const ModelConfig m = ModelConfig::parse(kMistral7b01);
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(m.window(0), 4096);
  EXPECT_EQ(m.window(31), 4096);
  EXPECT_EQ(ModelConfig::parse(kMistralNemo12b).window(0), 0);  // null: full attention
  EXPECT_EQ(ModelConfig::parse(kQwen2_7b).window(27), 0);       // use_sliding_window false
  const std::string qwen = R"("model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 8, "num_hidden_layers": 4, "num_attention_heads": 2,
    "use_sliding_window": true, "sliding_window": 16)";
  const ModelConfig q = ModelConfig::parse("{" + qwen + R"(, "max_window_layers": 2})");
  EXPECT_EQ(q.window(0), 0);
  EXPECT_EQ(q.window(1), 0);
  EXPECT_EQ(q.window(2), 16);
  EXPECT_EQ(q.window(3), 16);
  const ModelConfig t = ModelConfig::parse("{" + qwen + R"(, "layer_types": ["sliding_attention",
    "full_attention", "sliding_attention", "full_attention"]})");
  EXPECT_EQ(t.window(0), 16);
  EXPECT_EQ(t.window(1), 0);
  EXPECT_EQ(t.window(2), 16);
  EXPECT_THROW_WITH(
      ModelConfig::parse("{" + qwen + R"(, "layer_types": ["sliding_attention"]})", "q.json"),
      IoError, "q.json", "'layer_types'", "4 entries");
  EXPECT_THROW_WITH(
      ModelConfig::parse(R"({"model_type": "mistral", "vocab_size": 8, "hidden_size": 8,
    "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "sliding_window": -3})",
                         "m.json"),
      IoError, "m.json", "'sliding_window' is -3");
}

// The mask on scores of ones, against the rule written out here: query i sees key j when
// i - window < j <= i.
TEST(AttentionMask, SlidingWindowIsABandedCausalMask) {
  const Mesh mesh = Mesh::parse("x:1", 1);
  const Executor exec(1);
  const int t = 7;
  const Array ones = device_put(Tensor::from(Shape{1, t, t}, std::vector<float>(t * t, 1.0f)),
                                NamedSharding(mesh, PartitionSpec()), exec);
  for (const int window : {0, 1, 3, 7, 9}) {
    const std::vector<double> got =
        sjit(mesh, [&](const Array& s) { return train::attention_mask(s, window); })(ones)
            .to_host()
            .to_doubles();
    for (int i = 0; i < t; ++i) {
      for (int j = 0; j < t; ++j) {
        const bool seen = j <= i && (window == 0 || i - j < window);
        EXPECT_EQ(got[static_cast<std::size_t>(i * t + j)], seen ? 1.0 : double{-1e30f})
            << "window " << window << " query " << i << " key " << j;
      }
    }
  }
}

TEST(ModelConfig, EveryBadValueNamesTheFileAndTheField) {
  const std::string head = R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": )";
  for (const std::string bad : {"1e400", "8.5", "true", "\"8\"", "[8]", "-1", "0",
                                "18446744073709551615", "9223372036854775808"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW_WITH(ModelConfig::parse(head + bad + "}", "v.json"), IoError,
                      std::string("v.json"), "'vocab_size' is " + bad,
                      std::string("positive integer"));
  }
  // Nested 100,000 levels deep: the reader's depth limit, not a stack overflow.
  const std::string deep = head + std::string(100'000, '[') + std::string(100'000, ']') + "}";
  EXPECT_THROW_WITH(ModelConfig::parse(deep, "deep.json"), IoError, "deep.json", "not JSON");
  // A long value is shown cut short.
  std::string list = "[";
  for (int i = 0; i < 10000; ++i) list += "1,";
  list += "1]";
  try {
    ModelConfig::parse(head + list + "}", "v.json");
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
  }
  EXPECT_THROW_WITH(ModelConfig::parse(head + R"(8, "vocab_size": 16})", "dup.json"), IoError,
                    "dup.json", "'vocab_size' appears twice");
  EXPECT_THROW_WITH(ModelConfig::parse("{\"model_type\": \"ll\xff\"}", "u.json"), IoError, "u.json",
                    "not JSON");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 8,
    "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "tie_word_embeddings": "no"})",
                                       "b.json"),
                    IoError, "b.json", "'tie_word_embeddings' is \"no\"", "true or false");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "gpt2", "vocab_size": 8, "n_embd": 8,
    "n_layer": 1, "n_head": 2, "n_positions": 8, "resid_pdrop": -0.5})",
                                       "g.json"),
                    IoError, "g.json", "'resid_pdrop' is -0.5");
  // Every other kind of field check names the file, the field and what it expects.
  const std::string llama = R"({"model_type": "llama", "vocab_size": 8, "intermediate_size": 8,
    "num_hidden_layers": 2, "num_attention_heads": 2, )";
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "gpt2", "vocab_size": 8, "n_embd": 8,
    "n_layer": 1, "n_head": 2, "n_positions": 8, "resid_pdrop": "x"})",
                                       "g.json"),
                    IoError, "g.json", "'resid_pdrop' is \"x\"", "expected a number >= 0");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "t5", "vocab_size": 8, "d_model": 8,
    "d_kv": 4, "d_ff": 8, "num_layers": 1, "num_heads": 2, "feed_forward_proj": 5})",
                                       "t.json"),
                    IoError, "t.json", "'feed_forward_proj' is 5", "expected a string");
  EXPECT_THROW_WITH(
      ModelConfig::parse(llama + R"("hidden_size": 8, "architectures": "LlamaForCausalLM"})",
                         "a.json"),
      IoError, "a.json", "'architectures' is \"LlamaForCausalLM\"", "a list of class names");
  EXPECT_THROW_WITH(
      ModelConfig::parse(llama + R"("hidden_size": 8, "architectures": [5]})", "a.json"),
      IoError, "a.json", "'architectures' holds 5", "class names (strings)");
  EXPECT_THROW_WITH(ModelConfig::parse(llama + R"("hidden_size": 9})", "h.json"), IoError,
                    "h.json", "hidden size 9 does not divide into 2 heads");
  EXPECT_THROW_WITH(ModelConfig::parse(R"({"model_type": "gpt2", "vocab_size": 8, "n_embd": 9,
    "n_layer": 1, "n_head": 2, "n_positions": 8})",
                                       "g.json"),
                    IoError, "g.json", "hidden size 9 does not divide into 2 heads");
  EXPECT_THROW_WITH(
      ModelConfig::parse(llama + R"("hidden_size": 8, "head_dim": 4611686018427387904})",
                         "w.json"),
      IoError, "w.json", "attention width num_attention_heads x head_dim",
      "does not fit in 64 bits");
  const std::string qwen = R"({"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8,
    "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
    "use_sliding_window": true, "sliding_window": 4, )";
  EXPECT_THROW_WITH(ModelConfig::parse(qwen + R"("max_window_layers": -1})", "q.json"), IoError,
                    "q.json", "'max_window_layers' is -1", "an integer (0 to 2^63 - 1)");
  EXPECT_THROW_WITH(
      ModelConfig::parse(qwen + R"("layer_types": ["full_attention", "local"]})", "q.json"),
      IoError, "q.json", "layer_types[1] is \"local\"", "\"sliding_attention\"");
}

// Only regular files are read: a FIFO (given, or as config.json in a directory) and a device are
// errors at once, not a hang or an endless read; a config.json that is a directory is named.
TEST(ModelConfig, LoadReadsRegularFilesOnly) {
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("shardplan_train_plan_test_files_{}", ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "fifo_ckpt");
  ASSERT_EQ(::mkfifo((dir / "pipe.json").c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo((dir / "fifo_ckpt" / "config.json").c_str(), 0600), 0);
  EXPECT_THROW_WITH(ModelConfig::load(dir / "pipe.json"), IoError, "pipe.json", "FIFO");
  EXPECT_THROW_WITH(ModelConfig::load(dir / "fifo_ckpt"), IoError, "config.json", "FIFO");
  EXPECT_THROW_WITH(ModelConfig::load("/dev/zero"), IoError, "/dev/zero", "character device");
  std::filesystem::create_directories(dir / "odd" / "config.json");
  EXPECT_THROW_WITH(ModelConfig::load(dir / "odd"), IoError, "config.json", "a directory");
  std::ofstream(dir / "ok.json") << kTinyLlama;
  EXPECT_EQ(ModelConfig::load(dir / "ok.json").hidden, 32);
  std::filesystem::remove_all(dir);
}

// Text for a terminal: controls and bytes outside UTF-8 escaped, other text kept.
// Whole-text UTF-8 check: well-formed text of every length, and each way of not being it.
TEST(Utf8, IsUtf8AcceptsWellFormedTextOnly) {
  EXPECT_TRUE(detail::is_utf8(""));
  EXPECT_TRUE(detail::is_utf8("fsdp \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(detail::is_utf8("f\xffsdp"));        // not a lead byte
  EXPECT_FALSE(detail::is_utf8("\xc3"));            // cut short
  EXPECT_FALSE(detail::is_utf8("\xc0\xaf"));        // overlong
  EXPECT_FALSE(detail::is_utf8("\xed\xa0\x80"));    // a surrogate
  EXPECT_FALSE(detail::is_utf8("ok\x80"));          // a stray continuation byte
}

// printable() of each line, the line breaks kept.
TEST(Printable, LinesKeepTheirBreaks) {
  EXPECT_EQ(detail::printable_lines("a\x1b[2J\nb\tc\n"), "a\\x1b[2J\nb\\x09c\n");
}

TEST(Printable, EscapesControlsAndInvalidBytes) {
  EXPECT_EQ(detail::printable("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(detail::printable(std::string("n\0l\n\t\x7f", 6)), "n\\x00l\\x0a\\x09\\x7f");
  EXPECT_EQ(detail::printable("c\xc2\x9b"
                              "d"),
            "c\\u009bd");                                    // C1 CSI
  EXPECT_EQ(detail::printable("x\xff\xc3"), "x\\xff\\xc3");  // invalid, cut short
  EXPECT_EQ(detail::printable("caf\xc3\xa9 \xe6\x97\xa5"), "caf\xc3\xa9 \xe6\x97\xa5");  // kept
  EXPECT_EQ(detail::printable("model/layers/0/mlp"), "model/layers/0/mlp");
}

TEST(ParseBytes, ReadsBinaryAndDecimalUnits) {
  EXPECT_EQ(parse_bytes("80GiB"), 80LL << 30);
  EXPECT_EQ(parse_bytes("80 GB"), 80000000000LL);
  EXPECT_EQ(parse_bytes("1.5TiB"), 3LL << 39);
  EXPECT_EQ(parse_bytes("1000000"), 1000000);
  EXPECT_EQ(parse_bytes("16g"), 16LL << 30);
  EXPECT_THROW_WITH(parse_bytes("lots"), SpecError, "'lots'", "80GiB");
  EXPECT_THROW_WITH(parse_bytes("80XB"), SpecError, "unknown unit");
  EXPECT_THROW_WITH(parse_bytes("-5GB"), SpecError, "'-5GB'");
  EXPECT_THROW_WITH(parse_bytes("9999999999TiB"), SpecError, "out of range");
  EXPECT_THROW_WITH(parse_bytes("1.2.3"), SpecError, "not a size");
  EXPECT_THROW_WITH(parse_bytes(".GB"), SpecError, "not a size");
  // Too many digits for a double: out of range, not a std exception.
  EXPECT_THROW_WITH(parse_bytes(std::string(400, '9')), SpecError, "out of range");
  EXPECT_THROW_WITH(parse_bytes(std::string(400, '9') + "GiB"), SpecError, "out of range");
  EXPECT_THROW_WITH(parse_bytes(""), SpecError, "not a size");
  EXPECT_EQ(parse_bytes(".5KiB"), 512);
}

TEST(ParseOptimizer, KnowsThree) {
  EXPECT_EQ(parse_optimizer("adamw"), OptimizerKind::kAdamw);
  EXPECT_EQ(name(parse_optimizer("sgd")), "sgd");
  EXPECT_THROW_WITH(parse_optimizer("lion"), SpecError, "'lion'", "sgd, adam, adamw");
}

// Per-device parameter and optimizer bytes agree with the planner's own report of the same rules
// over the same tree (another path: rule resolution without tracing).
TEST(PlanTraining, StateBytesAgreeWithThePlanner) {
  const ModelConfig c = ModelConfig::parse(kLlama7bTwoLayers);
  const Mesh mesh = Mesh::parse("fsdp:4,tp:2", 8);
  const RulePtr rules = preset("llama_fsdp_tp");
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 64;
  const TrainPlan p = plan_training(c, mesh, rules, o);
  const MeshShardingHelper helper(mesh);
  const PlanReport bf16 = helper.plan(RuleTree(rules), c.parameters(DType::kBF16));
  const PlanReport f32 = helper.plan(RuleTree(rules), c.parameters(DType::kF32));
  EXPECT_EQ(p.parameter_bytes, bf16.max_device_bytes());
  EXPECT_EQ(p.gradient_bytes, bf16.max_device_bytes());
  EXPECT_EQ(p.optimizer_bytes, 2 * f32.max_device_bytes() + 4);  // mu, nu and the f32 count
  EXPECT_EQ(p.batch_bytes, 2 * (8 / 4) * 64 * 4);                // tokens and targets, i32
  EXPECT_EQ(p.devices, 8);
  EXPECT_EQ(p.batch_axes, (std::vector<std::string>{"fsdp"}));
  EXPECT_GT(p.transient_bytes, 0);
  EXPECT_EQ(p.peak_held_bytes + p.peak_gathered_bytes + p.peak_computed_bytes, p.peak_bytes);
  EXPECT_GT(p.peak_computed_bytes, 0);
  EXPECT_EQ(p.peak_bytes,
            p.parameter_bytes + p.optimizer_bytes + p.batch_bytes + p.transient_bytes);
  EXPECT_GT(p.bytes_by_collective.at(CollectiveKind::kAllGather), 0);  // FSDP gathers its weights
  // SGD keeps only the count; f32 gradients are twice bf16's.
  o.optimizer = OptimizerKind::kSgd;
  o.grad_dtype = DType::kF32;
  const TrainPlan s = plan_training(c, mesh, rules, o);
  EXPECT_EQ(s.optimizer_bytes, 4);
  EXPECT_EQ(s.gradient_bytes, f32.max_device_bytes());
}

// The FLOPs of one device on one device: at least the matrix products worked out by hand
// (forward 2 m n k each, backward twice that), and not much more (the elementwise ops).
TEST(PlanTraining, FlopsAreTheMatrixProductsByHand) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  o.optimizer = OptimizerKind::kSgd;
  const double tokens = 4.0 * 16;
  const double d = 32, f = 48, kv = 16, v = 64, t = 16, layers = 2;
  const double per_token_layer = 2 * (d * d + 2 * kv * d + d * d + 3 * d * f)  // projections
                                 + 2 * 2 * t * d;  // scores and their product with v
  const double forward = tokens * (layers * per_token_layer + 2 * d * v);
  const TrainPlan p = plan_training(c, Mesh::parse("fsdp:1,tp:1", 1), preset("llama_fsdp_tp"), o);
  EXPECT_GE(p.flops, 3 * forward);
  EXPECT_LE(p.flops, 3 * forward * 1.35);
  EXPECT_DOUBLE_EQ(p.total_flops, p.flops);
  EXPECT_TRUE(p.bytes_by_collective.empty() ||
              p.bytes_moved() == 0);  // one device: nothing to move
  // Recomputation runs the layers' forward pass twice: more FLOPs, a lower peak.
  o.recompute = true;
  const TrainPlan r = plan_training(c, Mesh::parse("fsdp:1,tp:1", 1), preset("llama_fsdp_tp"), o);
  EXPECT_GT(r.flops, p.flops);
  // Each layer's forward again, except the down projection's product: the backward pass needs
  // its input, not its result, so no program computes it a second time.
  const double layer_forward = tokens * layers * per_token_layer;
  const double down_projection = tokens * layers * 2 * d * f;
  EXPECT_GE(r.flops - p.flops, layer_forward - down_projection);
  EXPECT_LE(r.flops - p.flops, layer_forward * 1.2);
}

// 32 query heads over 8 key/value heads of width 64 (not hidden / heads), attention dominating
// (1,024 tokens): per device at tp:16 the matrix products by hand / 16, half of tp:8's. The
// step splits the query heads over the 16 ranks and repeats each key/value head for the two
// ranks that share it; otherwise the heads would not split and each rank would do twice its
// share of the attention.
TEST(PlanTraining, AttentionSplitsOverMoreTensorRanksThanKvHeads) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 256,
    "hidden_size": 256, "head_dim": 64, "intermediate_size": 256, "num_hidden_layers": 1,
    "num_attention_heads": 32, "num_key_value_heads": 8})");
  TrainPlanOptions o;
  o.batch = 1;
  o.seq = 1024;
  o.optimizer = OptimizerKind::kSgd;
  o.fused_attention = false;  // the scores and probs @ v as whole products, counted below
  const double t = 1024, d = 256, q = 32 * 64, kv = 8 * 64, f = 256, v = 256;
  const double per_token = 2 * (q * d + 2 * kv * d + d * q + 3 * d * f)  // projections
                           + 2 * 2 * t * q                               // scores, probs @ v
                           + 2 * d * v;                                  // the head
  const double step = 3 * t * per_token;  // forward, and backward twice that
  const TrainPlan p8 = plan_training(c, Mesh::parse("fsdp:1,tp:8", 8), preset("llama_fsdp_tp"), o);
  const TrainPlan p16 =
      plan_training(c, Mesh::parse("fsdp:1,tp:16", 16), preset("llama_fsdp_tp"), o);
  EXPECT_GE(p8.flops, step / 8);
  EXPECT_LE(p8.flops, step / 8 * 1.2);
  EXPECT_GE(p16.flops, step / 16);
  EXPECT_LE(p16.flops, step / 16 * 1.2);
  EXPECT_NEAR(p16.flops, p8.flops / 2, p8.flops * 0.05);
  // Fused attention splits alike (the kernels skip the causal blocks above the diagonal, so
  // the step does less than the decomposed one's whole [t, t] products).
  o.fused_attention = true;
  const TrainPlan f8 = plan_training(c, Mesh::parse("fsdp:1,tp:8", 8), preset("llama_fsdp_tp"), o);
  const TrainPlan f16 =
      plan_training(c, Mesh::parse("fsdp:1,tp:16", 16), preset("llama_fsdp_tp"), o);
  EXPECT_NEAR(f16.flops, f8.flops / 2, f8.flops * 0.05);
  EXPECT_LT(f8.flops, p8.flops);
}

// The parameters of `c` in `dtype`, each uniform in [-0.3, 0.3] (seeds `seed`, `seed` + 1, ...),
// replicated over `mesh`.
Tree<Array> uniform_parameters(const ModelConfig& c, DType dtype, std::uint64_t seed,
                               const Mesh& mesh, const Executor& exec) {
  return c.parameters(dtype).map([&](const TensorSpec& s) {
    return device_put(Tensor::uniform(s.shape, dtype, seed++, -0.3, 0.3),
                      NamedSharding(mesh, PartitionSpec()), exec);
  });
}

// Tokens of `shape` (token i is 7 i mod 40) and their targets (the next token), placed as `spec`.
std::pair<Array, Array> tokens_and_targets(const Shape& shape, const Mesh& mesh,
                                           const PartitionSpec& spec, const Executor& exec) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7) % 40);
  const Array tokens = device_put(Tensor::from(shape, ids), NamedSharding(mesh, spec), exec);
  std::rotate(ids.begin(), ids.begin() + 1, ids.end());
  return {tokens, device_put(Tensor::from(shape, ids), NamedSharding(mesh, spec), exec)};
}

// The heads' width from head_dim, key/value heads repeated over four tensor-parallel ranks
// (2 key/value heads) and a sliding window: the sharded step gives one device's loss and
// gradients (one device runs the grouped layout).
TEST(LossAndGrads, RepeatedKvHeadsAndWindowsGiveOneDevicesGradients) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "mistral", "vocab_size": 40,
    "hidden_size": 16, "head_dim": 6, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 3})");
  ASSERT_EQ(c.window(1), 3);
  const auto run = [&](const char* axes, int n, const train::Layout& layout,
                       const ModelConfig& cfg) {
    const Executor exec(n);
    const Mesh mesh = Mesh::parse(axes, n);
    const Tree<Array> params = uniform_parameters(cfg, DType::kF32, 3, mesh, exec);
    const auto [x, y] = tokens_and_targets(Shape{2, 8}, mesh, PartitionSpec(), exec);
    const train::ModelStep model{cfg, layout};
    return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& a, const Array& b) {
      auto [loss, grads] = train::loss_and_grads(model, p, a, b);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, x, y));
  };
  const Tree<Tensor> one = run("fsdp:1,tp:1", 1, train::Layout{}, c);
  const Tree<Tensor> four = run("fsdp:1,tp:4", 4, train::Layout{{"fsdp"}, {"tp"}, 1, 4}, c);
  const double loss = one.at("loss").leaf().get(0);
  EXPECT_NEAR(loss, std::log(40.0), 1.0);
  expect_same_step(four, one, "fsdp:1,tp:4");
  // The window is applied: the same model without it gives another loss.
  ModelConfig full = c;
  full.window_layers.clear();
  EXPECT_GT(std::abs(run("fsdp:1,tp:1", 1, train::Layout{}, full).at("loss").leaf().get(0) - loss),
            1e-4);
}

// LLaMA's attention_bias and mlp_bias: the default preset places every bias, and the step adds
// them (each bias's gradient has its shape).
TEST(PlanTraining, LlamaBiasesArePlanned) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "attention_bias": true, "mlp_bias": true})");
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 8;
  const TrainPlan with =
      plan_training(c, Mesh::parse("fsdp:2,tp:2", 4), preset("llama_fsdp_tp"), o);
  ModelConfig plain = c;
  plain.attention_bias = plain.output_bias = plain.mlp_bias = false;
  const TrainPlan without =
      plan_training(plain, Mesh::parse("fsdp:2,tp:2", 4), preset("llama_fsdp_tp"), o);
  EXPECT_EQ(with.parameter_count - without.parameter_count, 2 * (32 + 16 + 16 + 32 + 48 + 48 + 32));
  EXPECT_GT(with.flops, without.flops);
}

// Every dtype train-plan offers (bf16, f32, f64) plans, in every role.
TEST(PlanTraining, EveryOfferedDtypePlans) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  for (const DType p : {DType::kBF16, DType::kF32, DType::kF64}) {
    for (const DType g : {DType::kBF16, DType::kF32, DType::kF64}) {
      for (const DType s : {DType::kBF16, DType::kF32, DType::kF64}) {
        SCOPED_TRACE(fmt::format("{} {} {}", name(p), name(g), name(s)));
        TrainPlanOptions o;
        o.batch = 4;
        o.seq = 8;
        o.param_dtype = p;
        o.grad_dtype = g;
        o.optimizer_dtype = s;
        const TrainPlan plan =
            plan_training(c, Mesh::parse("fsdp:2,tp:2", 4), preset("llama_fsdp_tp"), o);
        EXPECT_GT(plan.peak_bytes, 0);
      }
    }
  }
}

// Where activations dominate (long sequences, a narrow model, attention's [t, t] scores kept
// by the decomposed attention), keeping only layer inputs or running a quarter of the batch at
// a time lowers the peak by more than half; with fused attention and the fused loss (which keep
// far less to begin with), both still lower it.
TEST(PlanTraining, RecomputeAndAccumulationLowerThePeak) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 512,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4})");
  const Mesh mesh = Mesh::parse("fsdp:4,tp:2", 8);
  const RulePtr rules = preset("llama_fsdp_tp");
  TrainPlanOptions o;
  o.batch = 16;
  o.seq = 512;
  {
    TrainPlanOptions fused = o;
    const TrainPlan base = plan_training(c, mesh, rules, fused);
    fused.recompute = true;
    EXPECT_LT(plan_training(c, mesh, rules, fused).peak_bytes, base.peak_bytes);
    fused.recompute = false;
    fused.grad_accum = 4;
    EXPECT_LT(plan_training(c, mesh, rules, fused).peak_bytes, base.peak_bytes);
  }
  o.fused_attention = false;
  o.fused_loss = false;
  const TrainPlan base = plan_training(c, mesh, rules, o);
  o.recompute = true;
  const TrainPlan rec = plan_training(c, mesh, rules, o);
  EXPECT_LT(rec.peak_bytes, base.peak_bytes / 2);
  EXPECT_GT(rec.flops, base.flops);
  o.recompute = false;
  o.grad_accum = 4;
  const TrainPlan acc = plan_training(c, mesh, rules, o);
  EXPECT_LT(acc.peak_bytes, base.peak_bytes / 2);
  EXPECT_EQ(acc.parameter_bytes, base.parameter_bytes);
  EXPECT_NEAR(acc.flops, base.flops, base.flops * 0.02);  // the same work in pieces
}

// Mixtral: every token through k of the E experts, so the expert matrix products cost k/E of
// running every expert on every token; the router and attention as for a dense layer.
TEST(PlanTraining, MixtralRunsEachTokenThroughKExperts) {
  const ModelConfig c = ModelConfig::parse(kTinyMixtral);
  EXPECT_EQ(c.family_name(), "mixtral");
  EXPECT_EQ(c.parameters(DType::kF32)
                .at_path("model/layers/1/block_sparse_moe/experts/3/w2/weight")
                .leaf()
                .shape,
            (Shape{32, 24}));
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  o.optimizer = OptimizerKind::kSgd;
  const TrainPlan p = plan_training(c, Mesh::parse("ep:1,fsdp:1", 1), preset("mixtral_ep"), o);
  const double tokens = 4.0 * 16, d = 32, f = 24, kv = 16, v = 64, t = 16, layers = 2, e = 4, k = 2;
  const double per_token_layer = 2 * (d * d + 2 * kv * d + d * d)  // attention projections
                                 + 2 * 2 * t * d                   // scores, their product with v
                                 + 2 * d * e                       // the router
                                 + k * 2 * 3 * d * f;              // k experts' three matrices
  const double forward = tokens * (layers * per_token_layer + 2 * d * v);
  EXPECT_GE(p.flops, 3 * forward);
  EXPECT_LE(p.flops, 3 * forward * 1.35);
  // k x tokens must share evenly over the experts.
  const ModelConfig odd = ModelConfig::parse(R"({"model_type": "mixtral", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 24, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_local_experts": 3, "num_experts_per_tok": 1})");
  o.batch = 1;
  o.seq = 16;
  EXPECT_THROW_WITH(plan_training(odd, Mesh::parse("ep:1,fsdp:1", 1), preset("mixtral_ep"), o),
                    SpecError, "16 tokens", "3 experts");
}

// HF's bucketing of relative positions, written here from its definition with plain integers
// and std::log, against the program's (a table whose bucket b holds b reads the bucket back).
int t5_bucket(int rel, bool bidirectional, int buckets, int max_distance) {
  int base = 0, n = 0;
  if (bidirectional) {
    buckets /= 2;
    base = rel > 0 ? buckets : 0;
    n = std::abs(rel);
  } else {
    n = std::max(-rel, 0);
  }
  const int exact = buckets / 2;
  if (n < exact) return base + n;
  const int far = exact + static_cast<int>(std::log(static_cast<float>(n) / exact) /
                                           std::log(static_cast<float>(max_distance) / exact) *
                                           static_cast<float>(buckets - exact));
  return base + std::min(far, buckets - 1);
}

TEST(T5, RelativePositionBucketsAreHuggingFaces) {
  const Executor exec(1);
  const Mesh mesh = Mesh::parse("x:1", 1);
  for (const bool bidirectional : {true, false}) {
    for (const auto& [buckets, distance, len] : {std::tuple{32, 128, 300}, std::tuple{8, 12, 40}}) {
      SCOPED_TRACE(
          fmt::format("bidirectional {} buckets {} distance {}", bidirectional, buckets, distance));
      std::vector<float> table(static_cast<std::size_t>(buckets));
      for (int b = 0; b < buckets; ++b) table[static_cast<std::size_t>(b)] = static_cast<float>(b);
      const Array w = device_put(Tensor::from(Shape{buckets, 1}, table),
                                 NamedSharding(mesh, PartitionSpec()), exec);
      const Array bias = sjit(mesh, [&](const Array& t) {
        return train::relative_bias(t, len, len, bidirectional, distance);
      })(w);
      ASSERT_EQ(bias.shape(), (Shape{1, len, len}));
      const std::vector<double> got = bias.to_host().to_doubles();
      for (int i = 0; i < len; ++i) {
        for (int j = 0; j < len; ++j) {
          ASSERT_EQ(got[static_cast<std::size_t>(i * len + j)],
                    t5_bucket(j - i, bidirectional, buckets, distance))
              << "query " << i << " key " << j;
        }
      }
    }
  }
}

// T5's step sharded over 4 devices (batch and heads split) gives the loss and gradients of one
// device; the loss starts near log(vocab); recomputation is refused with a reason.
TEST(T5, ShardedStepEqualsOneDevice) {
  const ModelConfig c = ModelConfig::parse(kTinyT5);
  EXPECT_EQ(c.parameters(DType::kF32)
                .at_path("decoder/block/0/layer/1/EncDecAttention/q/weight")
                .leaf()
                .shape,
            (Shape{12, 16}));
  const auto run = [&](const char* axes, int n, const train::Layout& layout) {
    const Executor exec(n);
    const Mesh mesh = Mesh::parse(axes, n);
    std::uint64_t seed = 7;
    const Tree<Array> params = c.parameters(DType::kF32).map([&](const TensorSpec& s) {
      return device_put(Tensor::uniform(s.shape, DType::kF32, seed++, -0.3, 0.3),
                        NamedSharding(mesh, PartitionSpec()), exec);
    });
    std::vector<std::int32_t> ids(4 * 14), tgt(4 * 4);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 5) % 40);
    for (std::size_t i = 0; i < tgt.size(); ++i) tgt[i] = static_cast<std::int32_t>((i * 3) % 40);
    const Array x =
        device_put(Tensor::from(Shape{4, 14}, ids), NamedSharding(mesh, PartitionSpec()), exec);
    const Array y =
        device_put(Tensor::from(Shape{4, 4}, tgt), NamedSharding(mesh, PartitionSpec()), exec);
    const train::ModelStep model{c, layout};
    const Tree<Array> out = sjit(mesh, [&](const Tree<Array>& p, const Array& a, const Array& b) {
      auto [loss, grads] = train::loss_and_grads(model, p, a, b);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, x, y);
    return to_host(out);
  };
  const Tree<Tensor> one = run("fsdp:1,tp:1", 1, train::Layout{});
  const Tree<Tensor> four = run("fsdp:2,tp:2", 4, train::Layout{{"fsdp"}, {"tp"}, 2, 2});
  const double loss = one.at("loss").leaf().get(0);
  EXPECT_NEAR(loss, std::log(40.0), 1.0);
  EXPECT_NEAR(four.at("loss").leaf().get(0), loss, 1e-5);
  const auto a = one.at("grads").flatten(), b = four.at("grads").flatten();
  ASSERT_EQ(a.size(), c.parameters(DType::kF32).num_leaves());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].second.to_doubles(), y = b[i].second.to_doubles();
    for (std::size_t k = 0; k < x.size(); ++k) {
      ASSERT_NEAR(x[k], y[k], 1e-5 + 1e-4 * std::abs(x[k])) << a[i].first << " [" << k << "]";
    }
  }
  // Planned: the decoder's tokens are their own length; recomputation is for decoder-only models.
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 32;
  o.target_seq = 8;
  const TrainPlan p = plan_training(c, Mesh::parse("fsdp:2,tp:2", 4), preset("t5"), o);
  EXPECT_EQ(p.batch_bytes, (4 / 2) * (32 + 8 + 8) * 4);  // tokens (both parts) and targets, i32
  EXPECT_NE(p.table().find("32 encoder + 8 decoder tokens"), std::string::npos) << p.table();
  o.recompute = true;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:2,tp:2", 4), preset("t5"), o), SpecError,
                    "decoder-only", "T5");
}

TEST(PlanTraining, BadOptionsNameWhatDoesNotSplit) {
  const ModelConfig c = ModelConfig::parse(kLlama7bTwoLayers);
  const RulePtr rules = preset("llama_fsdp_tp");
  TrainPlanOptions o;
  o.batch = 6;
  o.seq = 16;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError,
                    "batch of 6", "[fsdp]", "multiple of 4");
  o.batch = 0;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError, "batch 0",
                    "must be positive");
  o.batch = 8;
  o.headroom = 1.5;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError,
                    "headroom 1.5");
  o.headroom = std::nan("");
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError,
                    "headroom nan");
  o.headroom = 0.1;
  o.target_seq = -1;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError,
                    "target sequence length -1");
  o.target_seq = 0;
  o.grad_accum = 4;
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError,
                    "4 micro-batches");
  o.grad_accum = 1;
  o.batch_axes = {"data"};
  EXPECT_THROW_WITH(plan_training(c, Mesh::parse("fsdp:4,tp:2", 8), rules, o), SpecError, "data");
  // A mesh axis the weights do not divide by: the rule's error names the tensor and the axis.
  o.batch_axes = {};
  EXPECT_THROW(plan_training(c, Mesh::parse("fsdp:1,tp:3", 3), rules, o), SpecError);
  const ModelConfig g = ModelConfig::parse(kGpt2Small);
  o.seq = 2048;
  EXPECT_THROW_WITH(plan_training(g, Mesh::parse("fsdp:8", 8), preset("gpt2"), o), SpecError,
                    "2048", "1024 learned positions");
}

TEST(TrainPlan, FitsAndTheCheapestThatFits) {
  TrainPlan a, b, c;
  a.peak_bytes = 70LL << 30;
  a.bytes_by_collective = {{CollectiveKind::kAllGather, 10}, {CollectiveKind::kAllReduce, 5}};
  b.peak_bytes = 60LL << 30;
  b.bytes_by_collective = {{CollectiveKind::kAllGather, 20}};
  c.peak_bytes = 90LL << 30;
  c.bytes_by_collective = {{CollectiveKind::kAllGather, 1}};
  EXPECT_EQ(a.fits(), std::nullopt);  // no memory given
  for (TrainPlan* p : {&a, &b, &c}) {
    p->device_memory = 80LL << 30;
    p->headroom = 0.1;
  }
  EXPECT_EQ(a.usable_bytes(), 72LL << 30);
  EXPECT_EQ(a.fits(), true);
  EXPECT_EQ(c.fits(), false);
  EXPECT_EQ(a.bytes_moved(), 15);
  // c moves least but does not fit; a moves less than b.
  EXPECT_EQ(cheapest_fitting({a, b, c}), 0u);
  EXPECT_EQ(cheapest_fitting({c, b, a}), 2u);
  EXPECT_EQ(cheapest_fitting({c}), std::nullopt);
  // A configuration that could not be planned never counts, whatever its figures say.
  TrainPlan failed = b;
  failed.bytes_by_collective = {};
  failed.error = "[train] a batch of 6 sequences does not split";
  EXPECT_EQ(cheapest_fitting({c, failed, b}), 2u);
  EXPECT_NE(compare_table({failed}).find("cannot be planned: [train] a batch of 6"),
            std::string::npos);
  EXPECT_NE(compare_table({c}).find("none of these fits"), std::string::npos);
  const std::string t = compare_table({a, b, c});
  EXPECT_NE(t.find("cheapest that fits: #0"), std::string::npos) << t;
  std::ostringstream js;
  write_compare_json(js, {c, b, a});
  const auto j = nlohmann::json::parse(js.str());
  EXPECT_EQ(j["cheapest_fitting"], 2);
  EXPECT_EQ(j["plans"].size(), 3u);
  EXPECT_EQ(j["plans"][0]["fits"], false);
}

TEST(PlanTraining, JsonAndTableCarryTheFigures) {
  const ModelConfig c = ModelConfig::parse(kTinyGpt2);
  TrainPlanOptions o;
  o.batch = 4;
  o.seq = 16;
  o.device_memory = 1 << 20;
  TrainPlan p = plan_training(c, Mesh::parse("fsdp:2,tp:2", 4), preset("gpt2"), o);
  std::ostringstream os;
  p.write_json(os);
  const auto j = nlohmann::json::parse(os.str());
  EXPECT_EQ(j["per_device"]["peak_bytes"], p.peak_bytes);
  EXPECT_EQ(j["per_device"]["parameter_bytes"], p.parameter_bytes);
  EXPECT_EQ(j["bytes_moved_per_device"], p.bytes_moved());
  EXPECT_EQ(j["fits"], *p.fits());
  EXPECT_EQ(j["devices"], 4);
  const std::string t = p.table();
  EXPECT_NE(t.find("Mesh('fsdp': 2, 'tp': 2)"), std::string::npos) << t;
  EXPECT_NE(t.find("optimizer state"), std::string::npos) << t;
}

// The step with each layer a checkpoint (every --remat policy) gives bitwise the gradients of
// the step without (the recomputed ops are the forward ops again), and the fused loss gives the
// unfused loss's gradients (the whole-graph differentiation, itself checked against finite
// differences in autodiff_test) to float rounding; sharded over four devices, every family.
TEST(LossAndGrads, RecomputationAndTheFusedLossGiveTheSameGradients) {
  for (const char* text : {kTinyLlama, kTinyGpt2, kTinyMixtral}) {
    const ModelConfig c = ModelConfig::parse(text);
    SCOPED_TRACE(c.model_type);
    const Executor exec(4);
    const Mesh mesh = Mesh::parse("fsdp:2,tp:2", 4);
    const Tree<Array> params = uniform_parameters(c, DType::kF32, 1, mesh, exec);
    const auto [tokens, targets] = tokens_and_targets(Shape{4, 8}, mesh, P("fsdp"), exec);
    const auto run = [&](std::optional<RematPolicy> remat, bool fused_loss) {
      const train::ModelStep model{.config = c,
                                   .layout = train::Layout{{"fsdp"}, {"tp"}, 2, 2},
                                   .remat = std::move(remat),
                                   .fused_loss = fused_loss};
      return sjit(mesh, [&](const Tree<Array>& p, const Array& x, const Array& y) {
        auto [loss, grads] = train::loss_and_grads(model, p, x, y);
        return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
      })(params, tokens, targets);
    };
    const Tree<Array> plain = run(std::nullopt, true);
    const double loss = plain.at("loss").leaf().to_host().get(0);
    EXPECT_NEAR(loss, std::log(static_cast<double>(c.vocab)), 1.0);  // near uniform at the start
    const auto a = plain.at("grads").flatten();
    ASSERT_EQ(a.size(), c.parameters(DType::kF32).num_leaves());
    const std::string names = c.family == ModelFamily::kGpt2      ? "names:mlpwi,context"
                              : c.family == ModelFamily::kMixtral ? "names:context,out_proj"
                                                                  : "names:mlpwi_0,mlpwi_1,context";
    for (const char* form : {"full", "dots", names.c_str()}) {
      SCOPED_TRACE(form);
      const Tree<Array> rec = run(parse_remat(form), true);
      EXPECT_TRUE(rec.at("loss").leaf().to_host().bit_equal(plain.at("loss").leaf().to_host()));
      const auto b = rec.at("grads").flatten();
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i].first, b[i].first);
        EXPECT_TRUE(a[i].second.to_host().bit_equal(b[i].second.to_host())) << a[i].first;
      }
    }
    const Tree<Array> naive = run(std::nullopt, false);
    EXPECT_NEAR(naive.at("loss").leaf().to_host().get(0), loss, 1e-5);
    const auto b = naive.at("grads").flatten();
    double largest = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto x = a[i].second.to_host().to_doubles(), y = b[i].second.to_host().to_doubles();
      ASSERT_EQ(x.size(), y.size());
      for (std::size_t k = 0; k < x.size(); ++k) {
        largest = std::max(largest, std::abs(x[k]));
        ASSERT_NEAR(x[k], y[k], 1e-5 + 1e-4 * std::abs(x[k])) << a[i].first << " [" << k << "]";
      }
    }
    EXPECT_GT(largest, 1e-3);  // the gradients are not all zero
  }
}

// In bf16, the naive loss (the logits taken to f32, whose cotangent is cast back by a kernel of
// its own, as PyTorch's eager .float()) gives the fused loss's loss and gradients.
TEST(LossAndGrads, TheNaiveLossInBf16GivesTheFusedLossGradients) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  const Executor exec(1);
  const Mesh mesh = Mesh::parse("fsdp:1,tp:1", 1);
  const Tree<Array> params = uniform_parameters(c, DType::kBF16, 5, mesh, exec);
  const auto [tokens, targets] = tokens_and_targets(Shape{2, 8}, mesh, P(), exec);
  const auto run = [&](bool fused_loss) {
    const train::ModelStep model{.config = c, .layout = train::Layout{}, .fused_loss = fused_loss};
    return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& x, const Array& y) {
      auto [loss, grads] = train::loss_and_grads(model, p, x, y);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, tokens, targets));
  };
  const Tree<Tensor> naive = run(false), fused = run(true);
  EXPECT_NEAR(naive.at("loss").leaf().get(0), fused.at("loss").leaf().get(0), 1e-3);
  const auto a = naive.at("grads").flatten(), b = fused.at("grads").flatten();
  ASSERT_EQ(a.size(), b.size());
  double largest = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].second.dtype(), DType::kBF16) << a[i].first;
    const auto x = a[i].second.to_doubles(), y = b[i].second.to_doubles();
    for (std::size_t k = 0; k < x.size(); ++k) {
      largest = std::max(largest, std::abs(x[k]));
      ASSERT_NEAR(x[k], y[k], 1e-3 + 2e-2 * std::abs(y[k])) << a[i].first << " [" << k << "]";
    }
  }
  EXPECT_GT(largest, 1e-3);
}

// With tensor parallelism the naive loss runs as DTensor's loss_parallel: the same loss and
// gradients as the unsplit formulation (one device), and its backward pass holds one more f32
// copy of the logits: four at its peak (x, grad_input, exp(x) or the product, their sum), where
// the unsplit loss holds three. On tp:4 with the head split along the vocabulary, 2 x 64 tokens
// and 4,096 classes: each copy is 128 x 1,024 x 4 bytes = 512 KiB a device.
TEST(LossAndGrads, LossParallelHoldsFourCopiesOfTheLogits) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 4096,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2})");
  // Loss and gradients of the whole step: tp:4 (loss parallel) against one device.
  const auto run = [&](const char* axes, int n, const train::Layout& layout) {
    const Executor exec(n);
    const Mesh mesh = Mesh::parse(axes, n);
    const Tree<Array> params = uniform_parameters(c, DType::kF32, 11, mesh, exec);
    const auto [x, y] = tokens_and_targets(Shape{2, 8}, mesh, PartitionSpec(), exec);
    const train::ModelStep model{.config = c, .layout = layout, .fused_loss = false};
    return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& a, const Array& b) {
      auto [loss, grads] = train::loss_and_grads(model, p, a, b);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, x, y));
  };
  const Tree<Tensor> one = run("fsdp:1,tp:1", 1, train::Layout{});
  const Tree<Tensor> four = run("fsdp:1,tp:4", 4, train::Layout{{"fsdp"}, {"tp"}, 1, 4});
  EXPECT_NEAR(four.at("loss").leaf().get(0), one.at("loss").leaf().get(0), 1e-5);
  const auto a = four.at("grads").flatten(), b = one.at("grads").flatten();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto u = a[i].second.to_doubles(), v = b[i].second.to_doubles();
    ASSERT_EQ(u.size(), v.size()) << a[i].first;
    for (std::size_t k = 0; k < u.size(); ++k) {
      ASSERT_NEAR(u[k], v[k], 1e-5 + 1e-4 * std::abs(v[k])) << a[i].first << " [" << k << "]";
    }
  }

  // The loss's peak alone: the gradient of the loss with respect to the head's input h, split
  // over tp:4 against one device with a quarter of the vocabulary (the same local logits, taken
  // whole by PyTorch's cross_entropy: three copies).
  const auto peak = [&](const train::Layout& layout, const Mesh& mesh, std::int64_t vocab) {
    const train::ModelStep model{.config = c, .layout = layout, .fused_loss = false};
    auto f = sjit(mesh, [&](const Array& norm, const Array& head, const Array& h, const Array& y) {
      const Tree<Array> rest = Tree<Array>::dict(
          {{"model", Tree<Array>::dict({{"norm", Tree<Array>::dict({{"weight", Tree<Array>(norm)}})}})},
           {"lm_head", Tree<Array>::dict({{"weight", Tree<Array>(head)}})}});
      return value_and_grad([&](const Array& x) { return model.loss(rest, x, y); })(h).second;
    }, SjitOptions{.in_shardings = RuleTree::list({RuleTree(P()), RuleTree(P("tp")),
                                                   RuleTree(P()), RuleTree(P())}),
                   .count_constants = false});  // as train-plan plans (an iota is folded)
    return f.lower(TensorSpec{Shape{32}, DType::kF32}, TensorSpec{Shape{vocab, 32}, DType::kF32},
                   TensorSpec{Shape{2, 64, 32}, DType::kF32}, TensorSpec{Shape{2, 64}, DType::kI32})
        .cost();
  };
  const ProgramCost split = peak(train::Layout{{"fsdp"}, {"tp"}, 1, 4}, Mesh::parse("fsdp:1,tp:4", 4), 4096);
  const ProgramCost whole = peak(train::Layout{}, Mesh::parse("fsdp:1,tp:1", 1), 1024);
  constexpr std::int64_t kCopy = 128 * 1024 * 4;
  // One copy more, give or take the per-token vectors ([2, 64] f32, 512 B) each formulation
  // holds beside it (the unsplit one sums the cotangent over the vocabulary, for instance).
  EXPECT_NEAR(static_cast<double>(split.peak_bytes[0] - whole.peak_bytes[0]), kCopy, 4 * 512);
  ASSERT_GE(split.timeline.live_at_peak.size(), 5u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(split.timeline.live_at_peak[static_cast<std::size_t>(i)].type, "f32[2, 64, 4096]");
    EXPECT_EQ(split.timeline.live_at_peak[static_cast<std::size_t>(i)].bytes, kCopy);
  }
  EXPECT_LT(split.timeline.live_at_peak[4].bytes, kCopy);
}

// The naive losses (eager_cross_entropy on one device, loss_parallel on tp:4) follow the losses'
// label rule (docs/sjit.md "Losses' labels"): an ignored target (-100) gives 0 and no gradient
// (the head input's rows of those tokens exactly 0), the others the fused loss's (one-hot)
// cross-entropy; a target outside the vocabulary is a named error.
TEST(LossAndGrads, TheNaiveLossesFollowTheLabelRule) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2})");
  const auto run = [&](const char* axes, int n, const train::Layout& layout, bool fused,
                       std::int32_t bad) {
    const Executor exec(n);
    const Mesh mesh = Mesh::parse(axes, n);
    std::vector<std::int32_t> ids;
    for (int i = 0; i < 16; ++i) ids.push_back((i * 7) % 64);
    ids[3] = ids[12] = -100;
    ids[9] = bad;
    const Array y = device_put(Tensor::from(Shape{2, 8}, ids), NamedSharding(mesh, P()), exec);
    const Array norm = device_put(Tensor::uniform(Shape{32}, DType::kF32, 1, 0.5, 1.5),
                                  NamedSharding(mesh, P()), exec);
    const Array head = device_put(Tensor::uniform(Shape{64, 32}, DType::kF32, 2, -1, 1),
                                  NamedSharding(mesh, layout.model_ways > 1 ? P("tp") : P()), exec);
    const Array h = device_put(Tensor::uniform(Shape{2, 8, 32}, DType::kF32, 3, -1, 1),
                               NamedSharding(mesh, P()), exec);
    const train::ModelStep model{.config = c, .layout = layout, .fused_loss = fused};
    return to_host(sjit(mesh, [&](const Array& nw, const Array& hw, const Array& x, const Array& t) {
      const Tree<Array> rest = Tree<Array>::dict(
          {{"model", Tree<Array>::dict({{"norm", Tree<Array>::dict({{"weight", Tree<Array>(nw)}})}})},
           {"lm_head", Tree<Array>::dict({{"weight", Tree<Array>(hw)}})}});
      auto [loss, grad] = value_and_grad([&](const Array& v) { return model.loss(rest, v, t); })(x);
      return Tree<Array>::dict({{"grad", Tree<Array>(grad)}, {"loss", Tree<Array>(loss)}});
    })(norm, head, h, y));
  };
  const train::Layout one{}, tp4{{"fsdp"}, {"tp"}, 1, 4};
  const Tree<Tensor> want = run("fsdp:1,tp:1", 1, one, true, 5);  // linear_cross_entropy
  for (const auto& [axes, n, layout] : {std::tuple{"fsdp:1,tp:1", 1, one},
                                        std::tuple{"fsdp:1,tp:4", 4, tp4}}) {
    SCOPED_TRACE(axes);
    const Tree<Tensor> got = run(axes, n, layout, false, 5);
    EXPECT_NEAR(got.at("loss").leaf().get(0), want.at("loss").leaf().get(0), 1e-5);
    const Tensor& g = got.at("grad").leaf();
    const Tensor& wg = want.at("grad").leaf();
    for (std::int64_t token = 0; token < 16; ++token) {
      for (std::int64_t d = 0; d < 32; ++d) {
        const std::int64_t k = token * 32 + d;
        if (token == 3 || token == 12) {
          ASSERT_EQ(g.get(k), 0.0) << token << ", " << d;  // exactly
        } else {
          ASSERT_NEAR(g.get(k), wg.get(k), 1e-6) << token << ", " << d;
        }
      }
    }
    EXPECT_THROW_WITH(run(axes, n, layout, false, 64), DeviceError,
                      "[cross_entropy] label 64 at index [1, 1]", "[0, 64)");
  }
}

// The naive loss on whole logits reserves what eager PyTorch's cross_entropy(pred.float(), labels)
// does, worked by hand in copies of the f32 logits (c): the head writes pred (bf16, c/2), .float()
// a copy (c), log_softmax its result (c, the one array kept); pred and the copy are freed, which
// leaves a hole of 1.5c under the result. The backward pass writes nll_loss's cotangent (c) in
// the hole's first c, then log_softmax's (c), which no hole holds: the segment grows by c. 3.5c
// reserved with expandable segments for 3c live. With a segment per cudaMalloc: pred's segment
// (c/2) and the copy's (c) are cached; nll_loss's cotangent reuses the copy's, log_softmax's
// backward takes a new one: 3.5c again. Writing x - max, exp and a one-hot array in the forward
// pass (log_softmax's and cross_entropy's ops) left no such hole: 3c with expandable segments.
TEST(LossAndGrads, NaiveLossReservesAsEagerPyTorchsCrossEntropy) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 32768,
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2})");
  const Mesh mesh = Mesh::parse("fsdp:1", 1);
  const train::ModelStep model{.config = c, .layout = train::Layout{}, .fused_loss = false};
  auto f = sjit(mesh, [&](const Array& norm, const Array& head, const Array& h, const Array& y) {
    const Tree<Array> rest = Tree<Array>::dict(
        {{"model", Tree<Array>::dict({{"norm", Tree<Array>::dict({{"weight", Tree<Array>(norm)}})}})},
         {"lm_head", Tree<Array>::dict({{"weight", Tree<Array>(head)}})}});
    return value_and_grad([&](const Array& x) { return model.loss(rest, x, y); })(h).second;
  }, SjitOptions{.count_constants = false});
  const Lowered low =
      f.lower(TensorSpec{Shape{64}, DType::kBF16}, TensorSpec{Shape{32768, 64}, DType::kBF16},
              TensorSpec{Shape{1, 2048, 64}, DType::kBF16}, TensorSpec{Shape{1, 2048}, DType::kI32});
  const ProgramCost& cost = low.cost();
  const detail::ReservedBytes reserved = detail::reserved_bytes(detail::program_of(low));
  constexpr double kCopy = 2048.0 * 32768 * 4;  // 256 MiB
  // Beside the logits' arrays: the weights, h and its gradient, per-token vectors (a few MiB),
  // and the 20 MiB pages of an expandable segment.
  constexpr double kSlack = 32.0 * 1024 * 1024;
  EXPECT_NEAR(static_cast<double>(cost.peak_bytes[0]), 3 * kCopy, kSlack);
  EXPECT_NEAR(static_cast<double>(reserved.expandable), 3.5 * kCopy, kSlack);
  EXPECT_NEAR(static_cast<double>(reserved.segments), 3.5 * kCopy, kSlack);
}

// FSDP2's MixedPrecisionPolicy as torchtitan sets it (--mixed-precision fsdp2): weights held in
// f32, used in bf16, gradients reduced and the optimizer state in f32.
void fsdp2_mixed_precision(TrainPlanOptions& o) {
  o.param_dtype = DType::kBF16;
  o.master_dtype = o.reduce_dtype = DType::kF32;
  o.grad_dtype = o.optimizer_dtype = DType::kF32;
}

// "fsdp:4,tp:2": a mesh of as many devices as its axes make.
Mesh mesh_of(const std::string& text) {
  std::int64_t devices = 1;
  for (std::size_t at = text.find(':'); at != std::string::npos; at = text.find(':', at + 1)) {
    devices *= std::stoll(text.substr(at + 1));
  }
  return Mesh::parse(text, devices);
}

// Every figure of two plans of the same step, for a plan extrapolated from small steps against
// the whole step traced.
void expect_same_plan(const TrainPlan& a, const TrainPlan& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.parameter_count, b.parameter_count);
  EXPECT_EQ(a.parameter_bytes, b.parameter_bytes);
  EXPECT_EQ(a.gradient_bytes, b.gradient_bytes);
  EXPECT_EQ(a.optimizer_bytes, b.optimizer_bytes);
  EXPECT_EQ(a.batch_bytes, b.batch_bytes);
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.transient_bytes, b.transient_bytes);
  EXPECT_EQ(a.peak_held_bytes, b.peak_held_bytes);
  EXPECT_EQ(a.peak_gathered_bytes, b.peak_gathered_bytes);
  EXPECT_EQ(a.peak_computed_bytes, b.peak_computed_bytes);
  // The caching allocator model's reserved bytes: an extrapolated plan gives none unless asked
  // to trace the whole step for them (TrainPlanOptions::reserved_whole).
  if (a.extrapolated && a.reserved_bytes == 0) {
    EXPECT_EQ(a.reserved_bytes_expandable, 0);
  } else {
    EXPECT_EQ(a.reserved_bytes, b.reserved_bytes);
    EXPECT_EQ(a.reserved_bytes_expandable, b.reserved_bytes_expandable);
  }
  EXPECT_EQ(a.bytes_by_collective, b.bytes_by_collective);
  EXPECT_DOUBLE_EQ(a.flops, b.flops);
  EXPECT_DOUBLE_EQ(a.total_flops, b.total_flops);
}

// Many layers or micro-batches are planned from a few small traced steps: field for field the
// plan of the whole step traced, for each family, with and without recomputation, accumulation
// over few and over many micro-batches, on meshes with and without tensor parallelism. (One
// test per case: each traces a step of some twenty layers whole, a few seconds.)
struct ExtrapolationCase {
  const char* name;
  const char* config;
  const char* mesh;
  const char* rules;
  std::int64_t layers;
  int accum;
  bool recompute;
  bool fsdp_root = false;
};
class Extrapolation : public ::testing::TestWithParam<ExtrapolationCase> {};

TEST_P(Extrapolation, PlanIsTheWholeTracedStep) {
  const ExtrapolationCase& k = GetParam();
  ModelConfig c = ModelConfig::parse(k.config);
  c.layers = k.layers;
  const Mesh mesh = mesh_of(k.mesh);
  TrainPlanOptions o;
  o.batch = 8 * k.accum;
  o.seq = 8;
  o.grad_accum = k.accum;
  o.recompute = k.recompute;
  o.fsdp_root = k.fsdp_root;
  const TrainPlan extrapolated = plan_training(c, mesh, preset(k.rules), o);
  EXPECT_TRUE(extrapolated.extrapolated) << extrapolated.traced;
  o.extrapolate = false;
  const TrainPlan whole = plan_training(c, mesh, preset(k.rules), o);
  EXPECT_FALSE(whole.extrapolated);
  EXPECT_EQ(whole.traced, "the whole step");
  expect_same_plan(extrapolated, whole, extrapolated.traced);
}

// The caching allocator model's reserved bytes are not affine in the layers (its fragmentation
// repeats every few layers, docs/training.md): an extrapolated plan gives them from the whole step
// traced when asked, else none. A Llama-2-7B-shaped step of 22 layers.
TEST(PlanTraining, ReservedBytesOfAnExtrapolatedStepAreTheWholeStepsOrNone) {
  ModelConfig c = ModelConfig::parse(kLlama2_7b);
  c.layers = 22;
  const Mesh mesh = mesh_of("fsdp:8");
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 2048;
  fsdp2_mixed_precision(o);
  const TrainPlan none = plan_training(c, mesh, preset("llama_fsdp"), o);
  EXPECT_TRUE(none.extrapolated);
  EXPECT_EQ(none.reserved_bytes, 0);
  EXPECT_EQ(none.reserved_bytes_expandable, 0);
  EXPECT_EQ(none.table().find("reserved"), std::string::npos);
  {  // not computed is null in the JSON, not a figure of 0 bytes
    std::ostringstream js;
    none.write_json(js);
    const auto j = nlohmann::json::parse(js.str());
    EXPECT_TRUE(j["per_device"]["reserved_bytes"].is_null()) << j["per_device"];
    EXPECT_TRUE(j["per_device"]["reserved_bytes_expandable"].is_null());
  }
  o.reserved_whole = true;
  const TrainPlan asked = plan_training(c, mesh, preset("llama_fsdp"), o);
  EXPECT_TRUE(asked.extrapolated);
  o.extrapolate = false;
  const TrainPlan whole = plan_training(c, mesh, preset("llama_fsdp"), o);
  expect_same_plan(asked, whole, "reserved_whole");
  // The allocator holds at least what is live; rounding and caching make it more.
  EXPECT_GT(whole.reserved_bytes, whole.peak_bytes);
  EXPECT_GT(whole.reserved_bytes_expandable, whole.peak_bytes);
  std::ostringstream js;
  whole.write_json(js);
  EXPECT_EQ(nlohmann::json::parse(js.str())["per_device"]["reserved_bytes"], whole.reserved_bytes);
  EXPECT_NE(asked.table().find("reserved (caching allocator model)"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    PlanTraining, Extrapolation,
    ::testing::Values(
        ExtrapolationCase{"llama_tp", kTinyLlama, "fsdp:4,tp:2", "llama_fsdp_tp", 22, 1, false},
        ExtrapolationCase{"llama_tp_remat", kTinyLlama, "fsdp:4,tp:2", "llama_fsdp_tp", 22, 1,
                          true},
        ExtrapolationCase{"llama_accum2_remat", kTinyLlama, "fsdp:8", "llama_fsdp", 22, 2, true},
        ExtrapolationCase{"llama_accum3", kTinyLlama, "fsdp:8", "llama_fsdp", 22, 3, false},
        ExtrapolationCase{"llama_many_micro_batches_remat", kTinyLlama, "fsdp:2,tp:2",
                          "llama_fsdp_tp", 2, 20, true},
        // 10 x 20 = 220 units: more than the 209 its samples trace (with the four past the
        // smallest counts), so it is extrapolated.
        ExtrapolationCase{"llama_many_of_both_remat", kTinyLlama, "fsdp:2,tp:2", "llama_fsdp_tp", 10,
                          20, true},
        ExtrapolationCase{"mixtral", kTinyMixtral, "ep:2,fsdp:2", "mixtral_ep", 22, 1, false},
        ExtrapolationCase{"mixtral_accum2_remat", kTinyMixtral, "ep:2,fsdp:2", "mixtral_ep", 22, 2,
                          true},
        ExtrapolationCase{"mistral_window", kTinyMistralWindow, "fsdp:4,tp:2", "llama_fsdp_tp",
                          22, 1, false},
        ExtrapolationCase{"gpt2", kTinyGpt2, "fsdp:2,tp:2", "gpt2", 22, 1, false},
        ExtrapolationCase{"gpt2_accum2_remat", kTinyGpt2, "fsdp:2,tp:2", "gpt2", 22, 2, true},
        // The last layer differs (kept gathered): in every sample as in the whole step.
        ExtrapolationCase{"llama_fsdp_root", kTinyLlama, "fsdp:8", "llama_fsdp", 22, 1, false,
                          true},
        ExtrapolationCase{"llama_fsdp_root_remat_tp", kTinyLlama, "fsdp:4,tp:2", "llama_fsdp_tp",
                          22, 1, true, true}),
    [](const ::testing::TestParamInfo<ExtrapolationCase>& c) { return c.param.name; });

// --fsdp-root (torchtitan's wrapping before mid-2025): FSDP2 keeps the root module (embedding,
// final norm, head) unsharded from the forward pass's start to the backward pass's end, and the
// last block is not resharded after forward. The tiny LLaMA (vocabulary 64, hidden 32; a
// layer's matrices q 32x32, k and v 16x32, o 32x32, gate and up 48x32, down 32x48: 7,680
// elements) on fsdp:4, weights f32 held and used in bf16, no recomputation. By hand: at the peak
// (the loss's backward pass) the parameters gathered for use are the head alone without it
// (64 x 32 x 2 bytes), and with it the head, the embedding and the last layer's matrices; its
// all-gathers receive the last layer's matrices once less (not gathered again for its backward
// pass: 7,680 x 2 bytes x 3/4); the gradients are reduced as before (the same reduce-scatter
// and all-reduce bytes: the root's in f32, not in bf16). Without batch axes it does not apply.
TEST(PlanTraining, FsdpRootHoldsTheRootsWeightsAndTheLastLayers) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 64;
  fsdp2_mixed_precision(o);
  const TrainPlan units = plan_training(c, mesh_of("fsdp:4"), preset("llama_fsdp"), o);
  o.fsdp_root = true;
  const TrainPlan root = plan_training(c, mesh_of("fsdp:4"), preset("llama_fsdp"), o);
  constexpr std::int64_t kTable = 64 * 32 * 2;
  constexpr std::int64_t kLayer = 7680 * 2;
  EXPECT_FALSE(units.fsdp_root);
  EXPECT_TRUE(root.fsdp_root);
  EXPECT_EQ(units.peak_gathered_bytes, kTable);
  EXPECT_EQ(root.peak_gathered_bytes, 2 * kTable + kLayer);
  EXPECT_EQ(units.bytes_by_collective.at(CollectiveKind::kAllGather) -
                root.bytes_by_collective.at(CollectiveKind::kAllGather),
            kLayer * 3 / 4);
  EXPECT_EQ(root.bytes_by_collective.at(CollectiveKind::kReduceScatter),
            units.bytes_by_collective.at(CollectiveKind::kReduceScatter));
  // The norms' gradients (whole) are all-reduced in f32 as before: keep_alive carries their
  // pending sums to the f32 conversion (reduced before it in bf16, 96 bytes fewer).
  EXPECT_EQ(root.bytes_by_collective.at(CollectiveKind::kAllReduce),
            units.bytes_by_collective.at(CollectiveKind::kAllReduce));
  EXPECT_EQ(root.parameter_bytes, units.parameter_bytes);
  EXPECT_NE(root.table().find(", FSDP root module ("), std::string::npos) << root.table();
  EXPECT_EQ(units.table().find("FSDP root module"), std::string::npos);
  std::ostringstream js;
  root.write_json(js);
  EXPECT_EQ(nlohmann::json::parse(js.str())["fsdp_root"], true);
  // T5's step is not wrapped as torchtitan's: refused, not silently ignored.
  TrainPlanOptions t5 = o;
  t5.seq = 8;
  EXPECT_THROW_WITH(
      plan_training(ModelConfig::parse(kTinyT5), mesh_of("fsdp:2,tp:2"), preset("t5"), t5),
      SpecError, "--fsdp-root", "T5");
  // One device: nothing is sharded, so there is no root module to hold.
  const TrainPlan alone = plan_training(c, mesh_of("fsdp:1"), preset("llama_fsdp"), o);
  EXPECT_FALSE(alone.fsdp_root);
  o.fsdp_root = false;
  const TrainPlan alone_units = plan_training(c, mesh_of("fsdp:1"), preset("llama_fsdp"), o);
  EXPECT_EQ(alone.peak_bytes, alone_units.peak_bytes);
}

// The root module's custom VJP and the last layer's shared weights change where values are held,
// not what is computed: the loss and every gradient are those of the step without them.
TEST(LossAndGrads, FsdpRootGivesTheSameLossAndGradients) {
  const ModelConfig c = ModelConfig::parse(kTinyLlama);
  const Executor exec(4);
  const Mesh mesh = Mesh::parse("fsdp:4,tp:1", 4);
  const Tree<Array> params = uniform_parameters(c, DType::kF32, 21, mesh, exec);
  const auto [tokens, targets] = tokens_and_targets(Shape{4, 8}, mesh, P("fsdp"), exec);
  const auto run = [&](bool root, bool remat) {
    const train::ModelStep model{
        .config = c,
        .layout = train::Layout{{"fsdp"}, {"tp"}, 4, 1},
        .remat = remat ? std::optional(checkpoint_policies::nothing_saveable()) : std::nullopt,
        .compute_dtype = DType::kBF16,
        .reshard_after_forward = !remat,
        .fsdp_root = root};
    return to_host(sjit(mesh, [&](const Tree<Array>& p, const Array& x, const Array& y) {
      auto [loss, grads] = train::loss_and_grads(model, p, x, y);
      return Tree<Array>::dict({{"grads", grads}, {"loss", Tree<Array>(loss)}});
    })(params, tokens, targets));
  };
  for (const bool remat : {false, true}) {
    SCOPED_TRACE(remat ? "full recomputation" : "reshard after forward");
    const Tree<Tensor> a = run(true, remat), b = run(false, remat);
    EXPECT_EQ(a.at("loss").leaf().get(0), b.at("loss").leaf().get(0));
    const auto ga = a.at("grads").flatten(), gb = b.at("grads").flatten();
    ASSERT_EQ(ga.size(), gb.size());
    for (std::size_t i = 0; i < ga.size(); ++i) {
      EXPECT_TRUE(ga[i].second == gb[i].second) << ga[i].first;
    }
  }
}

// The samples are the model's first layers: a model whose layers differ (Qwen2's window from
// max_window_layers on; 24 layers would otherwise be planned from samples) is not extrapolated from them but traced whole, and its plan is the
// same as with extrapolation turned off.
TEST(PlanTraining, LayersThatDifferAreTracedWhole) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "qwen2", "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 24,
    "num_attention_heads": 4, "num_key_value_heads": 2, "use_sliding_window": true,
    "sliding_window": 4, "max_window_layers": 20})");
  ASSERT_EQ(c.window(19), 0);
  ASSERT_EQ(c.window(20), 4);
  TrainPlanOptions o;
  o.batch = 8;
  o.seq = 8;
  const TrainPlan p = plan_training(c, mesh_of("fsdp:8"), preset("llama_fsdp"), o);
  EXPECT_FALSE(p.extrapolated);
  EXPECT_EQ(p.traced, "the whole step");
  o.extrapolate = false;
  expect_same_plan(p, plan_training(c, mesh_of("fsdp:8"), preset("llama_fsdp"), o), "qwen2");
}

// The figures of a step made to fool the extrapolation: one that is not affine over the small
// counts, one whose peak moves to another point of the step past the third sample (a line of
// larger slope overtakes), one whose figures differ in kind. None is extrapolated.
TEST(PlanTraining, FiguresNotAffineAreNotExtrapolated) {
  const auto sample = [](std::int64_t l, std::int64_t k, std::int64_t peak, double flops = 0) {
    train::StepSample s{l, k, {}};
    s.figures.bytes[train::ByteFigure::kPeak] = peak;
    s.figures.flops[train::FlopFigure::kBusiest] = flops;
    return s;
  };
  const auto affine = [&](std::int64_t l) { return sample(l, 1, 100 + 7 * l, 3.0 * l); };
  const auto got = train::extrapolate({affine(2), affine(3), affine(4), affine(8)}, 1000, 1);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->bytes.at(train::ByteFigure::kPeak), 7100);
  EXPECT_DOUBLE_EQ(got->flops.at(train::FlopFigure::kBusiest), 3000.0);
  // Bilinear in both counts: a + b l + c k + d l k.
  std::vector<train::StepSample> both;
  for (const auto& [l, k] : std::vector<std::pair<int, int>>{
           {2, 2}, {3, 2}, {2, 3}, {3, 3}, {4, 2}, {8, 2}, {2, 4}, {2, 8}, {4, 4}}) {
    both.push_back(sample(l, k, 5 + 3 * l + 11 * k + 2 * l * k));
  }
  const auto bilinear = train::extrapolate(both, 1000, 8192);
  ASSERT_TRUE(bilinear.has_value());
  EXPECT_EQ(bilinear->bytes.at(train::ByteFigure::kPeak), 5 + 3000 + 11 * 8192 + 2 * 1000 * 8192);
  // With the samples past the smallest counts (plan_training traces them too), a step of 2
  // micro-batches off the surface is passed over: fitted on (3, 3), (4, 3), (3, 4), (4, 4).
  std::vector<train::StepSample> kinked = both;
  for (const auto& [l, k] : std::vector<std::pair<int, int>>{{4, 3}, {3, 4}, {8, 3}, {3, 8}}) {
    kinked.push_back(sample(l, k, 5 + 3 * l + 11 * k + 2 * l * k));
  }
  for (train::StepSample& k : kinked) {
    if (k.micro_batches == 2) k.figures.bytes[train::ByteFigure::kPeak] -= 64;
  }
  const auto passed_over = train::extrapolate(kinked, 1000, 8192);
  ASSERT_TRUE(passed_over.has_value());
  EXPECT_EQ(passed_over->bytes.at(train::ByteFigure::kPeak), 5 + 3000 + 11 * 8192 + 2 * 1000 * 8192);
  // Off the line at the third count.
  EXPECT_FALSE(train::extrapolate({affine(2), affine(3), sample(4, 1, 129), affine(8)}, 1000, 1));
  // Off at the smallest count only (a step of 2 that peaks elsewhere): fitted on 3 and 4 and
  // checked on 8 instead; off at 8 as well, refused.
  const auto past = train::extrapolate({sample(2, 1, 99, 6.0), affine(3), affine(4), affine(8)}, 1000, 1);
  ASSERT_TRUE(past.has_value());
  EXPECT_EQ(past->bytes.at(train::ByteFigure::kPeak), 7100);
  EXPECT_FALSE(
      train::extrapolate({sample(2, 1, 99, 6.0), affine(3), affine(4), sample(8, 1, 157, 24.0)}, 1000, 1));
  // max(100 + l, 70 + 5 l): affine on 2, 3, 4; the steeper line leads from l = 8.
  const auto crossing = [&](std::int64_t l) {
    return sample(l, 1, std::max<std::int64_t>(100 + l, 70 + 5 * l), 0);
  };
  EXPECT_FALSE(train::extrapolate({crossing(2), crossing(3), crossing(4), crossing(8)}, 1000, 1));
  // Not bilinear: one cross term off.
  both[8].figures.bytes[train::ByteFigure::kPeak] += 1;
  EXPECT_FALSE(train::extrapolate(both, 1000, 8192));
  // A collective kind only some samples use.
  train::StepSample extra = affine(8);
  extra.figures.bytes[CollectiveKind::kAllToAll] = 1;
  EXPECT_FALSE(train::extrapolate({affine(2), affine(3), affine(4), extra}, 1000, 1));
  // FLOPs off the line.
  EXPECT_FALSE(
      train::extrapolate({affine(2), affine(3), sample(4, 1, 128, 12.5), affine(8)}, 1000, 1));
  // The memory traffic (a time-model figure) may be off by a relative 1e-3, no more; the peak
  // beside it must still be exact.
  const auto traffic = [&](std::int64_t l, std::int64_t off) {
    train::StepSample t = affine(l);
    t.figures.bytes[train::ByteFigure::kMemoryTraffic] = 1'000'000'000 * l + off;
    return t;
  };
  const auto close = train::extrapolate({traffic(2, 0), traffic(3, 0), traffic(4, 64'000), traffic(8, 0)},
                                        10, 1);
  ASSERT_TRUE(close.has_value());
  EXPECT_EQ(close->bytes.at(train::ByteFigure::kMemoryTraffic), 10'000'000'000);
  EXPECT_FALSE(train::extrapolate(
      {traffic(2, 0), traffic(3, 0), traffic(4, 5'000'000), traffic(8, 0)}, 10, 1));
  // A count that was not sampled and cannot be extrapolated to.
  EXPECT_FALSE(train::extrapolate({affine(2), affine(3)}, 1000, 2));
  // Bytes that pass int64 at the count asked for (2^60 per layer, 16 layers): an error, not a
  // wrapped number.
  const auto huge = [&](std::int64_t l) { return sample(l, 1, l * (std::int64_t{1} << 60)); };
  EXPECT_THROW_WITH(train::extrapolate({huge(2), huge(3), huge(4), huge(5)}, 16, 1), SpecError,
                    "a byte count of the step overflows int64");
}

// Configs the tracer could not hold: ten thousand layers and thousands of micro-batches are
// planned from small steps; what is too large even so is refused before tracing, with the limit.
TEST(PlanTraining, LargeStepsArePlannedOrRefusedUpFront) {
  ModelConfig c = ModelConfig::parse(kTinyLlama);
  c.layers = 10000;
  TrainPlanOptions o;
  o.batch = 8192;
  o.seq = 8;
  o.grad_accum = 1024;
  const TrainPlan p = plan_training(c, mesh_of("fsdp:8"), preset("llama_fsdp"), o);
  EXPECT_TRUE(p.extrapolated);
  EXPECT_EQ(p.parameter_count, c.parameter_count());
  EXPECT_GT(p.peak_bytes, p.parameter_bytes + p.optimizer_bytes);
  // At LLaMA-3-8B's width, where each layer's constants (rotary tables) are large: kept between
  // steps up to a total, they grew with the first layers only and 10,000 layers or 16
  // micro-batches were refused as "not linear" (train-plan now keeps no constants).
  ModelConfig wide = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 10000,
    "num_attention_heads": 32, "num_key_value_heads": 8})");
  TrainPlanOptions w;
  w.batch = 32;
  w.seq = 1024;
  w.recompute = true;
  EXPECT_TRUE(plan_training(wide, mesh_of("fsdp:8"), preset("llama_fsdp"), w).extrapolated);
  wide.layers = 32;
  w.batch = 128;
  w.grad_accum = 16;
  EXPECT_TRUE(plan_training(wide, mesh_of("fsdp:8"), preset("llama_fsdp"), w).extrapolated);
  // Experts: each is traced, so many of them are refused before any tracing.
  ModelConfig m = ModelConfig::parse(kTinyMixtral);
  m.experts = 32768;
  o.grad_accum = 1;
  o.batch = 8;
  EXPECT_THROW_WITH(plan_training(m, mesh_of("ep:2,fsdp:2"), preset("mixtral_ep"), o), SpecError,
                    "too large to plan", "over the limit of 512", "experts");
  // Without extrapolation the whole step counts.
  c.layers = 600;
  o.extrapolate = false;
  EXPECT_THROW_WITH(plan_training(c, mesh_of("fsdp:8"), preset("llama_fsdp"), o), SpecError,
                    "600 layers x 1 micro-batch", "over the limit of 512");
  // T5 is traced whole.
  ModelConfig t = ModelConfig::parse(kTinyT5);
  t.layers = t.decoder_layers = 300;
  o.extrapolate = true;
  EXPECT_THROW_WITH(plan_training(t, mesh_of("fsdp:2"), preset("t5"), o), SpecError, "600 layers",
                    "T5 is traced whole");
}

// With recomputation each micro-batch gathers the weights it uses again (as FSDP does), and its
// reduced gradients are added to the sum when it ends: more micro-batches of the same global
// batch do not raise the peak, but for the sum itself: from one micro-batch (no sum) to two the
// peak may grow by at most the gradient shards the sum holds, and from two on not at all. (Before, every micro-batch used the first one's gathered weights,
// so the whole model stayed gathered: LLaMA-3-8B on 8 devices, 32 x 1024 tokens, peaked at
// 20.4, 29.4 and 32.4 GiB with 1, 2 and 4 micro-batches; and the fused chain of sums kept every
// micro-batch's gradients to the end.)
TEST(PlanTraining, MoreMicroBatchesDoNotRaiseThePeakWithRecomputation) {
  const ModelConfig c = ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8})");
  TrainPlanOptions o;
  o.seq = 1024;
  o.recompute = true;
  for (const std::int64_t batch : {32, 64}) {
    o.batch = batch;
    std::int64_t previous = std::numeric_limits<std::int64_t>::max();
    for (const int k : {1, 2, 4}) {
      o.grad_accum = k;
      const TrainPlan p = plan_training(c, mesh_of("fsdp:8"), preset("llama_fsdp"), o);
      EXPECT_LE(p.peak_bytes, previous + (k == 2 ? p.gradient_bytes : 0))
          << batch << " sequences in " << k << " micro-batches";
      if (k > 1) {
        EXPECT_EQ(p.peak_gathered_bytes, 0) << batch << " sequences in " << k << " micro-batches";
      }
      previous = p.peak_bytes;
    }
  }
}
}  // namespace
}  // namespace shardplan
