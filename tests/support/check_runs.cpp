// Linked into every test executable (tests/CMakeLists.txt): each Program::run that completes
// while a test runs is checked against what compile() said it would do.
// - Collectives: each step ran exactly the collectives its static cost lists (kind, axes, the
//   bytes each local device received and, over processes, staged beside its output to receive
//   them: what the plan adds to that device's peak at the step), and, when this process holds every device, the run's
//   bytes per kind (the most a device received per collective, summed) are the cost's
//   bytes_by_kind.
// - Memory: the bytes of the buffers the run's slots held per local device, each buffer once
//   however many values share it (RunRecord::live_bytes: what the devices hold), at the start and
//   after each step are the memory pass's timeline, so that the measured peak is the planned
//   peak. The memory pass counts a view and the value it views as one buffer, as the run holds
//   them (memory.hpp). Two figures are adjusted, each a fact of the run the compiler cannot
//   know: a run that took kept constants from an earlier run holds them from the start (expected:
//   the timeline plus the kept constants not yet reached, each buffer once); arguments that hold
//   one buffer (one array passed as two arguments, RunRecord::shared_arguments) are held once
//   where the plan counts each (expected: the timeline less the copies counted while more than
//   one of their groups is live). Then each local device's peak (its values' bytes, plus what
//   its collectives staged at their step over processes) is the cost's peak for that device.
//   A program compiled not to count constants
//   (SjitOptions::count_constants) is not checked: its plan leaves their bytes out on purpose.
// A mismatch fails the running test, naming the step, the device and both figures.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "../../src/program/compiler/compile.hpp"
#include "../../src/program/compiler/memory.hpp"
#include "../../src/program/ir/primitive.hpp"
#include "../../src/program/analysis/run_record.hpp"
#include "check_runs.hpp"

namespace shardplan::detail {
namespace {

std::string step_name(const Program& program, std::size_t s) {
  const Step& st = program.steps()[s];
  return fmt::format("step {} ({} {} = {})", s,
                     st.kind == Step::Kind::kReshard ? "reshard" : "kernel", value_name(st.node),
                     program.graph()[st.node].op->name);
}

bool same_on(const CollectiveRecord& a, const CollectiveRecord& b, const std::vector<int>& devices) {
  if (a.kind != b.kind || a.axes != b.axes) return false;
  const auto at_or_0 = [](const std::vector<std::int64_t>& v, std::size_t at) {
    return at < v.size() ? v[at] : 0;
  };
  for (const int d : devices) {
    const auto at = static_cast<std::size_t>(d);
    if (at_or_0(a.bytes_in, at) != at_or_0(b.bytes_in, at)) return false;
    if (at_or_0(a.staging_bytes, at) != at_or_0(b.staging_bytes, at)) return false;
  }
  return true;
}

void check_collectives(const Program& program, const RunRecord& rec) {
  const std::vector<Step>& steps = program.steps();
  std::vector<std::vector<const CollectiveRecord*>> ran(steps.size());
  for (const RanCollective& r : rec.collectives) ran[r.step].push_back(&r.rec);
  std::map<CollectiveKind, std::int64_t> want = program.cost().bytes_by_kind, got;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const bool cached = rec.took_constants && program.cached_steps()[s] != 0;
    const std::vector<CollectiveRecord>& cost = steps[s].cost;
    if (cached) {  // not run: taken from the cache
      for (const CollectiveRecord& c : cost) want[c.kind] -= c.max_bytes_in();
      continue;
    }
    bool same = ran[s].size() == cost.size();
    for (std::size_t k = 0; same && k < cost.size(); ++k) same = same_on(*ran[s][k], cost[k], rec.devices);
    if (!same) {
      std::string got_text;
      for (const CollectiveRecord* c : ran[s]) got_text += "\n  ran:  " + c->to_string();
      for (const CollectiveRecord& c : cost) got_text += "\n  cost: " + c.to_string();
      ADD_FAILURE() << "the run's collectives differ from the cost at " << step_name(program, s)
                    << got_text << "\n" << program.text();
    }
    for (const CollectiveRecord* c : ran[s]) got[c->kind] += c->max_bytes_in();
  }
  if (rec.devices.size() != program.output_shardings().front().mesh().devices().size()) return;
  for (const auto& [kind, bytes] : want) {
    if (got[kind] != bytes) {
      ADD_FAILURE() << "the run received " << got[kind] << " bytes by " << to_string(kind)
                    << " (the most a device received per collective, summed); its cost says "
                    << bytes << "\n" << program.text();
    }
  }
}

// Per step (and the start: index steps.size()), what the memory pass plans, plus kept constants
// a run that took them holds before their step (a constant that is a view of another kept one
// holds its buffer: counted once, for the first).
std::vector<std::int64_t> planned_bytes(const Program& program, const RunRecord& rec,
                                        const std::vector<SlotId>& root) {
  const MemoryTimeline& t = program.cost().timeline;
  std::vector<std::int64_t> want(t.live_bytes);
  want.push_back(t.start_bytes);
  if (!rec.took_constants) return want;
  const std::vector<Step>& steps = program.steps();
  for (std::size_t c = 0; c < steps.size(); ++c) {
    const Step& st = steps[c];
    if (program.cached_steps()[c] == 0 || root[index(st.out)] != st.out) continue;
    const std::int64_t bytes = byte_size(st.sharding->shard_shape(st.type.shape), st.type.dtype);
    for (std::size_t s = 0; s < c; ++s) want[s] += bytes;
  }
  return want;
}

// Per sample (steps, then the start), per device: the bytes the plan counts more than once
// because arguments share a buffer: (groups of those arguments held - 1) x its bytes. A group (the
// slots whose buffers are its root's) is held at a sample while any of its slots is.
std::vector<std::vector<std::int64_t>> shared_argument_bytes(const RunRecord& rec,
                                                             const std::vector<SlotId>& root) {
  const std::size_t steps = rec.live_bytes.size();
  const auto sample = [&](std::size_t s) {
    return s == steps ? RunRecord::kStart : static_cast<int>(s);
  };
  std::map<SlotId, std::vector<char>> held_at;  // by group root, per sample
  const auto held = [&](SlotId r) -> const std::vector<char>& {
    auto [it, fresh] = held_at.try_emplace(r);
    if (fresh) {
      it->second.assign(steps + 1, 0);
      for (std::size_t m = 0; m < root.size(); ++m) {
        if (root[m] != r) continue;
        for (std::size_t s = 0; s <= steps; ++s) {
          if (rec.bound_at[m] <= sample(s) && rec.freed_at[m] >= sample(s)) it->second[s] = 1;
        }
      }
    }
    return it->second;
  };
  std::vector<std::vector<std::int64_t>> out(steps + 1,
                                             std::vector<std::int64_t>(rec.devices.size(), 0));
  for (const RunRecord::SharedArgument& shared : rec.shared_arguments) {
    for (std::size_t s = 0; s <= steps; ++s) {
      std::int64_t groups = 0;
      for (const SlotId slot : shared.slots) groups += held(root[index(slot)])[s];
      if (groups > 1) out[s][shared.device] += (groups - 1) * shared.bytes;
    }
  }
  return out;
}

// The peak each local device reached: the bytes its values held at the start and after each step,
// plus, at a step, what its collectives staged there to receive from other processes (as the
// run allocated them: CollectiveRecord::staging_bytes), against the cost's peak for that device.
// (A run that took kept constants or shares argument buffers holds other bytes than the plan, as
// above: its steps are checked, not its peak.)
void check_peak(const Program& program, const RunRecord& rec) {
  if (rec.took_constants || !rec.shared_arguments.empty()) return;
  std::vector<std::int64_t> staged(rec.live_bytes.size() * rec.devices.size(), 0);
  for (const RanCollective& r : rec.collectives) {
    for (std::size_t i = 0; i < rec.devices.size(); ++i) {
      const auto d = static_cast<std::size_t>(rec.devices[i]);
      if (d < r.rec.staging_bytes.size() && r.step < rec.live_bytes.size()) {
        std::int64_t& at = staged[r.step * rec.devices.size() + i];
        at = std::max(at, r.rec.staging_bytes[d]);
      }
    }
  }
  for (std::size_t i = 0; i < rec.devices.size(); ++i) {
    std::int64_t peak = rec.start_bytes[i];
    for (std::size_t s = 0; s < rec.live_bytes.size(); ++s) {
      peak = std::max(peak, rec.live_bytes[s][i] + staged[s * rec.devices.size() + i]);
    }
    const auto d = static_cast<std::size_t>(rec.devices[i]);
    const std::vector<std::int64_t>& planned = program.cost().peak_bytes;
    if (d < planned.size() && peak != planned[d]) {
      ADD_FAILURE() << "device " << d << " peaked at " << peak
                    << " bytes (its values, and what its collectives staged); the cost plans "
                    << planned[d] << "\n" << program.text();
      return;
    }
  }
}

void check_memory(const Program& program, const RunRecord& rec) {
  if (!program.counts_constants()) return;
  const std::vector<SlotId> root = buffer_roots(program.steps(), rec.bound_at.size());
  const std::vector<std::int64_t> want = planned_bytes(program, rec, root);
  const std::size_t steps = rec.live_bytes.size();
  if (want.size() != steps + 1) {
    ADD_FAILURE() << "the timeline has " << want.size() - 1 << " steps, the run " << steps;
    return;
  }
  const std::vector<std::vector<std::int64_t>> shared = shared_argument_bytes(rec, root);
  for (std::size_t s = 0; s <= steps; ++s) {
    const std::vector<std::int64_t>& got = s == steps ? rec.start_bytes : rec.live_bytes[s];
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (got[i] == want[s] - shared[s][i]) continue;
      ADD_FAILURE() << "device " << rec.devices[i] << " held " << got[i] << " bytes "
                    << (s == steps ? std::string("at the start") : "after " + step_name(program, s))
                    << "; the memory pass plans " << want[s]
                    << (rec.took_constants ? " (kept constants taken from the cache)" : "")
                    << (shared[s][i] != 0 ? fmt::format(", less {} bytes its arguments share",
                                                        shared[s][i])
                                          : std::string())
                    << "\n" << program.text();
      return;  // the first difference: the later ones follow from it
    }
  }
  check_peak(program, rec);
}

const bool installed = [] {
  set_run_observer(&test::check_run);
  return true;
}();

}  // namespace

void test::check_run(const Program& program, const RunRecord& rec) {
  check_collectives(program, rec);
  check_memory(program, rec);
}

}  // namespace shardplan::detail
