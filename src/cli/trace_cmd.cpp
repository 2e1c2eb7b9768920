#include "trace_cmd.hpp"

#include <iostream>

#include "../input_file.hpp"
#include "../profiler/trace_summary.hpp"

namespace shardplan::cli {

TraceCommand& add_trace_commands(CLI::App& app, TraceCommand& c) {
  c.command =
      app.add_subcommand("trace", "Read profiler traces (Chrome/Perfetto trace event JSON)");
  c.command->require_subcommand(1);
  c.summarize = c.command->add_subcommand(
      "summarize",
      "The top kernels and collectives by time, each device's busy and idle time, the exposed "
      "communication");
  c.summarize->add_option("file", c.file, "A trace written by profiler::write_trace")->required();
  c.summarize->add_option("--top", c.top, "How many kernels and collectives to list (default 10)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000}));
  return c;
}

int run_trace(const TraceCommand& c) {
  const std::string text = detail::read_input_file(c.file, "trace");
  const detail::TraceSummary s = detail::summarize_trace(text, c.file);
  std::cout << detail::format_trace_summary(s, c.file, c.top);
  return 0;
}

}  // namespace shardplan::cli
