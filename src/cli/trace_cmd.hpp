#pragma once
// `shardplan trace summarize FILE`: a profiler trace (docs/profiling.md) as a table;
// `shardplan trace memory FILE [--html OUT] [--json OUT]`: the memory its runs held, measured and
// planned, as text, an HTML page and JSON.
#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>

namespace shardplan::cli {

struct TraceCommand {
  CLI::App* command = nullptr;
  CLI::App* summarize = nullptr;
  CLI::App* memory = nullptr;
  std::string file;
  std::size_t top = 10;
  std::string html, json;  // trace memory's outputs, "" for none
};

/// Registers `trace summarize` and `trace memory` under `app`; the returned options are filled
/// by parsing.
TraceCommand& add_trace_commands(CLI::App& app, TraceCommand& c);

/// Runs the one parsed: prints the summary (and writes the memory report's files). Throws
/// IoError naming the file when it cannot be read, is not a trace, has no memory runs (memory),
/// or an output cannot be written (the caller prints it and exits 1). Returns the exit code.
int run_trace(const TraceCommand& c);

}  // namespace shardplan::cli
