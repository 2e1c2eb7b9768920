#pragma once
// What the partitioner's search tests share (partition_search_test.cpp, partition_ilp_test.cpp):
// random small programs and the least cost over every assignment of their candidates.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../src/program/compiler/compile.hpp"
#include "../src/program/compiler/partition_choose.hpp"
#include "../src/program/frontend/trace.hpp"
#include "shardplan/ops.hpp"

namespace shardplan::detail::search {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ULL + 1) {}
  int below(int n) {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return static_cast<int>(s_ % static_cast<std::uint64_t>(n));
  }

 private:
  std::uint64_t s_;
};

// A random program: three inputs f32[8, 8] (a sum pending over the first axis, split by rows
// over the last, split by columns over the last), then `ops` random ops (neg, scale, add, exp,
// transpose, matmul, a constraint by rows or columns) on earlier values. With `tree`, each value
// is read once at most (the ops read values nothing has read yet). Every value nothing reads is
// an output.
struct Built {
  Graph graph;
  CompileSpec spec;
  std::string text;
};

inline Built random_program(const Mesh& mesh, Rng& rng, int ops, bool tree) {
  const Executor exec = Executor::process_local(static_cast<int>(mesh.size()));
  TraceContext ctx(exec, mesh);
  const std::string first = mesh.axis_names().front();
  const std::string last = mesh.axis_names().back();
  std::vector<Array> values;
  std::vector<int> reads;
  std::vector<std::string> trace;
  {
    TraceScope scope(&ctx);
    for (int k = 0; k < 3; ++k) {
      values.push_back(ctx.add_argument(TensorType{{8, 8}, DType::kF32}));
      reads.push_back(0);
    }
    const auto pick = [&]() -> int {
      std::vector<int> open;
      for (std::size_t i = 0; i < values.size(); ++i) {
        if (!tree || reads[i] == 0) open.push_back(static_cast<int>(i));
      }
      if (open.empty()) return -1;
      const int i = open[static_cast<std::size_t>(rng.below(static_cast<int>(open.size())))];
      ++reads[static_cast<std::size_t>(i)];
      return i;
    };
    for (int n = 0; n < ops; ++n) {
      const int code = rng.below(7);
      const int a = pick();
      if (a < 0) break;
      const Array& x = values[static_cast<std::size_t>(a)];
      Array r;
      if (code == 2 || code == 5) {
        const int b = pick();
        if (b < 0) break;
        const Array& y = values[static_cast<std::size_t>(b)];
        r = code == 2 ? x + y : matmul(x, y);
        trace.push_back(fmt::format("v{} = {}(v{}, v{})", values.size(), code == 2 ? "add" : "matmul",
                                    a, b));
      } else {
        static constexpr const char* kNames[] = {"neg", "scale", "", "exp", "transpose", "", "constrain"};
        switch (code) {
          case 0:
            r = neg(x);
            break;
          case 1:
            r = x * 2.0;
            break;
          case 3:
            r = exp(x);
            break;
          case 4:
            r = transpose(x, {1, 0});
            break;
          default:
            r = rng.below(2) == 0 ? with_sharding_constraint(x, P(first))
                                  : with_sharding_constraint(x, P(nullptr, last));
            break;
        }
        trace.push_back(fmt::format("v{} = {}(v{})", values.size(), kNames[code], a));
      }
      values.push_back(r);
      reads.push_back(0);
    }
  }
  std::vector<Array> outputs;
  for (std::size_t i = 3; i < values.size(); ++i) {
    if (reads[i] == 0) outputs.push_back(values[i]);
  }
  Built b{ctx.finish(outputs), CompileSpec{.mesh = mesh}, {}};
  b.spec.inputs.push_back(
      InputSpec{.spec = P(), .pending = Pending{ReduceOp::kSum, {first}}, .origin = "input 0"});
  b.spec.inputs.push_back(InputSpec{.spec = P(last), .origin = "input 1"});
  b.spec.inputs.push_back(InputSpec{.spec = P(nullptr, last), .origin = "input 2"});
  b.text = fmt::format("{}", fmt::join(trace, "; "));
  return b;
}

// The least cost of any consistent assignment (each read as it is meets the state its operand's
// candidate makes), by trying them all in graph order.
inline double brute_force(const CandidateSpace& space) {
  const std::size_t n = space.nodes.size();
  std::vector<int> pick(n, -1);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(std::size_t)> go = [&](std::size_t i) {
    if (i == n) {
      best = std::min(best, space.cost(pick));
      return;
    }
    const auto& ns = space.nodes[value_id(i)];
    for (std::size_t c = 0; c < ns.candidates.size(); ++c) {
      pick[i] = static_cast<int>(c);
      go(i + 1);
    }
  };
  go(0);
  return best;
}

}  // namespace shardplan::detail::search
