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
#include "families/config_parts.hpp"
#include "model_family.hpp"

namespace shardplan {
namespace train {

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

/// The checks every decoder-only family ends with: the tensor count, the heads and their width.
void check_heads(ModelConfig& c, std::string_view source) {
  check_tensor_count(c, source);
  if (c.heads % c.kv_heads != 0) {
    throw IoError(
        fmt::format("[config] {}: {} attention heads do not group evenly over {} key/value heads",
                    source, c.heads, c.kv_heads));
  }
  mul(c.heads, c.head_dim,
      fmt::format("{}: the attention width num_attention_heads x head_dim", source));
}

}  // namespace train

namespace {

using train::Fields;
using train::check_tensor_count;
using train::mul;
using train::shown;
namespace json = detail::json;

std::string known_types() {
  std::string out;
  for (const train::FamilyDef* f : train::families()) {
    for (std::string_view t : f->types) {
      if (!out.empty()) out += ", ";
      out += t;
    }
  }
  return out;
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
  for (const train::FamilyDef* fam : train::families()) {
    for (std::string_view t : fam->types) {
      if (c.model_type == t) family = fam;
    }
  }
  if (family == nullptr) {
    throw IoError(fmt::format(
        "[config] {}: model_type '{}' has no training step here (known: {}); `shardplan plan` "
        "still plans its weights",
        source, detail::printable(c.model_type), known_types()));
  }
  c.family = family;
  check_architectures(f, c.not_modelled);
  family->read(f, c);
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

std::string ModelConfig::family_name() const { return std::string(family->name); }

std::string ModelConfig::layers_path() const {
  return std::string(family->layers_path);
}

namespace {

}  // namespace

Tree<TensorSpec> ModelConfig::parameters(DType dtype) const {
  train::NamedSpecs n{dtype, {}};
  family->add_parameters(*this, n);
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
  const std::string_view routed_path = family->experts_path;
  for (const auto& [path, t] : parameters(DType::kF32).flatten()) {
    total += t.shape.numel();
    if (!routed_path.empty() && path.find(routed_path) != std::string::npos) routed += t.shape.numel();
  }
  if (routed == 0) return total;
  return total - routed + routed / experts * experts_per_token;
}

}  // namespace shardplan
