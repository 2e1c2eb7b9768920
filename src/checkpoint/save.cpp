// Saving: SaveJob's steps (shared with AsyncCheckpointer, async_save.cpp) and save_checkpoint.
// POSIX pwrite of each block's runs into files made at their full size, the run's own
// `.NAME.partial-X` directory then a no-replace rename (src/formats/output_file.hpp), XXH3 checksums in
// the index.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <thread>

#include "../runtime/box_copy.hpp"
#include "checkpoint_impl.hpp"
#include "checkpoint_index.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/safetensors.hpp"

namespace shardplan {

namespace fs = std::filesystem;
using detail::collectively;
using detail::File;
using detail::file_checksum;
using detail::file_name;
using detail::Hasher;
using detail::kIndexName;
using detail::kNewFile;
using detail::on_first_process;
using detail::plan_files;
using detail::SaveTensor;
using detail::sharding_text;
using detail::structure_of;

SaveJob::SaveJob(const fs::path& dir_in, const Tree<Array>& tree, const CheckpointOptions& options)
    : dir_(detail::output_path(dir_in, "checkpoint")) {
  collectively([&] { lay_out(tree, options); });
  if (distributed::process_count() > 1) {
    distributed::check_same(fmt::format("the tree saved to {} (each tensor's name, dtype, shape "
                                        "and sharding, then the tree's structure)",
                                        dir_.string()),
                            description());
  }
}

std::string SaveJob::description() const {
  std::string text;
  for (const SaveTensor& t : tensors_) {
    text += fmt::format("'{}': {}{} sharded {}\n", t.name, name(t.spec.dtype),
                        t.spec.shape.to_string(), t.sharding);
  }
  return text + "structure " + structure_.dump();
}

void SaveJob::lay_out(const Tree<Array>& tree, const CheckpointOptions& options) {
  std::string path;
  structure_ = structure_of(tree, path);
  for (const auto& [name, a] : tree.flatten()) {
    if (name.empty()) {
      throw SpecError(
          "[checkpoint] the tree is a single array: save a dict, so that the tensor has a "
          "name");
    }
    if (!a.valid()) {
      throw SpecError(fmt::format("[checkpoint] '{}' is an empty array handle", name));
    }
    if (a.is_pending()) {
      throw SpecError(fmt::format(
          "[checkpoint] '{}' ({}) is pending a reduction; reduce it (all_reduce or reshard) "
          "before saving",
          name, a.to_string()));
    }
    if (mesh_.empty()) mesh_ = a.mesh().to_string();
    all_local_ = all_local_ && a.executor().holds_all(a.mesh().devices());
    SaveTensor t{
        name, TensorSpec{a.shape(), a.dtype()}, sharding_text(a.sharding()), a.shard_shape(), {}};
    if (a.shard_shape().numel() > 0) {
      const std::vector<Block> blocks = a.sharding().device_blocks(a.shape());
      for (const auto& group : a.sharding().replica_groups(a.shape())) {
        const int d = group.front();
        if (!a.executor().is_local(d)) continue;
        t.blocks.emplace_back(blocks[static_cast<std::size_t>(d)], a.shard(d).data());
      }
    }
    tensors_.push_back(std::move(t));
  }
  std::vector<std::int64_t> sizes;
  for (const SaveTensor& t : tensors_) sizes.push_back(t.spec.bytes());
  files_ = plan_files(sizes, options.max_file_bytes);
  for (std::size_t f = 0; f < files_.size(); ++f) {
    std::int64_t offset = 0;
    for (const std::size_t i : files_[f]) {
      tensors_[i].file = f;
      tensors_[i].offset = offset;
      offset += sizes[i];
    }
  }
  for (std::size_t f = 0; f < files_.size(); ++f) {
    names_.push_back(file_name(f, files_.size()));
    std::vector<std::pair<std::string, TensorSpec>> specs;
    for (const std::size_t i : files_[f]) specs.emplace_back(tensors_[i].name, tensors_[i].spec);
    headers_.push_back(safetensors_header_bytes(dir_ / names_[f], specs, {{"format", "pt"}}));
  }
}

void SaveJob::snapshot() {
  for (SaveTensor& t : tensors_) {
    const std::int64_t bytes = t.shard.numel() * static_cast<std::int64_t>(size_of(t.spec.dtype));
    for (auto& [block, data] : t.blocks) {
      copies_.emplace_back(static_cast<std::size_t>(bytes));
      if (bytes > 0) std::memcpy(copies_.back().data(), data, static_cast<std::size_t>(bytes));
      data = copies_.back().data();
    }
  }
}

std::int64_t SaveJob::snapshot_bytes() const {
  std::int64_t n = 0;
  for (const auto& c : copies_) n += static_cast<std::int64_t>(c.size());
  return n;
}

void SaveJob::begin() {
  on_first_process([&] {
    out_.emplace(dir_, "checkpoint");
    tmp_ = out_->temp();
    for (std::size_t f = 0; f < files_.size(); ++f) {
      const File out(tmp_ / names_[f], kNewFile, dir_ / names_[f]);
      out.write_at(headers_[f].data(), static_cast<std::int64_t>(headers_[f].size()), 0);
      std::int64_t data = 0;
      for (const std::size_t i : files_[f]) data += tensors_[i].spec.bytes();
      out.truncate(static_cast<std::int64_t>(headers_[f].size()) + data);
    }
  });
  if (distributed::process_count() > 1) {
    const std::string mine = distributed::process_index() == 0 ? tmp_.string() : std::string();
    const auto all = distributed::allgather_bytes(std::as_bytes(std::span(mine)));
    tmp_ = std::string(reinterpret_cast<const char*>(all.front().data()), all.front().size());
  }
}

void SaveJob::write() {
  std::exception_ptr sum_error;
  std::thread summer;
  if (all_local_) {
    sums_.assign(files_.size(), 0);
    summer = std::thread([&] {
      try {
        for (std::size_t f = 0; f < files_.size(); ++f) sums_[f] = checksum_from_memory(f);
      } catch (...) {
        sum_error = std::current_exception();
      }
    });
  }
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{summer};
  std::vector<std::unique_ptr<File>> open(files_.size());
  for (const SaveTensor& t : tensors_) {
    const int rank = t.spec.shape.rank();
    const std::int64_t base = static_cast<std::int64_t>(headers_[t.file].size()) + t.offset;
    for (const auto& [block, data] : t.blocks) {
      const std::byte* src = data;  // (a lambda may not capture a structured binding)
      auto& file = open[t.file];
      if (!file)
        file = std::make_unique<File>(tmp_ / names_[t.file], O_WRONLY, dir_ / names_[t.file]);
      // The block's rows only: a padded shard's zeros are not the tensor's (files hold it
      // unpadded, restorable onto any sharding).
      std::vector<std::int64_t> origin, rows, zero(static_cast<std::size_t>(rank), 0);
      for (const auto& sl : block) {
        origin.push_back(sl.start);
        rows.push_back(sl.size);
      }
      detail::for_each_run(t.shard.begin(), zero.data(), t.spec.shape.begin(), origin.data(),
                           rows.data(), rank, size_of(t.spec.dtype),
                           [&](std::int64_t s, std::int64_t at, std::int64_t bytes) {
                             file->write_at(src + s, bytes, base + at);
                             file->start_writeback(base + at, bytes);
                           });
    }
  }
  for (const auto& f : open) {
    if (f) f->sync();
  }
  if (summer.joinable()) summer.join();
  if (sum_error) std::rethrow_exception(sum_error);
  sums_ready_ = all_local_;
}

void SaveJob::commit() {
  std::int64_t total = 0;
  for (const SaveTensor& t : tensors_) total += t.spec.bytes();
  nlohmann::json record;
  record["version"] = detail::kCheckpointFormatVersion;
  record["mesh"] = mesh_;
  record["structure"] = structure_;
  for (std::size_t f = 0; f < files_.size(); ++f) {
    const fs::path file = tmp_ / names_[f];
    File(file, O_RDONLY, dir_ / names_[f]).sync();
    const std::uint64_t sum = sums_ready_ ? sums_[f] : file_checksum(file);
    record["files"][names_[f]]["xxh3"] = fmt::format("{:016x}", sum);
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (const SaveTensor& t : tensors_) {
    weight_map[t.name] = names_[t.file];
    record["tensors"][t.name] = {{"sharding", t.sharding},
                                 {"dtype", std::string(safetensors_name(t.spec.dtype))}};
  }
  nlohmann::json meta;
  meta["metadata"] = {{"total_size", total}, {"shardplan", record}};
  meta["weight_map"] = weight_map;
  std::string text;
  try {
    text = meta.dump(1);
  } catch (const nlohmann::json::exception&) {
    throw IoError(fmt::format("[checkpoint] {}: a tensor name is not valid UTF-8", dir_.string()));
  }
  text += '\n';
  {
    const File index(tmp_ / kIndexName, kNewFile, dir_ / kIndexName);
    index.write_at(text.data(), static_cast<std::int64_t>(text.size()), 0);
    index.sync();
  }
  out_->commit();
}

void SaveJob::abort() noexcept {
  if (out_) out_->discard();
}

std::uint64_t SaveJob::checksum_from_memory(std::size_t f) const {
  Hasher h;
  h.update(headers_[f].data(), headers_[f].size());
  struct Run {
    std::int64_t at;
    const std::byte* src;
    std::int64_t bytes;
  };
  for (const std::size_t i : files_[f]) {
    const SaveTensor& t = tensors_[i];
    const int rank = t.spec.shape.rank();
    std::vector<Run> runs;
    for (const auto& [block, src] : t.blocks) {
      std::vector<std::int64_t> origin, rows, zero(static_cast<std::size_t>(rank), 0);
      for (const auto& sl : block) {
        origin.push_back(sl.start);
        rows.push_back(sl.size);
      }
      const std::byte* from = src;
      detail::for_each_run(t.shard.begin(), zero.data(), t.spec.shape.begin(), origin.data(),
                           rows.data(), rank, size_of(t.spec.dtype),
                           [&](std::int64_t s, std::int64_t at, std::int64_t bytes) {
                             runs.push_back({at, from + s, bytes});
                           });
    }
    std::sort(runs.begin(), runs.end(), [](const Run& x, const Run& y) { return x.at < y.at; });
    for (const Run& r : runs) h.update(r.src, static_cast<std::size_t>(r.bytes));
  }
  return h.digest();
}

void save_checkpoint(const fs::path& dir, const Tree<Array>& tree,
                     const CheckpointOptions& options) {
  SaveJob job(dir, tree, options);
  try {
    job.begin();
    collectively([&] { job.write(); });
    on_first_process([&] { job.commit(); });
  } catch (...) {
    job.abort();
    throw;
  }
}

}  // namespace shardplan
