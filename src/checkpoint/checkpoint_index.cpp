#include "checkpoint_index.hpp"

#include <fmt/format.h>

#include <filesystem>

#include "../formats/json_impl.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

/// A name for a message: cut at 200 bytes (at a character boundary) with "...", and control
/// characters as \xNN (a NUL would end the message where it stands, an escape sequence would
/// reach the terminal).
std::string shown(std::string_view name) {
  constexpr std::size_t kMax = 200;
  std::size_t cut = name.size();
  if (cut > kMax) {
    cut = kMax;
    while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  }
  std::string out;
  out.reserve(cut + 3);
  for (const char c : name.substr(0, cut)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  if (cut < name.size()) out += "...";
  return out;
}

[[noreturn]] void fail(std::string_view source, const std::string& what) {
  throw IoError(fmt::format("[checkpoint] {}: {}", source, what));
}

json::Document parse_json(std::string_view text, std::string_view source) {
  try {
    return json::Document(text);
  } catch (const json::SyntaxError& e) {
    fail(source, fmt::format("not valid JSON (at byte {}): {}", e.byte, e.what()));
  }
}

/// The member `key` of object `obj` (`where` names it in messages), if there; a key given twice
/// is an error (which of the two counts would be a guess).
std::optional<json::Value> member(json::Value obj, std::string_view key, std::string_view source,
                                  std::string_view where) {
  std::optional<json::Value> found;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (it.key() != key) continue;
    if (found) fail(source, fmt::format("{} has the key '{}' twice", where, key));
    found = it.value();
  }
  return found;
}

/// An optional string member.
std::optional<std::string_view> string_member(json::Value obj, std::string_view key,
                                              std::string_view source, std::string_view where) {
  const auto v = member(obj, key, source, where);
  if (!v) return std::nullopt;
  if (!v->is_string()) {
    fail(source, fmt::format("{}: '{}' must be a string, got {} {}", where, key, v->type_name(),
                             v->source_text(80)));
  }
  return v->str();
}

/// 1 to 16 hexadecimal digits (as the writer prints an XXH3-64: 16 of them).
std::optional<std::uint64_t> parse_hex64(std::string_view s) {
  if (s.empty() || s.size() > 16) return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : s) {
    int d = 0;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  return v;
}

/// A name the index may hold for a file: relative, inside the directory.
void check_file_name(std::string_view source, std::string_view tensor, std::string_view file) {
  bool bad = file.empty() || file.find('\0') != std::string_view::npos;
  if (!bad) {
    const std::filesystem::path p{std::string(file)};
    bad = p.has_root_path();
    for (const auto& part : p) bad = bad || part == "..";
  }
  if (bad) {
    fail(source, fmt::format("tensor '{}' is mapped to file '{}', which is not a file name "
                             "inside the checkpoint directory",
                             shown(tensor), shown(file)));
  }
}

CheckpointRecord read_record(json::Value r, std::string_view source) {
  constexpr std::string_view kWhere = "the shardplan record";
  if (!r.is_object()) {
    fail(source, fmt::format("{} (metadata.shardplan) must be an object, got {} {}", kWhere,
                             r.type_name(), r.source_text(80)));
  }
  CheckpointRecord out;
  if (const auto v = member(r, "version", source, kWhere)) {
    if (!v->is_uint() || v->as_uint() != kCheckpointFormatVersion) {
      fail(source, fmt::format("{} has version {}; this shardplan reads version {}", kWhere,
                               v->source_text(40), kCheckpointFormatVersion));
    }
  }
  if (const auto mesh = string_member(r, "mesh", source, kWhere)) out.mesh = *mesh;
  if (const auto names = string_member(r, "names", source, kWhere)) {
    if (*names == "dotted") {
      out.name_separator = '.';
    } else if (*names == "tree paths") {
      out.name_separator = '/';
    } else {
      fail(source, fmt::format("{}: 'names' is '{}'; expected 'tree paths' or 'dotted'", kWhere,
                               shown(*names)));
    }
  }
  if (const auto s = member(r, "structure", source, kWhere)) {
    out.structure = s->source_text(std::string::npos);
  }
  if (const auto files = member(r, "files", source, kWhere)) {
    if (!files->is_object()) {
      fail(source, fmt::format("{}: 'files' must be an object of file name -> checksum, got {}",
                               kWhere, files->type_name()));
    }
    out.checksums.reserve(files->size());
    for (auto it = files->begin(); it != files->end(); ++it) {
      const std::string where = fmt::format("{}: file '{}'", kWhere, shown(it.key()));
      const json::Value f = it.value();
      std::optional<std::uint64_t> sum;
      if (f.is_object()) {
        if (const auto h = string_member(f, "xxh3", source, where)) sum = parse_hex64(*h);
      }
      if (!sum) {
        fail(source, fmt::format("{}: expected {{\"xxh3\": 16 hexadecimal digits}}, got {}", where,
                                 f.source_text(80)));
      }
      if (!out.checksums.emplace(std::string(it.key()), *sum).second) {
        fail(source,
             fmt::format("{}: file '{}' appears twice in 'files'", kWhere, shown(it.key())));
      }
    }
  }
  if (const auto tensors = member(r, "tensors", source, kWhere)) {
    if (!tensors->is_object()) {
      fail(source, fmt::format("{}: 'tensors' must be an object of tensor name -> sharding and "
                               "dtype, got {}",
                               kWhere, tensors->type_name()));
    }
    out.shardings.reserve(tensors->size());
    for (auto it = tensors->begin(); it != tensors->end(); ++it) {
      const std::string where = fmt::format("{}: tensor '{}'", kWhere, shown(it.key()));
      const json::Value t = it.value();
      if (!t.is_object()) {
        fail(source, fmt::format("{}: expected an object with sharding and dtype, got {} {}", where,
                                 t.type_name(), t.source_text(80)));
      }
      const auto sharding = string_member(t, "sharding", source, where);
      string_member(t, "dtype", source, where);  // (the headers have the dtype; type-checked)
      if (!out.shardings.emplace(std::string(it.key()), std::string(sharding.value_or("")))
               .second) {
        fail(source,
             fmt::format("{}: tensor '{}' appears twice in 'tensors'", kWhere, shown(it.key())));
      }
    }
  }
  return out;
}

}  // namespace

CheckpointIndex parse_checkpoint_index(std::string_view text, std::string_view source) {
  const json::Document doc = parse_json(text, source);
  const json::Value root = doc.root();
  constexpr std::string_view kWhere = "the index";
  std::optional<json::Value> weight_map;
  if (root.is_object()) weight_map = member(root, "weight_map", source, kWhere);
  if (!weight_map || !weight_map->is_object()) {
    fail(source, "no \"weight_map\" object (of tensor name -> file name)");
  }
  CheckpointIndex out;
  json::KeySet seen(weight_map->size());
  out.weight_map.reserve(weight_map->size());
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    const std::string_view name = it.key();
    const json::Value file = it.value();
    if (!file.is_string()) {
      fail(source, fmt::format("tensor '{}' is mapped to {}, not a file name", shown(name),
                               file.source_text(80)));
    }
    if (!seen.insert(name)) {
      fail(source, fmt::format("tensor '{}' appears twice in weight_map", shown(name)));
    }
    check_file_name(source, name, file.str());
    out.weight_map.emplace_back(std::string(name), std::string(file.str()));
  }
  if (const auto meta = member(root, "metadata", source, kWhere); meta && meta->is_object()) {
    if (const auto record = member(*meta, "shardplan", source, "the index's metadata")) {
      out.record = read_record(*record, source);
    }
  }
  return out;
}

CheckpointRecord parse_checkpoint_record(std::string_view text, std::string_view source) {
  const json::Document doc = parse_json(text, source);
  return read_record(doc.root(), source);
}

}  // namespace shardplan::detail
