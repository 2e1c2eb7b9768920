#include "allocation_events.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "../program/compiler/memory.hpp"
#include "../program/ir/primitives.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

bool runs(const Step& st, CollectiveKind kind) {
  return std::any_of(st.cost.begin(), st.cost.end(),
                     [&](const CollectiveRecord& r) { return r.kind == kind; });
}

}  // namespace

std::vector<AllocEvent> allocation_events(const Program& p, StreamModel model) {
  using Kind = AllocEvent::Kind;
  const Graph& g = p.graph();
  const std::vector<Step>& steps = p.steps();
  const std::vector<std::int64_t>& bytes = p.slot_bytes();
  const auto num_slots = static_cast<std::int64_t>(bytes.size());
  std::vector<AllocEvent> out;
  out.reserve(2 * steps.size() + p.input_slots().size());
  const auto alloc = [&](std::int64_t id, std::int64_t b, AllocStream s) {
    out.push_back({Kind::kAllocate, id, b, s});
  };
  const auto free = [&](std::int64_t id) { out.push_back({Kind::kFree, id, 0, {}}); };
  // Slots that share one buffer (a value and its views: shares_operand_buffers) are one
  // allocation, made by the group's root and freed when its last member is (as the memory pass
  // counts them).
  const std::vector<SlotId> root = buffer_roots(steps, bytes.size());
  std::vector<int> members(bytes.size(), 0);
  const auto free_all = [&](const std::vector<SlotId>& slots) {
    for (const SlotId f : slots) {
      const std::size_t r = index(root[index(f)]);
      if (--members[r] == 0) free(static_cast<std::int64_t>(r));
    }
  };
  // The arguments, as the memory pass counts them (input nodes in graph order).
  std::vector<DType> dtype(bytes.size(), DType::kF32);
  for (const Node& n : g.nodes) {
    if (!n.is(prim::input)) continue;
    const auto k = static_cast<std::size_t>(n.attr<InputAttrs>().index);
    if (k >= p.input_slots().size() || index(p.input_slots()[k]) >= bytes.size()) continue;
    const std::size_t s = index(p.input_slots()[k]);
    dtype[s] = n.type.dtype;
    members[s] = 1;
    alloc(static_cast<std::int64_t>(s), bytes[s], AllocStream::kDefault);
  }
  free_all(p.free_at_start());
  const bool fsdp = model == StreamModel::kFsdp2;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const Step& st = steps[s];
    const std::size_t o = index(st.out);
    const auto id = static_cast<std::int64_t>(o);
    dtype[o] = st.type.dtype;
    const std::int64_t staging = num_slots + static_cast<std::int64_t>(s);  // a step's buffer
    const bool reshard = st.kind == Step::Kind::kReshard;
    if (fsdp && reshard && runs(st, CollectiveKind::kReduceScatter) && st.in.size() == 1) {
      const std::size_t in = index(st.in[0]);
      const std::int64_t in_bytes = bytes[in] / byte_size(Shape{}, dtype[in]) *
                                    byte_size(Shape{}, st.type.dtype);
      alloc(staging, in_bytes, AllocStream::kReduceScatter);
      free_all(p.free_after()[s]);
      members[o] = 1;
      alloc(id, bytes[o], AllocStream::kReduceScatter);
      free(staging);
      continue;
    }
    if (fsdp && reshard && runs(st, CollectiveKind::kAllGather) &&
        argument_read(g, st.node).has_value()) {
      alloc(staging, bytes[o], AllocStream::kAllGather);
      members[o] = 1;
      alloc(id, bytes[o], AllocStream::kDefault);
      free(staging);
      free_all(p.free_after()[s]);
      continue;
    }
    const std::size_t r = index(root[o]);
    if (r != o) {
      ++members[r];  // shares its operand's buffer: nothing allocated
    } else {
      members[o] = 1;
      alloc(id, bytes[o], AllocStream::kDefault);
    }
    free_all(p.free_after()[s]);
  }
  return out;
}

ReservedBytes reserved_bytes(const Program& p) {
  const std::int64_t requested =
      simulate_caching_allocator(allocation_events(p, StreamModel::kValues)).requested_peak;
  const MemoryTimeline& t = p.cost().timeline;  // the memory plan's peak, at its step
  const std::int64_t planned =
      t.peak_step < t.live_bytes.size() ? t.live_bytes[t.peak_step] : t.start_bytes;
  if (requested != planned) {
    throw Error(fmt::format("[reserved_bytes] the allocation events peak at {} bytes live, the "
                            "memory plan at {} (a bug: the two counts disagree)",
                            requested, planned));
  }
  const std::vector<AllocEvent> events = allocation_events(p, StreamModel::kFsdp2);
  return {.segments = simulate_caching_allocator(events).reserved_peak,
          .expandable =
              simulate_caching_allocator(events, {.expandable_segments = true}).reserved_peak};
}

}  // namespace shardplan::detail
