// ModelConfig: the fields of a Hugging Face config.json a training step needs, and the
// parameter tree of each family in the checkpoints' own naming.
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardplan/detail/checked.hpp"
#include "shardplan/error.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/train_plan.hpp"

namespace shardplan {
namespace {

using Json = nlohmann::json;

struct Family {
  const char* model_type;
  ModelFamily family;
};
// The model types whose layout the family's step reproduces.
constexpr Family kFamilies[] = {
    {"llama", ModelFamily::kLlama}, {"mistral", ModelFamily::kLlama},
    {"qwen2", ModelFamily::kLlama}, {"mixtral", ModelFamily::kMixtral},
    {"gpt2", ModelFamily::kGpt2},   {"t5", ModelFamily::kT5},
};

std::string known_types() {
  std::string out;
  for (const Family& f : kFamilies) {
    if (!out.empty()) out += ", ";
    out += f.model_type;
  }
  return out;
}

/// A positive integer field; `fallback` (when > 0) if absent or null.
std::int64_t positive(const Json& j, const char* key, std::string_view source,
                      std::int64_t fallback = 0) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback > 0) return fallback;
    throw IoError(fmt::format("[config] {}: the field '{}' is missing", source, key));
  }
  if (!it->is_number_integer() || it->get<std::int64_t>() <= 0) {
    throw IoError(fmt::format("[config] {}: the field '{}' is {}, expected a positive integer",
                              source, key, it->dump()));
  }
  return it->get<std::int64_t>();
}

bool flag(const Json& j, const char* key, bool fallback, std::string_view source) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    throw IoError(fmt::format("[config] {}: the field '{}' is {}, expected true or false", source,
                              key, it->dump()));
  }
  return it->get<bool>();
}

/// a * b, or an IoError naming what overflowed.
std::int64_t mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t out = 0;
  if (!detail::checked_mul(a, b, &out)) {
    throw IoError(fmt::format("[config] {} = {} x {} does not fit in 64 bits", what, a, b));
  }
  return out;
}

/// The most tensors a config may describe (DeepSeek-V3 has about 92,000): a number of layers or
/// experts beyond it is a mistake in the file, refused before anything is built for it.
constexpr std::int64_t kMaxTensors = 1'000'000;

void check_tensor_count(const ModelConfig& c, std::string_view source) {
  // Tensors per layer, generously: 16, plus 3 per expert; T5's decoder layers count too.
  const double per_layer = 16.0 + 3.0 * static_cast<double>(c.experts);
  const double tensors =
      per_layer * (static_cast<double>(c.layers) + static_cast<double>(c.decoder_layers)) + 8;
  if (tensors > static_cast<double>(kMaxTensors)) {
    throw IoError(fmt::format(
        "[config] {}: {} layers{} describe more than {} tensors; is a field wrong?", source,
        c.layers + c.decoder_layers,
        c.experts > 0 ? fmt::format(" of {} experts", c.experts) : std::string(), kMaxTensors));
  }
}

}  // namespace

ModelConfig ModelConfig::parse(std::string_view json, std::string_view source) {
  Json j;
  try {
    j = Json::parse(json);
  } catch (const Json::parse_error& e) {
    throw IoError(fmt::format("[config] {}: not JSON: {}", source, e.what()));
  }
  if (!j.is_object()) {
    throw IoError(
        fmt::format("[config] {}: expected a JSON object, got {}", source, j.type_name()));
  }
  const auto type = j.find("model_type");
  if (type == j.end() || !type->is_string()) {
    throw IoError(fmt::format(
        "[config] {}: no 'model_type' string (a Hugging Face config.json names its model type; "
        "known: {})",
        source, known_types()));
  }
  ModelConfig c;
  c.model_type = type->get<std::string>();
  const Family* family = nullptr;
  for (const Family& f : kFamilies) {
    if (c.model_type == f.model_type) family = &f;
  }
  if (family == nullptr) {
    throw IoError(fmt::format(
        "[config] {}: model_type '{}' has no training step here (known: {}); `shardplan plan` "
        "still plans its weights",
        source, c.model_type, known_types()));
  }
  c.family = family->family;
  if (c.family == ModelFamily::kGpt2) {
    c.vocab = positive(j, "vocab_size", source);
    c.hidden = positive(j, "n_embd", source);
    c.layers = positive(j, "n_layer", source);
    c.heads = positive(j, "n_head", source);
    c.kv_heads = c.heads;
    c.intermediate = positive(j, "n_inner", source, mul(4, c.hidden, "n_inner"));
    c.positions = positive(j, "n_positions", source);
    c.tie_embeddings = flag(j, "tie_word_embeddings", true, source);
    c.attention_bias = true;
  } else if (c.family == ModelFamily::kT5) {
    c.vocab = positive(j, "vocab_size", source);
    c.hidden = positive(j, "d_model", source);
    c.head_dim = positive(j, "d_kv", source);
    c.intermediate = positive(j, "d_ff", source);
    c.layers = positive(j, "num_layers", source);
    c.decoder_layers = positive(j, "num_decoder_layers", source, c.layers);
    c.heads = positive(j, "num_heads", source);
    c.kv_heads = c.heads;
    c.relative_buckets = positive(j, "relative_attention_num_buckets", source, 32);
    c.relative_max_distance = positive(j, "relative_attention_max_distance", source, 128);
    c.tie_embeddings = flag(j, "tie_word_embeddings", true, source);
    const auto proj = j.find("feed_forward_proj");
    if (proj != j.end() && !proj->is_null()) {
      if (!proj->is_string()) {
        throw IoError(
            fmt::format("[config] {}: the field 'feed_forward_proj' is {}, expected "
                        "\"relu\" or \"gated-gelu\"",
                        source, proj->dump()));
      }
      c.gated_mlp = proj->get<std::string>().rfind("gated-", 0) == 0;
    }
    check_tensor_count(c, source);
    if (c.relative_buckets < 4) {
      throw IoError(fmt::format("[config] {}: relative_attention_num_buckets {} is below 4", source,
                                c.relative_buckets));
    }
    return c;
  } else {
    c.vocab = positive(j, "vocab_size", source);
    c.hidden = positive(j, "hidden_size", source);
    c.layers = positive(j, "num_hidden_layers", source);
    c.heads = positive(j, "num_attention_heads", source);
    c.kv_heads = positive(j, "num_key_value_heads", source, c.heads);
    c.intermediate = positive(j, "intermediate_size", source);
    c.tie_embeddings = flag(j, "tie_word_embeddings", false, source);
    // Qwen2 always has q/k/v biases; LLaMA says so with attention_bias.
    c.attention_bias = flag(j, "attention_bias", c.model_type == "qwen2", source);
    if (c.family == ModelFamily::kMixtral) {
      c.experts = positive(j, "num_local_experts", source);
      c.experts_per_token = positive(j, "num_experts_per_tok", source);
      if (c.experts_per_token > c.experts) {
        throw IoError(fmt::format("[config] {}: {} experts per token of only {} experts", source,
                                  c.experts_per_token, c.experts));
      }
    }
  }
  check_tensor_count(c, source);
  if (c.hidden % c.heads != 0) {
    throw IoError(fmt::format("[config] {}: hidden size {} does not divide into {} heads", source,
                              c.hidden, c.heads));
  }
  if (c.heads % c.kv_heads != 0) {
    throw IoError(
        fmt::format("[config] {}: {} attention heads do not group evenly over {} key/value heads",
                    source, c.heads, c.kv_heads));
  }
  if ((c.hidden / c.heads) % 2 != 0 && c.family != ModelFamily::kGpt2) {
    throw IoError(fmt::format(
        "[config] {}: head size {} is odd (rotary embeddings rotate pairs of dimensions)", source,
        c.hidden / c.heads));
  }
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) file = path / "config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw IoError(fmt::format("[config] cannot read '{}'{}", file.string(),
                              file == path ? "" : " (a checkpoint directory holds config.json)"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), file.string());
}

std::string ModelConfig::family_name() const {
  switch (family) {
    case ModelFamily::kGpt2:
      return "gpt2";
    case ModelFamily::kMixtral:
      return "mixtral";
    case ModelFamily::kT5:
      return "t5";
    case ModelFamily::kLlama:
      break;
  }
  return "llama";
}

std::string ModelConfig::layers_path() const {
  if (family == ModelFamily::kT5) return "decoder/block";
  return family == ModelFamily::kGpt2 ? "h" : "model/layers";
}

Tree<TensorSpec> ModelConfig::parameters(DType dtype) const {
  std::vector<std::pair<std::string, TensorSpec>> named;
  const auto add = [&](std::string name, std::vector<std::int64_t> dims) {
    named.emplace_back(std::move(name), TensorSpec{Shape(std::move(dims)), dtype});
  };
  const std::int64_t dh = hidden / heads;
  if (family == ModelFamily::kT5) {
    // Linear weights [out, in]; attention's inner width is heads x d_kv. The relative position
    // bias sits in the first block of each stack and serves every block.
    const std::int64_t inner = mul(heads, head_dim, "attention width num_heads x d_kv");
    add("shared.weight", {vocab, hidden});
    const auto attention = [&](const std::string& p, bool bias) {
      add(p + "q.weight", {inner, hidden});
      add(p + "k.weight", {inner, hidden});
      add(p + "v.weight", {inner, hidden});
      add(p + "o.weight", {hidden, inner});
      if (bias) add(p + "relative_attention_bias.weight", {relative_buckets, heads});
    };
    const auto feed_forward = [&](const std::string& p) {
      if (gated_mlp) {
        add(p + "DenseReluDense.wi_0.weight", {intermediate, hidden});
        add(p + "DenseReluDense.wi_1.weight", {intermediate, hidden});
      } else {
        add(p + "DenseReluDense.wi.weight", {intermediate, hidden});
      }
      add(p + "DenseReluDense.wo.weight", {hidden, intermediate});
      add(p + "layer_norm.weight", {hidden});
    };
    for (std::int64_t l = 0; l < layers; ++l) {
      const std::string p = fmt::format("encoder.block.{}.layer.", l);
      attention(p + "0.SelfAttention.", l == 0);
      add(p + "0.layer_norm.weight", {hidden});
      feed_forward(p + "1.");
    }
    add("encoder.final_layer_norm.weight", {hidden});
    for (std::int64_t l = 0; l < decoder_layers; ++l) {
      const std::string p = fmt::format("decoder.block.{}.layer.", l);
      attention(p + "0.SelfAttention.", l == 0);
      add(p + "0.layer_norm.weight", {hidden});
      attention(p + "1.EncDecAttention.", false);
      add(p + "1.layer_norm.weight", {hidden});
      feed_forward(p + "2.");
    }
    add("decoder.final_layer_norm.weight", {hidden});
    if (!tie_embeddings) add("lm_head.weight", {vocab, hidden});
    return tree_from_names(named);
  }
  if (family == ModelFamily::kGpt2) {
    // Conv1D weights are stored [in, out].
    add("wte.weight", {vocab, hidden});
    add("wpe.weight", {positions, hidden});
    for (std::int64_t l = 0; l < layers; ++l) {
      const std::string p = fmt::format("h.{}.", l);
      add(p + "ln_1.weight", {hidden});
      add(p + "ln_1.bias", {hidden});
      const std::int64_t qkv = mul(3, hidden, "c_attn width 3 x n_embd");
      add(p + "attn.c_attn.weight", {hidden, qkv});
      add(p + "attn.c_attn.bias", {qkv});
      add(p + "attn.c_proj.weight", {hidden, hidden});
      add(p + "attn.c_proj.bias", {hidden});
      add(p + "ln_2.weight", {hidden});
      add(p + "ln_2.bias", {hidden});
      add(p + "mlp.c_fc.weight", {hidden, intermediate});
      add(p + "mlp.c_fc.bias", {intermediate});
      add(p + "mlp.c_proj.weight", {intermediate, hidden});
      add(p + "mlp.c_proj.bias", {hidden});
    }
    add("ln_f.weight", {hidden});
    add("ln_f.bias", {hidden});
    if (!tie_embeddings) add("lm_head.weight", {vocab, hidden});
  } else {
    const std::int64_t kv = mul(kv_heads, dh, "key/value width num_key_value_heads x head size");
    add("model.embed_tokens.weight", {vocab, hidden});
    for (std::int64_t l = 0; l < layers; ++l) {
      const std::string p = fmt::format("model.layers.{}.", l);
      add(p + "input_layernorm.weight", {hidden});
      add(p + "self_attn.q_proj.weight", {hidden, hidden});
      add(p + "self_attn.k_proj.weight", {kv, hidden});
      add(p + "self_attn.v_proj.weight", {kv, hidden});
      if (attention_bias) {
        add(p + "self_attn.q_proj.bias", {hidden});
        add(p + "self_attn.k_proj.bias", {kv});
        add(p + "self_attn.v_proj.bias", {kv});
      }
      add(p + "self_attn.o_proj.weight", {hidden, hidden});
      add(p + "post_attention_layernorm.weight", {hidden});
      if (family == ModelFamily::kMixtral) {
        add(p + "block_sparse_moe.gate.weight", {experts, hidden});
        for (std::int64_t e = 0; e < experts; ++e) {
          const std::string x = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
          add(x + "w1.weight", {intermediate, hidden});
          add(x + "w2.weight", {hidden, intermediate});
          add(x + "w3.weight", {intermediate, hidden});
        }
        continue;
      }
      add(p + "mlp.gate_proj.weight", {intermediate, hidden});
      add(p + "mlp.up_proj.weight", {intermediate, hidden});
      add(p + "mlp.down_proj.weight", {hidden, intermediate});
    }
    add("model.norm.weight", {hidden});
    if (!tie_embeddings) add("lm_head.weight", {vocab, hidden});
  }
  return tree_from_names(named);
}

std::int64_t ModelConfig::parameter_count() const {
  std::int64_t n = 0;
  for (const TensorSpec& t : parameters(DType::kF32).leaves()) {
    if (!detail::checked_add(n, t.shape.numel(), &n)) {
      throw SpecError("[config] the parameter count does not fit in 64 bits");
    }
  }
  return n;
}

}  // namespace shardplan
