// The recorded events as Chrome/Perfetto trace event JSON (the "JSON Array/Object Format" of the
// Trace Event Format document): complete events ("ph": "X") per device, metadata events ("ph":
// "M") naming the process ("rank N") and its threads ("device D", "host"), counters ("ph": "C")
// of the bytes each device's program holds.
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "../output_file.hpp"
#include "recorder.hpp"
#include "shardplan/collective_kind.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/profiler.hpp"

namespace shardplan::profiler {
namespace {

using nlohmann::json;

// Microseconds (the format's unit) from nanoseconds, to the nanosecond.
double micros(std::int64_t ns) { return static_cast<double>(ns) / 1000.0; }

// A memory sample: a counter per device (counters are the process's: the device is in the name).
json counter_json(const detail::Event& e, std::int64_t origin, int pid) {
  return json{{"name", "live bytes, device " + std::to_string(e.device)},
              {"cat", detail::category_name(e.cat)},
              {"ph", "C"},
              {"ts", micros(e.start_ns - origin)},
              {"pid", pid},
              {"tid", e.device},
              {"args", {{"bytes", e.bytes}}}};
}

json event_json(const detail::Event& e, std::int64_t origin, int pid) {
  if (e.cat == detail::Category::kMemory) return counter_json(e, origin, pid);
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

}  // namespace

std::string trace_json() {
  std::int64_t origin = 0;
  const std::vector<detail::Event> events = detail::collect(&origin);
  const int pid = distributed::process_index();
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
  const json doc{{"traceEvents", std::move(list)},
                 {"displayTimeUnit", "ms"},
                 {"otherData",
                  {{"producer", "shardplan"},
                   {"process_index", pid},
                   {"process_count", distributed::process_count()},
                   {"steady_clock_origin_ns", origin}}}};
  return doc.dump();
}

void write_trace(const std::filesystem::path& path) {
  const std::string text = trace_json();
  shardplan::detail::OutputFile out(path, "trace");
  out.write(text);
  out.commit();
}

}  // namespace shardplan::profiler
