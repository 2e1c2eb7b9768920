// Linked into every test executable (tests/CMakeLists.txt): each Program::run that completes
// while a test runs is checked against what compile() said it would do.
// - Collectives: each step ran exactly the collectives its static cost lists (kind, axes, the
//   bytes each local device received), and, when this process holds every device, the run's
//   bytes per kind (the most a device received per collective, summed) are the cost's
//   bytes_by_kind.
// - Memory: the bytes of the buffers the run's values held per local device (each value's
//   buffers counted for it, as the memory pass counts: RunRecord::value_bytes) at the start and
//   after each step are the memory pass's timeline, so that the measured peak is the planned
//   peak. Counted each buffer once (RunRecord::live_bytes) a run holds less wherever two live
//   values share buffers (a view whose operand is still live, one array passed as two
//   arguments): docs/profiling.md. A run that took kept constants from an earlier run holds
//   them from the start: its expected bytes are the timeline plus the kept constants not yet
//   reached. A program compiled not to count constants (SjitOptions::count_constants) is not
//   checked: its plan leaves their bytes out on purpose.
// A mismatch fails the running test, naming the step, the device and both figures.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "compile.hpp"
#include "primitive.hpp"
#include "run_record.hpp"
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
  for (const int d : devices) {
    const auto at = static_cast<std::size_t>(d);
    const std::int64_t x = at < a.bytes_in.size() ? a.bytes_in[at] : 0;
    const std::int64_t y = at < b.bytes_in.size() ? b.bytes_in[at] : 0;
    if (x != y) return false;
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
// a run that took them holds before their step.
std::vector<std::int64_t> planned_bytes(const Program& program, const RunRecord& rec) {
  const MemoryTimeline& t = program.cost().timeline;
  std::vector<std::int64_t> want(t.live_bytes);
  want.push_back(t.start_bytes);
  if (!rec.took_constants) return want;
  const std::vector<Step>& steps = program.steps();
  for (std::size_t c = 0; c < steps.size(); ++c) {
    if (program.cached_steps()[c] == 0) continue;
    const Step& st = steps[c];
    const std::int64_t bytes = byte_size(st.sharding->shard_shape(st.type.shape), st.type.dtype);
    for (std::size_t s = 0; s < c; ++s) want[s] += bytes;
  }
  return want;
}

void check_memory(const Program& program, const RunRecord& rec) {
  if (!program.counts_constants()) return;
  const std::vector<std::int64_t> want = planned_bytes(program, rec);
  const std::size_t steps = rec.value_bytes.size();
  if (want.size() != steps + 1) {
    ADD_FAILURE() << "the timeline has " << want.size() - 1 << " steps, the run " << steps;
    return;
  }
  for (std::size_t s = 0; s <= steps; ++s) {
    const std::vector<std::int64_t>& got = s == steps ? rec.value_start_bytes : rec.value_bytes[s];
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (got[i] == want[s]) continue;
      ADD_FAILURE() << "device " << rec.devices[i] << "'s values held " << got[i] << " bytes "
                    << (s == steps ? std::string("at the start") : "after " + step_name(program, s))
                    << "; the memory pass plans " << want[s]
                    << (rec.took_constants ? " (kept constants taken from the cache)" : "")
                    << "\n" << program.text();
      return;  // the first difference: the later ones follow from it
    }
  }
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
