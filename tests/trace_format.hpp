#pragma once
// The trace event format's required fields per phase, as a test checks a written trace against
// them (tests/profiler_test.cpp, multiprocess_profiler_test.cpp).
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace shardplan::test {

// The trace event format (Google's "Trace Event Format" document) for the phases written here:
// every event an object with a string "ph" and "name" and integer "pid" and "tid"; a complete
// event ("X") a number "ts" and a non-negative number "dur", a string "cat", an object "args";
// a metadata event ("M") one of the metadata names, with "args" holding its "name" (a string)
// or "sort_index" (an integer); a counter ("C") a number "ts" and "args" of numbers; an instant
// event ("i") a number "ts", a scope "s" of "g", "p" or "t" when given, an object "args".
// Returns the first violation, or "".
inline std::string trace_format_violation(const nlohmann::json& doc) {
  if (!doc.is_object()) return "the document is not an object";
  if (!doc.contains("traceEvents") || !doc["traceEvents"].is_array()) return "no traceEvents array";
  if (doc.contains("displayTimeUnit") &&
      !(doc["displayTimeUnit"] == "ms" || doc["displayTimeUnit"] == "ns")) {
    return "displayTimeUnit is neither ms nor ns";
  }
  const std::set<std::string> metadata_names = {
      "process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"};
  for (const nlohmann::json& e : doc["traceEvents"]) {
    const std::string at = e.dump();
    if (!e.is_object()) return "an event is not an object: " + at;
    for (const char* k : {"ph", "name"}) {
      if (!e.contains(k) || !e[k].is_string()) return std::string("no string ") + k + ": " + at;
    }
    for (const char* k : {"pid", "tid"}) {
      if (!e.contains(k) || !e[k].is_number_integer())
        return std::string("no integer ") + k + ": " + at;
    }
    if (e["ph"] == "X") {
      if (!e.contains("ts") || !e["ts"].is_number()) return "X without a number ts: " + at;
      if (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0) {
        return "X without a non-negative dur: " + at;
      }
      if (!e.contains("cat") || !e["cat"].is_string()) return "X without a string cat: " + at;
      if (e.contains("args") && !e["args"].is_object()) return "X args not an object: " + at;
    } else if (e["ph"] == "M") {
      if (!metadata_names.count(e["name"].get<std::string>())) return "unknown metadata: " + at;
      if (!e.contains("args") || !e["args"].is_object()) return "M without args: " + at;
      const nlohmann::json& a = e["args"];
      const bool named = a.contains("name") && a["name"].is_string();
      const bool sorted = a.contains("sort_index") && a["sort_index"].is_number_integer();
      if (!named && !sorted) return "M args with neither name nor sort_index: " + at;
    } else if (e["ph"] == "C") {  // a counter: a number ts, args of numbers (the series)
      if (!e.contains("ts") || !e["ts"].is_number()) return "C without a number ts: " + at;
      if (!e.contains("args") || !e["args"].is_object() || e["args"].empty()) {
        return "C without args: " + at;
      }
      for (const auto& [k, v] : e["args"].items()) {
        if (!v.is_number()) return "C with a series that is not a number: " + at;
      }
    } else if (e["ph"] == "i") {  // an instant: a number ts, a scope g/p/t, an object args
      if (!e.contains("ts") || !e["ts"].is_number()) return "i without a number ts: " + at;
      if (e.contains("s") && !(e["s"] == "g" || e["s"] == "p" || e["s"] == "t")) {
        return "i with a scope other than g, p, t: " + at;
      }
      if (e.contains("args") && !e["args"].is_object()) return "i args not an object: " + at;
    } else {
      return "a phase this writer does not write: " + at;
    }
  }
  return "";
}

}  // namespace shardplan::test
