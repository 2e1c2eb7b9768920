#include "trace_cmd.hpp"

#include <iostream>

#include "../formats/input_file.hpp"
#include "../formats/output_file.hpp"
#include "../profiler/memory_report.hpp"
#include "../profiler/trace_summary.hpp"
#include "input_path_option.hpp"
#include "output_path_option.hpp"
#include "shardplan/detail/printable.hpp"

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
  c.memory = c.command->add_subcommand(
      "memory",
      "Each program run's live bytes per device over its steps, measured and planned, with the "
      "peak and what is live at it");
  c.memory->add_option("file", c.file, "A trace written by profiler::write_trace")->required();
  c.memory->add_option("--html", c.html, "Also write the report as an HTML page")
      ->check(non_empty_output_path());
  c.memory->add_option("--json", c.json, "Also write the report as JSON")
      ->check(non_empty_output_path());
  c.memory->add_option("--top", c.top, "How many values live at each peak to list (default 10)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1000}));
  return c;
}

namespace {

int run_memory(const TraceCommand& c) {
  require_input("trace FILE", c.file);
  const std::string text = detail::read_input_file(c.file, "trace");
  const std::vector<profiler::MemoryRun> runs = profiler::detail::read_trace_memory(text, c.file);
  // The outputs contract (docs/cli.md "Outputs"): checked, written, then renamed together,
  // before anything is printed.
  std::vector<detail::NamedOutput> named;
  if (!c.html.empty()) named.push_back({"--html", c.html});
  if (!c.json.empty()) named.push_back({"--json", c.json});
  detail::OutputFiles out(named);
  std::size_t i = 0;
  if (!c.html.empty()) out[i++].write(profiler::memory_html(runs, "shardplan memory: " + c.file));
  if (!c.json.empty()) out[i++].write(profiler::memory_json(runs));
  out.commit();
  std::cout << profiler::detail::format_memory_runs(runs, c.file, c.top);
  for (std::size_t k = 0; k < named.size(); ++k) {
    std::cout << (k == 0 ? "\n" : "") << "wrote " << detail::printable(named[k].path.string())
              << "\n";
  }
  return 0;
}

}  // namespace

int run_trace(const TraceCommand& c) {
  if (c.memory->parsed()) return run_memory(c);
  require_input("trace FILE", c.file);
  const std::string text = detail::read_input_file(c.file, "trace");
  const detail::TraceSummary s = detail::summarize_trace(text, c.file);
  std::cout << detail::format_trace_summary(s, c.file, c.top);
  return 0;
}

}  // namespace shardplan::cli
