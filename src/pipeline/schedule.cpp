// The schedule generators (docs/pipeline.md has each one's source) and the lowering that adds a
// schedule's transfers.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <utility>

#include "shardplan/error.hpp"
#include "shardplan/pipeline_schedule.hpp"

namespace shardplan::pipeline {

namespace {

constexpr std::array<std::string_view, 8> kOpNames = {"F",      "B",      "I",      "W",
                                                      "SEND_F", "RECV_F", "SEND_B", "RECV_B"};

void require(bool ok, std::string_view schedule, const std::string& what) {
  if (!ok) throw Error(fmt::format("[pipeline] {}: {}", schedule, what));
}

// The bounds keep a schedule's actions (about 4 per stage and micro-batch) and the simulator's
// tables (56 bytes per stage micro-batch) in memory.
void require_sizes(std::string_view schedule, int ranks, int microbatches, int per_rank = 1) {
  require(ranks >= 1 && ranks <= 4096, schedule,
          fmt::format("the pipeline has {} ranks; it needs 1 to 4096", ranks));
  require(microbatches >= 1 && microbatches <= 1'000'000, schedule,
          fmt::format("{} micro-batches; it needs 1 to 1000000", microbatches));
  const long long actions = 1LL * ranks * per_rank * microbatches;
  require(actions <= 1'000'000, schedule,
          fmt::format("{} stages x {} micro-batches = {} stage micro-batches; at most 1000000",
                      ranks * per_rank, microbatches, actions));
}

Step compute(Op op, int stage, int microbatch) {
  return Step{Step::Kind::kCompute, {Action{op, stage, microbatch}}, false};
}

// A schedule of one stage per rank (stage r on rank r), steps to be filled.
Schedule one_stage_per_rank(std::string name, int ranks, int microbatches) {
  Schedule s{std::move(name), ranks, ranks, microbatches, {}, {}};
  for (int r = 0; r < ranks; ++r) s.stage_rank.push_back(r);
  s.steps.resize(ranks);
  return s;
}

}  // namespace

std::string_view name(Op op) { return kOpNames.at(static_cast<std::size_t>(op)); }

bool is_compute(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput ||
         op == Op::kBackwardWeight;
}

std::string to_string(const Action& a) {
  return fmt::format("{}{}{}", a.stage, name(a.op), a.microbatch);
}

Schedule gpipe(int ranks, int microbatches) {
  require_sizes("gpipe", ranks, microbatches);
  Schedule s = one_stage_per_rank("gpipe", ranks, microbatches);
  for (int r = 0; r < ranks; ++r) {
    for (int m = 0; m < microbatches; ++m) s.steps[r].push_back(compute(Op::kForward, r, m));
    for (int m = 0; m < microbatches; ++m) s.steps[r].push_back(compute(Op::kBackward, r, m));
  }
  return with_transfers(std::move(s));
}

Schedule one_f_one_b(int ranks, int microbatches) {
  require_sizes("1f1b", ranks, microbatches);
  require(microbatches >= ranks, "1f1b",
          fmt::format("{} micro-batches for {} stages: 1F1B needs at least one per stage",
                      microbatches, ranks));
  Schedule s = one_stage_per_rank("1f1b", ranks, microbatches);
  for (int r = 0; r < ranks; ++r) {
    const int warmup = ranks - r - 1;
    int f = 0;
    for (; f < warmup; ++f) s.steps[r].push_back(compute(Op::kForward, r, f));
    for (int b = 0; b < microbatches; ++b) {
      if (f < microbatches) s.steps[r].push_back(compute(Op::kForward, r, f++));
      s.steps[r].push_back(compute(Op::kBackward, r, b));
    }
  }
  return with_transfers(std::move(s));
}

Schedule interleaved_1f1b(int ranks, int virtual_stages, int microbatches) {
  require(virtual_stages >= 2 && virtual_stages <= 64, "interleaved",
          fmt::format("{} virtual stages per rank; interleaving needs 2 to 64 (1 is 1F1B)",
                      virtual_stages));
  require_sizes("interleaved", ranks, microbatches, virtual_stages);
  require(microbatches % ranks == 0, "interleaved",
          fmt::format("{} micro-batches over {} ranks: Megatron's interleaved schedule needs a "
                      "multiple of the ranks",
                      microbatches, ranks));
  const int v = virtual_stages;
  Schedule s{"interleaved", ranks, ranks * v, microbatches, {}, {}};
  for (int stage = 0; stage < ranks * v; ++stage) s.stage_rank.push_back(stage % ranks);
  s.steps.resize(ranks);
  // Megatron's order: the k-th forward of a rank is chunk (k / ranks) % v of micro-batch
  // (k / (ranks * v)) * ranks + k % ranks; backwards walk the chunks the other way.
  const int total = microbatches * v;
  for (int r = 0; r < ranks; ++r) {
    const auto at = [&](int k, bool forward) {
      const int chunk = (k / ranks) % v;
      const int mb = (k / (ranks * v)) * ranks + k % ranks;
      const int c = forward ? chunk : v - 1 - chunk;
      return compute(forward ? Op::kForward : Op::kBackward, c * ranks + r, mb);
    };
    const int warmup = std::min((ranks - r - 1) * 2 + (v - 1) * ranks, total);
    int f = 0;
    for (; f < warmup; ++f) s.steps[r].push_back(at(f, true));
    for (int b = 0; b < total; ++b) {
      if (f < total) s.steps[r].push_back(at(f++, true));
      s.steps[r].push_back(at(b, false));
    }
  }
  return with_transfers(std::move(s));
}

Schedule zero_bubble_h1(int ranks, int microbatches) {
  require_sizes("zbh1", ranks, microbatches);
  require(microbatches >= ranks, "zbh1",
          fmt::format("{} micro-batches for {} stages: ZB-H1 needs at least one per stage",
                      microbatches, ranks));
  Schedule s = one_stage_per_rank("zbh1", ranks, microbatches);
  for (int r = 0; r < ranks; ++r) {
    auto& out = s.steps[r];
    const int warmup = ranks - r - 1;
    int f = 0;
    int w = 0;
    for (; f < warmup; ++f) out.push_back(compute(Op::kForward, r, f));
    for (int i = 0; i < microbatches; ++i) {
      if (f < microbatches) out.push_back(compute(Op::kForward, r, f++));
      out.push_back(compute(Op::kBackwardInput, r, i));
      // Rank r's weight gradients run r micro-batches late: they fill the waits of its
      // cool-down, and rank r ends with r + 1 of them.
      if (i - r >= 0) out.push_back(compute(Op::kBackwardWeight, r, w++));
    }
    while (w < microbatches) out.push_back(compute(Op::kBackwardWeight, r, w++));
  }
  return with_transfers(std::move(s));
}

Schedule with_transfers(Schedule s) {
  const auto remote = [&](int rank, int stage) {
    return stage >= 0 && stage < s.stages && s.stage_rank[stage] != rank;
  };
  const auto posted = [](Op op, int stage, int mb) {
    return Step{Step::Kind::kTransfers, {Action{op, stage, mb}}, false};
  };
  for (int r = 0; r < s.ranks; ++r) {
    std::vector<Step> out;
    bool has_transfers = false;
    for (const Step& step : s.steps[r]) has_transfers |= step.kind == Step::Kind::kTransfers;
    if (has_transfers) continue;  // a schedule with its own transfers keeps them
    for (const Step& step : s.steps[r]) {
      for (const Action& a : step.actions) {
        if (a.op == Op::kForward && remote(r, a.stage - 1))
          out.push_back(posted(Op::kRecvForward, a.stage, a.microbatch));
        if ((a.op == Op::kBackward || a.op == Op::kBackwardInput) && remote(r, a.stage + 1))
          out.push_back(posted(Op::kRecvBackward, a.stage, a.microbatch));
      }
      out.push_back(step);
      for (const Action& a : step.actions) {
        if (a.op == Op::kForward && remote(r, a.stage + 1))
          out.push_back(posted(Op::kSendForward, a.stage, a.microbatch));
        if ((a.op == Op::kBackward || a.op == Op::kBackwardInput) && remote(r, a.stage - 1))
          out.push_back(posted(Op::kSendBackward, a.stage, a.microbatch));
      }
    }
    s.steps[r] = std::move(out);
  }
  return s;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved", "zbh1",
                                                 "dualpipev"};
  return names;
}

Schedule make_schedule(std::string_view which, int ranks, int microbatches, int virtual_stages) {
  if (which == "interleaved") return interleaved_1f1b(ranks, virtual_stages, microbatches);
  const auto& known = schedule_names();
  if (std::find(known.begin(), known.end(), which) == known.end())
    throw Error(fmt::format("[pipeline] unknown schedule '{}'; the schedules are {}", which,
                            fmt::join(known, ", ")));
  require(virtual_stages == 1, which,
          fmt::format("{} virtual stages: only 'interleaved' has virtual stages (DualPipeV's two "
                      "stages per rank are its own)",
                      virtual_stages));
  if (which == "gpipe") return gpipe(ranks, microbatches);
  if (which == "1f1b") return one_f_one_b(ranks, microbatches);
  if (which == "zbh1") return zero_bubble_h1(ranks, microbatches);
  return dualpipe_v(ranks, microbatches);
}

std::string to_text(const Schedule& s) {
  std::string out = fmt::format("{}: {} ranks, {} stages, {} micro-batches\n", s.name, s.ranks,
                                s.stages, s.microbatches);
  for (int r = 0; r < s.ranks; ++r) {
    out += fmt::format("rank {}:", r);
    for (const Step& step : s.steps[r]) {
      std::vector<std::string> parts;
      for (const Action& a : step.actions) parts.push_back(to_string(a));
      switch (step.kind) {
        case Step::Kind::kCompute: out += " " + parts.front(); break;
        case Step::Kind::kOverlapped: out += fmt::format(" [{}]", fmt::join(parts, "&")); break;
        case Step::Kind::kTransfers:
          out += fmt::format(" {{{}{}}}", fmt::join(parts, " "), step.wait ? " |wait" : "");
          break;
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace shardplan::pipeline
