// The thread-local mesh context (scalax's `with mesh_helper:` / get_global_mesh()).
#include "shardplan/error.hpp"
#include "shardplan/mesh_sharding_helper.hpp"

namespace shardplan {
namespace {
thread_local const MeshContext* g_context = nullptr;
}  // namespace

MeshContext::MeshContext(MeshShardingHelper helper,
                         std::map<std::string, RuleTree> annotation_shardings)
    : helper_(std::move(helper)),
      annotations_(std::move(annotation_shardings)),
      previous_(g_context) {
  g_context = this;
}

MeshContext::~MeshContext() { g_context = previous_; }

const MeshContext* get_context() { return g_context; }

const Mesh& get_global_mesh() {
  if (g_context == nullptr) {
    throw SpecError(
        "[get_global_mesh] no MeshContext is active on this thread: create one "
        "(MeshContext ctx(helper);) or pass the mesh explicitly");
  }
  return g_context->mesh();
}

}  // namespace shardplan
