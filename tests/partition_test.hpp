#pragma once
// What the partitioner tests share (partition_test.cpp, partition_test_*.cpp).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "../src/program/compiler/compile.hpp"
#include "../src/program/compiler/partition.hpp"
#include "../src/program/frontend/trace.hpp"
#include "../src/program/ir/primitives.hpp"
#include "shardplan/ops.hpp"
#include "test_util.hpp"

namespace shardplan {
// For gtest's messages: "sum over [x]".
inline void PrintTo(const Pending& p, std::ostream* os) {
  *os << to_string(p.op) << " over [" << fmt::format("{}", fmt::join(p.axes, ", ")) << "]";
}
}  // namespace shardplan

namespace shardplan::detail {
namespace {

using ::testing::ElementsAre;
using Fn = std::function<std::vector<Array>(const std::vector<Array>&)>;

// An input of a traced function: its type, the sharding it arrives in, and the pending sum it
// arrives as (each device holding a summand), if any. `positive`: values in [1, 5] (a divisor).
struct Arg {
  TensorType type;
  PartitionSpec spec;
  Pending pending;
  bool positive = false;
};

inline Pending sum_over(const std::string& axis) { return Pending{ReduceOp::kSum, {axis}}; }
// A replicated input that is a sum pending over 'x'.
inline Arg pending(Shape s, DType dtype = DType::kF32) {
  return Arg{{std::move(s), dtype}, P(), sum_over("x")};
}
// A replicated input, nothing pending.
inline Arg whole(Shape s, DType dtype = DType::kF32) { return Arg{{std::move(s), dtype}, P(), {}}; }

// Multiples of 1/4 in [-4, 4] (bool: true for the positive ones): small sums of them are exact
// in every float dtype, so a sum reduced in another order is the same value.
inline Tensor quarters(const Shape& shape, DType dtype, std::uint64_t seed, bool positive) {
  Tensor t(shape, dtype);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = std::floor(random_uniform(seed, static_cast<std::uint64_t>(i)) * 33) / 4 - 4;
    if (positive) v = std::abs(v) + 1;
    if (dtype == DType::kBool) {
      t.bytes()[i] = static_cast<std::byte>(v > 0 ? 1 : 0);
    } else {
      t.set(i, v);
    }
  }
  return t;
}

inline double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.get(i) - b.get(i)));
  return m;
}

// `f` traced on inputs of `args`, compiled on `mesh` (without fusion) with output shardings
// `outs` (open where nullopt or missing); run on inputs made as the args say.
class Case {
 public:
  Case(Mesh mesh, std::vector<Arg> args, Fn f, std::vector<std::optional<PartitionSpec>> outs = {},
       bool fuse = false)
      : exec_(static_cast<int>(mesh.size())),
        mesh_(std::move(mesh)),
        args_(std::move(args)),
        f_(std::move(f)),
        fuse_(fuse),
        prog_(compile_traced(std::move(outs))) {}

  const Program& prog() const { return prog_; }
  const Graph& graph() const { return prog_.graph(); }
  const std::vector<Step>& steps() const { return prog_.steps(); }

  // The nth node (in graph order) that applies `op`.
  ValueId node(const Primitive& op, int nth = 0) const {
    for (std::size_t i = 0; i < graph().size(); ++i) {
      if (graph().nodes[i].is(op) && nth-- == 0) return value_id(i);
    }
    ADD_FAILURE() << "no node applies " << op.name << "\n" << graph().to_string();
    return ValueId{0};
  }
  // The node of input k.
  ValueId input(int k) const {
    for (std::size_t i = 0; i < graph().size(); ++i) {
      const Node& n = graph().nodes[i];
      if (n.is(prim::input) && n.attr<InputAttrs>().index == k) return value_id(i);
    }
    ADD_FAILURE() << "no input " << k;
    return ValueId{0};
  }
  ValueId output(std::size_t k) const { return graph().outputs.at(k); }

  // The kernel steps that compute `v`.
  std::vector<const Step*> kernels(ValueId v) const { return of(v, Step::Kind::kKernel); }
  // The one kernel step that computes `v` (a test failure and nullptr when there is not one).
  const Step* kernel(ValueId v) const {
    const auto k = kernels(v);
    if (k.size() == 1) return k[0];
    ADD_FAILURE() << k.size() << " kernel steps compute " << value_name(v) << "\n" << text();
    return nullptr;
  }
  // The reshard steps of `v`, in order.
  std::vector<const Step*> reshards(ValueId v) const { return of(v, Step::Kind::kReshard); }

  // Every collective the reshard steps run, in order, as "kind %value bytes" (the most bytes a
  // device receives); local slices move nothing and are left out.
  std::vector<std::string> collectives() const {
    std::vector<std::string> out;
    for (const Step& st : steps()) {
      if (st.kind != Step::Kind::kReshard) continue;
      for (const CollectiveRecord& rec : st.cost) {
        if (rec.kind == CollectiveKind::kSlice) continue;
        out.push_back(
            fmt::format("{} {} {}", to_string(rec.kind), value_name(st.node), rec.max_bytes_in()));
      }
    }
    return out;
  }
  std::string collective(std::string_view kind, ValueId v, std::int64_t bytes) const {
    return fmt::format("{} {} {}", kind, value_name(v), bytes);
  }

  // The graph and the program's text, for failure messages.
  std::string text() const { return graph().to_string() + "\n" + prog_.text(); }

  // Runs the program and compares each output with `f` run on one device on the inputs' values
  // (a pending input's value is the sum of its summands); every output arrives in the program's
  // output sharding with nothing pending.
  void expect_values(double tolerance = 1e-5) const {
    const Executor one = Executor::process_local(1);
    std::vector<std::pair<std::string, std::int64_t>> axes;
    for (const std::string& a : mesh_.axis_names()) axes.emplace_back(a, 1);
    const Mesh single(axes, 1);
    std::vector<Array> ins, ones;
    for (std::size_t k = 0; k < args_.size(); ++k) {
      ins.push_back(make_input(k));
      ones.push_back(device_put(ins.back().to_host(), NamedSharding(single, P()), one));
    }
    const std::vector<Array> got = prog_.run(exec_, ins);
    const std::vector<Array> want = f_(ones);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      SCOPED_TRACE(fmt::format("output {}", k));
      EXPECT_FALSE(got[k].is_pending());
      EXPECT_TRUE(got[k].sharding() == prog_.output_shardings()[k])
          << got[k].sharding().spec().to_string();
      const Tensor g = got[k].to_host();
      const Tensor w = want[k].to_host();
      ASSERT_EQ(g.shape(), w.shape());
      ASSERT_EQ(g.dtype(), w.dtype());
      EXPECT_LE(max_diff(g, w), tolerance) << text();
    }
  }

 private:
  Program compile_traced(std::vector<std::optional<PartitionSpec>> outs) const {
    TraceContext ctx(exec_, mesh_);
    std::vector<Array> results;
    {
      TraceScope scope(&ctx);
      std::vector<Array> xs;
      for (const Arg& a : args_) xs.push_back(ctx.add_argument(a.type));
      results = f_(xs);
    }
    const Graph g = ctx.finish(results);
    CompileSpec spec{.mesh = mesh_, .outputs = std::move(outs), .fuse = fuse_};
    for (std::size_t k = 0; k < args_.size(); ++k) {
      spec.inputs.push_back(InputSpec{.spec = args_[k].spec,
                                      .pending = args_[k].pending,
                                      .origin = fmt::format("input {}", k)});
    }
    return compile(g, spec);
  }

  std::vector<const Step*> of(ValueId v, Step::Kind kind) const {
    std::vector<const Step*> out;
    for (const Step& st : steps()) {
      if (st.kind == kind && st.node == v) out.push_back(&st);
    }
    return out;
  }

  // Input k: device d's summand, or the value put on every device.
  Array make_input(std::size_t k) const {
    const Arg& a = args_[k];
    const NamedSharding s(mesh_, a.spec);
    const std::uint64_t seed = 1000 * (k + 1);
    if (a.pending.empty()) {
      return device_put(quarters(a.type.shape, a.type.dtype, seed, a.positive), s, exec_);
    }
    std::vector<std::shared_ptr<Buffer>> bufs(static_cast<std::size_t>(exec_.num_devices()));
    for (const int d : mesh_.devices()) {
      const Tensor t = quarters(s.shard_shape(a.type.shape), a.type.dtype,
                                seed + static_cast<std::uint64_t>(d) + 1, a.positive);
      auto b = std::make_shared<Buffer>(exec_.allocate(d, t.nbytes()));
      std::memcpy(b->data(), t.bytes(), static_cast<std::size_t>(t.nbytes()));
      bufs[static_cast<std::size_t>(d)] = b;
    }
    return Array::from_buffers(exec_, a.type.shape, a.type.dtype, s, bufs, a.pending);
  }

  Executor exec_;
  Mesh mesh_;
  std::vector<Arg> args_;
  Fn f_;
  bool fuse_ = false;
  Program prog_;
};

inline Mesh x2() { return Mesh::parse("x:2", 2); }

// ---- Where a pending sum is reduced -------------------------------------------------------------
// The pending inputs are f32[3, 5] (60 bytes): no dimension divides by 2, so no pointwise node can
// run split over x (split_pointwise, tested on its own below) and a reduction is an all-reduce.

// `op`'s one node runs on the pending inputs `reduced` all-reduced (60 bytes each, the program's
// only collectives, each input's one reshard), with nothing pending.
inline void expect_reduced_first(const Case& c, const Primitive& op,
                                 const std::vector<int>& reduced) {
  const Step* k = c.kernel(c.node(op));
  ASSERT_NE(k, nullptr);
  EXPECT_TRUE(k->pending.empty()) << c.text();
  std::vector<std::string> want;
  for (const int i : reduced) {
    const ValueId in = c.input(i);
    want.push_back(c.collective("all_reduce", in, 60));
    const auto r = c.reshards(in);
    ASSERT_EQ(r.size(), 1u) << c.text();
    EXPECT_THAT(k->in, ::testing::Contains(r[0]->out)) << "the kernel reads the reduced copy";
  }
  EXPECT_THAT(c.collectives(), ::testing::ElementsAreArray(want)) << c.text();
  c.expect_values();
}

}  // namespace
}  // namespace shardplan::detail
