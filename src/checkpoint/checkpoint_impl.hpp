#pragma once
// Private to src/checkpoint/: what the checkpoint's sources share. One file per concern:
// save.cpp (SaveJob, save_checkpoint), info.cpp (read_checkpoint_info, verify_checkpoint),
// restore.cpp (restore_checkpoint and the reads), load.cpp (load_checkpoint of Hugging Face
// weights by rules), convert.cpp (consolidate, reshard), manager.cpp (CheckpointManager),
// async_save.cpp (AsyncCheckpointer); common.cpp defines what is declared here.
#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../formats/output_file.hpp"
#include "shardplan/array.hpp"
#include "shardplan/checkpoint.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/tensor_spec.hpp"
#include "shardplan/tree.hpp"

namespace shardplan::detail {

inline constexpr const char* kIndexName = "model.safetensors.index.json";
/// Reads of a device's block whose byte ranges are small go through a staging buffer of this
/// size (one per reading thread): the memory bound of a restore beyond the devices' own shards.
/// Conversions copy through one buffer of this size.
inline constexpr std::int64_t kStageBytes = std::int64_t{4} << 20;
/// Flags of a new file in a run's own temporary directory: never an existing name or a link.
inline constexpr int kNewFile = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW;

/// Throws IoError "[checkpoint] FILE: WHAT (strerror(err))" (no parenthesis when err is 0).
[[noreturn]] void io_fail(const std::filesystem::path& file, std::string_view what, int err = 0);

/// A file descriptor, closed on destruction. Errors name `shown` when given: a file written in a
/// temporary directory is named by its place in the destination.
class File {
 public:
  File(const std::filesystem::path& path, int flags, const std::filesystem::path& shown = {});
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();
  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }

  /// pwrite of all `bytes`; a short write is an IoError (ENOSPC when the disk is full).
  void write_at(const void* data, std::int64_t bytes, std::int64_t offset) const;
  /// pread of all `bytes`; the file ending first is an IoError ("truncated?").
  void read_at(void* data, std::int64_t bytes, std::int64_t offset) const;
  /// Asks the kernel to start writing these bytes to disk now (without waiting), so that the
  /// final fsync finds less to do; below 1 MiB the pages are left to the usual writeback.
  void start_writeback(std::int64_t offset, std::int64_t bytes) const;
  void sync() const;
  void truncate(std::int64_t size) const;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

/// An XXH3-64 over bytes given in pieces.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void update(const void* data, std::size_t bytes);
  std::uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t (xxhash.h stays in common.cpp)
};

/// The whole file's XXH3-64, read in pieces (a regular file only: a FIFO put in its place
/// would make the read wait, a device never end).
std::uint64_t file_checksum(const std::filesystem::path& path);

/// Tensors of these sizes, in order, cut into files of at most `max_file_bytes` (0: one file;
/// a larger tensor has a file of its own; never an empty list).
std::vector<std::vector<std::size_t>> plan_files(const std::vector<std::int64_t>& sizes,
                                                 std::int64_t max_file_bytes);

/// Hugging Face's names: model.safetensors, or model-00001-of-00003.safetensors...
std::string file_name(std::size_t f, std::size_t count);

/// Runs `step`; over processes, every process learns whether it failed anywhere (collective:
/// distributed::all_succeed). In one process the step's own exception comes out as it is.
void collectively(const std::function<void()>& step);

/// Runs `step` on process 0 only; every process learns whether it failed (collective).
void on_first_process(const std::function<void()>& step);

/// The record's "structure": the tree's shape as JSON, each leaf its tree path (`path` is the
/// prefix so far, restored on return).
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

/// A sharding as the record writes it: "P('data') on data:4,model:2".
std::string sharding_text(const NamedSharding& s);

/// The tree of a checkpoint's tensors (tree_from_names); a conflict of names (empty parts, a
/// name that is also a prefix) is an error naming the checkpoint.
Tree<TensorSpec> tree_of(const std::vector<std::pair<std::string, TensorSpec>>& named,
                         char separator, const std::filesystem::path& path);

/// A tensor to restore: its name in the checkpoint, its sharding, and the shape and dtype the
/// caller expects (a template's leaf), when it expects one.
struct Wanted {
  std::string name;
  NamedSharding sharding;
  std::optional<TensorSpec> like;
  bool widen_f16 = false;  // an f16 tensor becomes f32 (the runtime computes in f32, bf16, ...)
};

/// Collective over processes. Reads the `wanted` tensors of `info` onto `exec` (each device its
/// own block; checksums first when options.verify) and gives the arrays, in order, to `build`.
Tree<Array> restore_leaves(const CheckpointInfo& info, const std::vector<Wanted>& wanted,
                           const Executor& exec, const RestoreOptions& options,
                           const std::function<Tree<Array>(std::vector<Array>)>& build);

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

}  // namespace shardplan::detail

namespace shardplan {

/// A save in steps, so that the synchronous and the asynchronous save share them:
/// begin (collective: process 0 makes the hidden directory and every file at its full size),
/// write (this process's blocks, fsync; no communication), commit (process 0: checksums, the
/// index last, rename), abort (process 0 removes the hidden directory). (checkpoint.hpp declares
/// it for AsyncCheckpointer; save.cpp defines it.)
class SaveJob {
 public:
  /// Checks the tree (named leaves, valid, not pending) and lays the tensors out in files.
  /// Collective over processes: a check that fails on one process fails on every process
  /// (distributed::all_succeed), and the processes must pass the same tree (each leaf's name,
  /// dtype, shape and sharding, and the structure; distributed::check_same), before anything is
  /// written: each process writes its blocks at the places its own tree gives.
  SaveJob(const std::filesystem::path& dir_in, const Tree<Array>& tree,
          const CheckpointOptions& options);

  /// Copies this process's blocks into host memory owned by the job, so that the arrays may
  /// change or go while it writes (the asynchronous save's only synchronous work).
  void snapshot();
  std::int64_t snapshot_bytes() const;

  /// Process 0 makes the run's own temporary directory (detail::OutputDir: a name no other run
  /// has, renamed without replacing anything) and tells the others its name.
  void begin();

  /// Writes this process's blocks, run by run into their places in the global row-major
  /// tensors, and fsyncs. When this process holds every block, the files' checksums are
  /// computed from memory on a second thread meanwhile (each header, then each tensor's runs in
  /// file order); otherwise commit() reads the files back.
  void write();

  /// Process 0: the checksums, the index (last), fsync, rename into place.
  void commit();

  /// Process 0 removes the temporary directory (and the parents it made); nothing else.
  void abort() noexcept;

 private:
  /// The constructor's work on this process: the checks and the layout.
  void lay_out(const Tree<Array>& tree, const CheckpointOptions& options);
  /// A line per tensor (name, dtype, shape, sharding), then the structure: what every process
  /// must save alike.
  std::string description() const;
  /// XXH3-64 of file f as written: its header, then each tensor's runs sorted by place.
  std::uint64_t checksum_from_memory(std::size_t f) const;

  std::filesystem::path dir_, tmp_;
  std::optional<detail::OutputDir> out_;  // process 0's
  std::string mesh_;
  nlohmann::json structure_;
  bool all_local_ = true;
  std::vector<detail::SaveTensor> tensors_;
  std::vector<std::vector<std::size_t>> files_;
  std::vector<std::string> names_, headers_;
  std::vector<std::uint64_t> sums_;
  bool sums_ready_ = false;
  std::vector<std::vector<std::byte>> copies_;
};

}  // namespace shardplan
