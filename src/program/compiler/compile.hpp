#pragma once
// From a traced graph to an SPMD program. compile() runs the passes in order:
//   propagate.cpp  every value gets a sharding and remembers where it came from;
//   partition.cpp  per node, the factor axes, the reshards of the operands, the kernel step;
//   fuse.cpp       groups of pointwise kernel steps become one step that runs chunk by chunk;
//   memory.cpp     when each slot is last needed (what to free after each step), peak bytes;
// and program.cpp runs the result (Program::run, the interpreter) and prints it.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../ir/graph.hpp"
#include "shardplan/array.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/detail/sjit_call.hpp"
#include "shardplan/links.hpp"
#include "shardplan/program_cost.hpp"

namespace shardplan::detail {

/// What is known of an input when compiling: its sharding when fixed (in_shardings, or the
/// array's own when it is resharded at call time anyway), and whether it arrives pending.
struct InputSpec {
  std::optional<PartitionSpec> spec;
  Pending pending;
  std::string origin;  // "input 0 (in_shardings)", "argument 'params/w'"
  // Donated (sjit's donate_argnums): the program owns the array and frees it after its last use.
  bool donated = false;
  std::string name;  // for people: "argument 0 'params/w'"
  /// A batch of examples (SjitOptions::batch_argnums): what is computed from it is not moved
  /// between devices of the mesh axes its first dimension is split over.
  bool batch = false;
  /// The array's sharding pads (Uneven::kPad) a dimension its axes do not divide: the program
  /// takes it so, and each op reads that dimension gathered (value_sharding, propagate.hpp).
  bool padded = false;
};

struct CompileSpec {
  Mesh mesh;
  std::vector<InputSpec> inputs;                      // by input index
  std::vector<std::optional<PartitionSpec>> outputs;  // by output position; nullopt: open
  /// The outputs' specs pad a dimension their axes do not divide (SjitOptions::uneven).
  bool pad_outputs = false;
  /// Keep the results of constant steps per executor for the next run (sjit). Off for the eager
  /// one-op programs, which the executor itself caches: they must hold no arrays.
  bool cache_constants = true;
  /// The most bytes of them kept per device (SjitOptions::kept_constant_bytes).
  std::int64_t kept_constant_bytes = kDefaultKeptConstantBytes;
  /// Count constant steps' results in the peak (SjitOptions::count_constants).
  bool count_constants = true;
  /// Fuse groups of pointwise steps (fuse.hpp). Off only to compare with the unfused program
  /// (SjitOptions::fuse).
  bool fuse = true;
  /// Fuse only repetitions into their readers (SjitOptions::eager).
  bool eager = false;
  /// Over processes: each process holds this many consecutive device ids
  /// (Executor::process_of); 0 when one process holds every device. The collectives then
  /// count what they stage to receive from other processes (plan_reshard), and the peak per
  /// device includes it (ProgramCost::peak_bytes).
  int devices_per_process = 0;
  /// The partitioner ranks its candidates by estimated time with these figures, by bytes
  /// received without them.
  std::optional<LinkFigures> links;
};

/// CompileSpec::devices_per_process for a program run on `executor` over `mesh` (0 for none).
int devices_per_process(const Executor* executor, const Mesh& mesh);

using CostReport = ProgramCost;

/// A value's decided layout: its sharding, and the sum still pending over mesh axes (each device
/// of those axes holds a summand: DTensor's Partial).
struct Layout {
  PartitionSpec spec;
  Pending pending;
  /// Why it differs from the propagated sharding (the partitioner's choice), or empty.
  std::string why;
};

/// Where a program keeps a value while it runs.
enum class SlotId : std::int32_t {};
constexpr std::size_t index(SlotId s) { return static_cast<std::size_t>(s); }

/// One kernel of a fused step (fuse.hpp): `args[i] >= 0` is the fused step's input args[i],
/// `args[i] < 0` the result of the group's op -1 - args[i]. With `period` > 0 the op is not run:
/// its result element i is its one operand's element (i / inner) mod period (Primitive::repeat).
struct FusedOp {
  Node local;
  std::vector<int> args;
  std::int64_t period = 0;
  std::int64_t inner = 1;
};

class RunRecord;

struct Step {
  enum class Kind { kKernel, kReshard };
  Kind kind = Kind::kKernel;
  ValueId node{};  // the graph node it computes (kernel) or feeds (reshard)
  Node local;      // kernel: the node with local attributes and shape
  std::vector<SlotId> in;
  SlotId out{};
  TensorType type;                                   // global type of the result
  std::optional<NamedSharding> sharding;             // of the result (always set)
  Pending pending;                                   // kernel result
  std::shared_ptr<const std::vector<Block>> blocks;  // kernel: the result's blocks by device
  /// kernel: their starts, by device. Both are shared by every step of the same result shape
  /// and sharding (a large mesh would otherwise hold a copy per step and device).
  std::shared_ptr<const std::vector<std::vector<std::int64_t>>> offsets;
  std::vector<CollectiveRecord> cost;  // reshard: the collectives it will run (static)
  double flops = 0;                    // kernel: per device (the most of any device)
  bool constant = false;               // depends on no input: run once per executor, then cached
  // kernel: pointwise ops fused into this step, in order (the last computes `out`); empty: `local`
  std::shared_ptr<const std::vector<FusedOp>> fused;
  /// kernel, fused: "fused(add, exp)", its ops' names (the trace's name for the step).
  std::shared_ptr<const std::string> fused_name;
  /// reshard: the decision that asked for it, "for %5: pass factors first: 96 B; runner-up
  /// reduce factors first: 192 B" (the first reader in graph order; "for output 0: ...").
  std::shared_ptr<const std::string> reason;
};

class Program {
 public:
  explicit Program(Mesh mesh) : mesh_(std::move(mesh)) {}
  /// Runs on `executor`: `inputs` in input order (resharded to the compiled input shardings
  /// when they differ). Returns the outputs. The donated inputs are moved out of `inputs` and
  /// released after their last use; when the run throws, those not yet released are put back.
  std::vector<Array> run(const Executor& executor, std::vector<Array>& inputs) const;
  /// As above, for a program without donated inputs.
  std::vector<Array> run(const Executor& executor, const std::vector<Array>& inputs) const {
    std::vector<Array> copy = inputs;
    return run(executor, copy);
  }

  /// The program as text: each value with the layout it is computed in (sharding, pending sum)
  /// and where that came from, each step with the layout it runs with, each reshard with its
  /// collectives, then the cost.
  std::string text() const;
  const std::vector<Step>& steps() const { return steps_; }
  /// Each value's layout as the partitioner decided it (what its step computes).
  const Layout& layout(ValueId v) const { return layouts_[v]; }
  const CostReport& cost() const { return cost_; }
  const std::vector<NamedSharding>& output_shardings() const { return output_shardings_; }
  const std::vector<NamedSharding>& input_shardings() const { return input_shardings_; }
  /// The sum input k arrives pending with (nothing, unless compiled for a pending array).
  const Pending& input_pending(std::size_t k) const { return input_pending_.at(k); }
  const Graph& graph() const { return graph_; }
  /// Where each input is held, by input index (a slot past num_slots(): an input no step reads).
  const std::vector<SlotId>& input_slots() const { return input_slots_; }
  int num_slots() const { return num_slots_; }
  /// Per step: whether it is a constant step whose result is kept for the next run.
  const std::vector<char>& cached_steps() const { return cached_step_; }
  const std::vector<std::vector<SlotId>>& free_after() const { return free_after_; }
  /// Donated inputs no step uses, freed before the first step.
  const std::vector<SlotId>& free_at_start() const { return free_at_start_; }
  /// The bytes per device of each slot as the memory pass counts them (Liveness::slot_bytes).
  const std::vector<std::int64_t>& slot_bytes() const { return slot_bytes_; }
  /// Whether constant steps' results count in the cost's bytes (CompileSpec::count_constants).
  bool counts_constants() const { return counts_constants_; }
  /// What run_record.cpp works out once per program for the memory report (its steps' labels),
  /// shared by copies of the program.
  struct ReportMemo {
    std::once_flag once;
    std::shared_ptr<const void> value;
  };
  ReportMemo& report_memo() const { return shared_->report_memo; }

 private:
  std::string step_text(const Step& st) const;  // text()'s lines of one step
  friend Program compile(const Graph& graph, const CompileSpec& spec);
  // `rec`: what the run records for the debug modes and tests (run_record.hpp), or null.
  std::vector<Array> run_steps(const Executor& executor, std::vector<Array>& inputs,
                               std::vector<Array>& slots, std::vector<char>& moved_in,
                               RunRecord* rec) const;
  // The constant steps' results this executor kept from an earlier run, into `slots`; false
  // when it has none (then keep_constants stores this run's).
  bool take_constants(const Executor& executor, std::vector<Array>& slots, RunRecord* rec) const;
  void keep_constants(const Executor& executor, const std::vector<Array>& slots) const;
  void bind_inputs(std::vector<Array>& inputs, std::vector<Array>& slots,
                   std::vector<char>& moved_in, RunRecord* rec) const;
  void run_kernel_step(const Executor& executor, const Step& st, std::vector<Array>& slots,
                       RunRecord* rec) const;
  void run_collective_step(const Executor& executor, const Step& st, std::vector<Array>& slots,
                           RunRecord* rec) const;
  void run_reshard_step(const Executor& executor, const Step& st, std::vector<Array>& slots,
                        RunRecord* rec) const;
  void note_step(RunRecord& rec, std::size_t s, const std::vector<Array>& slots) const;
  // Appends the collectives step `st` ran (moved from `ran`) to `rec`.
  void note_collectives(RunRecord& rec, const Step& st, std::vector<CollectiveRecord>& ran) const;

  Graph graph_;
  Mesh mesh_;
  ValueMap<PartitionSpec> specs_;  // after propagation
  ValueMap<std::string> origins_;
  ValueMap<Layout> layouts_;  // as the partitioner decided: what the steps run with
  std::vector<Step> steps_;
  int num_slots_ = 0;
  std::vector<SlotId> input_slots_;  // by input index
  std::vector<SlotId> output_slots_;
  std::vector<NamedSharding> input_shardings_;
  std::vector<Pending> input_pending_;
  std::vector<NamedSharding> output_shardings_;
  std::vector<std::vector<SlotId>> free_after_;  // per step: slots no longer needed
  std::vector<SlotId> free_at_start_;            // donated inputs no step uses
  std::vector<std::int64_t> slot_bytes_;         // per slot, as the memory pass counts them
  std::vector<char> input_donated_;              // by input index
  bool any_donated_ = false;
  // Results of the constant steps, per executor (they never change).
  struct ConstantCache {
    std::mutex mu;
    std::map<const void*, std::vector<std::pair<SlotId, Array>>> by_executor;
  };
  // What copies of the program share, in one allocation (an eager op compiles a program per
  // shape: each allocation is made, and later freed, per call).
  struct Shared {
    ConstantCache constants;
    ReportMemo report_memo;
  };
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  std::vector<SlotId> constant_slots_;
  std::vector<char> cached_step_;  // per step: its result is in the constant cache
  CostReport cost_;
  bool counts_constants_ = true;
};

/// Called with every program compile() makes, when set (tests check each program's text against
/// its steps). Not for library code. Returns the observer it replaces.
using CompileObserver = void (*)(const Program& program);
CompileObserver set_compile_observer(CompileObserver observer);

/// Propagates shardings through `graph` and partitions it. Annotation nodes carry the spec their
/// name resolved to while tracing (none: left to propagation). Throws SpecError for a constraint
/// that names an unknown axis or does not divide.
Program compile(const Graph& graph, const CompileSpec& spec);

}  // namespace shardplan::detail
