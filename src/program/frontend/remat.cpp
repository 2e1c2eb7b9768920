// Checkpointed regions and names (include/shardplan/remat.hpp): recorded in the trace, read by
// value_and_grad (autodiff.cpp), which recomputes what a region's policy does not save.
#include "shardplan/remat.hpp"

#include <fmt/format.h>

#include "trace.hpp"

namespace shardplan {

std::string RematPolicy::to_string() const {
  switch (kind_) {
    case Kind::kEverythingSaveable:
      return "everything_saveable";
    case Kind::kNothingSaveable:
      return "nothing_saveable";
    case Kind::kDotsSaveable:
      return "dots_saveable";
    case Kind::kDotsWithNoBatchDimsSaveable:
      return "dots_with_no_batch_dims_saveable";
    case Kind::kSaveOnlyTheseNames:
      return fmt::format("save_only_these_names({})", fmt::join(names_, ", "));
    case Kind::kSaveAnythingExceptTheseNames:
      return fmt::format("save_anything_except_these_names({})", fmt::join(names_, ", "));
  }
  return "?";
}

namespace checkpoint_policies {
RematPolicy everything_saveable() { return RematPolicy::of(RematPolicy::Kind::kEverythingSaveable); }
RematPolicy nothing_saveable() { return RematPolicy::of(RematPolicy::Kind::kNothingSaveable); }
RematPolicy dots_saveable() { return RematPolicy::of(RematPolicy::Kind::kDotsSaveable); }
RematPolicy dots_with_no_batch_dims_saveable() {
  return RematPolicy::of(RematPolicy::Kind::kDotsWithNoBatchDimsSaveable);
}
RematPolicy save_only_these_names(std::vector<std::string> names) {
  return RematPolicy::of(RematPolicy::Kind::kSaveOnlyTheseNames, std::move(names));
}
RematPolicy save_anything_except_these_names(std::vector<std::string> names) {
  return RematPolicy::of(RematPolicy::Kind::kSaveAnythingExceptTheseNames, std::move(names));
}
}  // namespace checkpoint_policies

Array checkpoint_name(const Array& x, const std::string& name) {
  detail::TraceContext* ctx = detail::current_trace();
  // Only a trace records names (a tracer of another trace is captured by node_of, as an input:
  // naming it names nothing of this trace's, which is what differentiation reads).
  if (ctx != nullptr && x.is_tracer()) {
    const detail::ValueId v = ctx->node_of(x);
    ctx->value_names[v].push_back(name);
    ctx->graph.names[v].push_back(name);
  }
  return x;
}

namespace detail {

RematScope::RematScope(const RematPolicy& policy, bool prevent_cse) {
  TraceContext* ctx = current_trace();
  if (ctx == nullptr) return;
  trace_ = ctx;
  previous_ = ctx->open_region;
  ctx->remat_regions.push_back({policy, previous_, prevent_cse});
  ctx->open_region = static_cast<int>(ctx->remat_regions.size()) - 1;
}

RematScope::~RematScope() {
  if (trace_ != nullptr) static_cast<TraceContext*>(trace_)->open_region = previous_;
}

}  // namespace detail
}  // namespace shardplan
