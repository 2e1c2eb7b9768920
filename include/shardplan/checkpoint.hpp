#pragma once
// Sharded checkpoints: a tree of arrays saved as safetensors files that Hugging Face tools read,
// and restored onto any mesh and sharding, each device reading only the bytes of its own block.
//
//   save_checkpoint("ckpt/step_100", state);             // any Tree<Array>
//   Tree<Array> s = restore_checkpoint("ckpt/step_100", like);  // shapes, dtypes, shardings
//
// A checkpoint is a directory: the tensors in one or more safetensors files (each tensor once,
// its global row-major bytes, however it was sharded or replicated), and
// `model.safetensors.index.json`, Hugging Face's weight map, whose metadata also holds
// shardplan's own record: the mesh, each tensor's sharding and dtype, the tree's structure, and
// an XXH3-64 checksum of every file. The directory appears under its name only when complete
// (written under a hidden temporary name, fsynced, then renamed). See docs/checkpoint.md.
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/mesh_sharding_helper.hpp"
#include "shardplan/named_sharding.hpp"
#include "shardplan/tensor_spec.hpp"
#include "shardplan/tree.hpp"

namespace shardplan {

struct CheckpointOptions {
  /// A file holds at most this many bytes of tensors before the next file starts (a tensor
  /// larger than this has a file of its own; tensors are never split). 0: one file.
  std::int64_t max_file_bytes = std::int64_t{4} << 30;
};

/// Collective over processes. Saves every leaf of `tree` (arrays, neither pending nor donated)
/// under its tree path as tensor name. `dir` must not exist (`dir/` is `dir`); its missing
/// parents are created. Each block is written once, by the process holding the first device of
/// its replica group, into a hidden directory of this save's own, renamed to `dir` without
/// replacing anything. Throws IoError (naming the file or `dir`: it exists or appeared meanwhile,
/// an empty or unusable path) or SpecError (naming the tree path); after a failure `dir` does not
/// exist, and this save's temporary directory and the parents it made are removed (nothing else).
void save_checkpoint(const std::filesystem::path& dir, const Tree<Array>& tree,
                     const CheckpointOptions& options = {});

/// One tensor of a checkpoint: where its bytes are.
struct CheckpointTensor {
  std::string name;
  TensorSpec spec;
  std::string file;         // relative to the checkpoint directory
  std::int64_t offset = 0;  // of its first byte in the file
  std::string sharding;     // as saved by shardplan ("P('data') on data:4,model:2"); "" otherwise
};

struct CheckpointFile {
  std::string name;                   // relative to the checkpoint directory
  std::optional<std::uint64_t> xxh3;  // the whole file's XXH3-64, when shardplan wrote it
};

/// What a checkpoint holds, read from its index and file headers only (no tensor data).
struct CheckpointInfo {
  std::filesystem::path dir;
  std::vector<CheckpointTensor> tensors;  // by file, then in each file's order
  std::vector<CheckpointFile> files;
  bool shardplan = false;  // written by save_checkpoint (sharding, structure and checksums known)
  std::string mesh;        // the mesh it was saved from, when shardplan
  std::string structure;   // the tree's structure as JSON (leaves are tensor names), when shardplan
  /// How tensor names split into tree paths: '/' (shardplan's tree paths), '.' (Hugging Face's
  /// dotted names, also kept by a shardplan checkpoint converted from one).
  char name_separator = '.';
  /// The tensor of this name, or null (a linear scan).
  const CheckpointTensor* find(std::string_view name) const;
  std::int64_t total_bytes() const;
};

/// Reads a checkpoint's layout: a directory with `model.safetensors.index.json` (shardplan's
/// or Hugging Face's), a directory holding one `.safetensors` file, or a `.safetensors` file.
/// Throws IoError naming the file for a missing or malformed index or header.
CheckpointInfo read_checkpoint_info(const std::filesystem::path& path);

/// Reads every file of a shardplan checkpoint and compares its checksum; throws IoError naming
/// the first file that differs or cannot be read. Over processes, collective: each process
/// checks some of the files.
void verify_checkpoint(const CheckpointInfo& info);

struct RestoreOptions {
  /// Check every file's checksum before reading tensors (each file read once more).
  bool verify = true;
};

/// Collective over processes. Restores the tensors named by the tree paths of `target` with
/// those shardings, on `executor`: each device of this process reads only the byte ranges of its
/// block, straight into its buffer (through a bounded staging buffer when the ranges are small).
/// Throws IoError naming the tensor and the file (missing, truncated, checksum) and SpecError
/// naming the tensor, its shape and the axis when a sharding does not divide it.
Tree<Array> restore_checkpoint(const std::filesystem::path& dir, const Tree<NamedSharding>& target,
                               const Executor& executor, const RestoreOptions& options = {});
/// As above, with shapes, dtypes, shardings and executor taken from a template of arrays (their
/// values are not read): a tensor whose shape or dtype differs from the template's is an error.
Tree<Array> restore_checkpoint(const std::filesystem::path& dir, const Tree<Array>& like,
                               const RestoreOptions& options = {});

/// Loads a checkpoint, Hugging Face's or shardplan's, as a tree built from its tensor names
/// (Hugging Face's dotted names split at '.', as `shardplan plan` reads them; shardplan's tree
/// paths at '/'), each tensor sharded as `rules` decide on `helper`'s mesh
/// (MeshShardingHelper::match; a leaf no rule decides is replicated), on `executor`. Each device
/// reads only its block, as restore_checkpoint. f16 tensors are widened to f32 (exactly; the
/// runtime has no f16 arithmetic); bf16 and f32 stay as they are. Throws as match and as
/// restore_checkpoint.
Tree<Array> load_checkpoint(const std::filesystem::path& path, const MeshShardingHelper& helper,
                            const RuleTree& rules, const Executor& executor,
                            const RestoreOptions& options = {});

struct ConvertOptions {
  std::int64_t max_file_bytes = std::int64_t{4} << 30;  // as CheckpointOptions
  /// Called as bytes are copied (done, total), e.g. for a progress bar.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
};

/// Offline, streaming through one 4 MiB buffer: a shardplan (checksums checked first) or Hugging
/// Face checkpoint rewritten as plain Hugging Face safetensors (+ index), the tensors' names and
/// bytes as they were. `dst` must not exist; written atomically and without replacing anything,
/// as save_checkpoint (two runs into one `dst`: one result, one IoError naming it).
void consolidate_checkpoint(const std::filesystem::path& src, const std::filesystem::path& dst,
                            const ConvertOptions& options = {});
/// Offline, streaming: a shardplan or Hugging Face checkpoint rewritten as a shardplan checkpoint
/// laid out for `helper`'s mesh: each tensor's sharding decided by `rules` (and checked, before
/// anything is written, to divide it), recorded with the mesh, structure and checksums. The
/// tensors' bytes do not depend on the mesh (they are global), so they are copied as they are.
void reshard_checkpoint(const std::filesystem::path& src, const std::filesystem::path& dst,
                        const MeshShardingHelper& helper, const RuleTree& rules,
                        const ConvertOptions& options = {});

/// Numbered checkpoints under one root (`root/step_00000100`), keeping the last `keep`.
/// Hidden directories of saves or removals that never finished are ignored, and removed
/// by the next save.
class CheckpointManager {
 public:
  explicit CheckpointManager(std::filesystem::path root, int keep = 3);
  /// Saves `tree` as step `step` (an existing step is an error), then removes the oldest
  /// steps beyond `keep`. Collective over processes.
  void save(std::int64_t step, const Tree<Array>& tree, const CheckpointOptions& options = {});
  /// The complete steps, oldest first.
  std::vector<std::int64_t> steps() const;
  /// The newest complete step, if any.
  std::optional<std::int64_t> latest() const;
  std::filesystem::path path_of(std::int64_t step) const;
  int keep() const { return keep_; }
  /// Removes hidden directories left by its saves or removals that never finished (process 0;
  /// only names it makes: `.step_N.partial-X`, `.step_N.removing-X`, earlier `.step_N.partial`).
  void remove_unfinished() const;
  /// Removes the oldest complete steps beyond `keep` (process 0; each renamed away first).
  void remove_old_steps() const;

 private:
  std::filesystem::path root_;
  int keep_;
};

class SaveJob;

/// Saves in the background, as Orbax's async checkpointing: save() waits for the previous save
/// still running (if any), copies this process's blocks to host memory (at most one copy of each
/// device's shards: a replicated block once), and returns while a background thread writes the
/// files. wait() returns when the last save is complete on disk and rethrows its error; the
/// destructor waits too (printing an error it cannot throw). A step appears in
/// manager().steps() once complete. Over processes save() and wait() are collective, and the
/// background thread never communicates: the files are created in save(), and the index written
/// and the directory renamed in the next wait() or save().
class AsyncCheckpointer {
 public:
  explicit AsyncCheckpointer(std::filesystem::path root, int keep = 3);
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  void save(std::int64_t step, const Tree<Array>& tree, const CheckpointOptions& options = {});
  void wait();
  /// Host bytes held by the save in flight (its copy of this process's blocks); 0 when idle.
  std::int64_t pending_bytes() const;
  const CheckpointManager& manager() const { return manager_; }

 private:
  CheckpointManager manager_;
  std::unique_ptr<SaveJob> job_;
  std::thread thread_;
  std::exception_ptr error_;
};

}  // namespace shardplan
