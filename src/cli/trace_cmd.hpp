#pragma once
// `shardplan trace summarize FILE`: a profiler trace (docs/profiling.md) as a table.
#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>

namespace shardplan::cli {

struct TraceCommand {
  CLI::App* command = nullptr;
  CLI::App* summarize = nullptr;
  std::string file;
  std::size_t top = 10;
};

/// Registers `trace summarize` under `app`; the returned options are filled by parsing.
TraceCommand& add_trace_commands(CLI::App& app, TraceCommand& c);

/// Runs it: prints the summary. Throws IoError naming the file when it cannot be read or is not
/// a trace (the caller prints it and exits 1). Returns the exit code.
int run_trace(const TraceCommand& c);

}  // namespace shardplan::cli
