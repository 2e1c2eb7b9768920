#pragma once
// The one way shardplan opens a file it reads (configs, checkpoint indexes and records, model
// descriptions, rule files, safetensors headers): regular files only, so that a FIFO, a device
// such as /dev/zero or a directory given by mistake is an error naming it rather than a hang,
// an unbounded read or a confusing parse error; and at most a stated number of bytes.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace shardplan::detail {

/// What a file of mode `mode` (st_mode) is, for messages: "a directory", "a FIFO (named pipe)",
/// "a regular file", ... (the one wording of input_file.cpp and output_file.cpp).
const char* file_kind(unsigned mode);

/// Files the project reads whole are JSON and YAML texts; none is near this size.
inline constexpr std::size_t kMaxInputFileBytes = std::size_t{1} << 30;  // 1 GiB

/// The whole content of `file`. Throws IoError "[what] FILE: ..." when it cannot be opened,
/// is not a regular file (a directory, a FIFO, a device, a socket), is larger than
/// `max_bytes`, or a read fails. Opening never blocks (O_NONBLOCK) and the type is checked on
/// the opened descriptor, so a file replaced between a check and the open cannot slip through.
std::string read_input_file(const std::filesystem::path& file, std::string_view what,
                            std::size_t max_bytes = kMaxInputFileBytes);

/// A file opened by InputFile (or read_input_file) while an InputRecord was alive.
struct ReadInput {
  std::uint64_t device = 0, inode = 0;  // st_dev, st_ino: the file, however it was named
  std::string path, what;               // as opened; the reader's word for it ("trace")
};

/// While one is alive (in any thread), every file InputFile opens is noted: a command checks that
/// none of its outputs is one of the files it read (OutputFiles, docs/cli.md "Outputs"). Off
/// otherwise: a program may read a file and later write it again. Nests.
class InputRecord {
 public:
  InputRecord();
  ~InputRecord();
  InputRecord(const InputRecord&) = delete;
  InputRecord& operator=(const InputRecord&) = delete;
  /// The files opened since the first live InputRecord was made, each once, in order.
  static std::vector<ReadInput> files();
};

/// An opened regular file for reads at offsets (safetensors headers, shard data): the same
/// checks as read_input_file, without reading it. Closes on destruction.
class InputFile {
 public:
  InputFile(const std::filesystem::path& file, std::string_view what);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  int fd() const { return fd_; }
  std::size_t size() const { return size_; }
  /// Reads exactly `n` bytes at `offset` into `out`; throws IoError naming the file if the
  /// file ends first or a read fails.
  void read_at(std::size_t offset, char* out, std::size_t n) const;

 private:
  std::string path_, what_;
  int fd_ = -1;
  std::size_t size_ = 0;
};

}  // namespace shardplan::detail
