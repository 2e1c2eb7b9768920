// PlanReport as JSON: the streaming JSON writer and the report's layout (docs/cli.md).
#include "shardplan/plan_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string_view>
#include <thread>
#include <type_traits>

#include "../formats/json_impl.hpp"
#include "shardplan/detail/utf8.hpp"

namespace shardplan {

namespace {

/// Writes JSON text straight into a string, in the layout of nlohmann's dump(indent): with
/// indent >= 0 one value per line, else no spaces. Building a DOM of a 90k-tensor report first
/// took most of `shardplan plan --json`'s time.
// The writer's output buffer: appends without std::string's terminator and out-of-line growth
// path on every call (the report of a 90k-tensor plan is tens of megabytes of small appends).
class Buffer {
 public:
  using value_type = char;  // for std::back_inserter
  void reserve(std::size_t n) {
    if (n > cap_) grow_to(n);
  }
  void push_back(char c) {
    if (size_ == cap_) grow_to(size_ + 1);
    data_[size_++] = c;
  }
  Buffer& operator+=(char c) {
    push_back(c);
    return *this;
  }
  Buffer& operator+=(std::string_view s) {
    append(s.data(), s.size());
    return *this;
  }
  void append(const char* p, std::size_t n) {
    copy(room(n), p, n);
    size_ += n;
  }
  /// memcpy, with the short copies the writer makes most (keys, numbers, separators) done
  /// inline in two overlapping moves instead of a call.
  static void copy(char* to, const char* from, std::size_t n) {
    if (n > 16) {
      std::memcpy(to, from, n);
    } else if (n >= 8) {
      std::uint64_t a, b;
      std::memcpy(&a, from, 8);
      std::memcpy(&b, from + n - 8, 8);
      std::memcpy(to, &a, 8);
      std::memcpy(to + n - 8, &b, 8);
    } else if (n >= 4) {
      std::uint32_t a, b;
      std::memcpy(&a, from, 4);
      std::memcpy(&b, from + n - 4, 4);
      std::memcpy(to, &a, 4);
      std::memcpy(to + n - 4, &b, 4);
    } else {
      for (std::size_t i = 0; i < n; ++i) to[i] = from[i];
    }
  }
  void append(std::size_t n, char c) {
    if (cap_ - size_ < n) grow_to(size_ + n);
    if (n != 0) std::memset(data_.get() + size_, c, n);
    size_ += n;
  }
  /// Room for `n` more bytes at the end; write them, then commit(n).
  char* room(std::size_t n) {
    if (cap_ - size_ < n) grow_to(size_ + n);
    return data_.get() + size_;
  }
  void commit(std::size_t n) { size_ += n; }
  const char* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  void clear() { size_ = 0; }

 private:
  void grow_to(std::size_t n) {
    const std::size_t cap = std::max(n, 2 * cap_ + 256);
    auto data = std::make_unique_for_overwrite<char[]>(cap);
    if (size_ != 0) std::memcpy(data.get(), data_.get(), size_);
    data_ = std::move(data);
    cap_ = cap;
  }
  std::unique_ptr<char[]> data_;
  std::size_t size_ = 0, cap_ = 0;
};

class JsonWriter {
 public:
  /// Writes into a string (take()), or, with `sink`, into the stream in pieces.
  explicit JsonWriter(int indent, std::ostream* sink = nullptr) : indent_(indent), sink_(sink) {
    if (sink_) out_.reserve(2 * kChunk);
  }

  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }

  /// An object member's key (a plain identifier: written as it is); the value follows.
  JsonWriter& key(std::string_view k) {
    element();
    char* p = out_.room(k.size() + 4);
    *p++ = '"';
    Buffer::copy(p, k.data(), k.size());
    p += k.size();
    *p++ = '"';
    *p++ = ':';
    if (indent_ >= 0) *p++ = ' ';
    out_.commit(k.size() + (indent_ >= 0 ? 4 : 3));
    after_key_ = true;
    return *this;
  }

  JsonWriter& value(std::string_view v) {
    element();
    string_text(v);
    return *this;
  }
  JsonWriter& value(const char* v) { return value(std::string_view(v)); }
  /// A value given as its JSON text (already quoted and escaped).
  JsonWriter& json_text(std::string_view text) {
    element();
    out_.append(text.data(), text.size());
    return *this;
  }
  /// One string value made of three parts.
  JsonWriter& value_concat(std::string_view a, std::string_view b, std::string_view c) {
    element();
    out_ += '"';
    string_body(a);
    string_body(b);
    string_body(c);
    out_ += '"';
    return *this;
  }
  JsonWriter& value(bool v) {
    element();
    out_ += v ? "true" : "false";
    return *this;
  }
  JsonWriter& value(std::nullptr_t) {
    element();
    out_ += "null";
    return *this;
  }
  template <typename T>
  requires std::is_integral_v<T> JsonWriter& value(T v) {
    element();
    const fmt::format_int text(v);
    out_.append(text.data(), text.size());
    return *this;
  }
  template <typename Range>
  JsonWriter& array_of(const Range& r) {
    begin_array();
    for (const auto& x : r) value(x);
    return end_array();
  }

  /// A writer that goes on inside the containers open in `w` (for text made elsewhere and
  /// spliced in with splice()); `first` says whether the innermost has no element yet.
  JsonWriter(const JsonWriter& w, bool first)
      : indent_(w.indent_), sink_(nullptr), first_(w.first_), after_key_(false) {
    first_.back() = first;
  }
  /// Appends what `part` wrote (a continuation of this writer); `wrote` says it wrote an
  /// element into the innermost container.
  void splice(const JsonWriter& part, bool wrote) {
    if (sink_) {  // straight to the sink, after what is buffered
      flush(/*all=*/true);
      sink_->write(part.out_.data(), static_cast<std::streamsize>(part.out_.size()));
    } else {
      out_.append(part.out_.data(), part.out_.size());
    }
    if (wrote) first_.back() = false;
  }

  std::string take() const { return std::string(out_.data(), out_.size()); }
  /// Hands what is buffered to the sink once it holds a chunk (or always, with `all`).
  void flush(bool all = false) {
    if (sink_ && (all || out_.size() >= kChunk)) {
      sink_->write(out_.data(), static_cast<std::streamsize>(out_.size()));
      out_.clear();
    }
  }
  void reserve(std::size_t n) { out_.reserve(n); }
  /// True when the innermost open container has no element yet.
  bool empty_container() const { return !first_.empty() && first_.back(); }

 private:
  JsonWriter& open(char c) {
    element();
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char c) {
    const bool empty = first_.back();
    first_.pop_back();
    if (!empty) newline();
    out_ += c;
    return *this;
  }
  // Before a key or a value: a comma after a previous element, then its line.
  void element() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (first_.empty()) return;
    if (!first_.back()) out_ += ',';
    first_.back() = false;
    newline();
  }
  void newline() {
    if (indent_ < 0) return;
    const std::size_t n = first_.size() * static_cast<std::size_t>(indent_);
    static constexpr std::string_view kSpaces = "                                ";
    char* p = out_.room(n + 1);
    *p = '\n';
    if (n <= kSpaces.size()) {
      Buffer::copy(p + 1, kSpaces.data(), n);
    } else {
      std::memset(p + 1, ' ', n);
    }
    out_.commit(n + 1);
  }
  // A JSON string. Bytes that are not UTF-8 (a pattern or a name from a file can hold any) are
  // written as U+FFFD, so the output is always valid JSON.
  void string_text(std::string_view s) {
    out_ += '"';
    string_body(s);
    out_ += '"';
  }
  void string_body(std::string_view s) {
    std::size_t run = 0;
    for (std::size_t i = 0; i < s.size();) {
      if (i + 8 <= s.size() && detail::json::plain_string_word(s.data() + i)) {
        i += 8;
        continue;
      }
      const auto c = static_cast<unsigned char>(s[i]);
      if (kPlain[c]) {
        ++i;
        continue;
      }
      std::size_t len = 1;
      if (c >= 0x80) {
        len = utf8_length(s, i);
        if (len != 0) {
          i += len;
          continue;
        }
      }
      out_.append(s.data() + run, i - run);
      switch (c) {
        case '"':
          out_ += "\\\"";
          break;
        case '\\':
          out_ += "\\\\";
          break;
        case '\b':
          out_ += "\\b";
          break;
        case '\f':
          out_ += "\\f";
          break;
        case '\n':
          out_ += "\\n";
          break;
        case '\r':
          out_ += "\\r";
          break;
        case '\t':
          out_ += "\\t";
          break;
        default:
          if (c < 0x20) {
            fmt::format_to(std::back_inserter(out_), "\\u{:04x}", c);
          } else {
            out_ += "\\ufffd";
          }
      }
      ++i;
      run = i;
    }
    out_.append(s.data() + run, s.size() - run);
  }
  // Bytes written as they are: printable ASCII other than '"' and '\\'.
  static constexpr std::array<bool, 256> kPlain = [] {
    std::array<bool, 256> t{};
    for (int c = 0x20; c < 0x80; ++c) t[static_cast<std::size_t>(c)] = c != '"' && c != '\\';
    return t;
  }();
  /// Length of the well-formed UTF-8 sequence at s[i] (a byte >= 0x80), or 0.
  static std::size_t utf8_length(std::string_view s, std::size_t i) {
    char32_t cp = 0;
    return detail::utf8_decode(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i,
                               cp);
  }

  static constexpr std::size_t kChunk = std::size_t{1} << 20;
  int indent_;
  std::ostream* sink_;
  Buffer out_;
  std::vector<unsigned char> first_;  // per open container: no element written yet (not
                                      // vector<bool>: its bit proxies cost on every element)
  bool after_key_ = false;
};

/// A spec as JSON: null for a replicated dimension, "x" for one axis, ["x", "y"] for several.
void write_spec(JsonWriter& w, const PartitionSpec& spec) {
  w.begin_array();
  for (const auto& d : spec.dims()) {
    if (d.empty()) {
      w.value(nullptr);
    } else if (d.size() == 1) {
      w.value(d[0]);
    } else {
      w.array_of(d);
    }
  }
  w.end_array();
}

/// The report as JSON (format in docs/cli.md).
void write_report(JsonWriter& w, const PlanReport& report);

}  // namespace

std::string PlanReport::to_json(int indent) const {
  JsonWriter w(indent);
  w.reserve(leaves.size() * (indent >= 0 ? 560 : 360) + 4096);
  write_report(w, *this);
  return w.take();
}

void PlanReport::write_json(std::ostream& os, int indent) const {
  JsonWriter w(indent, &os);
  write_report(w, *this);
  w.flush(/*all=*/true);
}

namespace {

/// The JSON text (quoted and escaped) of the strings that every leaf a rule decided repeats:
/// the rule's name and path and each entry's reason, escaped once per report.
struct RuleTexts {
  std::string rule, rule_path;
  std::vector<std::string> reasons;  // by entry: "matched '<label>'"
};

std::string json_string(std::string_view a, std::string_view b = {}, std::string_view c = {}) {
  JsonWriter w(-1);
  w.value_concat(a, b, c);
  return w.take();
}

std::vector<RuleTexts> rule_texts(const PlanReport& report) {
  std::vector<RuleTexts> out;
  out.reserve(report.rules.size());
  for (const RuleInfo& r : report.rules) {
    RuleTexts& t = out.emplace_back();
    t.rule = json_string(r.rule);
    t.rule_path = json_string(r.rule_path);
    for (const std::string& label : r.labels)
      t.reasons.push_back(json_string("matched '", label, "'"));
  }
  return out;
}

void write_leaf(JsonWriter& w, const PlanReport& report, const std::vector<RuleTexts>& texts,
                const LeafPlan& l) {
  const RuleInfo& r = report.rule_of(l);
  // rule_of(l) is report.rules[l.rule_index] when that is in range; texts are by the same index.
  const RuleTexts* t = l.rule_index >= 0 && static_cast<std::size_t>(l.rule_index) < texts.size()
                           ? &texts[static_cast<std::size_t>(l.rule_index)]
                           : nullptr;
  w.begin_object();
  w.key("bytes").value(l.tensor.bytes());
  w.key("bytes_per_device").value(l.bytes_per_device);
  w.key("dtype").value(safetensors_name(l.tensor.dtype));
  w.key("entry").value(l.entry);
  w.key("fell_through").value(l.fell_through);
  w.key("path").value(l.path);
  w.key("reason");
  if (l.reason.empty() && l.entry >= 0 && static_cast<std::size_t>(l.entry) < r.labels.size()) {
    // reason_of's text, written without building it.
    const auto entry = static_cast<std::size_t>(l.entry);
    if (t) {
      w.json_text(t->reasons[entry]);
    } else {
      w.value_concat("matched '", r.labels[entry], "'");
    }
  } else if (!l.reason.empty()) {
    w.value(l.reason);
  } else {
    w.value(report.reason_of(l));
  }
  w.key("rule");
  t ? w.json_text(t->rule) : w.value(r.rule);
  w.key("rule_index").value(l.rule_index);
  w.key("rule_path");
  t ? w.json_text(t->rule_path) : w.value(r.rule_path);
  w.key("shape").array_of(l.tensor.shape);
  w.key("shard_shape").array_of(l.shard_shape);
  w.key("spec");
  if (l.spec) {
    write_spec(w, *l.spec);
  } else {
    w.value(nullptr);
  }
  w.end_object();
}

/// The leaves array's elements. A large report is written in chunks of leaves formatted on
/// up to hardware_concurrency threads (the calling one among them) and handed to `w` in order,
/// at most a few chunks ahead of the one being written; the text is the same as written
/// serially.
void write_leaves(JsonWriter& w, const PlanReport& report) {
  const std::vector<LeafPlan>& leaves = report.leaves;
  const std::vector<RuleTexts> texts = rule_texts(report);
  constexpr std::size_t kLeavesPerChunk = 1024;
  const std::size_t chunks = (leaves.size() + kLeavesPerChunk - 1) / kLeavesPerChunk;
  const std::size_t threads =
      std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), chunks);
  if (threads <= 1) {
    for (const LeafPlan& l : leaves) {
      write_leaf(w, report, texts, l);
      w.flush();
    }
    return;
  }
  const std::size_t window = 2 * threads;  // chunks formatted but not yet written, at most
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::optional<JsonWriter>> ready(chunks);
  std::size_t next = 0, written = 0;
  std::exception_ptr error;
  // The chunks' writers start from this state, taken before any thread starts (`w` itself
  // changes as chunks are spliced in).
  const JsonWriter start(w, w.empty_container());
  auto format = [&](std::size_t c) {
    JsonWriter part(start, c == 0 && start.empty_container());
    const std::size_t end = std::min(leaves.size(), (c + 1) * kLeavesPerChunk);
    for (std::size_t i = c * kLeavesPerChunk; i < end; ++i) {
      write_leaf(part, report, texts, leaves[i]);
    }
    return part;
  };
  // Takes the next chunk when the window allows (with `lock` held); false when none is left.
  auto take = [&](std::unique_lock<std::mutex>& lock) {
    if (error || next >= chunks || next >= written + window) return false;
    const std::size_t c = next++;
    lock.unlock();
    std::optional<JsonWriter> part;
    std::exception_ptr failed;
    try {
      part.emplace(format(c));
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    if (failed && !error) error = failed;
    ready[c] = std::move(part);
    changed.notify_all();
    return true;
  };
  std::vector<std::jthread> helpers;
  helpers.reserve(threads - 1);
  for (std::size_t t = 1; t < threads; ++t) {
    helpers.emplace_back([&] {
      std::unique_lock lock(mutex);
      while (!error && next < chunks) {
        if (!take(lock)) changed.wait(lock);
      }
    });
  }
  std::unique_lock lock(mutex);
  while (!error && written < chunks) {
    if (ready[written]) {
      std::optional<JsonWriter> part = std::move(ready[written]);
      lock.unlock();
      w.splice(*part, true);
      part.reset();
      w.flush();
      lock.lock();
      ++written;
      changed.notify_all();
    } else if (!take(lock)) {
      changed.wait(lock);
    }
  }
  lock.unlock();
  changed.notify_all();
  helpers.clear();  // joins
  if (error) std::rethrow_exception(error);
}

void write_report(JsonWriter& w, const PlanReport& report) {
  const auto& [mesh, leaves, device_bytes, total_bytes, unmatched_rules, rules] = report;
  // Keys in sorted order, as the format has always listed them.
  w.begin_object();
  w.key("bytes_per_device").begin_object();
  w.key("max").value(report.max_device_bytes()).key("min").value(report.min_device_bytes());
  w.end_object();
  w.key("devices").begin_array();
  for (std::size_t i = 0; i < device_bytes.size(); ++i) {
    w.begin_object().key("bytes").value(device_bytes[i]).key("id").value(i).end_object();
  }
  w.end_array();
  w.key("fell_through").begin_array();
  for (const auto& l : leaves) {
    if (l.fell_through) w.value(l.path);
  }
  w.end_array();
  w.key("leaves").begin_array();
  write_leaves(w, report);
  w.end_array();
  w.key("mesh").begin_object();
  w.key("axes").array_of(mesh.axis_names());
  w.key("devices").array_of(mesh.devices());
  w.key("shape").array_of(mesh.axis_sizes());
  w.end_object();
  w.key("total_bytes").value(total_bytes);
  w.key("unmatched_rules").begin_array();
  for (const auto& u : unmatched_rules) {
    w.begin_object();
    w.key("activation").value(u.activation);
    w.key("entry").value(u.entry);
    w.key("label").value(u.label);
    w.key("rule").value(u.rule);
    w.key("rule_index").value(u.rule_index);
    w.key("rule_path").value(u.rule_path);
    w.end_object();
  }
  w.end_array();
  w.end_object();
}

}  // namespace

}  // namespace shardplan
