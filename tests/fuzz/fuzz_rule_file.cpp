// Any text as a rule file: parsing, building the rule and resolving its activations must accept
// or throw shardplan::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/rule_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const shardplan::RuleFile f = shardplan::parse_rule_file(text, "fuzz.yaml");
    const shardplan::RulePtr rule = f.make_rule();
    const shardplan::Mesh mesh = shardplan::Mesh::parse("fsdp:2,tp:2", 4);
    const shardplan::TensorSpec t{shardplan::Shape{8, 8}, shardplan::DType::kF32};
    // The activations section (named intermediate shardings in logical axes), resolved against
    // the mesh, with and without a binding that turns sequence parallelism off.
    for (const bool bind : {false, true}) {
      shardplan::RuleFile::LogicalMapping m;
      if (bind) m.emplace_back("activation_norm_length", std::nullopt);
      try {
        (void)f.activation_shardings(mesh, m);
      } catch (const shardplan::Error&) {
      }
    }
    // ASCII, non-ASCII with a final newline, and invalid UTF-8 (decoded as surrogateescape).
    for (std::string_view path : {"model/layers/0/mlp/up_proj/weight", "lm_head/weight", "",
                                  "model/\xe5\xb1\x82/\xce\xb6_proj/weight\n", "a/\xc3/\xff"}) {
      try {
        rule->apply(shardplan::RuleInput{path, t, mesh});
      } catch (const shardplan::Error&) {
      }
    }
  } catch (const shardplan::Error&) {
  }
  return 0;
}
