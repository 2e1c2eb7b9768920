// The LLaMA family (model_type llama, mistral, qwen2): its declarations and the parts the
// LLaMA-like families share (llama_like.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "llama_like.hpp"

namespace shardplan::train {

void read_llama_like(Fields& f, ModelConfig& c, std::int64_t head_dim,
                     const GateActivation& gate) {
  const std::string_view source = f.source();
  c.vocab = f.positive("vocab_size");
  c.hidden = f.positive("hidden_size");
  c.layers = f.positive("num_hidden_layers");
  c.heads = f.positive("num_attention_heads");
  c.kv_heads = f.positive("num_key_value_heads", c.heads);
  c.intermediate = f.positive("intermediate_size");
  c.tie_embeddings = f.flag("tie_word_embeddings", false);
  check_tensor_count(c, source);  // before per-layer lists are made
  // The heads' width: head_dim when given (Mistral-NeMo: 128 with hidden 5120 and 32 heads),
  // else hidden / heads, as transformers reads it.
  if (!f.has("head_dim") && head_dim == 0 && c.hidden % c.heads != 0) {
    throw IoError(fmt::format("[config] {}: hidden size {} does not divide into {} heads", source,
                              c.hidden, c.heads));
  }
  c.head_dim = f.positive("head_dim", head_dim > 0 ? head_dim : c.hidden / c.heads);
  const std::string act = f.string(gate.field).value_or(std::string(gate.names[0]));
  if (act != gate.names[0] && act != gate.names[1]) {
    c.not_modelled.push_back(fmt::format("{} '{}' (the step's MLP is {})", gate.field,
                                         detail::printable(act), gate.mlp));
  }
  if (const double r = f.rate("attention_dropout"); r > 0) {
    c.not_modelled.push_back(fmt::format("dropout (attention_dropout {})", r));
  }
  check_heads(c, source);
  if (c.head_dim % 2 != 0) {
    throw IoError(fmt::format(
        "[config] {}: head size {} is odd (rotary embeddings rotate pairs of dimensions)", source,
        c.head_dim));
  }
}

void read_window_every_layer(Fields& f, ModelConfig& c) {
  if (const auto w = f.optional_positive("sliding_window")) {
    c.sliding_window = *w;
    c.window_layers.assign(static_cast<std::size_t>(c.layers), true);
  }
}

void read_window_from_layer(Fields& f, ModelConfig& c) {
  // transformers' defaults: a window of 4096 from layer 28 on, when use_sliding_window.
  const bool use = f.flag("use_sliding_window", false);
  const std::int64_t window = f.positive("sliding_window", 4096);
  const std::int64_t from = f.integer("max_window_layers", 0, 28);
  std::vector<bool> sliding(static_cast<std::size_t>(c.layers));
  for (std::int64_t l = 0; l < c.layers; ++l) sliding[static_cast<std::size_t>(l)] = l >= from;
  read_layer_types(f, c, sliding);
  if (use && std::find(sliding.begin(), sliding.end(), true) != sliding.end()) {
    c.sliding_window = window;
    c.window_layers = std::move(sliding);
  }
}

void read_layer_types(Fields& f, const ModelConfig& c, std::vector<bool>& sliding) {
  const std::string_view source = f.source();
  if (const auto types = f.get("layer_types")) {
    if (!types->is_array() || static_cast<std::int64_t>(types->size()) != c.layers) {
      throw IoError(
          fmt::format("[config] {}: the field 'layer_types' is {}, expected a list of {} entries "
                      "(\"full_attention\" or \"sliding_attention\", one per layer)",
                      source, shown(*types), c.layers));
    }
    std::size_t l = 0;
    for (const json::Value t : *types) {
      if (!t.is_string() || (t.str() != "full_attention" && t.str() != "sliding_attention")) {
        throw IoError(
            fmt::format("[config] {}: layer_types[{}] is {}, expected \"full_attention\" or "
                        "\"sliding_attention\"",
                        source, l, shown(t)));
      }
      sliding[l++] = t.str() == "sliding_attention";
    }
  }
}

void add_gated_mlp(const ModelConfig& c, NamedSpecs& n, const std::string& p) {
  n.add(p + "mlp.gate_proj.weight", {c.intermediate, c.hidden});
  n.add(p + "mlp.up_proj.weight", {c.intermediate, c.hidden});
  n.add(p + "mlp.down_proj.weight", {c.hidden, c.intermediate});
  if (c.mlp_bias) {
    n.add(p + "mlp.gate_proj.bias", {c.intermediate});
    n.add(p + "mlp.up_proj.bias", {c.intermediate});
    n.add(p + "mlp.down_proj.bias", {c.hidden});
  }
}

void add_llama_like(const ModelConfig& c, NamedSpecs& n, AddMlp mlp) {
  // q_proj [heads x head_dim, hidden], k/v_proj [kv_heads x head_dim, hidden], o_proj
  // [hidden, heads x head_dim]: with head_dim given, heads x head_dim need not be hidden.
  const std::int64_t q = mul(c.heads, c.head_dim, "query width num_attention_heads x head_dim");
  const std::int64_t kv =
      mul(c.kv_heads, c.head_dim, "key/value width num_key_value_heads x head_dim");
  n.add("model.embed_tokens.weight", {c.vocab, c.hidden});
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    n.add(p + "input_layernorm.weight", {c.hidden});
    n.add(p + "self_attn.q_proj.weight", {q, c.hidden});
    n.add(p + "self_attn.k_proj.weight", {kv, c.hidden});
    n.add(p + "self_attn.v_proj.weight", {kv, c.hidden});
    if (c.qk_norm) {
      n.add(p + "self_attn.q_norm.weight", {c.head_dim});
      n.add(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    if (c.attention_bias) {
      n.add(p + "self_attn.q_proj.bias", {q});
      n.add(p + "self_attn.k_proj.bias", {kv});
      n.add(p + "self_attn.v_proj.bias", {kv});
    }
    n.add(p + "self_attn.o_proj.weight", {c.hidden, q});
    if (c.output_bias) n.add(p + "self_attn.o_proj.bias", {c.hidden});
    n.add(p + "post_attention_layernorm.weight", {c.hidden});
    mlp(c, n, p);
  }
  n.add("model.norm.weight", {c.hidden});
  if (!c.tie_embeddings) n.add("lm_head.weight", {c.vocab, c.hidden});
}

namespace {

void read_llama(Fields& f, ModelConfig& c) {
  read_llama_like(f, c);
  // LLaMA: attention_bias puts biases on q, k, v and o; mlp_bias on gate, up and down.
  c.attention_bias = f.flag("attention_bias", false);
  c.output_bias = c.attention_bias;
  c.mlp_bias = f.flag("mlp_bias", false);
}

void read_mistral(Fields& f, ModelConfig& c) {
  read_llama_like(f, c);
  read_window_every_layer(f, c);
}

void read_qwen2(Fields& f, ModelConfig& c) {
  read_llama_like(f, c);
  c.attention_bias = true;  // Qwen2's q, k and v always have biases (o has none)
  read_window_from_layer(f, c);
}

void add_parameters(const ModelConfig& c, NamedSpecs& n) { add_llama_like(c, n, add_gated_mlp); }

constexpr std::array<std::string_view, 1> kLlama{"llama"};
constexpr std::array<std::string_view, 1> kMistral{"mistral"};
constexpr std::array<std::string_view, 1> kQwen2{"qwen2"};

/// The three model types differ in the fields they read only.
constexpr FamilyDef llama_family(std::span<const std::string_view> types,
                                 void (*read)(Fields&, ModelConfig&)) {
  return {.name = "llama",
          .title = "LLaMA",
          .types = types,
          .layers_path = "model/layers",
          .default_preset = "llama_fsdp_tp",
          .preset_without_tp = "llama_fsdp",
          .support = {},
          .read = read,
          .add_parameters = add_parameters,
          .step = kRmsNormDecoder};
}

}  // namespace

namespace families_defs {

extern const FamilyDef llama, mistral, qwen2;

constexpr FamilyDef llama = llama_family(kLlama, read_llama);
constexpr FamilyDef mistral = llama_family(kMistral, read_mistral);
constexpr FamilyDef qwen2 = llama_family(kQwen2, read_qwen2);

}  // namespace families_defs
}  // namespace shardplan::train
