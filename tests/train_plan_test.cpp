// The training planner's inputs: Hugging Face configs read (every field, every bad value named),
// byte and optimizer options parsed, names printed safely. The plans themselves: the other
// train_plan_test_*.cpp.
#include "train_plan_test.hpp"

namespace shardplan {
namespace {

using namespace test;

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

}  // namespace
}  // namespace shardplan
