#pragma once
// What a model family's declaration uses to read its config.json fields and to list its
// parameters: the fields of the file (each read one marked), checked products, the tensor bound.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../formats/json_impl.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/error.hpp"
#include "shardplan/train_plan.hpp"

namespace shardplan::train {

namespace json = detail::json;

/// A value as it is written in the file, short, for messages.
inline std::string shown(const json::Value& v) { return v.source_text(40); }

/// The members of config.json's object, each key once, and which of them were read: what is
/// left at the end is named (not modelled) or known to change neither shapes nor work.
class Fields {
 public:
  Fields(const json::Value& root, std::string_view source) : source_(source) {
    json::KeySet seen(root.size());
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (!seen.insert(it.key())) {
        throw IoError(fmt::format("[config] {}: the field '{}' appears twice", source_,
                                  detail::printable(it.key())));
      }
      members_.push_back({it.key(), it.value(), false});
    }
  }
  std::string_view source() const { return source_; }

  /// The field, marked as read; nullopt when absent or null.
  std::optional<json::Value> get(std::string_view key) {
    for (Member& m : members_) {
      if (m.key != key) continue;
      m.read = true;
      if (m.value.is_null()) return std::nullopt;
      return m.value;
    }
    return std::nullopt;
  }
  bool has(std::string_view key) const {
    for (const Member& m : members_) {
      if (m.key == key && !m.value.is_null()) return true;
    }
    return false;
  }
  /// Whether the file has the field, null or not (transformers: absent is the default, null
  /// may mean none).
  bool present(std::string_view key) const {
    for (const Member& m : members_) {
      if (m.key == key) return true;
    }
    return false;
  }

  /// A positive integer (up to 2^63 - 1); `fallback` (when > 0) if absent or null.
  std::int64_t positive(std::string_view key, std::int64_t fallback = 0) {
    return integer(key, 1, fallback > 0 ? std::optional(fallback) : std::nullopt);
  }
  /// An integer from `min` to 2^63 - 1; `fallback` if absent or null (an error without one).
  std::int64_t integer(std::string_view key, std::int64_t min,
                       std::optional<std::int64_t> fallback) {
    const auto v = get(key);
    if (!v) {
      if (fallback) return *fallback;
      throw IoError(fmt::format("[config] {}: the field '{}' is missing", source_, key));
    }
    if (!v->is_uint() || v->as_uint() < static_cast<std::uint64_t>(min) ||
        v->as_uint() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw IoError(
          fmt::format("[config] {}: the field '{}' is {}, expected {} integer ({} to 2^63 - 1)",
                      source_, key, shown(*v), min == 1 ? "a positive" : "an", min));
    }
    return static_cast<std::int64_t>(v->as_uint());
  }
  /// A positive integer, or nullopt when absent or null.
  std::optional<std::int64_t> optional_positive(std::string_view key) {
    if (!has(key)) {
      get(key);  // null is read as "none"
      return std::nullopt;
    }
    return positive(key);
  }

  bool flag(std::string_view key, bool fallback) {
    const auto v = get(key);
    if (!v) return fallback;
    if (v->kind() != json::Kind::kBool) {
      throw IoError(fmt::format("[config] {}: the field '{}' is {}, expected true or false",
                                source_, key, shown(*v)));
    }
    return v->as_bool();
  }

  std::optional<std::string> string(std::string_view key) {
    const auto v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) {
      throw IoError(fmt::format("[config] {}: the field '{}' is {}, expected a string", source_,
                                key, shown(*v)));
    }
    return std::string(v->str());
  }

  /// A finite number >= 0 (a dropout rate, a noise level); 0 when absent or null.
  double rate(std::string_view key) {
    const auto v = get(key);
    if (!v) return 0;
    const json::Kind k = v->kind();
    const double x = k == json::Kind::kUint || k == json::Kind::kInt || k == json::Kind::kNumber
                         ? v->as_double()
                         : -1;
    if (!std::isfinite(x) || x < 0) {
      throw IoError(fmt::format("[config] {}: the field '{}' is {}, expected a number >= 0",
                                source_, key, shown(*v)));
    }
    return x;
  }

  struct Member {
    std::string_view key;
    json::Value value;
    bool read;
  };
  std::vector<Member>& members() { return members_; }

 private:
  std::string source_;
  std::vector<Member> members_;
};

/// a * b, or an IoError naming what overflowed.
std::int64_t mul(std::int64_t a, std::int64_t b, std::string_view what);

/// Refuses a config whose layers (and experts) describe more tensors than any model has.
void check_tensor_count(const ModelConfig& c, std::string_view source);

/// The checks a decoder-only family's reader ends with: the tensor count, the heads grouping
/// over the key/value heads, the attention width.
void check_heads(ModelConfig& c, std::string_view source);

/// Parameters by their checkpoint names, as they are added.
struct NamedSpecs {
  DType dtype;
  std::vector<std::pair<std::string, TensorSpec>> named;
  void add(std::string name, std::vector<std::int64_t> dims) {
    named.emplace_back(std::move(name), TensorSpec{Shape(std::move(dims)), dtype});
  }
};

}  // namespace shardplan::train
