// The recorded events as Chrome/Perfetto trace event JSON (the "JSON Array/Object Format" of the
// Trace Event Format document): complete events ("ph": "X") per device, metadata events ("ph":
// "M") naming the process ("rank N") and its threads ("device D", "host"), counters ("ph": "C")
// of the bytes each device's program holds. Under mpirun one file for the job: each process's
// events on process 0's clock, gathered and written there.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>

#include "../formats/output_file.hpp"
#include "memory_report.hpp"
#include "recorder.hpp"
#include "shardplan/collective_kind.hpp"
#include "shardplan/detail/agreement.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/profiler.hpp"

namespace shardplan::profiler {
namespace {

using nlohmann::json;

// Microseconds (the format's unit) from nanoseconds, to the nanosecond.
double micros(std::int64_t ns) { return static_cast<double>(ns) / 1000.0; }

// A memory sample: a counter per device (counters are the process's: the device is in the name),
// two series: the bytes measured, and the memory pass's plan.
json counter_json(const detail::Event& e, std::int64_t origin, int pid) {
  json args{{"bytes", e.bytes}};
  if (e.planned >= 0) args["planned"] = e.planned;
  return json{{"name", "live bytes, device " + std::to_string(e.device)},
              {"cat", detail::category_name(e.cat)},
              {"ph", "C"},
              {"ts", micros(e.start_ns - origin)},
              {"pid", pid},
              {"tid", e.device},
              {"args", std::move(args)}};
}

// A run's peak: an instant event on its device's track, the whole run in its args (what
// `shardplan trace memory` reads back).
json peak_json(const detail::Event& e, std::int64_t origin, int pid) {
  return json{{"name", detail::kMemoryPeakEvent},
              {"cat", detail::category_name(e.cat)},
              {"ph", "i"},
              {"s", "t"},
              {"ts", micros(e.start_ns - origin)},
              {"pid", pid},
              {"tid", e.device},
              {"args", e.run ? detail::memory_run_json(*e.run) : json::object()}};
}

json event_json(const detail::Event& e, std::int64_t origin, int pid) {
  if (e.cat == detail::Category::kMemory) return counter_json(e, origin, pid);
  if (e.cat == detail::Category::kMemoryPeak) return peak_json(e, origin, pid);
  json args = json::object();
  const std::string_view op = e.op();
  if (!op.empty()) args["op"] = op;
  if (e.scope) args["scope"] = *e.scope;
  std::string name = !op.empty() ? std::string(op) : std::string(detail::category_name(e.cat));
  if (e.kind >= 0) {
    const std::string kind(to_string(static_cast<CollectiveKind>(e.kind)));
    args["kind"] = kind;
    name = kind;
  }
  if (e.bytes >= 0) args["bytes"] = e.bytes;
  if (e.group) {
    json peers = json::array();
    for (const int d : *e.group) {
      if (d != e.device) peers.push_back(d);
    }
    args["peers"] = std::move(peers);
  }
  if (e.cat == detail::Category::kWait) name = "wait";
  if (e.cat == detail::Category::kReshard) name = "reshard";
  return json{{"name", name},
              {"cat", detail::category_name(e.cat)},
              {"ph", "X"},
              {"ts", micros(e.start_ns - origin)},
              {"dur", micros(std::max<std::int64_t>(0, e.end_ns - e.start_ns))},
              {"pid", pid},
              {"tid", e.device},
              {"args", std::move(args)}};
}

json metadata(const char* what, int pid, int tid, const std::string& value) {
  return json{{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", value}}}};
}

// This process's metadata and complete events as a JSON array: pid `pid`, times from `origin`
// (on this process's clock).
json process_events(const std::vector<detail::Event>& events, std::int64_t origin, int pid) {
  json list = json::array();
  list.push_back(metadata("process_name", pid, 0, "rank " + std::to_string(pid)));
  std::set<int> threads;
  for (const detail::Event& e : events) threads.insert(e.device);
  for (const int t : threads) {
    list.push_back(
        metadata("thread_name", pid, t,
                 t == detail::kHostTid ? std::string("host") : "device " + std::to_string(t)));
    // The host first, then the devices in order.
    list.push_back(json{{"name", "thread_sort_index"},
                        {"ph", "M"},
                        {"pid", pid},
                        {"tid", t},
                        {"args", {{"sort_index", t == detail::kHostTid ? -1 : t}}}});
  }
  for (const detail::Event& e : events) list.push_back(event_json(e, origin, pid));
  return list;
}

json header(int pid, std::int64_t origin) {
  return json{{"displayTimeUnit", "ms"},
              {"otherData",
               {{"producer", "shardplan"},
                {"process_index", pid},
                {"process_count", distributed::process_count()},
                {"steady_clock_origin_ns", origin}}}};
}

std::string as_text(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// Process 0's file: the header (with the clock offsets) and every process's events, the arrays
// each process sent (their text) joined into one.
std::string merged_document(const std::vector<std::vector<std::byte>>& parts,
                            const std::vector<ClockOffset>& offsets, std::int64_t origin) {
  json head = header(0, origin);
  json clocks = json::array();
  for (const ClockOffset& o : offsets) {
    clocks.push_back(json{{"process", o.process},
                          {"offset_ns", o.offset_ns},
                          {"error_bound_ns", o.error_bound_ns},
                          {"round_trip_ns", o.round_trip_ns}});
  }
  head["otherData"]["clock_offsets"] = std::move(clocks);
  head["otherData"]["merged"] = true;
  head["traceEvents"] = json::array();
  std::string text = head.dump();  // ends with "traceEvents":[]} (keys are sorted)
  text.resize(text.size() - 2);
  bool first = true;
  for (const std::vector<std::byte>& part : parts) {
    const std::string a = as_text(part);  // "[...]"
    if (a.size() <= 2) continue;
    if (!first) text += ',';
    text.append(a, 1, a.size() - 2);
    first = false;
  }
  text += "]}";
  return text;
}

// Runs `step` (may be empty here) and agrees on it with the other processes.
template <class F>
void agreed(const F& step, const char* what) {
  std::exception_ptr failed;
  try {
    step();
  } catch (...) {
    failed = std::current_exception();
  }
  distributed::detail::agree(failed, failed ? std::string("[profiler] write_trace: ") + what
                                            : std::string());
}

// write_trace over several processes: open (process 0), align, gather, write, each step agreed.
void write_merged_trace(const std::filesystem::path& path) {
  const int me = distributed::process_index();
  std::optional<shardplan::detail::OutputFile> out;
  std::vector<detail::Event> events;
  std::int64_t origin = 0;
  agreed(
      [&] {
        if (me == 0) out.emplace(path, "trace");
        events = detail::collect(&origin);
      },
      "opening the file and collecting the events");
  const std::vector<ClockOffset> offsets = estimate_clock_offsets();
  // The job's origin, on process 0's clock: the earliest session start (of the processes that
  // started one: a process that never did sends nothing).
  const std::span<const std::int64_t> sent(&origin, origin != 0 || !events.empty() ? 1 : 0);
  const auto origins = distributed::allgather_bytes(std::as_bytes(sent));
  std::int64_t job_origin = std::numeric_limits<std::int64_t>::max();
  for (std::size_t p = 0; p < origins.size(); ++p) {
    std::int64_t o = 0;
    if (origins[p].size() != sizeof o) continue;
    std::memcpy(&o, origins[p].data(), sizeof o);
    job_origin = std::min(job_origin, o - offsets[p].offset_ns);
  }
  if (job_origin == std::numeric_limits<std::int64_t>::max()) job_origin = 0;
  std::string mine;
  agreed(
      [&] {
        const std::int64_t shift = job_origin + offsets[static_cast<std::size_t>(me)].offset_ns;
        mine = process_events(events, shift, me).dump(-1, ' ', false, json::error_handler_t::replace);
      },
      "writing the events as JSON");
  const auto parts = distributed::gather_bytes(std::as_bytes(std::span(mine)), 0);
  agreed(
      [&] {
        if (me != 0) return;
        out->write(merged_document(parts, offsets, job_origin));
        out->commit();
      },
      "writing the file");
}

}  // namespace

std::string trace_json() {
  std::int64_t origin = 0;
  const std::vector<detail::Event> events = detail::collect(&origin);
  const int pid = distributed::process_index();
  json doc = header(pid, origin);
  doc["traceEvents"] = process_events(events, origin, pid);
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

void write_trace(const std::filesystem::path& path) {
  if (distributed::process_count() > 1) {
    write_merged_trace(path);
    return;
  }
  const std::string text = trace_json();
  shardplan::detail::OutputFile out(path, "trace");
  out.write(text);
  out.commit();
}

}  // namespace shardplan::profiler
