#pragma once
// The model families' declarations: one record per family of what the planner asks of it, so
// code outside a family's definition asks a capability or a declared name, not an identity.

#include <span>
#include <string_view>

#include "resolve_options.hpp"
#include "shardplan/train_plan.hpp"

namespace shardplan::train {

/// One model family, declared once (model_family.cpp holds the table).
struct FamilyDef {
  ModelFamily id;
  std::string_view name;                    // as reports print it ("llama")
  std::span<const std::string_view> types;  // the config.json model_type values it reads
  std::string_view layers_path;             // where its repeated layers sit in the parameter tree
  std::string_view default_preset;          // the rules used when no --rules is given
  std::string_view preset_without_tp;       // the default on a mesh with no tp axis ("" = same)
  bool encoder_decoder = false;             // an encoder and a decoder (its layers both count)
  FamilySupport support;                    // what its step can run
};

/// Every family, in the order the model types are listed in messages.
std::span<const FamilyDef> families();
/// The declaration of `id`.
const FamilyDef& family(ModelFamily id);

}  // namespace shardplan::train
