#include "trace_summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "../formats/json_impl.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

using Interval = std::pair<double, double>;

[[noreturn]] void fail(std::string_view file, const std::string& what) {
  throw IoError(fmt::format("[trace] {}: {}", printable(file), what));
}

// An object's members by key; a key given twice is an error (which one counts would be a guess).
struct Members {
  std::vector<std::pair<std::string_view, json::Value>> list;
  const json::Value* find(std::string_view key) const {
    for (const auto& [k, v] : list) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

Members members(const json::Value& obj, std::string_view file, const std::string& where) {
  Members m;
  json::KeySet seen(obj.size());
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!seen.insert(it.key())) {
      fail(file, fmt::format("{} has the key '{}' twice", where, printable(it.key())));
    }
    m.list.emplace_back(it.key(), it.value());
  }
  return m;
}

double number(const Members& m, const char* key, std::string_view file, const std::string& where) {
  const json::Value* v = m.find(key);
  if (v == nullptr) fail(file, fmt::format("{} has no '{}'", where, key));
  const json::Kind k = v->kind();
  if (k != json::Kind::kUint && k != json::Kind::kInt && k != json::Kind::kNumber) {
    fail(file, fmt::format("{}: '{}' is {}, not a number", where, key, v->type_name()));
  }
  const double d = v->as_double();
  if (!std::isfinite(d)) fail(file, fmt::format("{}: '{}' is not finite", where, key));
  return d;
}

int integer(const Members& m, const char* key, std::string_view file, const std::string& where) {
  const double d = number(m, key, file, where);
  if (d != std::floor(d) || std::fabs(d) > 2e9) {
    fail(file, fmt::format("{}: '{}' is not an integer id", where, key));
  }
  return static_cast<int>(d);
}

std::string string_or(const Members& m, const char* key, std::string_view file,
                      const std::string& where, bool required) {
  const json::Value* v = m.find(key);
  if (v == nullptr) {
    if (required) fail(file, fmt::format("{} has no '{}'", where, key));
    return {};
  }
  if (!v->is_string())
    fail(file, fmt::format("{}: '{}' is {}, not a string", where, key, v->type_name()));
  return std::string(v->str());
}

// Sorted, overlapping intervals merged.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.first <= out.back().second) {
      out.back().second = std::max(out.back().second, i.second);
    } else {
      out.push_back(i);
    }
  }
  return out;
}

double length(const std::vector<Interval>& v) {
  double s = 0;
  for (const auto& [a, b] : v) s += b - a;
  return s;
}

// The length of the intersection of two merged lists.
double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double s = 0;
  for (std::size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) s += hi - lo;
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return s;
}

struct Track {
  std::string name;
  std::vector<Interval> busy, kernels, collectives;
};

// Reads one event into the tracks and op totals; metadata names threads.
void read_event(const json::Value& e, std::size_t n, std::string_view file,
                std::map<int, std::string>& processes, std::map<std::pair<int, int>, Track>& tracks,
                std::map<std::pair<std::string, std::string>, TraceSummary::OpRow>& ops,
                TraceSummary& s, double& first, double& last) {
  const std::string where = fmt::format("event {}", n);
  if (!e.is_object()) fail(file, fmt::format("{} is {}, not an object", where, e.type_name()));
  const Members m = members(e, file, where);
  const std::string ph = string_or(m, "ph", file, where, true);
  if (ph == "M") {
    const std::string what = string_or(m, "name", file, where, false);
    if (what != "thread_name" && what != "process_name") return;
    const json::Value* args = m.find("args");
    if (args == nullptr || !args->is_object()) return;
    const Members a = members(*args, file, where + " args");
    const std::string name = string_or(a, "name", file, where + " args", false);
    if (name.empty()) return;
    if (what == "process_name") {
      processes[integer(m, "pid", file, where)] = name;
    } else {
      tracks[{integer(m, "pid", file, where), integer(m, "tid", file, where)}].name = name;
    }
    return;
  }
  if (ph != "X") return;  // other phases (instant, counter, B/E pairs) are not summed
  const std::string name = string_or(m, "name", file, where, true);
  const std::string cat = string_or(m, "cat", file, where, false);
  const double ts = number(m, "ts", file, where), dur = number(m, "dur", file, where);
  if (dur < 0) fail(file, fmt::format("{}: 'dur' is negative", where));
  // Microseconds past 2^53 (285 years) are no trace's, and their sums would print as inf.
  constexpr double kMaxUs = 0x1p53;
  if (!(std::fabs(ts) <= kMaxUs) || !(dur <= kMaxUs)) {
    fail(file, fmt::format("{}: 'ts' {} or 'dur' {} is past 2^53 us (285 years): not a trace's time",
                           where, ts, dur));
  }
  Track& t = tracks[{integer(m, "pid", file, where), integer(m, "tid", file, where)}];
  const Interval iv{ts, ts + dur};
  ++s.events;
  first = std::min(first, ts);
  last = std::max(last, ts + dur);
  if (cat != "wait") t.busy.push_back(iv);
  if (cat == "kernel") t.kernels.push_back(iv);
  if (cat == "collective") t.collectives.push_back(iv);
  if (cat == "kernel" || cat == "collective") {
    TraceSummary::OpRow& row = ops[{cat, name}];
    row.cat = cat;
    row.name = name;
    ++row.count;
    row.total_us += dur;
  }
}

}  // namespace

namespace {

/// The trace's text walked one value at a time: each event is parsed on its own into a small
/// Document and dropped after its callback, so reading holds the text and one event, not a
/// Document of the whole file (about 10x its size: 774 MB for a 78 MB trace).
class EventWalker {
 public:
  EventWalker(std::string_view text, std::string_view file, const TraceEventFn& fn)
      : text_(text), file_(file), fn_(fn) {}

  void walk() {
    std::size_t at = skip(0);
    if (at < text_.size() && text_[at] == '[') {
      at = events(at, 1);
    } else if (at < text_.size() && text_[at] == '{') {
      at = top_object(at);
    } else {
      // A scalar or not JSON: parsed whole for the message (a scalar is one node).
      const json::Document doc = parse(0, text_.size(), 0);
      fail(file_, fmt::format("not a trace: the events are {}, not an array", doc.root().type_name()));
    }
    if (skip(at) != text_.size()) syntax(skip(at), "text after the trace's value");
  }

 private:
  [[noreturn]] void syntax(std::size_t at, std::string_view what) const {
    fail(file_, fmt::format("not a trace: not valid JSON (at byte {}): {}", at, what));
  }

  std::size_t skip(std::size_t at) const {
    while (at < text_.size() && (text_[at] == ' ' || text_[at] == '\n' || text_[at] == '\t' ||
                                 text_[at] == '\r')) {
      ++at;
    }
    return at;
  }

  /// The end of the string starting at `at` (its opening quote).
  std::size_t string_end(std::size_t at) const {
    for (std::size_t i = at + 1; i < text_.size(); ++i) {
      if (text_[i] == '\\') {
        ++i;
      } else if (text_[i] == '"') {
        return i + 1;
      }
    }
    syntax(at, "a string is not closed");
  }

  /// The end of the value starting at `at`: its extent only (parse() checks it).
  std::size_t value_end(std::size_t at) const {
    if (at >= text_.size()) syntax(at, "a value is missing");
    const char c = text_[at];
    if (c == '"') return string_end(at);
    if (c != '[' && c != '{') {
      std::size_t i = at;
      while (i < text_.size() && std::string_view(",]} \t\n\r").find(text_[i]) == std::string_view::npos) ++i;
      return i;
    }
    std::size_t depth = 0;
    for (std::size_t i = at; i < text_.size(); ++i) {
      const char d = text_[i];
      if (d == '"') {
        i = string_end(i) - 1;
      } else if (d == '[' || d == '{') {
        ++depth;
      } else if ((d == ']' || d == '}') && --depth == 0) {
        return i + 1;
      }
    }
    syntax(at, "an array or object is not closed");
  }

  /// [begin, end) parsed, inside `outer` levels of nesting (the depth bound is the whole file's).
  json::Document parse(std::size_t begin, std::size_t end, std::size_t outer) const {
    try {
      return json::Document(text_.substr(begin, end - begin), json::kMaxDepth - outer);
    } catch (const json::SyntaxError& e) {
      syntax(begin + e.byte, e.what());
    }
  }

  /// The array at `at`, each element given to the callback; returns the end.
  std::size_t events(std::size_t at, std::size_t outer) {
    at = skip(at + 1);
    if (at < text_.size() && text_[at] == ']') return at + 1;
    for (;;) {
      const std::size_t end = value_end(at);
      const json::Document event = parse(at, end, outer);
      fn_(event.root(), n_++);
      at = skip(end);
      if (at < text_.size() && text_[at] == ']') return at + 1;
      if (at >= text_.size() || text_[at] != ',') syntax(at, "expected ',' or ']' after an event");
      at = skip(at + 1);
    }
  }

  /// The top-level object at `at`: its "traceEvents" walked, every other member checked; each
  /// key once. Returns the end.
  std::size_t top_object(std::size_t at) {
    std::vector<std::string> keys;
    bool found = false;
    at = skip(at + 1);
    if (at < text_.size() && text_[at] == '}') {
      fail(file_, "not a trace: the top-level object has no 'traceEvents'");
    }
    for (;;) {
      if (at >= text_.size() || text_[at] != '"') syntax(at, "expected a key");
      const std::size_t key_end = string_end(at);
      std::string key(parse(at, key_end, 1).root().str());
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
        fail(file_, fmt::format("the top-level object has the key '{}' twice", printable(key)));
      }
      at = skip(key_end);
      if (at >= text_.size() || text_[at] != ':') syntax(at, "expected ':' after a key");
      at = skip(at + 1);
      if (key == "traceEvents" && at < text_.size() && text_[at] == '[') {
        at = events(at, 2);
        found = true;
      } else {
        const std::size_t end = value_end(at);
        const json::Document value = parse(at, end, 1);
        if (key == "traceEvents") {
          fail(file_, fmt::format("not a trace: the events are {}, not an array",
                                  value.root().type_name()));
        }
        at = end;
      }
      keys.push_back(std::move(key));
      at = skip(at);
      if (at < text_.size() && text_[at] == '}') break;
      if (at >= text_.size() || text_[at] != ',') syntax(at, "expected ',' or '}' after a member");
      at = skip(at + 1);
    }
    if (!found) fail(file_, "not a trace: the top-level object has no 'traceEvents'");
    return at + 1;
  }

  std::string_view text_, file_;
  const TraceEventFn& fn_;
  std::size_t n_ = 0;
};

}  // namespace

void for_each_trace_event(std::string_view text, std::string_view file, const TraceEventFn& fn) {
  EventWalker(text, file, fn).walk();
}

TraceSummary summarize_trace(std::string_view text, std::string_view file) {
  TraceSummary s;
  std::map<std::pair<int, int>, Track> tracks;
  std::map<std::pair<std::string, std::string>, TraceSummary::OpRow> ops;
  double first = INFINITY, last = -INFINITY;
  std::map<int, std::string> processes;  // process_name metadata
  for_each_trace_event(text, file, [&](const json::Value& e, std::size_t n) {
    read_event(e, n, file, processes, tracks, ops, s, first, last);
  });
  if (s.events == 0) fail(file, "not a trace: it has no complete ('ph': 'X') events");
  s.span_us = last - first;
  for (auto& [key, row] : ops) s.ops.push_back(std::move(row));
  std::stable_sort(s.ops.begin(), s.ops.end(),
                   [](const auto& a, const auto& b) { return a.total_us > b.total_us; });
  // Over several processes (a merged trace) each row is named with its process too.
  std::set<int> pids;
  for (const auto& [key, t] : tracks) {
    if (!t.busy.empty() || !t.kernels.empty()) pids.insert(key.first);
  }
  for (auto& [key, t] : tracks) {
    if (t.busy.empty() && t.kernels.empty()) continue;  // only named
    TraceSummary::ThreadRow r;
    r.pid = key.first;
    r.tid = key.second;
    r.name = t.name.empty() ? fmt::format("pid {} tid {}", r.pid, r.tid) : t.name;
    if (pids.size() > 1 && !t.name.empty()) {
      const auto p = processes.find(r.pid);
      r.name = (p != processes.end() ? p->second : fmt::format("pid {}", r.pid)) + " " + r.name;
    }
    const std::vector<Interval> kernels = merged(std::move(t.kernels));
    const std::vector<Interval> comm = merged(std::move(t.collectives));
    r.busy_us = length(merged(std::move(t.busy)));
    r.idle_us = std::max(0.0, s.span_us - r.busy_us);
    r.comm_us = length(comm);
    r.exposed_comm_us = std::max(0.0, r.comm_us - overlap(comm, kernels));
    s.threads.push_back(std::move(r));
  }
  return s;
}

namespace {

// "812 ns", "41.2 us", "3.18 ms", "2.04 s".
std::string duration(double us) {
  if (us < 1) return fmt::format("{:.0f} ns", us * 1000);
  if (us < 1000) return fmt::format("{:.1f} us", us);
  if (us < 1e6) return fmt::format("{:.2f} ms", us / 1000);
  return fmt::format("{:.2f} s", us / 1e6);
}

std::string percent(double part, double whole) {
  return whole > 0 ? fmt::format("{:.1f}%", 100 * part / whole) : std::string("-");
}

}  // namespace

std::string format_trace_summary(const TraceSummary& s, std::string_view file, std::size_t top) {
  std::string out = fmt::format("trace {}: {} complete events over {}\n\n", printable(file),
                                s.events, duration(s.span_us));
  out += fmt::format("top kernels and collectives by total time ({} of {})\n",
                     std::min(top, s.ops.size()), s.ops.size());
  out += fmt::format("  {:<10} {:<32} {:>7} {:>10} {:>10}\n", "category", "name", "count", "total",
                     "mean");
  for (std::size_t i = 0; i < s.ops.size() && i < top; ++i) {
    const TraceSummary::OpRow& r = s.ops[i];
    out += fmt::format("  {:<10} {:<32} {:>7} {:>10} {:>10}\n", printable(r.cat), printable(r.name),
                       r.count, duration(r.total_us), duration(r.mean_us()));
  }
  out += fmt::format("\nper thread, over the trace's {}\n", duration(s.span_us));
  std::size_t width = 16;  // wider for long names ("rank 12 device 100")
  for (const TraceSummary::ThreadRow& r : s.threads) width = std::max(width, printable(r.name).size());
  out += fmt::format("  {:<{}} {:>10} {:>8} {:>10} {:>10} {:>10}\n", "thread", width, "busy",
                     "of span", "idle", "comm", "exposed");
  for (const TraceSummary::ThreadRow& r : s.threads) {
    out += fmt::format("  {:<{}} {:>10} {:>8} {:>10} {:>10} {:>10}\n", printable(r.name), width,
                       duration(r.busy_us), percent(r.busy_us, s.span_us), duration(r.idle_us),
                       duration(r.comm_us), duration(r.exposed_comm_us));
  }
  out += "\nexposed: collective time on a thread that no kernel on the same thread overlaps\n";
  return out;
}

}  // namespace shardplan::detail
