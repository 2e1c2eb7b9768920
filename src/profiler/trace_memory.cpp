// `shardplan trace memory`: the runs a trace carries in its "memory peak" instant events, read
// back through json_impl (memory_report.hpp), and printed as text.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <initializer_list>
#include <optional>

#include "../formats/json_impl.hpp"
#include "memory_report.hpp"
#include "trace_summary.hpp"
#include "shardplan/detail/checked.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan::profiler::detail {
namespace {

namespace json = shardplan::detail::json;
using shardplan::detail::printable;

[[noreturn]] void fail(std::string_view file, const std::string& what) {
  throw IoError(fmt::format("[trace] {}: {}", printable(file), what));
}

// Where a value is, for messages: the file and the path to it ("event 12 args 'peak'").
struct At {
  std::string_view file;
  std::string where;
  At operator/(std::string_view key) const { return {file, fmt::format("{} '{}'", where, key)}; }
  At operator[](std::size_t i) const { return {file, fmt::format("{} [{}]", where, i)}; }
  [[noreturn]] void fail(const std::string& what) const { detail::fail(file, where + ": " + what); }
};

// An object's members, each key once.
std::vector<std::pair<std::string_view, json::Value>> members(const json::Value& v, const At& at) {
  if (!v.is_object()) at.fail(fmt::format("is {}, not an object", v.type_name()));
  std::vector<std::pair<std::string_view, json::Value>> m;
  json::KeySet seen(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!seen.insert(it.key())) at.fail(fmt::format("has the key '{}' twice", printable(it.key())));
    m.emplace_back(it.key(), it.value());
  }
  return m;
}

std::optional<json::Value> find(const std::vector<std::pair<std::string_view, json::Value>>& m,
                                std::string_view key) {
  for (const auto& [k, v] : m) {
    if (k == key) return v;
  }
  return std::nullopt;
}

// An object read by key: each field required unless asked with `optional`.
struct Object {
  std::vector<std::pair<std::string_view, json::Value>> m;
  At at;
  Object(const json::Value& v, At where) : m(members(v, where)), at(std::move(where)) {}
  json::Value get(std::string_view key) const {
    const auto v = find(m, key);
    if (!v) at.fail(fmt::format("has no '{}'", key));
    return *v;
  }
  /// A run's objects are shardplan's own (memory_run_json): a key it does not write is an error.
  const Object& known(std::initializer_list<std::string_view> keys) const {
    for (const auto& [k, v] : m) {
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
        at.fail(fmt::format("has the unknown key '{}' (expected {})", printable(k),
                            fmt::join(keys, ", ")));
      }
    }
    return *this;
  }
};

std::int64_t bytes(const json::Value& v, const At& at) {
  if (!v.is_uint() || v.as_uint() > static_cast<std::uint64_t>(INT64_MAX)) {
    at.fail(fmt::format("is {}, not a byte count", v.kind() == json::Kind::kString
                                                       ? std::string("a string")
                                                       : printable(v.source_text(40))));
  }
  return static_cast<std::int64_t>(v.as_uint());
}

int device(const json::Value& v, const At& at) {
  if (!v.is_uint() || v.as_uint() > 1u << 30) {
    at.fail(fmt::format("is {}, not a device id", printable(v.source_text(40))));
  }
  return static_cast<int>(v.as_uint());
}

std::string string_of(const json::Value& v, const At& at) {
  if (!v.is_string()) at.fail(fmt::format("is {}, not a string", v.type_name()));
  return std::string(v.str());
}

json::Value array(const json::Value& v, const At& at, std::optional<std::size_t> size,
                  std::string_view of) {
  if (!v.is_array()) at.fail(fmt::format("is {}, not an array", v.type_name()));
  if (size && v.size() != *size) {
    at.fail(fmt::format("has {} entries, not one per {} ({})", v.size(), of, *size));
  }
  return v;
}

std::vector<std::int64_t> byte_list(const json::Value& v, const At& at, std::size_t size,
                                    std::string_view of) {
  std::vector<std::int64_t> out;
  std::size_t i = 0;
  for (const json::Value b : array(v, at, size, of)) out.push_back(bytes(b, at[i++]));
  return out;
}

std::vector<std::vector<std::int64_t>> per_step(const json::Value& v, const At& at,
                                                std::size_t steps, std::size_t devices) {
  std::vector<std::vector<std::int64_t>> out;
  std::size_t i = 0;
  for (const json::Value row : array(v, at, steps, "step")) {
    out.push_back(byte_list(row, at[i], devices, "device"));
    ++i;
  }
  return out;
}

void read_peak(const Object& o, MemoryRun& r) {
  const Object peak(o.get("peak"), o.at / "peak");
  peak.known({"step", "bytes", "device", "live"});
  const json::Value step = peak.get("step");
  if (step.is_null()) {
    r.peak_step = r.steps.size();
  } else if (!step.is_uint() || step.as_uint() >= r.steps.size()) {
    (peak.at / "step").fail(fmt::format("is {}, not null or a step below {}",
                                        printable(step.source_text(40)), r.steps.size()));
  } else {
    r.peak_step = static_cast<std::size_t>(step.as_uint());
  }
  r.peak_bytes = bytes(peak.get("bytes"), peak.at / "bytes");
  r.peak_device = device(peak.get("device"), peak.at / "device");
  if (std::find(r.devices.begin(), r.devices.end(), r.peak_device) == r.devices.end()) {
    (peak.at / "device").fail(fmt::format("{} is not one of the run's devices [{}]",
                                          r.peak_device, fmt::join(r.devices, ", ")));
  }
  const At live_at = peak.at / "live";
  std::size_t i = 0;
  std::int64_t sum = 0;  // what the page adds up: must fit
  for (const json::Value b : array(peak.get("live"), live_at, std::nullopt, "")) {
    const Object lb(b, live_at[i++]);
    lb.known({"what", "scope", "bytes"});
    r.live_at_peak.push_back(LiveBuffer{string_of(lb.get("what"), lb.at / "what"),
                                        string_of(lb.get("scope"), lb.at / "scope"),
                                        bytes(lb.get("bytes"), lb.at / "bytes")});
    if (!shardplan::detail::checked_add(sum, r.live_at_peak.back().bytes, &sum)) {
      (lb.at / "bytes").fail(fmt::format("the values live at the peak add up past {} bytes (no "
                                         "device holds that much)",
                                         INT64_MAX));
    }
  }
}

MemoryRun read_run(const json::Value& args, const At& at) {
  const Object o(args, at);
  o.known({"devices", "steps", "start_bytes", "live_bytes", "value_start_bytes", "value_bytes",
           "planned_start_bytes", "planned_bytes", "peak", "took_constants"});
  MemoryRun r;
  std::size_t i = 0;
  for (const json::Value d : array(o.get("devices"), at / "devices", std::nullopt, "")) {
    const At here = (at / "devices")[i++];
    r.devices.push_back(device(d, here));
    if (std::count(r.devices.begin(), r.devices.end(), r.devices.back()) > 1) {
      here.fail(fmt::format("device {} is listed twice", r.devices.back()));
    }
  }
  if (r.devices.empty()) (at / "devices").fail("is empty: a run has at least one device");
  i = 0;
  for (const json::Value s : array(o.get("steps"), at / "steps", std::nullopt, "")) {
    const Object st(s, (at / "steps")[i++]);
    st.known({"op", "value", "scope"});
    r.steps.push_back(MemoryStep{string_of(st.get("op"), st.at / "op"),
                                 string_of(st.get("value"), st.at / "value"),
                                 string_of(st.get("scope"), st.at / "scope")});
  }
  const std::size_t n = r.steps.size(), d = r.devices.size();
  r.start_bytes = byte_list(o.get("start_bytes"), at / "start_bytes", d, "device");
  r.live_bytes = per_step(o.get("live_bytes"), at / "live_bytes", n, d);
  r.value_start_bytes = byte_list(o.get("value_start_bytes"), at / "value_start_bytes", d, "device");
  r.value_bytes = per_step(o.get("value_bytes"), at / "value_bytes", n, d);
  r.planned_start_bytes = bytes(o.get("planned_start_bytes"), at / "planned_start_bytes");
  r.planned_bytes = byte_list(o.get("planned_bytes"), at / "planned_bytes", n, "step");
  read_peak(o, r);
  const json::Value took = o.get("took_constants");
  if (took.kind() != json::Kind::kBool) {
    (at / "took_constants").fail(fmt::format("is {}, not a boolean", took.type_name()));
  }
  r.took_constants = took.as_bool();
  return r;
}

}  // namespace

std::vector<MemoryRun> read_trace_memory(std::string_view text, std::string_view file) {
  std::vector<MemoryRun> runs;
  std::size_t counters = 0;
  shardplan::detail::for_each_trace_event(text, file, [&](const json::Value& e, std::size_t n) {
    const At at{file, fmt::format("event {}", n)};
    const Object o(e, at);
    const std::string ph = string_of(o.get("ph"), at / "ph");
    const auto name = find(o.m, "name");
    const bool named = name && name->is_string();
    if (ph == "C" && named && name->str().starts_with("live bytes, device ")) ++counters;
    if (ph != "i" || !named || name->str() != kMemoryPeakEvent) return;
    runs.push_back(read_run(o.get("args"), at / "args"));
  });
  if (runs.empty()) {
    fail(file, fmt::format("no memory runs: it has no '{}' instant events (the profiler writes one "
                           "per program run with ProfileOptions::memory on; this trace has {} "
                           "live-bytes counter samples)",
                           kMemoryPeakEvent, counters));
  }
  return runs;
}

std::string format_memory_runs(const std::vector<MemoryRun>& runs, std::string_view file,
                               std::size_t top) {
  std::string out = fmt::format("trace {}: {} program run{} with memory measured\n",
                                printable(file), runs.size(), runs.size() == 1 ? "" : "s");
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const MemoryRun& r = runs[i];
    out += fmt::format("\nrun {}: {} step{} on devices [{}]\n", i, r.steps.size(),
                       r.steps.size() == 1 ? "" : "s", fmt::join(r.devices, ", "));
    const auto where = [&r](std::size_t step) {
      if (step >= r.steps.size()) return std::string("at the start");
      const MemoryStep& s = r.steps[step];
      std::string w = fmt::format("after step {} ({}", step, printable(s.op));
      if (!s.value.empty()) w += fmt::format(" '{}'", printable(s.value));
      if (!s.scope.empty()) w += fmt::format(", scope {}", printable(s.scope));
      return w + ")";
    };
    std::size_t planned_step = r.planned_bytes.size();
    std::int64_t planned = r.planned_start_bytes;
    for (std::size_t s = 0; s < r.planned_bytes.size(); ++s) {
      if (r.planned_bytes[s] > planned) planned = r.planned_bytes[planned_step = s];
    }
    if (peak_agrees_with_samples(r)) {
      out += fmt::format("  measured peak {} on device {} {}\n", format_bytes(r.peak_bytes),
                         r.peak_device, where(r.peak_step));
    } else {
      // A peak the run's own samples contradict is the trace's claim, not a measurement.
      const SampledPeak s = sampled_peak(r);
      out += fmt::format("  claimed peak  {} on device {} {}: its own samples contradict it\n"
                         "  sampled peak  {} on device {} {}\n",
                         format_bytes(r.peak_bytes), r.peak_device, where(r.peak_step),
                         format_bytes(s.bytes), s.device, where(s.step));
    }
    out += fmt::format("  planned peak  {} {}\n", format_bytes(planned), where(planned_step));
    if (r.took_constants) {
      out += "  (kept constants taken from an earlier run: held from the start, above the plan)\n";
    }
    out += fmt::format("  {:<40} {:<20} {:>12}\n", "live at the peak", "scope", "bytes");
    for (std::size_t k = 0; k < r.live_at_peak.size() && k < top; ++k) {
      const LiveBuffer& b = r.live_at_peak[k];
      out += fmt::format("  {:<40} {:<20} {:>12}\n", printable(b.what), printable(b.scope),
                         format_bytes(b.bytes));
    }
    if (r.live_at_peak.size() > top) {
      out += fmt::format("  ... and {} more\n", r.live_at_peak.size() - top);
    }
  }
  return out;
}

}  // namespace shardplan::profiler::detail
