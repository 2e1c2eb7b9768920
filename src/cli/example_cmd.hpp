#pragma once
// `shardplan example trace FILE` and `shardplan example checkpoint DIR`: small inputs for the
// commands that read a trace or a checkpoint (trace summarize/memory, checkpoint
// inspect/reshard/consolidate, plan --model), made here so that they can be tried at once.
#include <CLI/CLI.hpp>
#include <string>

namespace shardplan::cli {

struct ExampleCommand {
  CLI::App* command = nullptr;
  CLI::App* trace = nullptr;
  CLI::App* checkpoint = nullptr;
  std::string path;
};

/// Registers `example trace` and `example checkpoint` under `app`.
ExampleCommand& add_example_commands(CLI::App& app, ExampleCommand& c);

/// Runs the one parsed: `trace` runs two training steps of a small MLP under sjit on
/// Mesh('fsdp': 4, 'tp': 2) (8 virtual devices) with the profiler on (memory too) and writes the
/// trace; `checkpoint` saves a small LLaMA (Hugging Face names, f32, random) sharded by the
/// llama_fsdp_tp preset on the same mesh. Throws IoError naming the path when it cannot be
/// written (a checkpoint directory that exists included). Returns the exit code.
int run_example(const ExampleCommand& c);

}  // namespace shardplan::cli
