// Any text as each stack config format (torchtitan TOML, Megatron arguments, MaxText YAML):
// reading it, and the batch it gives on a mesh, must succeed or throw shardplan::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "shardplan/error.hpp"
#include "shardplan/mesh.hpp"
#include "shardplan/stack_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const shardplan::Mesh mesh = shardplan::Mesh::parse("dp:2,fsdp:2,tp:2", 8);
  for (const char* stack :
       {"torchtitan-2024-07", "torchtitan-2025-08", "megatron-core", "maxtext"}) {
    try {
      const shardplan::StackConfig f =
          shardplan::parse_stack_config(text, "fuzz", shardplan::find_training_stack(stack));
      (void)f.mesh_text();
      (void)f.batch_on(mesh, {});
    } catch (const shardplan::Error&) {
    }
  }
  return 0;
}
