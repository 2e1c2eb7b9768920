#include "model_family.hpp"

#include <array>

namespace shardplan::train {
namespace {

constexpr std::array<std::string_view, 3> kLlamaTypes{"llama", "mistral", "qwen2"};
constexpr std::array<std::string_view, 1> kMixtralTypes{"mixtral"};
constexpr std::array<std::string_view, 1> kGpt2Types{"gpt2"};
constexpr std::array<std::string_view, 1> kT5Types{"t5"};

const std::array<FamilyDef, 4> kFamilies{{
    {.id = ModelFamily::kLlama,
     .name = "llama",
     .types = kLlamaTypes,
     .layers_path = "model/layers",
     .default_preset = "llama_fsdp_tp",
     .preset_without_tp = "llama_fsdp",
     .support = {}},
    {.id = ModelFamily::kMixtral,
     .name = "mixtral",
     .types = kMixtralTypes,
     .layers_path = "model/layers",
     .default_preset = "mixtral_ep",
     .support = {}},
    {.id = ModelFamily::kGpt2,
     .name = "gpt2",
     .types = kGpt2Types,
     .layers_path = "h",
     .default_preset = "gpt2",
     .support = {.ring_attention = false, .float8 = false}},
    {.id = ModelFamily::kT5,
     .name = "t5",
     .types = kT5Types,
     .layers_path = "decoder/block",
     .default_preset = "t5",
     .encoder_decoder = true,
     .support = {.decoder_only = false,
                 .ring_attention = false,
                 .fused_attention = false,
                 .fused_loss = false,
                 .annotated_regions = false,
                 .float8 = false,
                 .remat = false,
                 .fsdp_root = false}},
}};

}  // namespace

std::span<const FamilyDef> families() { return kFamilies; }

const FamilyDef& family(ModelFamily id) {
  for (const FamilyDef& f : kFamilies) {
    if (f.id == id) return f;
  }
  return kFamilies.front();
}

}  // namespace shardplan::train
