#include "shardplan/checkpoint.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "../input_file.hpp"
#include "../output_file.hpp"
#include "../runtime/box_copy.hpp"
#include "../runtime/numeric.hpp"
#include "checkpoint_index.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/detail/utf8.hpp"
#include "shardplan/error.hpp"
#include "shardplan/model_loader.hpp"
#include "shardplan/safetensors.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace shardplan {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIndexName = "model.safetensors.index.json";
// Reads of a device's block whose byte ranges are small go through a staging buffer of this
// size (one per reading thread): the memory bound of a restore beyond the devices' own shards.
constexpr std::int64_t kStageBytes = std::int64_t{4} << 20;
// A restore reads at most this many files at once (a checkpoint may have more files than the
// process may open: 1024 by default).
constexpr std::size_t kMaxOpenFiles = 64;

[[noreturn]] void io_fail(const fs::path& file, std::string_view what, int err = 0) {
  throw IoError(fmt::format("[checkpoint] {}: {}{}", file.string(), what,
                            err != 0 ? fmt::format(" ({})", std::strerror(err)) : std::string()));
}

/// A file descriptor, closed on destruction. Errors name `shown` when given: a file written in a
/// temporary directory is named by its place in the destination.
class File {
 public:
  File(const fs::path& path, int flags, const fs::path& shown = {})
      : path_(shown.empty() ? path : shown) {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    if (fd_ < 0) io_fail(path_, "cannot open", errno);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  const fs::path& path() const { return path_; }

  void write_at(const void* data, std::int64_t bytes, std::int64_t offset) const {
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n =
          ::pwrite(fd_, p, static_cast<std::size_t>(std::min<std::int64_t>(bytes, 1 << 30)),
                   static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        io_fail(path_, fmt::format("write of {} bytes at offset {} failed", bytes, offset),
                n < 0 ? errno : ENOSPC);
      p += n;
      bytes -= n;
      offset += n;
    }
  }
  void read_at(void* data, std::int64_t bytes, std::int64_t offset) const {
    auto* p = static_cast<char*>(data);
    while (bytes > 0) {
      const ssize_t n =
          ::pread(fd_, p, static_cast<std::size_t>(std::min<std::int64_t>(bytes, 1 << 30)),
                  static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        io_fail(path_, fmt::format("read of {} bytes at offset {} failed", bytes, offset), errno);
      if (n == 0) {
        io_fail(path_, fmt::format("the file ends before byte {} (truncated?)", offset + bytes));
      }
      p += n;
      bytes -= n;
      offset += n;
    }
  }
  /// Asks the kernel to start writing these bytes to disk now (without waiting), so that the
  /// final fsync finds less to do; below 1 MiB the pages are left to the usual writeback.
  void start_writeback(std::int64_t offset, std::int64_t bytes) const {
    if (bytes >= (std::int64_t{1} << 20)) {
      ::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes),
                        SYNC_FILE_RANGE_WRITE);
    }
  }
  void sync() const {
    if (::fsync(fd_) != 0) io_fail(path_, "fsync failed", errno);
  }
  void truncate(std::int64_t size) const {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      io_fail(path_, fmt::format("cannot size to {} bytes", size), errno);
    }
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

/// Flags of a new file in a run's own temporary directory: never an existing name or a link.
constexpr int kNewFile = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW;

/// An XXH3-64 over bytes given in pieces.
class Hasher {
 public:
  Hasher() : state_(XXH3_createState()) {
    if (state_ == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state_);
  }
  ~Hasher() { XXH3_freeState(state_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void update(const void* data, std::size_t bytes) { XXH3_64bits_update(state_, data, bytes); }
  std::uint64_t digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

/// The whole file's XXH3-64, read in pieces (a regular file only: a FIFO put in its place
/// would make the read wait, a device never end).
std::uint64_t file_checksum(const fs::path& path) {
  const detail::InputFile f(path, "checkpoint");
  Hasher h;
  std::vector<char> buf(static_cast<std::size_t>(kStageBytes));
  for (;;) {
    const ssize_t n = ::read(f.fd(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) io_fail(path, "read failed", errno);
    if (n == 0) break;
    h.update(buf.data(), static_cast<std::size_t>(n));
  }
  return h.digest();
}

/// Tensors of these sizes, in order, cut into files of at most `max_file_bytes` (0: one file;
/// a larger tensor has a file of its own; never an empty list).
std::vector<std::vector<std::size_t>> plan_files(const std::vector<std::int64_t>& sizes,
                                                 std::int64_t max_file_bytes) {
  std::vector<std::vector<std::size_t>> files;
  std::int64_t in_file = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (files.empty() ||
        (max_file_bytes > 0 && in_file > 0 && in_file + sizes[i] > max_file_bytes)) {
      files.emplace_back();
      in_file = 0;
    }
    in_file += sizes[i];
    files.back().push_back(i);
  }
  if (files.empty()) files.emplace_back();
  return files;
}

/// Hugging Face's names: model.safetensors, or model-00001-of-00003.safetensors...
std::string file_name(std::size_t f, std::size_t count) {
  return count == 1 ? std::string("model.safetensors")
                    : fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, count);
}

/// Runs `step`; over processes, every process learns whether it failed anywhere (collective:
/// distributed::all_succeed). In one process the step's own exception comes out as it is.
void collectively(const std::function<void()>& step) {
  if (distributed::process_count() == 1) {
    step();
  } else {
    distributed::all_succeed(step);
  }
}

/// Runs `step` on process 0 only; every process learns whether it failed (collective).
void on_first_process(const std::function<void()>& step) {
  collectively([&] {
    if (distributed::process_index() == 0) step();
  });
}

template <class T>
nlohmann::json structure_of(const Tree<T>& t, std::string& path) {
  switch (t.kind()) {
    case NodeKind::kNone:
      return nullptr;
    case NodeKind::kLeaf:
      return path;
    case NodeKind::kDict:
    case NodeKind::kList: {
      nlohmann::json out = t.is_dict() ? nlohmann::json::object() : nlohmann::json::array();
      for (std::size_t i = 0; i < t.size(); ++i) {
        const std::size_t keep = path.size();
        const std::string seg = t.is_dict() ? escape_key(t.keys()[i]) : std::to_string(i);
        path = join_path(path, seg);
        if (t.is_dict()) {
          out[t.keys()[i]] = structure_of(t.children()[i], path);
        } else {
          out.push_back(structure_of(t.children()[i], path));
        }
        path.resize(keep);
      }
      return out;
    }
  }
  return nullptr;
}

std::string sharding_text(const NamedSharding& s) {
  return fmt::format("{} on {}", s.spec().to_string(), s.mesh().to_string());
}

/// The tree of a checkpoint's tensors (tree_from_names); a conflict of names (empty parts, a
/// name that is also a prefix) is an error naming the checkpoint.
Tree<TensorSpec> tree_of(const std::vector<std::pair<std::string, TensorSpec>>& named,
                         char separator, const fs::path& path) {
  try {
    return tree_from_names(named, separator);
  } catch (const IoError& e) {
    std::string_view what = e.what();
    if (what.starts_with("[model] ")) what.remove_prefix(8);
    throw IoError(fmt::format("[checkpoint] {}: {}", path.string(), what));
  }
}

}  // namespace

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

/// One tensor to save: what the file records, and the blocks this process writes (of each
/// replica group whose first device is here: that device's block and shard bytes).
struct SaveTensor {
  std::string name;
  TensorSpec spec;
  std::string sharding;
  Shape shard;
  std::vector<std::pair<Block, const std::byte*>> blocks;
  std::size_t file = 0;
  std::int64_t offset = 0;  // in the file's data section
};

}  // namespace

/// A save in steps, so that the synchronous and the asynchronous save share them:
/// begin (collective: process 0 makes the hidden directory and every file at its full size),
/// write (this process's blocks, fsync; no communication), commit (process 0: checksums, the
/// index last, rename), abort (process 0 removes the hidden directory).
class SaveJob {
 public:
  SaveJob(const fs::path& dir_in, const Tree<Array>& tree, const CheckpointOptions& options)
      : dir_(detail::output_path(dir_in, "checkpoint")) {
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

  /// Copies this process's blocks into host memory owned by the job, so that the arrays may
  /// change or go while it writes (the asynchronous save's only synchronous work).
  void snapshot() {
    for (SaveTensor& t : tensors_) {
      const std::int64_t bytes = t.shard.numel() * static_cast<std::int64_t>(size_of(t.spec.dtype));
      for (auto& [block, data] : t.blocks) {
        copies_.emplace_back(static_cast<std::size_t>(bytes));
        if (bytes > 0) std::memcpy(copies_.back().data(), data, static_cast<std::size_t>(bytes));
        data = copies_.back().data();
      }
    }
  }

  std::int64_t snapshot_bytes() const {
    std::int64_t n = 0;
    for (const auto& c : copies_) n += static_cast<std::int64_t>(c.size());
    return n;
  }

  /// Process 0 makes the run's own temporary directory (detail::OutputDir: a name no other run
  /// has, renamed without replacing anything) and tells the others its name.
  void begin() {
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

  /// Writes this process's blocks, run by run into their places in the global row-major
  /// tensors, and fsyncs. When this process holds every block, the files' checksums are
  /// computed from memory on a second thread meanwhile (each header, then each tensor's runs in
  /// file order); otherwise commit() reads the files back.
  void write() {
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
        std::vector<std::int64_t> origin, zero(static_cast<std::size_t>(rank), 0);
        for (const auto& sl : block) origin.push_back(sl.start);
        detail::for_each_run(t.shard.begin(), zero.data(), t.spec.shape.begin(), origin.data(),
                             t.shard.begin(), rank, size_of(t.spec.dtype),
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

  /// Process 0: the checksums, the index (last), fsync, rename into place.
  void commit() {
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
      throw IoError(
          fmt::format("[checkpoint] {}: a tensor name is not valid UTF-8", dir_.string()));
    }
    text += '\n';
    {
      const File index(tmp_ / kIndexName, kNewFile, dir_ / kIndexName);
      index.write_at(text.data(), static_cast<std::int64_t>(text.size()), 0);
      index.sync();
    }
    out_->commit();
  }

  /// Process 0 removes the temporary directory (and the parents it made); nothing else.
  void abort() noexcept {
    if (out_) out_->discard();
  }

 private:
  /// XXH3-64 of file f as written: its header, then each tensor's runs sorted by place.
  std::uint64_t checksum_from_memory(std::size_t f) const {
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
        std::vector<std::int64_t> origin, zero(static_cast<std::size_t>(rank), 0);
        for (const auto& sl : block) origin.push_back(sl.start);
        const std::byte* from = src;
        detail::for_each_run(t.shard.begin(), zero.data(), t.spec.shape.begin(), origin.data(),
                             t.shard.begin(), rank, size_of(t.spec.dtype),
                             [&](std::int64_t s, std::int64_t at, std::int64_t bytes) {
                               runs.push_back({at, from + s, bytes});
                             });
      }
      std::sort(runs.begin(), runs.end(), [](const Run& x, const Run& y) { return x.at < y.at; });
      for (const Run& r : runs) h.update(r.src, static_cast<std::size_t>(r.bytes));
    }
    return h.digest();
  }

  fs::path dir_, tmp_;
  std::optional<detail::OutputDir> out_;  // process 0's
  std::string mesh_;
  nlohmann::json structure_;
  bool all_local_ = true;
  std::vector<SaveTensor> tensors_;
  std::vector<std::vector<std::size_t>> files_;
  std::vector<std::string> names_, headers_;
  std::vector<std::uint64_t> sums_;
  bool sums_ready_ = false;
  std::vector<std::vector<std::byte>> copies_;
};

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

CheckpointInfo read_checkpoint_info(const fs::path& path) {
  CheckpointInfo info;
  std::vector<std::string> file_names;
  detail::CheckpointIndex index;  // from the index, when there is one
  fs::path index_path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    info.dir = path;
    index_path = path / kIndexName;
    if (!fs::exists(index_path, ec)) {
      // Hugging Face names the index after the weights file; take any single index.
      std::vector<fs::path> indexes, weights;
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
      index_path.clear();
      if (indexes.size() == 1) {
        index_path = indexes.front();
      } else if (indexes.empty() && weights.size() == 1) {
        file_names.push_back(weights.front().filename().string());
      } else {
        throw IoError(fmt::format(
            "[checkpoint] {}: expected {} (or one *.safetensors.index.json, or a single "
            ".safetensors file); found {} index files and {} .safetensors files",
            path.string(), kIndexName, indexes.size(), weights.size()));
      }
    }
  } else if (fs::exists(path, ec) || ec) {
    // A single safetensors file (its reader refuses anything but a regular file, and names
    // what stat could not tell: a link loop, a permission error).
    info.dir = path.parent_path();
    file_names.push_back(path.filename().string());
  } else {
    throw IoError(fmt::format("[checkpoint] {}: no such file or directory", path.string()));
  }
  // Tensor name -> file, as the index maps them (views into `index`).
  std::unordered_map<std::string_view, std::string_view> file_of;
  if (!index_path.empty()) {
    index = detail::parse_checkpoint_index(detail::read_input_file(index_path, "checkpoint"),
                                           index_path.string());
    file_of.reserve(index.weight_map.size());
    std::unordered_set<std::string_view> listed;
    for (const auto& [name, file] : index.weight_map) {
      file_of.emplace(name, file);
      if (listed.insert(file).second) file_names.push_back(file);
    }
    std::sort(file_names.begin(), file_names.end());
  }
  const detail::CheckpointRecord* record = index.record ? &*index.record : nullptr;
  info.shardplan = record != nullptr;
  if (record != nullptr) {
    info.mesh = record->mesh;
    info.name_separator = record->name_separator;
    info.structure = record->structure;
  }
  for (const std::string& name : file_names) {
    const fs::path file = info.dir / name;
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
  return info;
}

void verify_checkpoint(const CheckpointInfo& info) {
  collectively([&] {
    const int me = distributed::process_index(), n = distributed::process_count();
    for (std::size_t i = 0; i < info.files.size(); ++i) {
      if (static_cast<int>(i % static_cast<std::size_t>(n)) != me) continue;
      const CheckpointFile& f = info.files[i];
      if (!f.xxh3) continue;
      const std::uint64_t got = file_checksum(info.dir / f.name);
      if (got != *f.xxh3) {
        throw IoError(
            fmt::format("[checkpoint] {}: checksum mismatch (XXH3 {:016x}, the index "
                        "records {:016x}): the file was changed or damaged after saving",
                        (info.dir / f.name).string(), got, *f.xxh3));
      }
    }
  });
}

namespace {

struct Wanted {
  std::string name;
  NamedSharding sharding;
  std::optional<TensorSpec> like;
  bool widen_f16 = false;  // an f16 tensor becomes f32 (the runtime computes in f32, bf16, ...)
};

/// The halves in the upper half of `buf` (n of them, at byte 2n) become floats over the whole
/// buffer, front to back: element i is read before bytes [4i, 4i + 4) are written, and those
/// never reach an unread half (4i + 4 <= 2n + 2i + 2 for i < n).
void widen_halves_in_place(std::byte* buf, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint16_t h = 0;
    std::memcpy(&h, buf + 2 * n + 2 * i, 2);
    const float f = detail::half_to_float(h);
    std::memcpy(buf + 4 * i, &f, 4);
  }
}

/// `bytes` bytes at `at` in `file`, for `to`.
struct ReadRun {
  const File* file;
  std::int64_t at;
  std::byte* to;
  std::int64_t bytes;
};

/// Reads every run: each large one straight into its place; small neighbours in the file (the
/// rows of a column block, and the other devices' rows beside them) through a staging buffer
/// read once and copied out, so that each byte of the file is read once, in order. The reads run
/// on up to 4 threads (disks serve a few requests at once better than one).
void read_runs(std::vector<ReadRun> runs) {
  std::sort(runs.begin(), runs.end(), [](const ReadRun& x, const ReadRun& y) {
    return x.file != y.file ? std::less<const File*>()(x.file, y.file) : x.at < y.at;
  });
  struct Read {
    std::size_t first, last;  // runs [first, last)
    std::int64_t begin, end;  // the bytes read (staged when last - first > 1)
  };
  std::vector<Read> reads;
  constexpr std::int64_t kDirect = kStageBytes / 4;
  for (std::size_t i = 0; i < runs.size();) {
    std::size_t j = i + 1;
    std::int64_t end = runs[i].at + runs[i].bytes;
    if (runs[i].bytes < kDirect) {
      while (j < runs.size() && runs[j].file == runs[i].file && runs[j].bytes < kDirect &&
             std::max(end, runs[j].at + runs[j].bytes) - runs[i].at <= kStageBytes) {
        end = std::max(end, runs[j].at + runs[j].bytes);
        ++j;
      }
    }
    reads.push_back({i, j, runs[i].at, end});
    i = j;
  }
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    std::vector<std::byte> stage;
    try {
      for (std::size_t k = next++; k < reads.size(); k = next++) {
        const Read& r = reads[k];
        const ReadRun& first = runs[r.first];
        if (r.last - r.first == 1) {
          first.file->read_at(first.to, first.bytes, first.at);
          continue;
        }
        if (stage.empty()) stage.resize(static_cast<std::size_t>(kStageBytes));
        first.file->read_at(stage.data(), r.end - r.begin, r.begin);
        for (std::size_t i = r.first; i < r.last; ++i) {
          std::memcpy(runs[i].to, stage.data() + (runs[i].at - r.begin),
                      static_cast<std::size_t>(runs[i].bytes));
        }
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
      next = reads.size();
    }
  };
  const std::size_t n =
      std::min<std::size_t>({4, reads.size(), std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> threads;
  for (std::size_t i = 1; i < n; ++i) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

Tree<Array> restore_leaves(const CheckpointInfo& info, const std::vector<Wanted>& wanted,
                           const Executor& exec, const RestoreOptions& options,
                           const std::function<Tree<Array>(std::vector<Array>)>& build) {
  if (options.verify) verify_checkpoint(info);
  // Tensors by name (CheckpointInfo::find is a linear scan: once per tensor would be quadratic).
  std::unordered_map<std::string_view, const CheckpointTensor*> by_name;
  for (const auto& t : info.tensors) by_name.emplace(t.name, &t);
  std::vector<Array> out;
  collectively([&] {
    std::map<std::string, std::unique_ptr<File>> open;
    std::vector<ReadRun> runs;
    struct Made {
      Shape shape;
      DType dtype;
      NamedSharding sharding;
      std::vector<std::shared_ptr<Buffer>> buffers;
    };
    std::vector<Made> made;
    std::vector<std::pair<std::shared_ptr<Buffer>, std::int64_t>> widened;  // buffer, halves
    for (const Wanted& w : wanted) {
      const auto found = by_name.find(w.name);
      const CheckpointTensor* t = found == by_name.end() ? nullptr : found->second;
      if (t == nullptr) {
        std::string some;
        for (std::size_t i = 0; i < info.tensors.size() && i < 5; ++i) {
          some += (i ? ", '" : "'") + info.tensors[i].name + "'";
        }
        throw IoError(fmt::format("[checkpoint] {}: no tensor '{}' (it holds {} tensors{}{})",
                                  info.dir.string(), w.name, info.tensors.size(),
                                  some.empty() ? "" : ": ", some));
      }
      const fs::path file = info.dir / t->file;
      if (w.like && (w.like->shape != t->spec.shape || w.like->dtype != t->spec.dtype)) {
        throw SpecError(fmt::format("[checkpoint] tensor '{}' in {} is {}{}, the target wants {}{}",
                                    w.name, file.string(), name(t->spec.dtype),
                                    t->spec.shape.to_string(), name(w.like->dtype),
                                    w.like->shape.to_string()));
      }
      const Shape& shape = t->spec.shape;
      Shape shard;
      std::vector<Block> blocks;
      try {
        shard = w.sharding.shard_shape(shape, w.name);
        blocks = w.sharding.device_blocks(shape);
      } catch (const SpecError& e) {
        throw SpecError(
            fmt::format("[checkpoint] tensor '{}' in {}: {}", w.name, file.string(), e.what()));
      }
      if (!open.contains(t->file) && open.size() == kMaxOpenFiles) {
        read_runs(std::move(runs));  // (the buffers stay; the files may close)
        runs.clear();
        open.clear();
      }
      auto& f = open[t->file];
      if (!f) f = std::make_unique<File>(file, O_RDONLY);
      const File& in = *f;
      const std::size_t elem = size_of(t->spec.dtype);
      const std::int64_t bytes = shard.numel() * static_cast<std::int64_t>(elem);
      // An f16 tensor widened to f32 is read into the upper half of its f32 buffer.
      const bool widen = w.widen_f16 && t->spec.dtype == DType::kF16;
      const DType dtype = widen ? DType::kF32 : t->spec.dtype;
      const std::int64_t image = widen ? bytes : 0;
      std::vector<std::shared_ptr<Buffer>> buffers(static_cast<std::size_t>(exec.num_devices()));
      for (const int d : w.sharding.mesh().devices()) {
        if (exec.is_local(d)) {
          buffers[static_cast<std::size_t>(d)] =
              std::make_shared<Buffer>(exec.allocate(d, bytes + image));
          if (widen) widened.emplace_back(buffers[static_cast<std::size_t>(d)], shard.numel());
        }
      }
      const int rank = shape.rank();
      for (const int d : w.sharding.mesh().devices()) {
        if (!exec.is_local(d) || bytes == 0) continue;
        std::vector<std::int64_t> origin, zero(static_cast<std::size_t>(rank), 0);
        for (const auto& sl : blocks[static_cast<std::size_t>(d)]) origin.push_back(sl.start);
        std::byte* dst = buffers[static_cast<std::size_t>(d)]->data();
        detail::for_each_run(shape.begin(), origin.data(), shard.begin(), zero.data(),
                             shard.begin(), rank, elem,
                             [&](std::int64_t s, std::int64_t t2, std::int64_t n) {
                               runs.push_back({&in, t->offset + s, dst + image + t2, n});
                             });
      }
      made.push_back({shape, dtype, w.sharding, std::move(buffers)});
    }
    read_runs(std::move(runs));
    for (const auto& [buffer, n] : widened) widen_halves_in_place(buffer->data(), n);
    for (auto& m : made) {
      out.push_back(Array::from_buffers(exec, m.shape, m.dtype, m.sharding, std::move(m.buffers)));
    }
  });
  return build(std::move(out));
}

}  // namespace

Tree<Array> restore_checkpoint(const fs::path& dir, const Tree<NamedSharding>& target,
                               const Executor& executor, const RestoreOptions& options) {
  std::vector<Wanted> wanted;
  for (const auto& [path, s] : target.flatten()) wanted.push_back({path, s, std::nullopt});
  return restore_leaves(
      read_checkpoint_info(dir), wanted, executor, options,
      [&](std::vector<Array> leaves) { return target.unflatten(std::move(leaves)); });
}

Tree<Array> restore_checkpoint(const fs::path& dir, const Tree<Array>& like,
                               const RestoreOptions& options) {
  std::vector<Wanted> wanted;
  std::optional<Executor> exec;
  for (const auto& [path, a] : like.flatten()) {
    if (!exec) exec = a.executor();
    if (!(a.executor() == *exec)) {
      throw SpecError(
          fmt::format("[checkpoint] the template's arrays live on different executors "
                      "('{}' is on another one than '{}')",
                      path, like.paths().front()));
    }
    wanted.push_back({path, a.sharding(), TensorSpec{a.shape(), a.dtype()}});
  }
  if (!exec) return like;
  return restore_leaves(
      read_checkpoint_info(dir), wanted, *exec, options,
      [&](std::vector<Array> leaves) { return like.unflatten(std::move(leaves)); });
}

Tree<Array> load_checkpoint(const fs::path& path, const MeshShardingHelper& helper,
                            const RuleTree& rules, const Executor& executor,
                            const RestoreOptions& options) {
  const CheckpointInfo info = read_checkpoint_info(path);
  const char separator = info.name_separator;
  std::vector<std::pair<std::string, TensorSpec>> named;
  std::map<std::string, std::string> name_of;  // tree path -> tensor name
  for (const auto& t : info.tensors) {
    named.emplace_back(t.name, t.spec);
    const std::string p = tree_path_of_name(t.name, separator);
    name_of[p] = t.name;
  }
  const Tree<TensorSpec> data = tree_of(named, separator, path);
  const Tree<MaybeSharding> decided = helper.match(rules, data);
  std::vector<Wanted> wanted;
  for (const auto& [p, s] : decided.flatten()) {
    const auto it = name_of.find(p);
    if (it == name_of.end()) {
      throw IoError(fmt::format("[checkpoint] {}: no tensor for tree path '{}'", path.string(), p));
    }
    wanted.push_back(
        {it->second, s.value_or(NamedSharding(helper.mesh(), P())), std::nullopt, true});
  }
  return restore_leaves(info, wanted, executor, options, [&](std::vector<Array> leaves) {
    return decided.unflatten(std::move(leaves));
  });
}

// ---- Offline conversions ------------------------------------------------------------------

namespace {

/// Copies every tensor of `info`, in its order, into new safetensors files in `dst` (written as
/// save_checkpoint writes: the run's own hidden directory, fsync, index last, rename without
/// replacing), through one bounded buffer. `record`, when given, becomes the index's shardplan
/// record (its "files" filled here).
void copy_tensors(const CheckpointInfo& info, const fs::path& dst_in,
                  std::optional<nlohmann::json> record, const ConvertOptions& options) {
  std::vector<std::int64_t> sizes;
  for (const auto& t : info.tensors) sizes.push_back(t.spec.bytes());
  const auto files = plan_files(sizes, options.max_file_bytes);
  const std::int64_t total = info.total_bytes();
  std::int64_t done = 0;
  detail::OutputDir out_dir(dst_in, "checkpoint");  // removed unless committed
  const fs::path& dst = out_dir.path();
  const fs::path& tmp = out_dir.temp();
  {
    std::vector<char> buf(static_cast<std::size_t>(kStageBytes));
    // The tensors come file by file: one source open at a time (a checkpoint may have more
    // files than a process may open).
    std::string source_name;
    std::unique_ptr<File> source;
    nlohmann::json weight_map = nlohmann::json::object();
    nlohmann::json sums = nlohmann::json::object();
    for (std::size_t f = 0; f < files.size(); ++f) {
      const std::string name = file_name(f, files.size());
      std::vector<std::pair<std::string, TensorSpec>> specs;
      for (const std::size_t i : files[f])
        specs.emplace_back(info.tensors[i].name, info.tensors[i].spec);
      const std::string header = safetensors_header_bytes(dst / name, specs, {{"format", "pt"}});
      const File out(tmp / name, kNewFile, dst / name);
      Hasher h;
      out.write_at(header.data(), static_cast<std::int64_t>(header.size()), 0);
      h.update(header.data(), header.size());
      std::int64_t at = static_cast<std::int64_t>(header.size());
      for (const std::size_t i : files[f]) {
        const CheckpointTensor& t = info.tensors[i];
        if (!source || source_name != t.file) {
          source.reset();
          source = std::make_unique<File>(info.dir / t.file, O_RDONLY);
          source_name = t.file;
        }
        const auto& in = source;
        for (std::int64_t off = 0; off < t.spec.bytes();) {
          const std::int64_t n = std::min(kStageBytes, t.spec.bytes() - off);
          in->read_at(buf.data(), n, t.offset + off);
          out.write_at(buf.data(), n, at);
          out.start_writeback(at, n);
          h.update(buf.data(), static_cast<std::size_t>(n));
          off += n;
          at += n;
          done += n;
          if (options.progress) options.progress(done, total);
        }
        weight_map[t.name] = name;
      }
      out.sync();
      sums[name] = {{"xxh3", fmt::format("{:016x}", h.digest())}};
    }
    nlohmann::json index;
    index["metadata"]["total_size"] = total;
    if (record) {
      (*record)["files"] = sums;
      index["metadata"]["shardplan"] = *record;
    }
    index["weight_map"] = weight_map;
    std::string text;
    try {
      text = index.dump(1) + "\n";
    } catch (const nlohmann::json::exception&) {
      throw IoError(
          fmt::format("[checkpoint] {}: a tensor name or the mesh's axis names are not valid UTF-8",
                      dst.string()));
    }
    {
      const File out(tmp / kIndexName, kNewFile, dst / kIndexName);
      out.write_at(text.data(), static_cast<std::int64_t>(text.size()), 0);
      out.sync();
    }
  }
  out_dir.commit();
}

}  // namespace

void consolidate_checkpoint(const fs::path& src, const fs::path& dst,
                            const ConvertOptions& options) {
  const CheckpointInfo info = read_checkpoint_info(src);
  if (info.shardplan) verify_checkpoint(info);
  copy_tensors(info, dst, std::nullopt, options);
}

void reshard_checkpoint(const fs::path& src, const fs::path& dst, const MeshShardingHelper& helper,
                        const RuleTree& rules, const ConvertOptions& options) {
  const CheckpointInfo info = read_checkpoint_info(src);
  if (info.shardplan) verify_checkpoint(info);
  std::vector<std::pair<std::string, TensorSpec>> named;
  for (const auto& t : info.tensors) named.emplace_back(t.name, t.spec);
  const Tree<TensorSpec> data = tree_of(named, info.name_separator, src);
  // Decided (and checked: axes, divisibility) before anything is written.
  const Tree<MaybeSharding> decided = helper.match(rules, data);
  const auto leaves = decided.flatten();
  nlohmann::json record;
  record["version"] = detail::kCheckpointFormatVersion;
  record["mesh"] = helper.mesh().to_string();
  record["names"] = info.name_separator == '.' ? "dotted" : "tree paths";
  // The leaves of `data` are in tree order, the tensors in file order: match them by path.
  const auto data_paths = data.paths();
  std::map<std::string, std::size_t> by_path;
  for (std::size_t i = 0; i < data_paths.size(); ++i) by_path[data_paths[i]] = i;
  std::map<std::string, std::string> name_at;  // tree path -> tensor name
  for (const auto& t : info.tensors) {
    const std::string p = tree_path_of_name(t.name, info.name_separator);
    const auto it = by_path.find(p);
    if (it == by_path.end()) {
      throw IoError(fmt::format("[checkpoint] {}: tensor '{}' has no place in the tree",
                                src.string(), t.name));
    }
    name_at[p] = t.name;
    const MaybeSharding& s = leaves[it->second].second;
    record["tensors"][t.name] = {
        {"sharding", sharding_text(s.value_or(NamedSharding(helper.mesh(), P())))},
        {"dtype", std::string(safetensors_name(t.spec.dtype))}};
  }
  const Tree<std::string> names =
      data.map_with_path([&](const std::string& p, const TensorSpec&) { return name_at.at(p); });
  std::string path;
  record["structure"] = structure_of(names, path);
  // The index is JSON: checked before anything is written. (Tensor names come from headers the
  // JSON reader checked; the mesh's axis names come from the user.)
  if (const std::string mesh = helper.mesh().to_string(); !detail::is_utf8(mesh)) {
    throw SpecError(fmt::format(
        "[checkpoint] mesh {}: an axis name is not valid UTF-8, which the index (JSON) cannot hold",
        detail::printable(mesh)));
  }
  copy_tensors(info, dst, record, options);
}

// ---- CheckpointManager --------------------------------------------------------------------

CheckpointManager::CheckpointManager(fs::path root, int keep)
    : root_(std::move(root)), keep_(keep) {
  if (keep < 1) {
    throw SpecError(fmt::format("[checkpoint] keep must be at least 1, got {}", keep));
  }
}

fs::path CheckpointManager::path_of(std::int64_t step) const {
  if (step < 0) throw SpecError(fmt::format("[checkpoint] step {} is negative", step));
  return root_ / fmt::format("step_{:08d}", step);
}

std::vector<std::int64_t> CheckpointManager::steps() const {
  std::vector<std::int64_t> out;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return out;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    const std::string n = e.path().filename().string();
    if (!n.starts_with("step_") || n.size() < 6) continue;
    const std::string digits = n.substr(5);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        digits.size() > 18) {
      continue;
    }
    // Not a checkpoint (complete ones have it; a link loop or a file named so has none).
    std::error_code index_ec;
    if (!fs::exists(e.path() / kIndexName, index_ec)) continue;
    out.push_back(std::stoll(digits));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::int64_t> CheckpointManager::latest() const {
  const auto s = steps();
  if (s.empty()) return std::nullopt;
  return s.back();
}

namespace {

/// Whether `name` is what a save (`.step_N.partial-X`) or a removal (`.step_N.removing-X`) of
/// CheckpointManager leaves when cut short; other hidden entries are the user's, never removed.
bool is_unfinished_step(std::string_view name) {
  if (!name.starts_with(".step_")) return false;
  const std::size_t dot = name.find('.', 1);
  if (dot == std::string_view::npos || dot == 6) return false;
  const std::string_view stem = name.substr(1, dot - 1);
  if (!std::all_of(stem.begin() + 5, stem.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  return detail::is_temp_name_of(name, stem, "partial") ||
         detail::is_temp_name_of(name, stem, "removing");
}

void remove_tree(const fs::path& p) {
  // Another process may be removing the same tree (two jobs on one root): an entry gone
  // meanwhile is not an error, and the removal goes on with what is left.
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    fs::remove_all(p, ec);
    if (!ec) return;
    if (ec != std::errc::no_such_file_or_directory || attempt == 10) {
      io_fail(p, "cannot remove", ec.value());
    }
  }
}

}  // namespace

void CheckpointManager::remove_unfinished() const {
  if (distributed::process_index() != 0) return;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    if (is_unfinished_step(e.path().filename().string())) stale.push_back(e.path());
  }
  if (ec) io_fail(root_, "cannot list", ec.value());
  // A save still running in another process (another job on the same root) holds a lock on
  // its directory and is left alone; removals cut short hold none.
  for (const auto& p : stale) {
    if (p.filename().string().find(".partial") != std::string::npos) {
      detail::remove_abandoned_temp(p, "checkpoint");
    } else {
      remove_tree(p);
    }
  }
}

void CheckpointManager::remove_old_steps() const {
  if (distributed::process_index() != 0) return;
  const auto all = steps();
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep_) < all.size(); ++i) {
    // Renamed away first (atomic, to a new name: nothing is replaced), then removed: a removal
    // cut short leaves a hidden directory, never a step whose index survives some of its files.
    const fs::path old = path_of(all[i]);
    fs::path gone;
    int err = EEXIST;
    for (int attempt = 0; attempt < 100 && err == EEXIST; ++attempt) {
      gone = detail::temp_name_for(old, "removing");
      err = detail::rename_no_replace(old, gone);
    }
    if (err == ENOENT) continue;  // removed meanwhile by another process on the same root
    if (err != 0) io_fail(old, "cannot rename the old step away to remove it", err);
    remove_tree(gone);
  }
}

void CheckpointManager::save(std::int64_t step, const Tree<Array>& tree,
                             const CheckpointOptions& options) {
  on_first_process([&] { remove_unfinished(); });
  save_checkpoint(path_of(step), tree, options);
  on_first_process([&] { remove_old_steps(); });
}

// ---- AsyncCheckpointer ------------------------------------------------------------------------

AsyncCheckpointer::AsyncCheckpointer(fs::path root, int keep) : manager_(std::move(root), keep) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[checkpoint] the last asynchronous save failed: %s\n", e.what());
  }
}

std::int64_t AsyncCheckpointer::pending_bytes() const { return job_ ? job_->snapshot_bytes() : 0; }

void AsyncCheckpointer::save(std::int64_t step, const Tree<Array>& tree,
                             const CheckpointOptions& options) {
  wait();
  on_first_process([&] { manager_.remove_unfinished(); });
  auto job = std::make_unique<SaveJob>(manager_.path_of(step), tree, options);
  job->snapshot();
  try {
    job->begin();
  } catch (...) {
    job->abort();
    throw;
  }
  job_ = std::move(job);
  error_ = nullptr;
  const bool alone = distributed::process_count() == 1;
  thread_ = std::thread([this, alone] {
    try {
      job_->write();
      if (alone) {  // nothing to agree on: finish here
        job_->commit();
        manager_.remove_old_steps();
      }
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void AsyncCheckpointer::wait() {
  if (thread_.joinable()) thread_.join();
  if (!job_) return;
  std::unique_ptr<SaveJob> job = std::move(job_);
  try {
    if (distributed::process_count() == 1) {
      if (error_) std::rethrow_exception(error_);
    } else {
      distributed::all_succeed([&] {
        if (error_) std::rethrow_exception(error_);
      });
      on_first_process([&] {
        job->commit();
        manager_.remove_old_steps();
      });
    }
  } catch (...) {
    job->abort();
    error_ = nullptr;
    throw;
  }
}

}  // namespace shardplan
