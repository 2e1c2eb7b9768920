// Running a schedule on costs: each rank's steps in order; a compute waits for its inputs (a
// result of its own rank, or a receive matched by its peer's send), a waited batch of transfers
// for every peer's match. The times do not depend on the order the ranks are stepped in: a step's
// start depends only on earlier steps' ends and on the peers' post times.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <tuple>

#include "shardplan/error.hpp"
#include "shardplan/pipeline_schedule.hpp"

namespace shardplan::pipeline {

namespace {

// What a compute leaves for others: a stage's activation (forward), the gradient of its input
// (whole or input backward), its weight gradient (whole or weight backward).
enum class Result : std::uint8_t { kActivation, kInputGrad, kWeightGrad };
using Key = std::tuple<int, int, int>;  // (what, stage, micro-batch)
Key key(Result what, int stage, int mb) { return {static_cast<int>(what), stage, mb}; }
// A transfer's key: its op among the four transfer ops.
Key key(const Action& a) {
  return {static_cast<int>(a.op) - static_cast<int>(Op::kSendForward), a.stage, a.microbatch};
}

// A time per (kind, stage, micro-batch), absent until set: a flat table (the simulator looks
// one up per input of every step).
class Times {
 public:
  Times(int kinds, int stages, int microbatches)
      : stages_(stages), mbs_(microbatches),
        t_(static_cast<std::size_t>(kinds) * stages * microbatches, kAbsent) {}
  std::optional<double> find(const Key& k) const {
    const double v = t_[index(k)];
    if (v == kAbsent) return std::nullopt;
    return v;
  }
  bool count(const Key& k) const { return t_[index(k)] != kAbsent; }
  bool emplace(const Key& k, double v) {  // false when already set
    double& slot = t_[index(k)];
    if (slot != kAbsent) return false;
    slot = v;
    return true;
  }

 private:
  static constexpr double kAbsent = -1.0;  // times are never negative
  std::size_t index(const Key& k) const {
    const auto [what, stage, mb] = k;
    return (static_cast<std::size_t>(what) * stages_ + stage) * mbs_ + mb;
  }
  int stages_;
  int mbs_;
  std::vector<double> t_;
};

// The transfer a transfer matches.
Action peer_of(const Action& a) {
  switch (a.op) {
    case Op::kSendForward: return {Op::kRecvForward, a.stage + 1, a.microbatch};
    case Op::kRecvForward: return {Op::kSendForward, a.stage - 1, a.microbatch};
    case Op::kSendBackward: return {Op::kRecvBackward, a.stage - 1, a.microbatch};
    default: return {Op::kSendBackward, a.stage + 1, a.microbatch};
  }
}

// The schedule's stages, after checking its sizes are ones a table can hold.
int checked_stages(const Schedule& s) {
  if (s.stages < 1 || s.microbatches < 1 || 1LL * s.stages * s.microbatches > 1'000'000)
    throw Error(fmt::format("[pipeline] {}: {} stages x {} micro-batches; the simulator takes 1 "
                            "to 1000000 stage micro-batches",
                            s.name, s.stages, s.microbatches));
  return s.stages;
}

class Run {
 public:
  Run(const Schedule& s, const Costs& c)
      : s_(s), c_(c), results_(3, checked_stages(s), s.microbatches),
        posted_(4, s.stages, s.microbatches) {
    validate_shape();
    pos_.assign(s.ranks, 0);
    now_.assign(s.ranks, 0.0);
    t_.ranks.resize(s.ranks);
    t_.busy.assign(s.ranks, 0.0);
    t_.peak_in_flight.assign(s.ranks, 0);
    in_flight_.assign(s.ranks, 0);
    queued_.assign(s.ranks, false);
    posted_step_.assign(s.ranks, -1);
  }

  Timeline go() {
    // A rank runs until it blocks; a post wakes the rank of its peer. Each step is visited a
    // bounded number of times: the work is linear in the steps, whatever the order of waits.
    for (int r = 0; r < s_.ranks; ++r) wake(r);
    while (!work_.empty()) {
      const int r = work_.front();
      work_.pop_front();
      queued_[r] = false;
      while (pos_[r] < static_cast<int>(s_.steps[r].size()) && advance(r)) {
      }
    }
    std::vector<std::string> blocked;
    for (int r = 0; r < s_.ranks; ++r)
      if (pos_[r] < static_cast<int>(s_.steps[r].size())) blocked.push_back(why_blocked(r));
    if (!blocked.empty())
      throw Error(fmt::format("[pipeline] {}: the schedule does not complete: {}", s_.name,
                              fmt::join(blocked, "; ")));
    finish();
    return std::move(t_);
  }

 private:
  void fail(const std::string& what) const {
    throw Error(fmt::format("[pipeline] {}: {}", s_.name, what));
  }

  void validate_shape() const {
    if (s_.ranks < 1 || static_cast<int>(s_.steps.size()) != s_.ranks)
      fail(fmt::format("{} ranks but steps for {}", s_.ranks, s_.steps.size()));
    if (s_.stages < 1 || static_cast<int>(s_.stage_rank.size()) != s_.stages)
      fail(fmt::format("{} stages but a rank for {}", s_.stages, s_.stage_rank.size()));
    for (int st = 0; st < s_.stages; ++st)
      if (s_.stage_rank[st] < 0 || s_.stage_rank[st] >= s_.ranks)
        fail(fmt::format("stage {} is on rank {}, not one of the {} ranks", st,
                         s_.stage_rank[st], s_.ranks));
    for (int r = 0; r < s_.ranks; ++r)
      for (const Step& step : s_.steps[r]) check_step(r, step);
  }

  void check_step(int r, const Step& step) const {
    const bool transfers = step.kind == Step::Kind::kTransfers;
    const std::size_t n = step.kind == Step::Kind::kOverlapped ? 2 : transfers ? 0 : 1;
    if ((n && step.actions.size() != n) || step.actions.empty())
      fail(fmt::format("rank {}: a step of {} actions", r, step.actions.size()));
    for (const Action& a : step.actions) {
      if (is_compute(a.op) == transfers)
        fail(fmt::format("rank {}: {} in a {} step", r, to_string(a),
                         transfers ? "transfer" : "compute"));
      if (a.stage < 0 || a.stage >= s_.stages || a.microbatch < 0 ||
          a.microbatch >= s_.microbatches)
        fail(fmt::format("rank {}: {} names a stage or micro-batch the schedule does not have "
                         "({} stages, {} micro-batches)",
                         r, to_string(a), s_.stages, s_.microbatches));
      if (s_.stage_rank[a.stage] != r)
        fail(fmt::format("rank {} runs {}, but stage {} is on rank {}", r, to_string(a), a.stage,
                         s_.stage_rank[a.stage]));
      if (!transfers) continue;
      const Action p = peer_of(a);
      if (p.stage < 0 || p.stage >= s_.stages)
        fail(fmt::format("rank {}: {} has no stage to match it", r, to_string(a)));
      if (s_.stage_rank[p.stage] == r)
        fail(fmt::format("rank {}: {} is a transfer to its own rank (stages {} and {} are both "
                         "on it)",
                         r, to_string(a), a.stage, p.stage));
    }
  }

  // When a result is ready for rank r, nullopt while not yet; fails when nothing earlier on r
  // will ever give it.
  std::optional<double> ready(int r, const Action& consumer, Result what, int stage) {
    const int mb = consumer.microbatch;
    if (s_.stage_rank[stage] == r) {
      const auto t = results_.find(key(what, stage, mb));
      if (!t)
        fail(fmt::format("rank {} runs {} before its own input from stage {} (micro-batch {})", r,
                         to_string(consumer), stage, mb));
      return t;
    }
    const Op recv = what == Result::kActivation ? Op::kRecvForward : Op::kRecvBackward;
    const Action need{recv, consumer.stage, mb};
    if (!posted_.count(key(need)))
      fail(fmt::format("rank {} runs {}, whose input from stage {} on rank {} no earlier step of "
                       "rank {} receives ({} missing)",
                       r, to_string(consumer), stage, s_.stage_rank[stage], r, to_string(need)));
    return matched(need);
  }

  // When a posted transfer is matched (its data across), nullopt while its peer has not posted.
  std::optional<double> matched(const Action& a) {
    const auto mine = posted_.find(key(a));
    const Action p = peer_of(a);
    const auto theirs = posted_.find(key(p));
    if (!mine || !theirs) return std::nullopt;
    const Action& send = a.op == Op::kSendForward || a.op == Op::kSendBackward ? a : p;
    const double across = c_.transfer ? c_.transfer(send.op, send.stage) : 0.0;
    if (!(across >= 0))
      fail(fmt::format("a transfer time of {} for {}", across, to_string(send)));
    return std::max(*mine, *theirs) + across;
  }

  std::optional<double> inputs_ready(int r, const Action& a) {
    double at = 0;
    const auto need = [&](Result what, int stage) {
      const auto t = ready(r, a, what, stage);
      if (t) at = std::max(at, *t);
      return t.has_value();
    };
    bool ok = true;
    if (a.op == Op::kForward && a.stage > 0) ok = need(Result::kActivation, a.stage - 1);
    if (a.op == Op::kBackward || a.op == Op::kBackwardInput) {
      ok = need(Result::kActivation, a.stage);
      if (ok && a.stage + 1 < s_.stages) ok = need(Result::kInputGrad, a.stage + 1);
    }
    if (a.op == Op::kBackwardWeight) {
      if (!results_.count(key(Result::kInputGrad, a.stage, a.microbatch)))
        fail(fmt::format("rank {} runs {} before the input backward of its micro-batch", r,
                         to_string(a)));
      ok = need(Result::kInputGrad, a.stage);
    }
    if (!ok) return std::nullopt;
    return at;
  }

  double cost(const Action& a) const {
    switch (a.op) {
      case Op::kForward: return c_.forward(a.stage);
      case Op::kBackward: return c_.backward_input(a.stage) + c_.backward_weight(a.stage);
      case Op::kBackwardInput: return c_.backward_input(a.stage);
      default: return c_.backward_weight(a.stage);
    }
  }

  void record(int r, const Action& a, double end) {
    const auto once = [&](Result what) {
      if (!results_.emplace(key(what, a.stage, a.microbatch), end))
        fail(fmt::format("rank {} runs {} a second time", r, to_string(a)));
    };
    if (a.op == Op::kForward) {
      once(Result::kActivation);
      t_.peak_in_flight[r] = std::max(t_.peak_in_flight[r], ++in_flight_[r]);
    }
    if (a.op == Op::kBackward || a.op == Op::kBackwardInput) once(Result::kInputGrad);
    if (a.op == Op::kBackward || a.op == Op::kBackwardWeight) {
      once(Result::kWeightGrad);
      --in_flight_[r];
    }
  }

  bool advance(int r) {
    const Step& step = s_.steps[r][pos_[r]];
    if (step.kind == Step::Kind::kTransfers) return advance_transfers(r, step);
    double start = now_[r];
    for (const Action& a : step.actions) {
      const auto t = inputs_ready(r, a);
      if (!t) return false;
      start = std::max(start, *t);
    }
    double took = 0;
    if (step.kind == Step::Kind::kOverlapped)
      took = c_.overlapped ? c_.overlapped(step.actions[0], step.actions[1])
                           : cost(step.actions[0]) + cost(step.actions[1]);
    else
      took = cost(step.actions[0]);
    if (!(took >= 0)) fail(fmt::format("a cost of {} for rank {}'s step {}", took, r, pos_[r]));
    for (const Action& a : step.actions) record(r, a, start + took);
    t_.ranks[r].push_back(Span{pos_[r]++, start, start + took});
    t_.busy[r] += took;
    now_[r] = start + took;
    return true;
  }

  bool advance_transfers(int r, const Step& step) {
    if (posted_step_[r] != pos_[r]) {
      for (const Action& a : step.actions) {
        const bool send = a.op == Op::kSendForward || a.op == Op::kSendBackward;
        const Result made = a.op == Op::kSendForward ? Result::kActivation : Result::kInputGrad;
        if (send && !results_.count(key(made, a.stage, a.microbatch)))
          fail(fmt::format("rank {} posts {} before it computes what it sends", r, to_string(a)));
      }
      for (const Action& a : step.actions)
        if (!posted_.emplace(key(a), now_[r]))
          fail(fmt::format("rank {} posts {} a second time", r, to_string(a)));
      posted_step_[r] = pos_[r];
      for (const Action& a : step.actions) {
        sent_.push_back({r, a});
        wake(s_.stage_rank[peer_of(a).stage]);
      }
    }
    double end = now_[r];
    if (step.wait) {
      for (const Action& a : step.actions) {
        const auto t = matched(a);
        if (!t) return false;
        end = std::max(end, *t);
      }
    }
    t_.ranks[r].push_back(Span{pos_[r]++, now_[r], end});
    now_[r] = end;
    return true;
  }

  std::string why_blocked(int r) const {
    const Step& step = s_.steps[r][pos_[r]];
    std::vector<std::string> waits;
    for (const Action& a : step.actions) {
      const Action want = step.kind == Step::Kind::kTransfers
                              ? peer_of(a)
                              : Action{a.op == Op::kForward ? Op::kRecvForward : Op::kRecvBackward,
                                       a.stage, a.microbatch};
      const Action from = step.kind == Step::Kind::kTransfers ? want : peer_of(want);
      const int peer = s_.stage_rank[from.stage];
      if (posted_.count(key(from))) continue;  // matched: not what it waits for
      int at = -1;
      for (std::size_t i = 0; i < s_.steps[peer].size() && at < 0; ++i)
        for (const Action& b : s_.steps[peer][i].actions)
          if (b == from) at = static_cast<int>(i);
      waits.push_back(at < 0 ? fmt::format("{} of rank {}, which rank {} never posts",
                                           to_string(from), peer, peer)
                             : fmt::format("{} of rank {} (its step {}; it is at step {})",
                                           to_string(from), peer, at, pos_[peer]));
    }
    return fmt::format("rank {} at step {} ({}) waits for {}", r, pos_[r],
                       to_string(step.actions.front()), fmt::join(waits, ", "));
  }

  void finish() {
    for (const auto& [r, a] : sent_) {
      const auto t = matched(a);
      if (!t)
        fail(fmt::format("rank {} posts {}, which rank {} never matches with {}", r, to_string(a),
                         s_.stage_rank[peer_of(a).stage], to_string(peer_of(a))));
      now_[r] = std::max(now_[r], *t);
    }
    for (int st = 0; st < s_.stages; ++st)
      for (int mb = 0; mb < s_.microbatches; ++mb)
        for (const Result what : {Result::kActivation, Result::kInputGrad, Result::kWeightGrad})
          if (!results_.count(key(what, st, mb)))
            fail(fmt::format("stage {} never runs its {} of micro-batch {}", st,
                             what == Result::kActivation ? "forward"
                             : what == Result::kInputGrad ? "input backward"
                                                          : "weight backward",
                             mb));
    t_.makespan = *std::max_element(now_.begin(), now_.end());
  }

  void wake(int r) {
    if (queued_[r]) return;
    queued_[r] = true;
    work_.push_back(r);
  }

  const Schedule& s_;
  const Costs& c_;
  std::deque<int> work_;
  std::vector<bool> queued_;
  std::vector<int> pos_;
  std::vector<double> now_;
  std::vector<int> in_flight_;
  Times results_;
  Times posted_;
  std::vector<int> posted_step_;  // rank -> the step whose transfers it has posted
  std::vector<std::pair<int, Action>> sent_;
  Timeline t_;
};

}  // namespace

double Timeline::bubble_fraction() const {
  double busy_total = 0;
  for (const double b : busy) busy_total += b;
  const double all = makespan * static_cast<double>(busy.size());
  return all > 0 ? 1.0 - busy_total / all : 0.0;
}

Costs unit_costs() {
  return Costs{[](int) { return 1.0; }, [](int) { return 1.0; }, [](int) { return 1.0; }, {}, {}};
}

Timeline simulate(const Schedule& schedule, const Costs& costs) {
  if (!costs.forward || !costs.backward_input || !costs.backward_weight)
    throw Error("[pipeline] simulate: the costs need a forward, an input backward and a weight "
                "backward time");
  return Run(schedule, costs).go();
}

void check(const Schedule& schedule) { simulate(schedule, unit_costs()); }

std::string timeline_text(const Schedule& schedule, const Timeline& timeline, int width) {
  width = std::clamp(width, 8, 1000);
  const double per = timeline.makespan > 0 ? timeline.makespan / width : 1.0;
  std::string out = fmt::format(
      "{}: makespan {:.4g}, bubble {:.1f}% (F forward, B backward, I input backward, W weight "
      "backward, X forward and backward overlapped, . waiting)\n",
      schedule.name, timeline.makespan, 100.0 * timeline.bubble_fraction());
  for (int r = 0; r < schedule.ranks; ++r) {
    std::string row(static_cast<std::size_t>(width), '.');
    for (const Span& span : timeline.ranks[r]) {
      const Step& step = schedule.steps[r][span.step];
      if (step.kind == Step::Kind::kTransfers) continue;
      const char c = step.kind == Step::Kind::kOverlapped ? 'X' : name(step.actions[0].op)[0];
      for (int i = 0; i < width; ++i) {
        const double mid = (i + 0.5) * per;
        if (mid >= span.start && mid < span.end) row[i] = c;
      }
    }
    out += fmt::format("rank {:>3} |{}|\n", r, row);
  }
  return out;
}

}  // namespace shardplan::pipeline
