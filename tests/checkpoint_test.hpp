#pragma once
// What the checkpoint tests share (checkpoint_test*.cpp): a train state with every kind of leaf,
// its shardings on another mesh, and a bitwise comparison of two states.
#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <latch>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint_fixtures.hpp"
#include "fixtures.hpp"
#include "shardplan/checkpoint.hpp"
#include "shardplan/error.hpp"
#include "shardplan/rule_file.hpp"
#include "shardplan/safetensors.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan::test {

namespace fs = std::filesystem;

/// A train state with the kinds of leaf a checkpoint holds, on `exec` and `mesh` (axes data and
/// model): weights sharded both ways, a bf16 bias, an int64 step, an optimizer list.
inline Tree<Array> train_state(const Executor& exec, const Mesh& mesh) {
  auto on = [&](const PartitionSpec& s) { return NamedSharding(mesh, s); };
  return Tree<Array>::dict(
      {{"params",
        Tree<Array>::dict(
            {{"w", Array::normal(Shape{16, 8}, DType::kF32, on(P("data", "model")), exec, 1)},
             {"b", Array::normal(Shape{8}, DType::kBF16, on(P("model")), exec, 2)},
             {"emb", Array::normal(Shape{6, 16}, DType::kF32, on(P(nullptr, "data")), exec, 3)}})},
       {"step", Array::generate(Shape{}, DType::kI64, on(P()), exec, Generator::full(1234))},
       {"opt",
        Tree<Array>::list({Array::uniform(Shape{16, 8}, DType::kF32, on(P("data")), exec, 4, -1, 1),
                           Tree<Array>::none()})}});
}

/// Shardings of the same tree for another mesh (`specs` by leaf path).
inline Tree<NamedSharding> shardings_for(const Tree<Array>& like, const Mesh& mesh,
                                         const std::map<std::string, PartitionSpec>& specs) {
  return like.map_with_path([&](const std::string& path, const Array&) {
    const auto it = specs.find(path);
    return NamedSharding(mesh, it == specs.end() ? P() : it->second);
  });
}

inline void expect_same_values(const Tree<Array>& got, const Tree<Array>& want) {
  ASSERT_TRUE(got.same_structure(want));
  const auto g = got.flatten();
  const auto w = want.flatten();
  for (std::size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i].first, w[i].first);
    EXPECT_TRUE(g[i].second.to_host() == w[i].second.to_host()) << g[i].first;
  }
}

}  // namespace shardplan::test
