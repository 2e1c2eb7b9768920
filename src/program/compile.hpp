#pragma once
// From a traced graph to an SPMD program: sharding propagation (every value gets a sharding and
// remembers where it came from), partitioning into per-device kernels and reshards, the static
// cost report, and running the program on an executor.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/collectives.hpp"
#include "shardplan/graph.hpp"
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
};

struct CompileSpec {
  Mesh mesh;
  std::vector<InputSpec> inputs;                      // by kInput index
  std::vector<std::optional<PartitionSpec>> outputs;  // by output position; nullopt: open
};

using CostReport = ProgramCost;

struct Step {
  enum class Kind { kKernel, kReshard };
  Kind kind = Kind::kKernel;
  int node = -1;                          // the graph node it computes (kernel) or feeds (reshard)
  Node local;                             // kernel: the node with local attributes and shape
  std::vector<int> in;                    // slots
  int out = -1;                           // slot
  TensorType type;                        // global type of the result
  std::optional<NamedSharding> sharding;  // of the result (always set)
  Pending pending;                        // kernel result
  std::shared_ptr<const std::vector<Block>> blocks;  // kernel: the result's blocks by device
  std::vector<std::vector<std::int64_t>> offsets;    // kernel: their starts, by device
  std::vector<CollectiveRecord> cost;  // reshard: the collectives it will run (static)
  double flops = 0;                    // kernel: per device (the most of any device)
  bool constant = false;               // depends on no input: run once per executor, then cached
};

class Program {
 public:
  explicit Program(Mesh mesh) : mesh_(std::move(mesh)) {}
  /// Runs on `executor`: `inputs` in kInput order (resharded to the compiled input shardings
  /// when they differ). Returns the outputs. The donated inputs are moved out of `inputs` and
  /// released after their last use; when the run throws, those not yet released are put back.
  std::vector<Array> run(const Executor& executor, std::vector<Array>& inputs) const;
  /// As above, for a program without donated inputs.
  std::vector<Array> run(const Executor& executor, const std::vector<Array>& inputs) const {
    std::vector<Array> copy = inputs;
    return run(executor, copy);
  }

  /// The program as text: each value with its sharding and where the sharding came from, each
  /// reshard with its collectives, then the cost.
  std::string text() const;
  const CostReport& cost() const { return cost_; }
  const std::vector<NamedSharding>& output_shardings() const { return output_shardings_; }
  const std::vector<NamedSharding>& input_shardings() const { return input_shardings_; }
  const Graph& graph() const { return graph_; }

 private:
  friend Program compile(const Graph& graph, const CompileSpec& spec);
  std::vector<Array> run_steps(const Executor& executor, std::vector<Array>& inputs,
                               std::vector<Array>& slots, std::vector<char>& moved_in) const;
  Graph graph_;
  Mesh mesh_;
  std::vector<PartitionSpec> specs_;  // per node (after propagation)
  std::vector<std::string> origins_;
  std::vector<Step> steps_;
  int num_slots_ = 0;
  std::vector<int> input_slots_;
  std::vector<int> output_slots_;
  std::vector<NamedSharding> input_shardings_;
  std::vector<Pending> input_pending_;
  std::vector<NamedSharding> output_shardings_;
  std::vector<std::vector<int>> free_after_;  // per step: slots no longer needed
  std::vector<int> free_at_start_;            // donated inputs no step uses
  std::vector<char> input_donated_;           // by input index
  bool any_donated_ = false;
  // Results of the constant steps, per executor (they never change).
  struct ConstantCache {
    std::mutex mu;
    std::map<const void*, std::vector<std::pair<int, Array>>> by_executor;
  };
  std::shared_ptr<ConstantCache> constants_ = std::make_shared<ConstantCache>();
  std::vector<int> constant_slots_;
  CostReport cost_;
};

/// Propagates shardings through `graph` and partitions it. Annotation nodes carry the spec their
/// name resolved to while tracing (none: left to propagation). Throws SpecError for a constraint
/// that names an unknown axis or does not divide.
Program compile(const Graph& graph, const CompileSpec& spec);

}  // namespace shardplan::detail
