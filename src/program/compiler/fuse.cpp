#include "fuse.hpp"
#include "memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "../ir/primitive.hpp"
#include "../ir/primitives.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

bool fusible(const Step& st) {
  // A pending result may join: fusion computes every device's values as the steps would, so a
  // reader that takes it as it is (a linear op carrying the sum) reads the same summands.
  return st.kind == Step::Kind::kKernel && st.local.op->pointwise && !st.constant;
}

std::int64_t local_numel(const Step& st) { return st.local.type.shape.numel(); }

// The local shape of every slot: a step's result block, an input's block.
std::vector<Shape> slot_shapes(const Graph& g, const Partitioned& p) {
  std::vector<Shape> shapes(static_cast<std::size_t>(p.num_slots));
  for (const Node& n : g.nodes) {
    if (!n.is(prim::input)) continue;
    const auto k = static_cast<std::size_t>(n.attr<InputAttrs>().index);
    if (k >= p.input_slots.size() || index(p.input_slots[k]) >= shapes.size()) continue;
    shapes[index(p.input_slots[k])] = p.input_shardings[k].shard_shape(n.type.shape);
  }
  for (const Step& st : p.steps) {
    shapes[index(st.out)] = st.kind == Step::Kind::kKernel
                                ? st.local.type.shape
                                : st.sharding->shard_shape(st.type.shape);
  }
  return shapes;
}

// How step `st` repeats its operand (Primitive::repeat); period 0 when it does not.
Repetition repetition(const Step& st, const std::vector<Shape>& shapes) {
  if (st.kind != Step::Kind::kKernel || st.local.op->repeat == nullptr || st.in.size() != 1) {
    return {};
  }
  return st.local.op->repeat(st.local, shapes[index(st.in[0])]);
}

// The steps after fusion, in order: each step not fused into another, a group's last step
// replaced by one fused step running the group's members (`members[t]`, in program order) on
// the group's outside inputs. Moves the steps out of `p`.
std::vector<Step> grouped_steps(Partitioned& p, const std::vector<int>& group,
                                const std::vector<std::vector<int>>& members,
                                const std::vector<Repetition>& period) {
  std::vector<Step> steps;
  for (std::size_t t = 0; t < p.steps.size(); ++t) {
    if (group[t] != static_cast<int>(t)) continue;  // computed inside a later fused step
    if (members[t].size() == 1) {
      steps.push_back(std::move(p.steps[t]));
      continue;
    }
    Step fused = p.steps[t];
    fused.in.clear();
    fused.flops = 0;
    auto ops = std::make_shared<std::vector<FusedOp>>();
    std::vector<std::pair<SlotId, int>> made;  // slot -> position of the op computing it
    for (const int m : members[t]) {
      const Step& st = p.steps[static_cast<std::size_t>(m)];
      const Repetition& r = period[static_cast<std::size_t>(m)];
      FusedOp op{.local = st.local, .period = r.period, .inner = r.inner};
      for (const SlotId in : st.in) {
        const auto inside =
            std::find_if(made.begin(), made.end(), [&](const auto& e) { return e.first == in; });
        if (inside != made.end()) {
          op.args.push_back(-1 - inside->second);
          continue;
        }
        const auto known = std::find(fused.in.begin(), fused.in.end(), in);
        op.args.push_back(static_cast<int>(known - fused.in.begin()));
        if (known == fused.in.end()) fused.in.push_back(in);
      }
      fused.flops += st.flops;
      made.emplace_back(st.out, static_cast<int>(ops->size()));
      ops->push_back(std::move(op));
    }
    std::string name = "fused(";
    for (std::size_t i = 0; i < ops->size(); ++i) {
      if (i > 0) name += ", ";
      name += (*ops)[i].local.op->name;
    }
    fused.fused_name = std::make_shared<const std::string>(name + ")");
    fused.fused = std::move(ops);
    steps.push_back(std::move(fused));
  }
  return steps;
}

}  // namespace

namespace {

// Per slot: how many steps read it (an output counts twice: kept, never fused away), the step
// making it (-1: none), the last step reading it (kKept for outputs and inputs), the bytes of
// its block.
struct SlotFacts {
  static constexpr int kKept = std::numeric_limits<int>::max();
  std::vector<int> uses, producer, last;
  std::vector<std::int64_t> bytes;
};
SlotFacts slot_facts(const Partitioned& p, const std::vector<Shape>& shapes) {
  const auto num_slots = static_cast<std::size_t>(p.num_slots);
  SlotFacts f{std::vector<int>(num_slots, 0), std::vector<int>(num_slots, -1),
              std::vector<int>(num_slots, -1), std::vector<std::int64_t>(num_slots, 0)};
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    for (const SlotId in : p.steps[s].in) {
      ++f.uses[index(in)];
      f.last[index(in)] = static_cast<int>(s);
    }
    f.producer[index(p.steps[s].out)] = static_cast<int>(s);
  }
  for (const SlotId out : p.output_slots) {
    f.uses[index(out)] += 2;
    f.last[index(out)] = SlotFacts::kKept;
  }
  for (const SlotId in : p.input_slots) {
    if (index(in) < num_slots) f.last[index(in)] = SlotFacts::kKept;
  }
  for (const Step& st : p.steps) {
    f.bytes[index(st.out)] = byte_size(shapes[index(st.out)], st.type.dtype);
  }
  return f;
}

// Fused, step s's group (its members `group_s`) is computed at t: an operand whose last reader
// is in the group then lives until t instead of the group's result. Where other steps run in
// between, that is only done when those operands are no larger than the result: else a chain
// of sums of values made far apart (a gradient summed over micro-batches) would keep every
// addend alive until the last sum. Small constant steps in between do not count: they run once
// per executor, then are kept (memory.hpp). True when joining would keep more alive.
bool keeps_more_alive(const Partitioned& p, const SlotFacts& f, const std::vector<int>& group,
                      const std::vector<int>& group_s, int s, int t) {
  bool others = false;
  for (int m = s + 1; m < t && !others; ++m) {
    const Step& st = p.steps[static_cast<std::size_t>(m)];
    others = group[static_cast<std::size_t>(m)] != t &&
             !(st.constant && f.bytes[index(st.out)] <= kMaxCachedConstantBytes);
  }
  if (!others) return false;
  std::int64_t dying = 0;
  std::set<SlotId> seen;
  for (const int m : group_s) {
    for (const SlotId x : p.steps[static_cast<std::size_t>(m)].in) {
      const int from = f.producer[index(x)];
      const bool inside = std::find(group_s.begin(), group_s.end(), from) != group_s.end();
      const bool dies_here =
          std::find(group_s.begin(), group_s.end(), f.last[index(x)]) != group_s.end();
      if (!inside && dies_here && seen.insert(x).second) dying += f.bytes[index(x)];
    }
  }
  return dying > f.bytes[index(p.steps[static_cast<std::size_t>(s)].out)];
}

}  // namespace

void fuse_pointwise(const Graph& g, Partitioned& p, bool repeats_only) {
  // A fused step is made of two steps or more (a group of one is kept as it is): with fewer
  // there is nothing to fuse (a one-op program).
  if (p.steps.size() < 2) return;
  const std::vector<Shape> shapes = slot_shapes(g, p);
  std::vector<Repetition> period(p.steps.size());
  for (std::size_t s = 0; s < p.steps.size(); ++s) period[s] = repetition(p.steps[s], shapes);
  const SlotFacts f = slot_facts(p, shapes);

  // group[s]: the step whose fused kernel computes step s (itself when not fused into another).
  std::vector<int> group(p.steps.size());
  for (std::size_t s = 0; s < group.size(); ++s) group[s] = static_cast<int>(s);
  std::vector<std::vector<int>> members(p.steps.size());
  for (std::size_t t = 0; t < p.steps.size(); ++t) {
    members[t] = {static_cast<int>(t)};
    const Step& consumer = p.steps[t];
    if (!fusible(consumer)) continue;
    // Repetitions (a broadcast scalar) join first: they run inside the group, not between.
    std::vector<SlotId> ins = consumer.in;
    std::stable_partition(ins.begin(), ins.end(), [&](SlotId in) {
      const int s = f.producer[index(in)];
      return s >= 0 && period[static_cast<std::size_t>(s)].period > 0;
    });
    // An operand read through an optimization barrier is made by a kernel of its own, as XLA
    // fuses nothing across one.
    std::vector<SlotId> barred;
    for (std::size_t k = 0; k < consumer.in.size() && k < consumer.local.operands.size(); ++k) {
      if (g[consumer.local.operands[k]].op->barrier) barred.push_back(consumer.in[k]);
    }
    for (const SlotId in : ins) {
      const int s = f.producer[index(in)];
      if (s < 0 || f.uses[index(in)] != 1 || group[static_cast<std::size_t>(s)] != s) continue;
      if (std::find(barred.begin(), barred.end(), in) != barred.end()) continue;
      const Step& made = p.steps[static_cast<std::size_t>(s)];
      const bool joins =
          (fusible(made) && !repeats_only) || period[static_cast<std::size_t>(s)].period > 0;
      if (!joins || local_numel(made) != local_numel(consumer)) continue;
      if (keeps_more_alive(p, f, group, members[static_cast<std::size_t>(s)], s,
                           static_cast<int>(t))) {
        continue;
      }
      for (const int m : members[static_cast<std::size_t>(s)]) {
        group[static_cast<std::size_t>(m)] = static_cast<int>(t);
        members[t].push_back(m);
      }
      members[static_cast<std::size_t>(s)].clear();
    }
    std::sort(members[t].begin(), members[t].end());  // program order: operands first
  }

  p.steps = grouped_steps(p, group, members, period);
}

namespace {

// run_fused's intermediates: a buffer of the thread's, kept between calls and never zeroed (each
// op writes every element of its chunk before the next op reads it). A fresh zeroed vector per
// call cost a memset of up to ops x 32 KiB per fused step, and under AddressSanitizer an mmap,
// page faults and an munmap (buffers over 128 KiB bypass its size classes): 60% of the LLaMA
// example's time there (perf, 2026-11-30). A call inside another on the same thread (a kernel
// waiting on a parallel region may run another task) takes a buffer of its own.
class FusedScratch {
 public:
  explicit FusedScratch(std::size_t bytes) : took_(!in_use_) {
    if (took_) in_use_ = true;
    std::vector<std::byte>& buffer = took_ ? kept_ : own_;
    if (buffer.size() < bytes) buffer.resize(bytes);
    data_ = buffer.data();
  }
  ~FusedScratch() {
    if (took_) in_use_ = false;
  }
  FusedScratch(const FusedScratch&) = delete;
  FusedScratch& operator=(const FusedScratch&) = delete;
  std::byte* data() const { return data_; }

 private:
  static inline thread_local std::vector<std::byte> kept_;
  static inline thread_local bool in_use_ = false;
  bool took_;
  std::vector<std::byte> own_;
  std::byte* data_ = nullptr;
};

}  // namespace

void run_fused(const std::vector<FusedOp>& ops, const std::vector<ConstBlock>& in,
               const MutBlock& out) {
  const std::int64_t n = out.shape.numel();
  // Every input block holds as many elements as the result, or as the period of the repetition
  // that reads it: a kernel would otherwise read past its end.
  for (const FusedOp& op : ops) {
    for (const int a : op.args) {
      if (a < 0) continue;
      const std::int64_t want = op.period > 0 ? op.period : n;
      const std::int64_t have = in[static_cast<std::size_t>(a)].shape.numel();
      if (have != want) {
        throw SpecError(fmt::format(
            "[fused kernel] {} reads a block of {} elements where {} are needed (result of {})",
            op.local.op->name, have, want, n));
      }
    }
  }
  // One chunk of each intermediate (all ops but the last), 8 bytes an element at most.
  const auto chunk_bytes = static_cast<std::size_t>(std::min(n, kFusedChunk)) * 8;
  const FusedScratch scratch((ops.size() - 1) * chunk_bytes);
  auto scratch_of = [&](std::size_t op) { return scratch.data() + op * chunk_bytes; };
  const Shape full{kFusedChunk}, tail{n % kFusedChunk};
  const std::vector<std::int64_t> zero{0};
  std::vector<ConstBlock> blocks;
  for (std::int64_t c = 0; c < n; c += kFusedChunk) {
    const Shape& shape = n - c >= kFusedChunk ? full : tail;
    const std::int64_t len = shape[0];
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const FusedOp& op = ops[i];
      const MutBlock o =
          i + 1 == ops.size()
              ? MutBlock{out.data + c * static_cast<std::int64_t>(size_of(out.dtype)), shape,
                         out.dtype}
              : MutBlock{scratch_of(i), shape, op.local.type.dtype};
      if (op.period > 0) {  // elements c .. c + len of the repeated operand
        const ConstBlock& from = in[static_cast<std::size_t>(op.args[0])];
        const auto size = static_cast<std::int64_t>(size_of(from.dtype));
        std::byte* to = o.data;
        if (op.period == 1 || op.inner > 1) {  // runs of one element: copied, then doubled
          // A scalar is one run over the whole result.
          const std::int64_t inner = op.period == 1 ? n : op.inner;
          for (std::int64_t e = c; e < c + len;) {
            const std::int64_t run = std::min(inner - e % inner, c + len - e);
            const std::int64_t at = (e / inner) % op.period;
            std::memcpy(to, from.data + at * size, static_cast<std::size_t>(size));
            for (std::int64_t have = 1; have < run; have *= 2) {
              std::memcpy(to + have * size, to,
                          static_cast<std::size_t>(std::min(have, run - have) * size));
            }
            to += run * size;
            e += run;
          }
          continue;
        }
        std::int64_t at = c % op.period;
        for (std::int64_t left = len; left > 0;) {
          const std::int64_t run = std::min(op.period - at, left);
          std::memcpy(to, from.data + at * size, static_cast<std::size_t>(run * size));
          to += run * size;
          left -= run;
          at = 0;
        }
        continue;
      }
      blocks.clear();
      for (const int a : op.args) {
        if (a >= 0) {
          const ConstBlock& b = in[static_cast<std::size_t>(a)];
          blocks.push_back(
              {b.data + c * static_cast<std::int64_t>(size_of(b.dtype)), shape, b.dtype});
        } else {
          const auto j = static_cast<std::size_t>(-1 - a);
          blocks.push_back({scratch_of(j), shape, ops[j].local.type.dtype});
        }
      }
      op.local.op->kernel(KernelArgs{op.local, blocks, o, zero});
    }
  }
}

}  // namespace shardplan::detail
