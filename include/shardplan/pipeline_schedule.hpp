#pragma once

// Pipeline schedules as data (issue 42): the actions each pipeline rank runs, in order, for one
// training step over micro-batches; generators for the schedules the big stacks use; a check that
// a schedule completes; and a simulator that times it from each action's cost. One runner (the
// runtime's, train-plan's simulation) executes any schedule, whichever generator or file made it.
//
// Stages are numbered along the data flow: stage 0 takes the micro-batch, the last stage computes
// the loss. A rank holds one stage (GPipe, 1F1B, ZB-H1), v stages round-robin (interleaved 1F1B:
// stage c*ranks + r on rank r) or two in a V (DualPipeV: stages r and 2*ranks-1-r on rank r).
// docs/pipeline.md has the sources of each schedule and the semantics of transfers.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace shardplan::pipeline {

/// What an action does. Compute: a stage's forward on a micro-batch; its whole backward; or the
/// backward split as the zero-bubble schedules split it, the gradient of the stage's input first
/// (what the previous stage waits for) and the gradient of its weights later. Transfers: the
/// activation a forward sends to the next stage, the gradient a backward sends to the previous one,
/// and their receives.
enum class Op : std::uint8_t {
  kForward,
  kBackward,
  kBackwardInput,
  kBackwardWeight,
  kSendForward,
  kRecvForward,
  kSendBackward,
  kRecvBackward,
};

/// "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B" (torch.distributed.pipelining's
/// names of the same actions).
std::string_view name(Op op);
bool is_compute(Op op);

/// One action. For a send, `stage` is the stage whose result is sent; for a receive, the stage
/// that receives it (SEND_F of stage s matches RECV_F of stage s+1; SEND_B of stage s matches
/// RECV_B of stage s-1, for the same micro-batch).
struct Action {
  Op op = Op::kForward;
  int stage = 0;
  int microbatch = 0;
  bool operator==(const Action&) const = default;
};

/// "2F5": stage 2's forward of micro-batch 5 (torch's spelling: stage, action, micro-batch).
std::string to_string(const Action& a);

/// One step of a rank, run after the previous one ends.
///  - kCompute: one compute action.
///  - kOverlapped: two compute actions run as one (DualPipe's overlapped forward and backward of
///    two micro-batches, F&B); its time is Costs::overlapped's.
///  - kTransfers: transfers posted together. `wait`: the rank waits until every one of them is
///    matched by its peer's (DualPipe's batched isend/irecv and wait); otherwise they are posted
///    and the rank goes on: a receive's data is waited for by the compute that needs it, a send
///    is complete by the end of the schedule (torch.distributed.pipelining's runtime).
struct Step {
  enum class Kind : std::uint8_t { kCompute, kOverlapped, kTransfers };
  Kind kind = Kind::kCompute;
  std::vector<Action> actions;
  bool wait = false;
};

/// A schedule: the steps of each rank, in order.
struct Schedule {
  std::string name;
  int ranks = 0;
  int stages = 0;
  int microbatches = 0;
  std::vector<int> stage_rank;            // stage -> the rank that holds it
  std::vector<std::vector<Step>> steps;   // rank -> its steps, in order
};

/// GPipe (Huang et al. 2019): every forward, then every backward. Any number of micro-batches.
Schedule gpipe(int ranks, int microbatches);
/// 1F1B (PipeDream-Flush; Narayanan et al. 2021): rank r runs ranks-r-1 forwards, then one
/// forward and one backward in turn. Needs microbatches >= ranks.
Schedule one_f_one_b(int ranks, int microbatches);
/// Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021) with `virtual_stages` stages per rank.
/// Needs microbatches to be a multiple of ranks (Megatron's condition).
Schedule interleaved_1f1b(int ranks, int virtual_stages, int microbatches);
/// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B with each backward split, rank
/// r running its weight gradients r steps late. Needs microbatches >= ranks.
Schedule zero_bubble_h1(int ranks, int microbatches);
/// DualPipeV (DeepSeek's DualPipe cut in half, Sea AI Lab): 2*ranks stages in a V, rank r holding
/// stages r and 2*ranks-1-r, as deepseek-ai/DualPipe's dualpipev.py steps it, with its batched
/// transfers waited at each step. Needs microbatches >= 2*ranks.
Schedule dualpipe_v(int ranks, int microbatches);

/// A schedule by name: "gpipe", "1f1b", "interleaved" (virtual_stages > 1), "zbh1", "dualpipev".
/// An unknown name, or virtual_stages other than 1 for a schedule without them, is an Error.
Schedule make_schedule(std::string_view name, int ranks, int microbatches, int virtual_stages = 1);
/// The names make_schedule takes.
const std::vector<std::string>& schedule_names();

/// The schedule with the transfers a stage boundary between ranks needs, where it has none: each
/// send posted (not waited) right after the compute that produces it, each receive posted right
/// before the compute that needs it (torch.distributed.pipelining's lowering). Generators other
/// than dualpipe_v return their schedules lowered this way.
Schedule with_transfers(Schedule compute_only);

/// A schedule from torch.distributed.pipelining's CSV (PipelineScheduleMulti._dump_csv): a row per
/// rank, a cell per action ("2F5", "1SEND_F0"), empty cells idle; each stage on the rank of the
/// row it is in. Rows of compute actions only get with_transfers(); rows with their own transfers
/// keep them, each posted and not waited. Checked (check()) before it is returned; a malformed
/// cell is an IoError naming `origin`, the line and the column. FSDP's UNSHARD / RESHARD /
/// REDUCE_GRAD are refused (not modelled).
Schedule parse_csv(std::string_view text, std::string_view origin);
/// The compute actions as such a CSV (torch's "compute_only" format): overlapped pairs become
/// two cells, transfers are left out.
std::string to_csv(const Schedule& schedule);

/// The cost of each action, in seconds (or any unit).
struct Costs {
  std::function<double(int stage)> forward;
  std::function<double(int stage)> backward_input;
  std::function<double(int stage)> backward_weight;
  /// A transfer across the boundary after `stage` (forward) or before it (backward); zero when
  /// unset.
  std::function<double(Op op, int stage)> transfer;
  /// Two overlapped compute actions (DualPipe's F&B); their sum when unset.
  std::function<double(const Action&, const Action&)> overlapped;
};
/// Every forward, input backward and weight backward 1; a whole backward 2; transfers free.
Costs unit_costs();

/// One step as it ran in the simulation.
struct Span {
  int step = 0;         // index into the rank's steps
  double start = 0;     // when it began (after waiting for its inputs)
  double end = 0;
};

struct Timeline {
  std::vector<std::vector<Span>> ranks;  // rank -> one span per step
  double makespan = 0;                   // the end of the last step or transfer
  std::vector<double> busy;              // rank -> time spent computing
  /// rank -> the most micro-batch stages whose forward ran and whose backward (all of it) has
  /// not: the activations the rank holds at its peak, in stage-micro-batch units.
  std::vector<int> peak_in_flight;
  /// The share of ranks x makespan not spent computing.
  double bubble_fraction() const;
};

/// Runs the schedule on the costs. Throws Error when it cannot complete: a transfer without its
/// match, a compute whose input no earlier step of its rank produces or receives, an action run
/// twice or never, or ranks waiting on each other (each blocked rank named with its step).
Timeline simulate(const Schedule& schedule, const Costs& costs);
/// simulate() with unit costs: the check that the schedule completes, run before a schedule runs.
void check(const Schedule& schedule);

/// The schedule's steps, a line per rank ("rank 0: 0F0 0F1 [0F2&1B0] {RECV_B 0B1} ...").
std::string to_text(const Schedule& schedule);
/// The timeline as text, a row per rank, `width` characters for the makespan: each compute
/// action's stage digit (forward) or letter, '.' where the rank waits.
std::string timeline_text(const Schedule& schedule, const Timeline& timeline, int width = 96);

}  // namespace shardplan::pipeline
