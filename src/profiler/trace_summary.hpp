#pragma once
// `shardplan trace summarize`: a Chrome/Perfetto trace event file (the profiler's, or any with
// complete "X" events) read through json_impl and summed up: the kernels and collectives that
// took the most time, each thread's busy and idle time, the communication no kernel hid.
// Private (src/cli/trace_cmd.cpp and tests/fuzz/fuzz_trace_summary.cpp use it).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardplan::detail {

namespace json {
class Document;
class Value;
}  // namespace json

/// What every trace reader (summarize, trace memory) reads through: each event of `text`, the
/// content of `file`, in order, with its index. The events are the root when it is an array,
/// else the top-level object's "traceEvents" (each key of that object once). Each event is
/// parsed alone and lives only during its call, so a trace is read in about its own size.
/// Throws IoError "[trace] FILE: not a trace: ..." naming what is wrong (not JSON, with the byte;
/// no "traceEvents"; events not an array); what `fn` throws passes through.
using TraceEventFn = std::function<void(const json::Value& event, std::size_t index)>;
void for_each_trace_event(std::string_view text, std::string_view file, const TraceEventFn& fn);

struct TraceSummary {
  /// Kernels and collectives by name, most total time first (ties by name).
  struct OpRow {
    std::string cat, name;
    std::int64_t count = 0;
    double total_us = 0;
    double mean_us() const { return count > 0 ? total_us / static_cast<double>(count) : 0; }
  };
  /// One track (a device, or the host) of one process, over the whole trace's span.
  struct ThreadRow {
    int pid = 0, tid = 0;
    /// Its thread_name metadata, else "pid P tid T"; in a trace of several processes, its
    /// process_name ("rank 1") before it: "rank 1 device 2", "rank 1 host".
    std::string name;
    double busy_us = 0;          // the union of its events that are not waits
    double idle_us = 0;          // the span less busy
    double comm_us = 0;          // the union of its collectives
    double exposed_comm_us = 0;  // of that, what no kernel on the same track overlaps
  };
  std::int64_t events = 0;  // complete events read
  double span_us = 0;       // first start to last end
  std::vector<OpRow> ops;
  std::vector<ThreadRow> threads;  // by pid, then tid
};

/// Reads `text`, the content of `file` (named in messages). Throws IoError "[trace] FILE: ..."
/// when it is not JSON, nests too deep, repeats a key, has no "traceEvents" array (an array at
/// the top is taken as the events), an event lacks what its phase needs (X: name, ts, dur, pid,
/// tid as numbers), or there is no complete event at all.
TraceSummary summarize_trace(std::string_view text, std::string_view file);

/// The summary as a table: the `top` first ops, then the threads. Names are escaped for a
/// terminal (detail::printable).
std::string format_trace_summary(const TraceSummary& s, std::string_view file, std::size_t top);

}  // namespace shardplan::detail
