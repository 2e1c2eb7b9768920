// Async TP's pairs: a tensor-parallel collective and the products it feeds or that feed it, found
// by the values they read and write in the compiled program, never from the options.
#include "tp_overlap.hpp"

#include <algorithm>
#include <iterator>
#include <optional>
#include <vector>

#include "../program/ir/primitives.hpp"

namespace shardplan::train {
namespace {

bool is_product(const detail::Step& st) {
  if (st.kind != detail::Step::Kind::kKernel || st.constant || st.fused) return false;
  const detail::TimeBound b = st.local.op->time_bound;
  return b == detail::TimeBound::kMatmul || b == detail::TimeBound::kMatmulFp8;
}

bool over_model_axes(const CollectiveRecord& c, const AxisNames& model) {
  return !c.axes.empty() && std::all_of(c.axes.begin(), c.axes.end(), [&](const std::string& a) {
    return std::find(model.begin(), model.end(), a) != model.end();
  });
}

// The dimensions of the resharded value that the all-gather over `axes` gathers: split over one
// of them in the value's layout, over none in the reshard's result.
std::vector<int> gathered_dims(const detail::Program& program, const detail::Step& st,
                               const std::vector<std::string>& axes) {
  const PartitionSpec& from = program.layout(st.node).spec;
  const PartitionSpec& to = st.sharding->spec();
  std::vector<int> dims;
  const auto has = [&](const AxisNames& d) {
    return std::any_of(axes.begin(), axes.end(), [&](const std::string& a) {
      return std::find(d.begin(), d.end(), a) != d.end();
    });
  };
  for (int d = 0; d < from.size(); ++d) {
    if (has(from[d]) && (d >= to.size() || !has(to[d]))) dims.push_back(d);
  }
  return dims;
}

// Whether product step `reader` reads slot `slot` (as its operand k) along none of `dims`
// contracted: the product splits by the gathered chunks.
bool splits_along(const detail::Program& program, const detail::Step& reader, detail::SlotId slot,
                  const std::vector<int>& dims) {
  const detail::Node& n = program.graph().nodes[detail::index(reader.node)];
  std::vector<Shape> shapes;
  for (const detail::ValueId v : n.operands) {
    shapes.push_back(program.graph().nodes[detail::index(v)].type.shape);
  }
  const detail::OpFactors f = n.op->factors(n, shapes);
  for (std::size_t k = 0; k < reader.in.size() && k < f.operands.size(); ++k) {
    if (reader.in[k] != slot) continue;
    const bool contracted = std::any_of(dims.begin(), dims.end(), [&](int d) {
      const int factor = f.operands[k][static_cast<std::size_t>(d)];
      return factor >= 0 && f.kind(factor) == detail::FactorKind::kReduce;
    });
    if (!contracted && !dims.empty()) return true;
  }
  return false;
}

}  // namespace

std::map<TpOverlapKind, std::int64_t> tp_overlap_pairs(const detail::Program& program,
                                                       const MemoryTimeline& timeline,
                                                       const AxisNames& model) {
  const std::vector<detail::Step>& steps = program.steps();
  std::size_t end = steps.size();
  for (const PhaseStart& p : timeline.phases) {
    if (p.phase == StepPhase::kUpdate) end = std::min(end, p.step);
  }
  // Per slot, the steps that read it and those that write it, ascending (a slot is reused once
  // its value is freed): a value's readers are those before the slot's next write.
  const auto slots = static_cast<std::size_t>(program.num_slots());
  std::vector<std::vector<std::size_t>> reads(slots), writes(slots);
  for (std::size_t j = 0; j < steps.size(); ++j) {
    if (detail::index(steps[j].out) < slots) writes[detail::index(steps[j].out)].push_back(j);
    for (const detail::SlotId in : steps[j].in) {
      if (detail::index(in) < slots) reads[detail::index(in)].push_back(j);
    }
  }
  std::map<TpOverlapKind, std::int64_t> pairs;
  for (std::size_t i = 0; i < end; ++i) {
    const detail::Step& st = steps[i];
    if (st.kind != detail::Step::Kind::kReshard || st.constant || st.cost.size() != 1) continue;
    const CollectiveRecord& c = st.cost.front();
    if (c.max_bytes_in() == 0 || !over_model_axes(c, model)) continue;
    TpOverlapKind kind{.collective = CollectiveOn{c.kind, c.axes, false}, .bytes = c.max_bytes_in()};
    double flops = 0;
    bool float8 = false;
    if (c.kind == CollectiveKind::kAllGather && detail::index(st.out) < slots) {
      // Its readers, until the slot is written again.
      const std::vector<std::size_t>& w = writes[detail::index(st.out)];
      const auto next = std::upper_bound(w.begin(), w.end(), i);
      const std::size_t until = next == w.end() ? steps.size() : *next;
      const std::vector<int> dims = gathered_dims(program, st, c.axes);
      for (const std::size_t j : reads[detail::index(st.out)]) {
        if (j <= i || j >= until) continue;
        const detail::Step& r = steps[j];
        if (!is_product(r) || !splits_along(program, r, st.out, dims)) continue;
        flops += r.flops;
        float8 = float8 || r.local.op->time_bound == detail::TimeBound::kMatmulFp8;
      }
    } else if (c.kind == CollectiveKind::kReduceScatter &&
               detail::index(st.in.front()) < slots) {
      // The step that wrote its operand.
      const std::vector<std::size_t>& w = writes[detail::index(st.in.front())];
      const auto at = std::lower_bound(w.begin(), w.end(), i);
      if (at != w.begin() && is_product(steps[*std::prev(at)])) {
        const detail::Step& producer = steps[*std::prev(at)];
        flops = producer.flops;
        float8 = producer.local.op->time_bound == detail::TimeBound::kMatmulFp8;
      }
    }
    if (flops <= 0) continue;
    kind.flops = static_cast<std::int64_t>(flops);
    kind.float8 = float8;
    ++pairs[kind];
  }
  return pairs;
}

}  // namespace shardplan::train
