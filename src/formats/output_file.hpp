#pragma once
// The one way shardplan writes a file or a directory (checkpoints, conversions, HTML reports,
// safetensors skeletons): under a hidden temporary name beside the destination that no other run
// can have (created exclusively, never following a symbolic link), then renamed into place only
// when complete. A directory is renamed without ever replacing what appeared at the destination
// meanwhile (renameat2 RENAME_NOREPLACE); a file replaces only a regular file. A failure removes
// the temporary and nothing else. Errors are IoError "[what] PATH: ..." naming the destination.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/error.hpp"

namespace shardplan::detail {

/// `dst` as a destination: absolute, lexically normal, trailing slashes dropped ("out/" is
/// "out"). Throws IoError for an empty path, a path with no last name ("/"), or a last name
/// longer than NAME_MAX (255) bytes.
std::filesystem::path output_path(const std::filesystem::path& dst, std::string_view what);

/// A hidden name beside `dst` no other run uses: `.NAME.KIND-XXXXXXXXXX` (ten random characters;
/// NAME shortened when the whole would pass NAME_MAX).
std::filesystem::path temp_name_for(const std::filesystem::path& dst, std::string_view kind);

/// Ten random characters of [0-9a-z] (getrandom), for names no other run picks.
std::string unique_suffix();

/// Whether `name` is one that temp_name_for(dst, kind) makes for some dst named `stem`, or
/// the fixed `.STEM.KIND` of versions before unique names.
bool is_temp_name_of(std::string_view name, std::string_view stem, std::string_view kind);

/// rename(2) of a directory that never replaces an existing `to` (renameat2 RENAME_NOREPLACE;
/// on file systems without it, an exclusive mkdir of `to` then rename onto that, ours).
/// Returns 0 or the errno (EEXIST when `to` exists).
int rename_no_replace(const std::filesystem::path& from, const std::filesystem::path& to) noexcept;

/// Removes `temp`, a temporary directory or file that OutputDir or OutputFile made, unless the
/// run that made it is still writing (it holds an flock on it until its commit or discard: a run
/// that ended, even by SIGKILL, holds none; on a file system without locks every one is kept).
/// Returns whether it was removed (or already gone). Throws IoError naming `temp` when it cannot
/// be opened or removed.
bool remove_abandoned_temp(const std::filesystem::path& temp, std::string_view what);

/// fsync of a directory (its entries: a rename inside it survives a crash). Throws IoError.
void sync_directory(const std::filesystem::path& dir, std::string_view what);

/// A directory written whole and then renamed to its destination, which must not exist.
/// Missing parent directories are made (and removed again, when still empty, on failure).
/// Not thread-safe; the destructor discards an uncommitted directory.
class OutputDir {
 public:
  /// Checks that `dst` does not exist, makes its missing parents, removes what earlier runs for
  /// `dst` cut short left (remove_abandoned_temp), then makes the temporary directory, locked
  /// (flock) until commit or discard. Throws IoError naming `dst` (exists, a parent is a file,
  /// permissions, ...).
  OutputDir(const std::filesystem::path& dst, std::string_view what);
  ~OutputDir();
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  /// The destination (normalised) and the temporary directory to write into.
  const std::filesystem::path& path() const { return dst_; }
  const std::filesystem::path& temp() const { return temp_; }
  /// fsyncs the temporary directory, renames it to path() without replacing anything, fsyncs
  /// the parent. When path() appeared meanwhile, removes the temporary and throws IoError.
  void commit();
  /// Removes the temporary directory and the parents this object made (if still empty).
  void discard() noexcept;

 private:
  std::string what_;
  std::filesystem::path dst_, temp_;
  std::vector<std::filesystem::path> made_parents_;  // outermost first
  int lock_fd_ = -1;  // temp_ opened, flock'ed: tells other runs that it is being written
  bool done_ = false;
};

/// A file written under a temporary name in its destination's directory (which must exist),
/// then renamed to its destination: a regular file there is replaced atomically; anything else
/// (a directory, a symbolic link, a device) is an error and left as it is, and so is a path that
/// names a directory by its form (ending in '/', "." or ".."). (The report files
/// and skeletons written this way are made again by running the command again; a checkpoint,
/// which must never be replaced, is an OutputDir.) Not thread-safe; the destructor removes an uncommitted file.
class OutputFile {
 public:
  /// Removes what runs for `dst` killed before their commit left (remove_abandoned_temp), then
  /// creates the temporary file (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0666 less the umask),
  /// locked (flock) until commit or discard. Throws IoError naming `dst`.
  OutputFile(const std::filesystem::path& dst, std::string_view what);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::filesystem::path& path() const { return dst_; }
  /// Appends `bytes`; throws IoError naming the destination (a full disk, EFBIG under a file
  /// size limit: the CLI ignores SIGXFSZ so that these are errors, not a silent death).
  void write(std::string_view bytes);
  /// Sets the file's size (the data beyond what was written reads as zeros, sparse on disk).
  void resize(std::int64_t bytes);
  /// fsync, close, rename into place, fsync of the directory.
  void commit();
  /// Removes the temporary file.
  void discard() noexcept;

 private:
  friend class OutputFiles;
  void close_written();  // fsync and close (commit's first half); discards on failure

  std::string what_;
  std::filesystem::path dst_, temp_;
  int fd_ = -1;
  int lock_fd_ = -1;  // temp_ opened again, flock'ed until the rename: see OutputDir
  bool done_ = false;
};

/// An output path a command was given that breaks the output contract (OutputFiles): bad usage,
/// exit 2 in the CLI. Names the option and the path.
class OutputPathError : public IoError {
 public:
  using IoError::IoError;
};

/// One output of a command: the option that names it ("--html") and its path.
struct NamedOutput {
  std::string option;
  std::filesystem::path path;
};

/// The files one command writes, under the output contract (docs/cli.md "Outputs"):
/// - no output is a file the command read (InputRecord: the same device and inode, however
///   named), so construct it once the inputs are read;
/// - the outputs are distinct files (the same path once resolved, or the same device and inode);
/// - an output names a file: a path ending in '/' (or "." / "..") or an existing directory is
///   refused;
/// - they appear together or not at all: each is written to its temporary (OutputFile), and
///   commit() renames them all at the end; when one rename fails, those made already are undone
///   (a file they replaced is put back) and every temporary removed.
/// The constructor checks all of that before anything is made (OutputPathError naming the
/// option and path), then makes every temporary (IoError as OutputFile). Not thread-safe.
class OutputFiles {
 public:
  explicit OutputFiles(const std::vector<NamedOutput>& outputs);
  ~OutputFiles();
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  std::size_t size() const { return files_.size(); }
  /// Output `i` (in the constructor's order): write it, then commit() all.
  OutputFile& operator[](std::size_t i) { return *files_[i]; }
  /// Closes every temporary, then renames each into place; all or none appear. Throws IoError
  /// naming the destination that failed.
  void commit();
  /// Removes every temporary (also done by the destructor unless committed).
  void discard() noexcept;

 private:
  std::vector<std::unique_ptr<OutputFile>> files_;
};

}  // namespace shardplan::detail
