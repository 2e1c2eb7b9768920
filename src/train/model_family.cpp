#include "model_family.hpp"

#include <array>
#include <string>

namespace shardplan::train {

// The registry: each family is declared in its own file under src/train/families/. Adding one is
// its file, its test and a line in each list below.
namespace families_defs {
extern const FamilyDef llama, mistral, qwen2, qwen3, mixtral, gpt2, t5, gemma2;
}  // namespace families_defs

std::span<const FamilyDef* const> families() {
  namespace d = families_defs;
  static const std::array<const FamilyDef*, 8> all{&d::llama, &d::mistral, &d::qwen2, &d::mixtral,
                                                   &d::gpt2,  &d::t5,      &d::qwen3, &d::gemma2};
  return all;
}

std::string titles_with(bool FamilySupport::*what) {
  std::string out;
  for (const FamilyDef* f : families()) {
    if (!(f->support.*what) || out.find(f->title) != std::string::npos) continue;
    if (!out.empty()) out += ", ";
    out += f->title;
  }
  return out;
}

}  // namespace shardplan::train
