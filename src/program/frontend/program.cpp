// The program: Program::run (the interpreter: binds the inputs, runs each step on the
// executor, frees what is no longer needed) and its text.
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "../../profiler/debug_modes.hpp"
#include "../../profiler/recorder.hpp"
#include "../ir/array_access.hpp"
#include "../compiler/compile.hpp"
#include "../compiler/fuse.hpp"
#include "../ir/primitive.hpp"
#include "../ir/primitives.hpp"
#include "../analysis/program_profile.hpp"
#include "../analysis/run_record.hpp"
#include "shardplan/detail/agreement.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan {

std::string_view name(StepPhase phase) {
  switch (phase) {
    case StepPhase::kForward:
      return "forward";
    case StepPhase::kBackward:
      return "backward";
    case StepPhase::kUpdate:
      break;
  }
  return "update";
}

std::string ProgramCost::to_string() const {
  const double most_flops = flops.empty() ? 0 : *std::max_element(flops.begin(), flops.end());
  const std::int64_t most_peak =
      peak_bytes.empty() ? 0 : *std::max_element(peak_bytes.begin(), peak_bytes.end());
  std::string s = fmt::format("flops per device: {:.4g}\n", most_flops);
  if (bytes_by_kind.empty()) {
    s += "communication: none\n";
  } else {
    for (const auto& [kind, bytes] : bytes_by_kind) {
      s += fmt::format("{}: {} per device\n", shardplan::to_string(kind), format_bytes(bytes));
    }
  }
  s += fmt::format("peak memory per device: {}\n", format_bytes(most_peak));
  return s;
}

namespace detail {

std::vector<Array> Program::run(const Executor& executor, std::vector<Array>& inputs) const {
  std::vector<Array> slots(static_cast<std::size_t>(num_slots_));
  // Donated inputs moved into their slots as they are: a failed run gives back those still there.
  std::vector<char> moved_in;
  if (any_donated_) moved_in.assign(input_slots_.size(), 0);
  // Recorded only for a debug mode alive or a test's observer (run_record.hpp).
  const bool comm = profiler::detail::comm_on();
  const bool memory = profiler::detail::memory_on();
  const RunObserver observer = run_observer();
  std::optional<RunRecord> record;
  const bool counters = profiler::detail::memory_on_trace();
  if (comm || memory || counters || observer != nullptr) {
    // The profiler's trace names what is live at each run's peak too.
    record.emplace(executor, mesh_, slots.size(), steps_.size(), memory || counters);
    if (counters) record->write_counters(cost_.timeline);
  }
  std::vector<Array> outs;
  try {
    outs = run_steps(executor, inputs, slots, moved_in, record ? &*record : nullptr);
  } catch (...) {
    for (std::size_t k = 0; k < moved_in.size(); ++k) {
      if (!moved_in[k]) continue;
      Array& held = slots[index(input_slots_[k])];
      if (held.valid()) inputs[k] = std::move(held);
    }
    throw;
  }
  if (record) {
    record->complete = true;
    if (observer != nullptr) observer(*this, *record);
    report_run(*this, *record, comm, memory);
  }
  return outs;
}

void Program::bind_inputs(std::vector<Array>& inputs, std::vector<Array>& slots,
                          std::vector<char>& moved_in, RunRecord* rec) const {
  for (std::size_t k = 0; k < input_slots_.size(); ++k) {
    if (index(input_slots_[k]) >= slots.size()) continue;
    Array& a = inputs.at(k);
    const NamedSharding& want = input_shardings_[k];
    const bool same =
        a.pending() == input_pending_[k] && a.sharding().is_equivalent_to(want, a.shape().rank());
    Array& slot = slots[index(input_slots_[k])];
    if (same && input_donated_[k]) {
      slot = std::move(a);
      moved_in[k] = 1;
    } else if (same) {
      slot = a;
    } else {
      ReshardResult r = reshard(a, want);
      slot = std::move(r.array);
      if (rec != nullptr) {
        for (CollectiveRecord& c : r.steps) rec->input_reshards.push_back(std::move(c));
      }
      if (input_donated_[k]) a = Array();  // its resharded copy is what the program uses
    }
    if (rec != nullptr) rec->bind(input_slots_[k], slot, RunRecord::kStart);
  }
}

bool Program::take_constants(const Executor& executor, std::vector<Array>& slots,
                             RunRecord* rec) const {
  if (constant_slots_.empty()) return false;
  std::lock_guard<std::mutex> lock(shared_->constants.mu);
  const auto it = shared_->constants.by_executor.find(executor.identity());
  if (it == shared_->constants.by_executor.end()) return false;
  for (const auto& [slot, a] : it->second) {
    slots[index(slot)] = a;
    if (rec != nullptr) rec->bind(slot, a, 0);  // held from the first step's sample on
  }
  if (rec != nullptr) rec->took_constants = true;
  return true;
}

void Program::keep_constants(const Executor& executor, const std::vector<Array>& slots) const {
  if (constant_slots_.empty()) return;
  std::vector<std::pair<SlotId, Array>> made;
  for (const SlotId slot : constant_slots_) made.emplace_back(slot, slots[index(slot)]);
  std::lock_guard<std::mutex> lock(shared_->constants.mu);
  if (shared_->constants.by_executor.size() > 16) shared_->constants.by_executor.clear();
  shared_->constants.by_executor.emplace(executor.identity(), std::move(made));
}

std::vector<Array> Program::run_steps(const Executor& executor, std::vector<Array>& inputs,
                                      std::vector<Array>& slots, std::vector<char>& moved_in,
                                      RunRecord* rec) const {
  bind_inputs(inputs, slots, moved_in, rec);
  if (rec != nullptr) {
    rec->sample_start();
    for (const SlotId f : free_at_start_) rec->drop(f, slots[index(f)], RunRecord::kStart);
  }
  for (const SlotId f : free_at_start_) slots[index(f)] = Array();
  // Constant steps ran on this executor before: take their results.
  const bool have_constants = take_constants(executor, slots, rec);
  // Over processes, a step that fails on one process must not leave the others waiting in the
  // next reshard: the failing process skips to the next communicating step (or the end), where
  // every process learns who failed and throws. Each collective of a reshard over processes
  // begins with that agreement (its buffers allocated, nothing exchanged yet: see
  // prepare_then_agree in collectives.cpp), so a reshard step costs no round trip more; the
  // failing process joins it in place of the reshard (whose input it may not have). A reshard
  // step runs a collective exactly when its static cost lists one (st.cost), on every process.
  const bool spans = !executor.holds_all(mesh_.devices());
  std::exception_ptr failed;
  for (std::size_t s = 0; s < steps_.size(); ++s) {
    const Step& st = steps_[s];
    if (have_constants && cached_step_[s] != 0) {  // taken from the cache
      // What only it read is freed all the same (a constant that is not kept, made again: held
      // to the end of the run otherwise). It reads no input: nothing donated is freed here.
      if (rec != nullptr) rec->sample(s);
      if (failed) continue;
      for (const SlotId f : free_after_[s]) {
        if (rec != nullptr) rec->drop(f, slots[index(f)], static_cast<int>(s));
        slots[index(f)] = Array();
      }
      continue;
    }
    // A shard_map collective communicates as a reshard does.
    const bool communicates =
        st.kind == Step::Kind::kReshard || st.local.op->collective != nullptr;
    if (failed && !communicates) continue;
    if (rec != nullptr) rec->drop(st.out, slots[index(st.out)], static_cast<int>(s) - 1);
    if (failed && st.kind == Step::Kind::kKernel) {
      if (!st.cost.empty()) distributed::detail::agree(failed);  // throws, on every process
    } else if (st.kind == Step::Kind::kReshard) {
      if (!failed) {
        run_reshard_step(executor, st, slots, rec);
      } else if (!st.cost.empty()) {
        distributed::detail::agree(failed);  // throws, on every process
      }
    } else if (communicates) {
      // As a reshard: a failure on any process is agreed inside the collective and thrown on
      // every process, not held as this process's own failure until the next agreement.
      run_collective_step(executor, st, slots, rec);
    } else {
      try {
        run_kernel_step(executor, st, slots, rec);
      } catch (...) {
        if (!spans) throw;
        failed = std::current_exception();
      }
    }
    // After a failure nothing more is freed: donated inputs still held go back to the caller,
    // as when the run stops at the failure in one process.
    if (!failed) {
      if (rec != nullptr) note_step(*rec, s, slots);
      for (const SlotId f : free_after_[s]) slots[index(f)] = Array();
    }
  }
  // A failure after the last collective: agreed on here.
  if (spans) {
    distributed::detail::agree(failed);
  } else if (failed) {
    std::rethrow_exception(failed);
  }
  if (!have_constants) keep_constants(executor, slots);
  std::vector<Array> outs;
  for (const SlotId s : output_slots_) outs.push_back(slots[index(s)]);
  return outs;
}

namespace {

// With more local devices than threads: each thread takes a run of consecutive devices, and the
// devices of a run that hold the same block of `shared` (operand 1: a replicated weight, so the
// same values) go to the op's group kernel together; a device alone, or a group the kernel
// declines, runs `one` device by device. False (nothing run) when there are not more devices
// than threads.
template <class BlocksOf, class OutOf, class One>
bool run_grouped(const Executor& executor, const Mesh& mesh, const Step& st, const Array& shared,
                 const BlocksOf& blocks_of, const OutOf& out_of, const One& one,
                 std::vector<std::int64_t>* spans) {
  std::vector<int> mine;
  for (const int d : mesh.devices()) {
    if (executor.is_local(d)) mine.push_back(d);
  }
  const std::size_t threads = static_cast<std::size_t>(std::max(1, executor.concurrency()));
  if (mine.size() <= threads) return false;
  std::vector<int> leaders;  // the first device of each thread's run
  for (std::size_t t = 0; t < threads; ++t) leaders.push_back(mine[t * mine.size() / threads]);
  const auto starts = [&](int d) {
    std::vector<std::int64_t> v;
    for (const DimSlice& s : shared.block(d)) v.push_back(s.start);
    return v;
  };
  executor.run(leaders, [&](int leader) {
    const auto t = static_cast<std::size_t>(std::find(leaders.begin(), leaders.end(), leader) -
                                            leaders.begin());
    // The run's devices ordered by their block of `shared` (stable: mesh order within a block).
    std::vector<std::pair<std::vector<std::int64_t>, int>> run;
    for (std::size_t i = t * mine.size() / threads; i < (t + 1) * mine.size() / threads; ++i) {
      run.emplace_back(starts(mine[i]), mine[i]);
    }
    std::stable_sort(run.begin(), run.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t i = 0; i < run.size();) {
      std::size_t j = i;
      while (j < run.size() && run[j].first == run[i].first) ++j;
      std::vector<std::vector<ConstBlock>> in_blocks;
      std::vector<MutBlock> out_blocks;
      std::vector<KernelArgs> args;
      in_blocks.reserve(j - i);
      out_blocks.reserve(j - i);
      for (std::size_t k = i; k < j; ++k) {
        const int d = run[k].second;
        in_blocks.push_back(blocks_of(d));
        out_blocks.push_back(out_of(d));
        args.push_back(KernelArgs{st.local, in_blocks.back(), out_blocks.back(),
                                  (*st.offsets)[static_cast<std::size_t>(d)]});
      }
      const std::int64_t began = spans != nullptr ? profiler::detail::stamp() : 0;
      if (args.size() < 2 || !st.local.op->group_kernel(args, 1)) {
        for (std::size_t k = i; k < j; ++k) one(run[k].second);
      } else if (spans != nullptr) {  // the group's devices ran together: each for the whole
        const std::int64_t ended = profiler::detail::stamp();
        for (std::size_t k = i; k < j; ++k) {
          (*spans)[2 * static_cast<std::size_t>(run[k].second)] = began;
          (*spans)[2 * static_cast<std::size_t>(run[k].second) + 1] = ended;
        }
      }
      i = j;
    }
  });
  return true;
}

}  // namespace

// One kernel step: a result buffer per local device, the primitive's kernel on each device's
// blocks, the result array.
void Program::run_kernel_step(const Executor& executor, const Step& st, std::vector<Array>& slots,
                              RunRecord* rec) const {
  if (st.local.op->collective != nullptr) return run_collective_step(executor, st, slots, rec);
  if (st.local.op->view && !st.fused) {  // the operand's bytes, another shape and sharding
    if (st.local.op->check != nullptr) {
      const Array& in = slots[index(st.in[0])];
      executor.run(mesh_.devices(), [&](int d) {
        st.local.op->check(st.local, ConstBlock{in.shard(d).data(), in.shard_shape(), in.dtype()},
                           (*st.offsets)[static_cast<std::size_t>(d)]);
      }, /*parallel=*/false);
    }
    slots[index(st.out)] =
        Array::from_buffers(executor, st.type.shape, st.type.dtype, *st.sharding, st.blocks,
                            ArrayAccess::buffers(slots[index(st.in[0])]), st.pending);
    return;
  }
  const Shape& local = st.local.type.shape;
  const std::int64_t bytes = byte_size(local, st.type.dtype);
  std::vector<std::shared_ptr<Buffer>> out(static_cast<std::size_t>(executor.num_devices()));
  for (const int d : mesh_.devices()) {
    if (!executor.is_local(d)) continue;  // another process runs it
    out[static_cast<std::size_t>(d)] = std::make_shared<Buffer>(executor.allocate(d, bytes));
  }
  std::vector<const Array*> ins;
  for (const SlotId in : st.in) ins.push_back(&slots[index(in)]);
  // Steps of a few KiB run inline: waking the pool would cost more than the work.
  const bool parallel = bytes * static_cast<std::int64_t>(mesh_.devices().size()) > (64 << 10);
  const auto blocks_of = [&](int d) {
    std::vector<ConstBlock> in_blocks;
    in_blocks.reserve(ins.size());
    for (const Array* a : ins) {
      in_blocks.push_back(ConstBlock{a->shard(d).data(), a->shard_shape(), a->dtype()});
    }
    return in_blocks;
  };
  const auto out_of = [&](int d) {
    return MutBlock{out[static_cast<std::size_t>(d)]->data(), local, st.type.dtype};
  };
  const auto run_one = [&](int d) {
    const std::vector<ConstBlock> in_blocks = blocks_of(d);
    const MutBlock out_block = out_of(d);
    if (st.fused) {
      run_fused(*st.fused, in_blocks, out_block);
    } else {
      st.local.op->kernel(
          KernelArgs{st.local, in_blocks, out_block, (*st.offsets)[static_cast<std::size_t>(d)]});
    }
  };
  // With the profiler on: each device's start and end (program_profile.hpp). Run inline, the
  // devices run one after another on this thread, so one clock read ends a device's span and
  // begins the next one's (a read is most of what an event costs: docs/performance.md).
  const bool profiling = profiler::detail::on();
  thread_local std::vector<std::int64_t> this_threads_spans;
  std::vector<std::int64_t>& spans = this_threads_spans;  // the pool's threads write it too
  std::int64_t step_began = 0, last = 0;
  if (profiling) {
    spans.assign(2 * static_cast<std::size_t>(executor.num_devices()), 0);
    step_began = last = profiler::detail::stamp();
  }
  const auto one = [&](int d) {
    const std::int64_t began = !profiling ? 0 : parallel ? profiler::detail::stamp() : last;
    run_one(d);
    if (profiling) {
      spans[2 * static_cast<std::size_t>(d)] = began;
      spans[2 * static_cast<std::size_t>(d) + 1] = profiler::detail::stamp();
      if (!parallel) last = spans[2 * static_cast<std::size_t>(d) + 1];
    }
  };
  const bool grouped = parallel && !st.fused && st.local.op->group_kernel != nullptr &&
                       ins.size() > 1 &&
                       run_grouped(executor, mesh_, st, *ins[1], blocks_of, out_of, one,
                                   profiling ? &spans : nullptr);
  if (!grouped) executor.run(mesh_.devices(), one, parallel);
  if (profiling) {
    profile_kernel_step(executor, mesh_, graph_, st, spans, step_began,
                        parallel ? profiler::detail::stamp() : last, parallel);
  }
  slots[index(st.out)] = Array::from_buffers(executor, st.type.shape, st.type.dtype, *st.sharding,
                                             st.blocks, std::move(out), st.pending);
}

// A collective inside shard_map: the operand's per-device values seen as one array (its blocks),
// resharded or permuted across devices, the blocks that gives taken as the result's values.
void Program::run_collective_step(const Executor& executor, const Step& st,
                                  std::vector<Array>& slots, RunRecord* rec) const {
  const Array& in = slots[index(st.in[0])];
  const CollectivePlan plan = st.local.op->collective(st.local, {in.shard_shape(), in.dtype()});
  const Array view =
      Array::from_buffers(executor, plan.view, in.dtype(), NamedSharding(mesh_, plan.from),
                          ArrayAccess::buffers(in), plan.pending);
  const bool profiling = profiler::detail::on();
  const std::int64_t began = profiling ? profiler::detail::stamp() : 0;
  Array moved;
  std::vector<CollectiveRecord> ran;
  std::vector<StepSpan> spans;
  if (plan.permute_axis.empty()) {
    ReshardResult r = profiling ? reshard_timed(view, NamedSharding(mesh_, plan.to),
                                                &profiler::detail::stamp, spans)
                                : reshard(view, NamedSharding(mesh_, plan.to));
    moved = std::move(r.array);
    ran = std::move(r.steps);
    if (profiling) {
      profile_reshard_step(executor, mesh_, graph_, st, ran, spans, began,
                           profiler::detail::stamp());
    }
  } else {
    CollectiveRecord permuted;
    moved = permute(view, plan.permute_axis, plan.pairs, rec != nullptr ? &permuted : nullptr);
    if (rec != nullptr) ran.push_back(std::move(permuted));
    if (profiling) {
      profile_reshard_step(executor, mesh_, graph_, st, st.cost, spans, began,
                           profiler::detail::stamp());
    }
  }
  if (rec != nullptr) note_collectives(*rec, st, ran);
  slots[index(st.out)] = Array::from_buffers(executor, st.type.shape, st.type.dtype, *st.sharding,
                                             st.blocks, ArrayAccess::buffers(moved), st.pending);
}

// A reshard step: its collectives, timed when the profiler is on.
void Program::run_reshard_step(const Executor& executor, const Step& st, std::vector<Array>& slots,
                               RunRecord* rec) const {
  const bool profiling = profiler::detail::on();
  const std::int64_t began = profiling ? profiler::detail::stamp() : 0;
  std::vector<StepSpan> spans;
  ReshardResult r =
      profiling
          ? reshard_timed(slots[index(st.in[0])], *st.sharding, &profiler::detail::stamp, spans)
          : reshard(slots[index(st.in[0])], *st.sharding);
  slots[index(st.out)] = std::move(r.array);
  if (profiling) {
    profile_reshard_step(executor, mesh_, graph_, st, r.steps, spans, began,
                         profiler::detail::stamp());
  }
  if (rec != nullptr) note_collectives(*rec, st, r.steps);
}

// Step s ran: its result is held, sampled, then what it read last let go (a view's first operand,
// whose buffers it is, before the sample: for the per-value count; the bytes held, each buffer
// once, are the same either way. keep_alive's other operands are held at the sample.)
void Program::note_step(RunRecord& rec, std::size_t s, const std::vector<Array>& slots) const {
  const Step& st = steps_[s];
  const bool view = st.kind == Step::Kind::kKernel && st.local.op->view && !st.fused;
  const auto viewed = [&](SlotId f) { return view && f == st.in[0]; };
  const int at = static_cast<int>(s);
  rec.bind(st.out, slots[index(st.out)], at);
  for (const SlotId f : free_after_[s]) {
    if (viewed(f)) rec.drop(f, slots[index(f)], at - 1);
  }
  rec.sample(s);
  for (const SlotId f : free_after_[s]) {
    if (!viewed(f)) rec.drop(f, slots[index(f)], at);
  }
}

void Program::note_collectives(RunRecord& rec, const Step& st,
                               std::vector<CollectiveRecord>& ran) const {
  const auto s = static_cast<std::size_t>(&st - steps_.data());
  for (CollectiveRecord& c : ran) rec.collectives.push_back(RanCollective{s, std::move(c)});
}

namespace {

// "pending sum over data, model".
std::string pending_text(const Pending& pending) {
  return fmt::format("pending {} over {}", shardplan::to_string(pending.op),
                     fmt::join(pending.axes, ", "));
}

// "P('x', None)", with " pending sum over data, model" when a sum is pending.
std::string layout_text(const PartitionSpec& spec, const Pending& pending) {
  if (pending.empty()) return spec.to_string();
  return fmt::format("{} {}", spec.to_string(), pending_text(pending));
}

}  // namespace

std::string Program::text() const {
  std::string s = fmt::format("program on {} ({} steps)\n", mesh_.to_string(), steps_.size());
  for (std::size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    const ValueId id = value_id(i);
    std::vector<std::string> operands;
    for (const ValueId o : n.operands) operands.push_back(value_name(o));
    std::string head = n.is(prim::input)
                           ? fmt::format("input {}", n.attr<InputAttrs>().index)
                           : fmt::format("{}({})", n.op->name, fmt::join(operands, ", "));
    if (n.is(prim::sharding_annotation)) {
      head += fmt::format(" '{}'", n.attr<AnnotationAttrs>().name);
    }
    // The layout the value is computed in; where the partitioner chose another than the
    // propagation's, why, and what was propagated.
    const Layout& at = layouts_[id];
    const std::string origin = at.why.empty() ? origins_[id]
                                              : fmt::format("{} (propagated {}: {})", at.why,
                                                            specs_[id].to_string(), origins_[id]);
    s += fmt::format("  {:>4} = {:<32} {:<16} {:<24} <- {}\n", value_name(id), head,
                     to_string(n.type), layout_text(at.spec, at.pending), origin);
  }
  s += "steps:\n";
  for (const Step& st : steps_) s += step_text(st);
  s += cost_.to_string();
  return s;
}

// A step's lines of text(): "kernel %3 = exp on blocks [4, 8] in P('x')" (and a shard_map's
// collectives), or "reshard %2 -> P(): all_gather ... [the decision that inserted it]".
std::string Program::step_text(const Step& st) const {
  std::string s;
  if (st.kind == Step::Kind::kKernel) {
    std::string what(st.local.op->name);
    if (st.fused) {
      std::vector<std::string_view> names;
      for (const FusedOp& op : *st.fused) names.push_back(op.local.op->name);
      what = fmt::format("fused({})", fmt::join(names, ", "));
    }
    s += fmt::format("  kernel  {} = {} on blocks {}{} in {}\n", value_name(st.node), what,
                     st.local.type.shape.to_string(),
                     st.pending.empty() ? "" : fmt::format(" ({})", pending_text(st.pending)),
                     st.sharding->spec().to_string());
    for (const auto& rec : st.cost) {  // a shard_map collective's
      s += fmt::format("          {}: {}\n", value_name(st.node), rec.to_string());
    }
    return s;
  }
  for (std::size_t r = 0; r < st.cost.size(); ++r) {
    s += fmt::format("  reshard {} -> {}: {}{}\n", value_name(st.node),
                     st.sharding->spec().to_string(), st.cost[r].to_string(),
                     r == 0 && st.reason ? fmt::format("  [{}]", *st.reason) : "");
  }
  return s;
}

}  // namespace detail
}  // namespace shardplan
