#pragma once
// What the profiler tests share (profiler_test*.cpp): the trace's events of a category and their
// scope, and a program with a collective over four devices.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardplan/ops.hpp"
#include "shardplan/profiler.hpp"
#include "shardplan/sjit.hpp"

namespace shardplan::test {

using nlohmann::json;

inline std::vector<json> events_of(const json& doc, const std::string& cat) {
  std::vector<json> out;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == cat) out.push_back(e);
  }
  return out;
}

inline std::string scope_of(const json& e) {
  return e["args"].contains("scope") ? e["args"]["scope"].get<std::string>() : std::string();
}

// x [8, 64] split over its contraction dimension on data:4, w [64, 16] likewise: each device's
// product is a summand, summed (a collective) for the replicated result; tanh after it.
inline Array contraction(const Array& x, const Array& w) {
  Array y;
  {
    auto s = named_scope("proj");
    y = matmul(x, w);
  }
  auto s = named_scope("act");
  return tanh(y);
}

inline auto contraction_sjit(const Mesh& mesh) {
  return sjit(mesh, contraction, SjitOptions{.out_shardings = RuleTree(P())});
}

// `rows` of x: 8 runs each step inline (devices one after another on the calling thread); 512
// gives results of 128 KiB, run on the pool.
struct ContractionProgram {
  explicit ContractionProgram(std::int64_t n = 8) : rows(n) {}
  std::int64_t rows;
  Executor exec{4};
  Mesh mesh = Mesh::parse("data:4", 4);
  Array x = device_put(Tensor::normal(Shape{rows, 64}, DType::kF32, 1),
                       NamedSharding(mesh, P(nullptr, "data")), exec);
  Array w = device_put(Tensor::normal(Shape{64, 16}, DType::kF32, 2),
                       NamedSharding(mesh, P("data", nullptr)), exec);
  decltype(contraction_sjit(mesh)) f = contraction_sjit(mesh);
};

}  // namespace shardplan::test
