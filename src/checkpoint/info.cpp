// Reading what a checkpoint holds (read_checkpoint_info) in shardplan's and Hugging Face's
// layouts: the index (or the single weights file), shardplan's record, each file's safetensors
// header; and checking the files' checksums (verify_checkpoint).
#include <fmt/format.h>

#include <algorithm>
#include <system_error>
#include <unordered_map>
#include <unordered_set>

#include "../formats/input_file.hpp"
#include "checkpoint_impl.hpp"
#include "checkpoint_index.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/safetensors.hpp"

namespace shardplan {

namespace fs = std::filesystem;
using detail::io_fail;
using detail::kIndexName;

const CheckpointTensor* CheckpointInfo::find(std::string_view name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::int64_t CheckpointInfo::total_bytes() const {
  std::int64_t n = 0;
  for (const auto& t : tensors) n += t.spec.bytes();
  return n;
}

namespace {

/// Where a checkpoint's tensors are listed: its index, or (no index) its one weights file.
struct Layout {
  fs::path index_path;                  // empty when there is no index
  std::vector<std::string> file_names;  // the weights file, when there is no index
};

/// A directory without model.safetensors.index.json: Hugging Face names the index after the
/// weights file; take any single index, else a single .safetensors file.
Layout find_in_directory(const fs::path& path) {
  std::vector<fs::path> indexes, weights;
  std::error_code ec;
  fs::directory_iterator entries(path, ec);
  if (ec) io_fail(path, "cannot list the directory", ec.value());
  for (const auto& e : entries) {
    const std::string n = e.path().filename().string();
    if (n.ends_with(".safetensors.index.json")) indexes.push_back(e.path());
    // (A file stat cannot tell, a link loop, counts: its reader names what is wrong.)
    std::error_code kind;
    if (n.ends_with(".safetensors") && (e.is_regular_file(kind) || kind)) {
      weights.push_back(e.path());
    }
  }
  Layout out;
  if (indexes.size() == 1) {
    out.index_path = indexes.front();
  } else if (indexes.empty() && weights.size() == 1) {
    out.file_names.push_back(weights.front().filename().string());
  } else {
    throw IoError(
        fmt::format("[checkpoint] {}: expected {} (or one *.safetensors.index.json, or a single "
                    ".safetensors file); found {} index files and {} .safetensors files",
                    path.string(), kIndexName, indexes.size(), weights.size()));
  }
  return out;
}

/// The layout of the checkpoint at `path` (a directory or a single safetensors file); sets
/// info.dir.
Layout locate(const fs::path& path, CheckpointInfo& info) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    info.dir = path;
    if (fs::exists(path / kIndexName, ec)) return {path / kIndexName, {}};
    return find_in_directory(path);
  }
  if (fs::exists(path, ec) || ec) {
    // A single safetensors file (its reader refuses anything but a regular file, and names
    // what stat could not tell: a link loop, a permission error).
    info.dir = path.parent_path();
    return {{}, {path.filename().string()}};
  }
  throw IoError(fmt::format("[checkpoint] {}: no such file or directory", path.string()));
}

/// Tensor name -> file, as the index maps them (views into the index).
using FileOf = std::unordered_map<std::string_view, std::string_view>;

/// The files the index maps tensors to, sorted, appended to `file_names`.
FileOf read_weight_map(const detail::CheckpointIndex& index, std::vector<std::string>& file_names) {
  FileOf file_of;
  file_of.reserve(index.weight_map.size());
  std::unordered_set<std::string_view> listed;
  for (const auto& [name, file] : index.weight_map) {
    file_of.emplace(name, file);
    if (listed.insert(file).second) file_names.push_back(file);
  }
  std::sort(file_names.begin(), file_names.end());
  return file_of;
}

/// Adds the file `name` (its checksum from `record`, when given) and the tensors of its header
/// that the index maps to it (all of them without an index) to `info`.
void add_file(CheckpointInfo& info, const std::string& name, const fs::path& index_path,
              const detail::CheckpointRecord* record, const FileOf& file_of) {
  const fs::path file = info.dir / name;
  std::error_code ec;
  // "missing" only when it is (a link loop or a permission error: the reader below names it).
  if (!fs::exists(file, ec) && !ec) {
    throw IoError(fmt::format("[checkpoint] {}: missing (the index {} maps tensors to it)",
                              file.string(), index_path.string()));
  }
  CheckpointFile cf{name, std::nullopt};
  if (record != nullptr) {
    const auto sum = record->checksums.find(name);
    if (sum == record->checksums.end()) {
      throw IoError(
          fmt::format("[checkpoint] {}: no checksum for file '{}' in the shardplan "
                      "record",
                      index_path.string(), name));
    }
    cf.xxh3 = sum->second;
  }
  info.files.push_back(cf);
  SafetensorsHeader h = read_safetensors_header(file);
  for (auto& e : h.tensors) {
    if (!index_path.empty()) {
      const auto it = file_of.find(e.name);
      if (it == file_of.end() || it->second != name) continue;  // the index names another
    }
    CheckpointTensor t{std::move(e.name), e.spec, name, 8 + h.header_size + e.begin, ""};
    if (record != nullptr) {
      const auto s = record->shardings.find(t.name);
      if (s != record->shardings.end()) t.sharding = s->second;
    }
    info.tensors.push_back(std::move(t));
  }
}

/// Every tensor the index maps must be in its file's header.
void check_all_found(const CheckpointInfo& info, const detail::CheckpointIndex& index) {
  std::unordered_set<std::string_view> found;
  found.reserve(info.tensors.size());
  for (const auto& t : info.tensors) found.insert(t.name);
  for (const auto& [name, file] : index.weight_map) {
    if (!found.contains(name)) {
      throw IoError(
          fmt::format("[checkpoint] {}: the index maps tensor '{}' to it, but its "
                      "header has no such tensor",
                      (info.dir / file).string(), name));
    }
  }
}

}  // namespace

CheckpointInfo read_checkpoint_info(const fs::path& path) {
  CheckpointInfo info;
  Layout layout = locate(path, info);
  detail::CheckpointIndex index;  // from the index, when there is one
  FileOf file_of;
  if (!layout.index_path.empty()) {
    index = detail::parse_checkpoint_index(detail::read_input_file(layout.index_path, "checkpoint"),
                                           layout.index_path.string());
    file_of = read_weight_map(index, layout.file_names);
  }
  const detail::CheckpointRecord* record = index.record ? &*index.record : nullptr;
  info.shardplan = record != nullptr;
  if (record != nullptr) {
    info.mesh = record->mesh;
    info.name_separator = record->name_separator;
    info.structure = record->structure;
  }
  for (const std::string& name : layout.file_names) {
    add_file(info, name, layout.index_path, record, file_of);
  }
  check_all_found(info, index);
  return info;
}

void verify_checkpoint(const CheckpointInfo& info) {
  detail::collectively([&] {
    const int me = distributed::process_index(), n = distributed::process_count();
    for (std::size_t i = 0; i < info.files.size(); ++i) {
      if (static_cast<int>(i % static_cast<std::size_t>(n)) != me) continue;
      const CheckpointFile& f = info.files[i];
      if (!f.xxh3) continue;
      const std::uint64_t got = detail::file_checksum(info.dir / f.name);
      if (got != *f.xxh3) {
        throw IoError(
            fmt::format("[checkpoint] {}: checksum mismatch (XXH3 {:016x}, the index "
                        "records {:016x}): the file was changed or damaged after saving",
                        (info.dir / f.name).string(), got, *f.xxh3));
      }
    }
  });
}

}  // namespace shardplan
