// DualPipeV: the steps of deepseek-ai/DualPipe's dualpipev.py (DualPipeV.step, eight phases), its
// transfers included: each chunk appends its receives before and its sends after, and every
// chunk and weight step first posts what was appended and waits for all of it (batched isend /
// irecv, then wait). With unit costs the bubble is the published (PP/2-1)(F&B+B-3W)
// (docs/pipeline.md).
#include <fmt/format.h>

#include <array>
#include <deque>
#include <utility>

#include "shardplan/error.hpp"
#include "shardplan/pipeline_schedule.hpp"

namespace shardplan::pipeline {

namespace {

// One rank's steps, built as dualpipev.py steps: phase 0 is stage r (the V's way down), phase 1
// stage 2*ranks-1-r (its way up, ending in the loss on rank 0).
class DualPipeVRank {
 public:
  DualPipeVRank(int ranks, int rank) : rank_(rank), first_(rank == 0), last_(rank == ranks - 1) {
    stage_ = {rank, 2 * ranks - 1 - rank};
  }

  std::vector<Step> steps(int ranks, int microbatches) {
    const int r = rank_;
    for (int i = 0; i < (ranks - r - 1) * 2; ++i) forward_chunk(0);  // 1: nF0
    recv_forward(0);                                                  // 2: nF0F1
    for (int i = 0; i < r + 1; ++i) {
      forward_chunk(0, false, false);
      recv_forward(0);
      forward_chunk(1, true, !last_ || i < r);
      send_forward(0);
    }
    for (int i = 0; i < ranks - r - 1; ++i) {  // 3: nB1W1F1, zero bubble
      backward_chunk(1, true);
      recv_forward(1);
      weight_chunk();
      forward_chunk(1, false, true);
    }
    for (int i = 0; i < microbatches - 2 * ranks + r + 1; ++i) {  // 4: nF0B1F1B0
      if (i == 0 && last_) {  // not overlapped: a smaller bubble (dualpipev.py's note)
        forward_chunk(0, false, false);
        send_forward(1);
        backward_chunk(1, false, true, false);
        send_forward(0);
        send_backward(1);
      } else {
        forward_backward_chunk(0, 1, i != 0);
      }
      forward_backward_chunk(1, 0, true);
    }
    for (int i = 0; i < ranks - r - 1; ++i) {  // 5: nB1F1B0
      backward_chunk(1, false);
      forward_backward_chunk(1, 0, true);
    }
    bool zb = false;  // 6: nB1B0, the second half split for zero bubble
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) zb = true;
      backward_chunk(1, zb);
      if (i == (r + 1) / 2 && r % 2 == 0) zb = true;
      backward_chunk(0, zb);
    }
    for (int i = 0; i < ranks - r - 1; ++i) {  // 7: nWB0
      weight_chunk();
      backward_chunk(0, true);
    }
    for (int i = 0; i < r + 1; ++i) weight_chunk();  // 8: nW
    commit();
    if (!weights_.empty() || forwards_[0] != microbatches || forwards_[1] != microbatches ||
        backwards_[0] != microbatches || backwards_[1] != microbatches)
      throw Error(fmt::format("[pipeline] dualpipev: rank {} did not step every micro-batch "
                              "once (an error in the generator)",
                              r));
    return std::move(out_);
  }

 private:
  // The rank's own transfers are skipped where dualpipev.py skips them: the input of stage 0,
  // the loss's stage, and the turn of the V on the last rank (one rank holds both sides).
  void recv_forward(int ph) {
    if ((first_ && ph == 0) || (last_ && ph == 1)) return;
    pending_.push_back(Action{Op::kRecvForward, stage_[ph], recv_f_[ph]++});
  }
  void send_forward(int ph) {
    if ((first_ && ph == 1) || (last_ && ph == 0)) return;
    pending_.push_back(Action{Op::kSendForward, stage_[ph], send_f_[ph]++});
  }
  void recv_backward(int ph) {
    if ((first_ && ph == 1) || (last_ && ph == 0)) return;
    pending_.push_back(Action{Op::kRecvBackward, stage_[ph], recv_b_[ph]++});
  }
  void send_backward(int ph) {
    if ((first_ && ph == 0) || (last_ && ph == 1)) return;
    pending_.push_back(Action{Op::kSendBackward, stage_[ph], send_b_[ph]++});
  }
  void commit() {
    if (pending_.empty()) return;
    out_.push_back(Step{Step::Kind::kTransfers, std::move(pending_), true});
    pending_.clear();
  }
  Action forward(int ph) { return Action{Op::kForward, stage_[ph], forwards_[ph]++}; }
  Action backward(int ph, bool zero_bubble) {
    const Action a{zero_bubble ? Op::kBackwardInput : Op::kBackward, stage_[ph], backwards_[ph]++};
    if (zero_bubble) weights_.push_back(Action{Op::kBackwardWeight, a.stage, a.microbatch});
    return a;
  }
  void forward_chunk(int ph, bool recv = true, bool send = true) {
    if (recv) recv_forward(ph);
    commit();
    out_.push_back(Step{Step::Kind::kCompute, {forward(ph)}, false});
    if (send) send_forward(ph);
  }
  void backward_chunk(int ph, bool zero_bubble, bool recv = true, bool send = true) {
    if (recv) recv_backward(ph);
    commit();
    out_.push_back(Step{Step::Kind::kCompute, {backward(ph, zero_bubble)}, false});
    if (send) send_backward(ph);
  }
  void forward_backward_chunk(int f_ph, int b_ph, bool recv_f) {
    if (recv_f) recv_forward(f_ph);
    recv_backward(b_ph);
    commit();
    const Action f = forward(f_ph);
    const Action b = backward(b_ph, false);
    out_.push_back(Step{Step::Kind::kOverlapped, {f, b}, false});
    send_forward(f_ph);
    send_backward(b_ph);
  }
  void weight_chunk() {  // the oldest deferred weight gradient (dualpipev.py's FIFO)
    commit();
    out_.push_back(Step{Step::Kind::kCompute, {weights_.front()}, false});
    weights_.pop_front();
  }

  int rank_;
  bool first_;
  bool last_;
  std::array<int, 2> stage_{};
  std::array<int, 2> forwards_{}, backwards_{};
  std::array<int, 2> recv_f_{}, send_f_{}, recv_b_{}, send_b_{};
  std::deque<Action> weights_;
  std::vector<Action> pending_;
  std::vector<Step> out_;
};

}  // namespace

Schedule dualpipe_v(int ranks, int microbatches) {
  if (ranks < 1 || ranks > 4096)
    throw Error(fmt::format("[pipeline] dualpipev: the pipeline has {} ranks; it needs 1 to 4096",
                            ranks));
  if (microbatches < 2 * ranks || microbatches > 1'000'000)
    throw Error(fmt::format("[pipeline] dualpipev: {} micro-batches on {} ranks; DualPipeV needs "
                            "at least 2 x ranks = {} (and at most 1000000)",
                            microbatches, ranks, 2 * ranks));
  Schedule s{"dualpipev", ranks, 2 * ranks, microbatches, {}, {}};
  for (int stage = 0; stage < 2 * ranks; ++stage)
    s.stage_rank.push_back(stage < ranks ? stage : 2 * ranks - 1 - stage);
  for (int r = 0; r < ranks; ++r) s.steps.push_back(DualPipeVRank(ranks, r).steps(ranks, microbatches));
  return s;
}

}  // namespace shardplan::pipeline
