#pragma once
// What Program::run records when the profiler is on (include/shardplan/profiler.hpp): per local
// device, each kernel step and the waits around it, each reshard and the collectives it ran.
// Called only after profiler::detail::on() said yes: off, a run pays that one load per step.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../../runtime/reshard_timed.hpp"
#include "../compiler/compile.hpp"

namespace shardplan::detail {

/// The step's named scope: the scope open on this thread while it runs (the caller's), then its
/// node's (relative to the traced function; none for an eager op's program); null for none.
std::shared_ptr<const std::string> scope_of(const Graph& graph, const Step& st);

/// A kernel step ran from `start_ns` to `end_ns` on the host; `spans` holds each device's own
/// start and end (2 per device id; 0, 0 for a device that ran nothing): its kernel event, and
/// with `waits` (the devices ran side by side, on the pool) the waits before and after it
/// within the step (a device done early waits for the others). A step run inline runs its
/// devices one after another on the calling thread: the gaps are not waits at a barrier.
void profile_kernel_step(const Executor& executor, const Mesh& mesh, const Graph& graph,
                         const Step& st, const std::vector<std::int64_t>& spans,
                         std::int64_t start_ns, std::int64_t end_ns, bool waits);

/// A reshard (or a shard_map collective) ran from `start_ns` to `end_ns` and ran `records`, the
/// k-th over the k-th of `spans` (reshard_timed's; the whole step for each when they disagree):
/// per local device a reshard event, and a collective event per record with the bytes that
/// device received and its group's other devices.
void profile_reshard_step(const Executor& executor, const Mesh& mesh, const Graph& graph,
                          const Step& st, const std::vector<CollectiveRecord>& records,
                          const std::vector<StepSpan>& spans, std::int64_t start_ns,
                          std::int64_t end_ns);

}  // namespace shardplan::detail
