#pragma once
// The model families' declarations: one record per family of what the planner asks of it (the
// config.json fields it reads, its parameter tree, its step's parts, its default rules, what it
// supports), so code outside a family's own file (src/train/families/) asks a declared part or
// capability, never which family it is. model_family.cpp registers them.

#include <span>
#include <string_view>

#include "resolve_options.hpp"
#include "shardplan/array.hpp"
#include "shardplan/train_plan.hpp"
#include "shardplan/tree.hpp"

namespace shardplan::train {

class Fields;
struct NamedSpecs;
struct ModelStep;

/// The parts of a family's training step, each a function of the step's options (ModelStep).
struct StepParts {
  /// Tokens [b, t] to the residual stream [b, t, d].
  Array (*embed)(const ModelStep& m, const Tree<Array>& rest, const Array& tokens) = nullptr;
  /// One decoder layer (its parameters, the residual stream, its attention window).
  Array (*layer)(const ModelStep& m, const Tree<Array>& layer, const Array& h,
                 std::int64_t window) = nullptr;
  /// The MLP of a layer (the normed x in, before the residual add), for a layer that asks.
  Array (*mlp)(const ModelStep& m, const Tree<Array>& layer, const Array& x) = nullptr;
  /// The final norm before the head.
  Array (*final_norm)(const ModelStep& m, const Tree<Array>& rest, const Array& h) = nullptr;
  /// The embedding table the head reads when the embeddings are tied.
  std::string_view embedding = "";
  /// A step written whole (an encoder-decoder): the loss from the parameters, tokens, targets.
  Array (*whole)(const ModelStep& m, const Tree<Array>& params, const Array& tokens,
                 const Array& targets) = nullptr;
};

/// One model family, declared once (each in its own file under src/train/families/).
struct FamilyDef {
  std::string_view name;                    // as reports print it ("llama")
  std::string_view title;                   // as messages name it ("LLaMA")
  std::span<const std::string_view> types;  // the config.json model_type values it reads
  std::string_view layers_path;             // where its repeated layers sit in the parameter tree
  std::string_view default_preset;          // the rules used when no --rules is given
  std::string_view preset_without_tp;       // the default on a mesh with no tp axis ("" = same)
  bool encoder_decoder = false;             // an encoder and a decoder (its layers both count)
  FamilySupport support;                    // what its step can run
  /// Reads and checks the family's config.json fields into `c` (model_type is set).
  void (*read)(Fields& f, ModelConfig& c) = nullptr;
  /// Adds its parameters in the checkpoints' naming.
  void (*add_parameters)(const ModelConfig& c, NamedSpecs& n) = nullptr;
  /// The routed experts' parameters are the ones whose path holds this ("" = none): a token runs
  /// through experts_per_token / experts of them (active parameters, as torchtitan counts them).
  std::string_view experts_path = "";
  StepParts step;
};

/// Every family, in the order the model types are listed in messages.
std::span<const FamilyDef* const> families();
/// The families that support `what`, by title ("LLaMA, Mixtral"), for messages.
std::string titles_with(bool FamilySupport::*what);

}  // namespace shardplan::train
