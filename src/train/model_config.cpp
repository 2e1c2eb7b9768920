// ModelConfig: the fields of a Hugging Face config.json a training step needs, and the
// parameter tree of each family in the checkpoints' own naming.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "../formats/input_file.hpp"
#include "../formats/json_impl.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/train_plan.hpp"
#include "model_family.hpp"

namespace shardplan {
namespace {

namespace json = detail::json;

std::string known_types() {
  std::string out;
  for (const train::FamilyDef& f : train::families()) {
    for (std::string_view t : f.types) {
      if (!out.empty()) out += ", ";
      out += t;
    }
  }
  return out;
}

/// A value as it is written in the file, short, for messages.
std::string shown(const json::Value& v) { return v.source_text(40); }

/// The members of config.json's object, each key once, and which of them were read: what is
/// left at the end is named (not modelled) or known to change neither shapes nor work.
class Fields {
 public:
  Fields(const json::Value& root, std::string_view source) : source_(source) {
    json::KeySet seen(root.size());
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (!seen.insert(it.key())) {
        throw IoError(fmt::format("[config] {}: the field '{}' appears twice", source_,
                                  detail::printable(it.key())));
      }
      members_.push_back({it.key(), it.value(), false});
    }
  }
  std::string_view source() const { return source_; }

  /// The field, marked as read; nullopt when absent or null.
  std::optional<json::Value> get(std::string_view key) {
    for (Member& m : members_) {
      if (m.key != key) continue;
      m.read = true;
      if (m.value.is_null()) return std::nullopt;
      return m.value;
    }
    return std::nullopt;
  }
  bool has(std::string_view key) const {
    for (const Member& m : members_) {
      if (m.key == key && !m.value.is_null()) return true;
    }
    return false;
  }

  /// A positive integer (up to 2^63 - 1); `fallback` (when > 0) if absent or null.
  std::int64_t positive(std::string_view key, std::int64_t fallback = 0) {
    return integer(key, 1, fallback > 0 ? std::optional(fallback) : std::nullopt);
  }
  /// An integer from `min` to 2^63 - 1; `fallback` if absent or null (an error without one).
  std::int64_t integer(std::string_view key, std::int64_t min,
                       std::optional<std::int64_t> fallback) {
    const auto v = get(key);
    if (!v) {
      if (fallback) return *fallback;
      throw IoError(fmt::format("[config] {}: the field '{}' is missing", source_, key));
    }
    if (!v->is_uint() || v->as_uint() < static_cast<std::uint64_t>(min) ||
        v->as_uint() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw IoError(
          fmt::format("[config] {}: the field '{}' is {}, expected {} integer ({} to 2^63 - 1)",
                      source_, key, shown(*v), min == 1 ? "a positive" : "an", min));
    }
    return static_cast<std::int64_t>(v->as_uint());
  }
  /// A positive integer, or nullopt when absent or null.
  std::optional<std::int64_t> optional_positive(std::string_view key) {
    if (!has(key)) {
      get(key);  // null is read as "none"
      return std::nullopt;
    }
    return positive(key);
  }

  bool flag(std::string_view key, bool fallback) {
    const auto v = get(key);
    if (!v) return fallback;
    if (v->kind() != json::Kind::kBool) {
      throw IoError(fmt::format("[config] {}: the field '{}' is {}, expected true or false",
                                source_, key, shown(*v)));
    }
    return v->as_bool();
  }

  std::optional<std::string> string(std::string_view key) {
    const auto v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) {
      throw IoError(fmt::format("[config] {}: the field '{}' is {}, expected a string", source_,
                                key, shown(*v)));
    }
    return std::string(v->str());
  }

  /// A finite number >= 0 (a dropout rate, a noise level); 0 when absent or null.
  double rate(std::string_view key) {
    const auto v = get(key);
    if (!v) return 0;
    const json::Kind k = v->kind();
    const double x = k == json::Kind::kUint || k == json::Kind::kInt || k == json::Kind::kNumber
                         ? v->as_double()
                         : -1;
    if (!std::isfinite(x) || x < 0) {
      throw IoError(fmt::format("[config] {}: the field '{}' is {}, expected a number >= 0",
                                source_, key, shown(*v)));
    }
    return x;
  }

  struct Member {
    std::string_view key;
    json::Value value;
    bool read;
  };
  std::vector<Member>& members() { return members_; }

 private:
  std::string source_;
  std::vector<Member> members_;
};

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

// Fields that change neither the parameters' shapes nor a training step's work: token ids,
// numerical constants (epsilons, rotary bases and scaling, initialisation), inference and
// generation settings, labels, bookkeeping. They are left unread without a word.
constexpr std::string_view kNoEffect[] = {
    "_name_or_path",
    "_attn_implementation",
    "attn_implementation",
    "auto_map",
    "bad_words_ids",
    "bos_token_id",
    "decoder_start_token_id",
    "diversity_penalty",
    "do_sample",
    "dtype",
    "early_stopping",
    "eos_token_id",
    "finetuning_task",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "id2label",
    "initializer_factor",
    "initializer_range",
    "label2id",
    "layer_norm_eps",
    "layer_norm_epsilon",
    "length_penalty",
    "max_length",
    "max_position_embeddings",
    "min_length",
    "model_type",
    "no_repeat_ngram_size",
    "num_beam_groups",
    "num_beams",
    "num_return_sequences",
    "output_attentions",
    "output_hidden_states",
    "output_past",
    "output_scores",
    "pad_token_id",
    "prefix",
    "pretraining_tp",
    "problem_type",
    "remove_invalid_values",
    "repetition_penalty",
    "return_dict",
    "return_dict_in_generate",
    "rms_norm_eps",
    "rope_scaling",
    "rope_theta",
    "sep_token_id",
    "task_specific_params",
    "temperature",
    "tokenizer_class",
    "top_k",
    "top_p",
    "torch_dtype",
    "torchscript",
    "transformers_version",
    "typical_p",
    "use_cache",
    "use_bfloat16",
    "is_encoder_decoder",
    // GPT-2: the double-heads model's summary head; attention scaling choices; the old name of
    // n_positions.
    "n_ctx",
    "scale_attn_by_inverse_layer_idx",
    "scale_attn_weights",
    "reorder_and_upcast_attn",
    "summary_activation",
    "summary_first_dropout",
    "summary_proj_to_labels",
    "summary_type",
    "summary_use_proj",
    // T5: derived from feed_forward_proj by transformers; n_positions is unused (relative
    // positions).
    "dense_act_fn",
    "is_gated_act",
    "n_positions",
    // Mixtral: the load-balancing loss's weight (the loss itself is output_router_logits).
    "router_aux_loss_coef",
};

/// A field that is harmless at its default value (false, 0, null, "", [] or {}) and changes
/// shapes or work otherwise.
bool at_default(const json::Value& v) {
  switch (v.kind()) {
    case json::Kind::kNull:
      return true;
    case json::Kind::kBool:
    case json::Kind::kUint:
      return v.as_uint() == 0;
    case json::Kind::kNumber:
    case json::Kind::kInt:
      return v.as_double() == 0;
    case json::Kind::kString:
      return v.str().empty();
    case json::Kind::kArray:
    case json::Kind::kObject:
      return v.size() == 0;
  }
  return false;
}

/// The fields left unread: the ones known to have no effect are dropped, every other one is
/// named in `out` with its value.
void name_the_rest(Fields& f, std::vector<std::string>& out) {
  for (const Fields::Member& m : f.members()) {
    if (m.read) continue;
    if (std::find(std::begin(kNoEffect), std::end(kNoEffect), m.key) != std::end(kNoEffect)) {
      continue;
    }
    // Known fields that do nothing at their default value (dropout 0, no biases, no
    // quantization): named only when set.
    static constexpr std::string_view kHarmlessAtDefault[] = {
        "attention_dropout",    "mlp_bias",
        "attention_bias",       "add_cross_attention",
        "quantization_config",  "pruned_heads",
        "tie_encoder_decoder",  "chunk_size_feed_forward",
        "output_router_logits", "router_jitter_noise",
        "is_decoder",           "use_sliding_window",
        "sliding_window",       "max_window_layers",
        "layer_types",          "head_dim"};
    const bool known = std::find(std::begin(kHarmlessAtDefault), std::end(kHarmlessAtDefault),
                                 m.key) != std::end(kHarmlessAtDefault);
    if (known && at_default(m.value)) continue;
    out.push_back(fmt::format("{} {}{}", detail::printable(m.key),
                              detail::printable(shown(m.value)),
                              known ? "" : " (a field this planner does not know)"));
  }
}

/// The `architectures` entries that are not a language-model head (a classifier, an encoder
/// alone): the step is the causal (or seq2seq) language model's.
void check_architectures(Fields& f, std::vector<std::string>& out) {
  const auto v = f.get("architectures");
  if (!v) return;
  if (!v->is_array()) {
    throw IoError(
        fmt::format("[config] {}: the field 'architectures' is {}, expected a list of "
                    "class names",
                    f.source(), shown(*v)));
  }
  for (const json::Value a : *v) {
    if (!a.is_string()) {
      throw IoError(
          fmt::format("[config] {}: the field 'architectures' holds {}, expected class "
                      "names (strings)",
                      f.source(), shown(a)));
    }
    const std::string_view name = a.str();
    const auto ends = [&](std::string_view s) {
      return name.size() >= s.size() && name.substr(name.size() - s.size()) == s;
    };
    if (!ends("ForCausalLM") && !ends("LMHeadModel") && !ends("ForConditionalGeneration")) {
      out.push_back(
          fmt::format("architectures '{}' (the step is the language model's: its "
                      "head and loss)",
                      detail::printable(name)));
    }
  }
}

/// GPT-2's fields.
void read_gpt2(Fields& f, ModelConfig& c) {
  c.vocab = f.positive("vocab_size");
  c.hidden = f.positive("n_embd");
  c.layers = f.positive("n_layer");
  c.heads = f.positive("n_head");
  c.kv_heads = c.heads;
  c.intermediate = f.positive("n_inner", mul(4, c.hidden, "n_inner"));
  c.positions = f.positive("n_positions");
  c.tie_embeddings = f.flag("tie_word_embeddings", true);
  c.attention_bias = true;
  // The step's GELU is the tanh approximation ("gelu_new", GPT-2's own).
  const std::string act = f.string("activation_function").value_or("gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    c.not_modelled.push_back(
        fmt::format("activation_function '{}' (the step uses gelu_new)", detail::printable(act)));
  }
  std::vector<std::string> drops;
  for (const char* key : {"attn_pdrop", "embd_pdrop", "resid_pdrop"}) {
    if (const double r = f.rate(key); r > 0) drops.push_back(fmt::format("{} {}", key, r));
  }
  if (!drops.empty()) {
    c.not_modelled.push_back(fmt::format("dropout ({})", fmt::join(drops, ", ")));
  }
}

/// T5's fields, checked.
void read_t5(Fields& f, ModelConfig& c) {
  const std::string_view source = f.source();
  c.vocab = f.positive("vocab_size");
  c.hidden = f.positive("d_model");
  c.head_dim = f.positive("d_kv");
  c.intermediate = f.positive("d_ff");
  c.layers = f.positive("num_layers");
  c.decoder_layers = f.positive("num_decoder_layers", c.layers);
  c.heads = f.positive("num_heads");
  c.kv_heads = c.heads;
  c.relative_buckets = f.positive("relative_attention_num_buckets", 32);
  c.relative_max_distance = f.positive("relative_attention_max_distance", 128);
  c.tie_embeddings = f.flag("tie_word_embeddings", true);
  // transformers reads "ACT" or "gated-ACT"; the step has ReLU and gated GELU.
  const std::string proj = f.string("feed_forward_proj").value_or("relu");
  const auto dash = proj.find('-');
  const std::string act = dash == std::string::npos ? proj : proj.substr(dash + 1);
  if ((dash != std::string::npos && proj.substr(0, dash) != "gated") || act.empty() ||
      act.find('-') != std::string::npos) {
    throw IoError(
        fmt::format("[config] {}: the field 'feed_forward_proj' is '{}', expected \"ACT\" or "
                    "\"gated-ACT\" (\"relu\", \"gated-gelu\")",
                    source, detail::printable(proj)));
  }
  c.gated_mlp = dash != std::string::npos;
  if (act != (c.gated_mlp ? "gelu" : "relu")) {
    c.not_modelled.push_back(
        fmt::format("feed_forward_proj '{}' (shapes as given; the step's activation is {})",
                    detail::printable(proj), c.gated_mlp ? "gelu" : "relu"));
  }
  if (const double r = f.rate("dropout_rate"); r > 0) {
    c.not_modelled.push_back(fmt::format("dropout (dropout_rate {})", r));
  }
  check_tensor_count(c, source);
  if (c.relative_buckets < 4) {
    throw IoError(fmt::format("[config] {}: relative_attention_num_buckets {} is below 4", source,
                              c.relative_buckets));
  }
}

/// Sliding-window attention: Mistral and Mixtral on every layer when sliding_window is set;
/// Qwen2 with use_sliding_window on the layers from max_window_layers on (or as layer_types
/// says).
void read_sliding_window(Fields& f, ModelConfig& c) {
  const std::string_view source = f.source();
  if (c.model_type == "mistral" || c.model_type == "mixtral") {
    if (const auto w = f.optional_positive("sliding_window")) {
      c.sliding_window = *w;
      c.window_layers.assign(static_cast<std::size_t>(c.layers), true);
    }
  } else if (c.model_type == "qwen2") {
    // transformers' defaults: a window of 4096 from layer 28 on, when use_sliding_window.
    const bool use = f.flag("use_sliding_window", false);
    const std::int64_t window = f.positive("sliding_window", 4096);
    const std::int64_t from = f.integer("max_window_layers", 0, 28);
    std::vector<bool> sliding(static_cast<std::size_t>(c.layers));
    for (std::int64_t l = 0; l < c.layers; ++l) sliding[static_cast<std::size_t>(l)] = l >= from;
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
    if (use && std::find(sliding.begin(), sliding.end(), true) != sliding.end()) {
      c.sliding_window = window;
      c.window_layers = std::move(sliding);
    }
  }
}

/// The fields of the LLaMA-like families: llama, mistral, qwen2 and mixtral.
void read_llama_like(Fields& f, ModelConfig& c) {
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
  if (!f.has("head_dim") && c.hidden % c.heads != 0) {
    throw IoError(fmt::format("[config] {}: hidden size {} does not divide into {} heads", source,
                              c.hidden, c.heads));
  }
  c.head_dim = f.positive("head_dim", c.hidden / c.heads);
  if (c.model_type == "llama") {
    // LLaMA: attention_bias puts biases on q, k, v and o; mlp_bias on gate, up and down.
    c.attention_bias = f.flag("attention_bias", false);
    c.output_bias = c.attention_bias;
    c.mlp_bias = f.flag("mlp_bias", false);
  } else if (c.model_type == "qwen2") {
    c.attention_bias = true;  // Qwen2's q, k and v always have biases (o has none)
  }
  const std::string act = f.string("hidden_act").value_or("silu");
  if (act != "silu" && act != "swish") {
    c.not_modelled.push_back(fmt::format("hidden_act '{}' (the step's MLP is SwiGLU, with silu)",
                                         detail::printable(act)));
  }
  if (const double r = f.rate("attention_dropout"); r > 0) {
    c.not_modelled.push_back(fmt::format("dropout (attention_dropout {})", r));
  }
  read_sliding_window(f, c);
  if (c.family == ModelFamily::kMixtral) {
    c.experts = f.positive("num_local_experts");
    c.experts_per_token = f.positive("num_experts_per_tok");
    if (c.experts_per_token > c.experts) {
      throw IoError(fmt::format("[config] {}: {} experts per token of only {} experts", source,
                                c.experts_per_token, c.experts));
    }
  }
}

/// The checks every family but T5 ends with: the tensor count, the heads and their width.
void check_heads(ModelConfig& c, std::string_view source) {
  check_tensor_count(c, source);
  if (c.family == ModelFamily::kGpt2) {
    if (c.hidden % c.heads != 0) {
      throw IoError(fmt::format("[config] {}: hidden size {} does not divide into {} heads", source,
                                c.hidden, c.heads));
    }
    c.head_dim = c.hidden / c.heads;
  }
  if (c.heads % c.kv_heads != 0) {
    throw IoError(
        fmt::format("[config] {}: {} attention heads do not group evenly over {} key/value heads",
                    source, c.heads, c.kv_heads));
  }
  if (c.head_dim % 2 != 0 && c.family != ModelFamily::kGpt2) {
    throw IoError(fmt::format(
        "[config] {}: head size {} is odd (rotary embeddings rotate pairs of dimensions)", source,
        c.head_dim));
  }
  mul(c.heads, c.head_dim,
      fmt::format("{}: the attention width num_attention_heads x head_dim", source));
}

}  // namespace

ModelConfig ModelConfig::parse(std::string_view text, std::string_view source) {
  std::optional<json::Document> doc;
  try {
    doc.emplace(text);
  } catch (const json::SyntaxError& e) {
    throw IoError(fmt::format("[config] {}: not JSON (at byte {}): {}", source, e.byte, e.what()));
  }
  const json::Value root = doc->root();
  if (!root.is_object()) {
    throw IoError(
        fmt::format("[config] {}: expected a JSON object, got {}", source, root.type_name()));
  }
  Fields f(root, source);
  const auto type = f.get("model_type");
  if (!type || !type->is_string()) {
    throw IoError(fmt::format(
        "[config] {}: no 'model_type' string (a Hugging Face config.json names its model type; "
        "known: {})",
        source, known_types()));
  }
  ModelConfig c;
  c.model_type = std::string(type->str());
  const train::FamilyDef* family = nullptr;
  for (const train::FamilyDef& fam : train::families()) {
    for (std::string_view t : fam.types) {
      if (c.model_type == t) family = &fam;
    }
  }
  if (family == nullptr) {
    throw IoError(fmt::format(
        "[config] {}: model_type '{}' has no training step here (known: {}); `shardplan plan` "
        "still plans its weights",
        source, detail::printable(c.model_type), known_types()));
  }
  c.family = family->id;
  check_architectures(f, c.not_modelled);
  if (c.family == ModelFamily::kGpt2) {
    read_gpt2(f, c);
  } else if (c.family == ModelFamily::kT5) {
    read_t5(f, c);
    name_the_rest(f, c.not_modelled);
    return c;
  } else {
    read_llama_like(f, c);
  }
  check_heads(c, source);
  name_the_rest(f, c.not_modelled);
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code ec;
  // A directory is a checkpoint holding config.json (a config.json that is itself a directory
  // is then named by the reader: "is a directory").
  if (std::filesystem::is_directory(path, ec)) file = path / "config.json";
  std::string text;
  try {
    text = detail::read_input_file(file, "config");
  } catch (const IoError& e) {
    if (file == path) throw;
    throw IoError(fmt::format("{} (a checkpoint directory holds config.json)", e.what()));
  }
  return parse(text, file.string());
}

std::string ModelConfig::family_name() const { return std::string(train::family(family).name); }

std::string ModelConfig::layers_path() const {
  return std::string(train::family(family).layers_path);
}

namespace {

/// Parameters by their checkpoint names, as they are added.
struct NamedSpecs {
  DType dtype;
  std::vector<std::pair<std::string, TensorSpec>> named;
  void add(std::string name, std::vector<std::int64_t> dims) {
    named.emplace_back(std::move(name), TensorSpec{Shape(std::move(dims)), dtype});
  }
};

/// T5's parameters.
void add_t5(const ModelConfig& c, NamedSpecs& n) {
  // Linear weights [out, in]; attention's inner width is heads x d_kv. The relative position
  // bias sits in the first block of each stack and serves every block.
  const std::int64_t inner = mul(c.heads, c.head_dim, "attention width num_heads x d_kv");
  n.add("shared.weight", {c.vocab, c.hidden});
  const auto attention = [&](const std::string& p, bool bias) {
    n.add(p + "q.weight", {inner, c.hidden});
    n.add(p + "k.weight", {inner, c.hidden});
    n.add(p + "v.weight", {inner, c.hidden});
    n.add(p + "o.weight", {c.hidden, inner});
    if (bias) n.add(p + "relative_attention_bias.weight", {c.relative_buckets, c.heads});
  };
  const auto feed_forward = [&](const std::string& p) {
    if (c.gated_mlp) {
      n.add(p + "DenseReluDense.wi_0.weight", {c.intermediate, c.hidden});
      n.add(p + "DenseReluDense.wi_1.weight", {c.intermediate, c.hidden});
    } else {
      n.add(p + "DenseReluDense.wi.weight", {c.intermediate, c.hidden});
    }
    n.add(p + "DenseReluDense.wo.weight", {c.hidden, c.intermediate});
    n.add(p + "layer_norm.weight", {c.hidden});
  };
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("encoder.block.{}.layer.", l);
    attention(p + "0.SelfAttention.", l == 0);
    n.add(p + "0.layer_norm.weight", {c.hidden});
    feed_forward(p + "1.");
  }
  n.add("encoder.final_layer_norm.weight", {c.hidden});
  for (std::int64_t l = 0; l < c.decoder_layers; ++l) {
    const std::string p = fmt::format("decoder.block.{}.layer.", l);
    attention(p + "0.SelfAttention.", l == 0);
    n.add(p + "0.layer_norm.weight", {c.hidden});
    attention(p + "1.EncDecAttention.", false);
    n.add(p + "1.layer_norm.weight", {c.hidden});
    feed_forward(p + "2.");
  }
  n.add("decoder.final_layer_norm.weight", {c.hidden});
  if (!c.tie_embeddings) n.add("lm_head.weight", {c.vocab, c.hidden});
}

/// GPT-2's parameters.
void add_gpt2(const ModelConfig& c, NamedSpecs& n) {
  // Conv1D weights are stored [in, out].
  n.add("wte.weight", {c.vocab, c.hidden});
  n.add("wpe.weight", {c.positions, c.hidden});
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("h.{}.", l);
    n.add(p + "ln_1.weight", {c.hidden});
    n.add(p + "ln_1.bias", {c.hidden});
    const std::int64_t qkv = mul(3, c.hidden, "c_attn width 3 x n_embd");
    n.add(p + "attn.c_attn.weight", {c.hidden, qkv});
    n.add(p + "attn.c_attn.bias", {qkv});
    n.add(p + "attn.c_proj.weight", {c.hidden, c.hidden});
    n.add(p + "attn.c_proj.bias", {c.hidden});
    n.add(p + "ln_2.weight", {c.hidden});
    n.add(p + "ln_2.bias", {c.hidden});
    n.add(p + "mlp.c_fc.weight", {c.hidden, c.intermediate});
    n.add(p + "mlp.c_fc.bias", {c.intermediate});
    n.add(p + "mlp.c_proj.weight", {c.intermediate, c.hidden});
    n.add(p + "mlp.c_proj.bias", {c.hidden});
  }
  n.add("ln_f.weight", {c.hidden});
  n.add("ln_f.bias", {c.hidden});
  if (!c.tie_embeddings) n.add("lm_head.weight", {c.vocab, c.hidden});
}

/// The parameters of the LLaMA-like families (llama, mistral, qwen2, mixtral).
void add_llama_like(const ModelConfig& c, NamedSpecs& n) {
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
    if (c.attention_bias) {
      n.add(p + "self_attn.q_proj.bias", {q});
      n.add(p + "self_attn.k_proj.bias", {kv});
      n.add(p + "self_attn.v_proj.bias", {kv});
    }
    n.add(p + "self_attn.o_proj.weight", {c.hidden, q});
    if (c.output_bias) n.add(p + "self_attn.o_proj.bias", {c.hidden});
    n.add(p + "post_attention_layernorm.weight", {c.hidden});
    if (c.family == ModelFamily::kMixtral) {
      n.add(p + "block_sparse_moe.gate.weight", {c.experts, c.hidden});
      for (std::int64_t e = 0; e < c.experts; ++e) {
        const std::string x = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
        n.add(x + "w1.weight", {c.intermediate, c.hidden});
        n.add(x + "w2.weight", {c.hidden, c.intermediate});
        n.add(x + "w3.weight", {c.intermediate, c.hidden});
      }
      continue;
    }
    n.add(p + "mlp.gate_proj.weight", {c.intermediate, c.hidden});
    n.add(p + "mlp.up_proj.weight", {c.intermediate, c.hidden});
    n.add(p + "mlp.down_proj.weight", {c.hidden, c.intermediate});
    if (c.mlp_bias) {
      n.add(p + "mlp.gate_proj.bias", {c.intermediate});
      n.add(p + "mlp.up_proj.bias", {c.intermediate});
      n.add(p + "mlp.down_proj.bias", {c.hidden});
    }
  }
  n.add("model.norm.weight", {c.hidden});
  if (!c.tie_embeddings) n.add("lm_head.weight", {c.vocab, c.hidden});
}

}  // namespace

Tree<TensorSpec> ModelConfig::parameters(DType dtype) const {
  NamedSpecs n{dtype, {}};
  if (family == ModelFamily::kT5) {
    add_t5(*this, n);
  } else if (family == ModelFamily::kGpt2) {
    add_gpt2(*this, n);
  } else {
    add_llama_like(*this, n);
  }
  return tree_from_names(n.named);
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

std::int64_t ModelConfig::active_parameter_count() const {
  // What one token runs through: every parameter but the experts it is not routed to. Each
  // layer's experts are alike, so a token's k of E experts are k / E of their parameters
  // (torchtitan's get_nparams_and_flops for its MoE models counts nparams_experts * top_k /
  // num_experts, with the router and every dense parameter whole; Mistral gives Mixtral 8x7B
  // 12.9B active of 46.7B).
  std::int64_t total = 0, routed = 0;
  for (const auto& [path, t] : parameters(DType::kF32).flatten()) {
    total += t.shape.numel();
    if (path.find("/block_sparse_moe/experts/") != std::string::npos) routed += t.shape.numel();
  }
  if (routed == 0) return total;
  return total - routed + routed / experts * experts_per_token;
}

}  // namespace shardplan
