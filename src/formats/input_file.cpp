#include "input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <mutex>
#include <set>
#include <utility>

#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"

namespace shardplan::detail {
const char* file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "of an unknown kind";
}

namespace {

/// InputRecord's state: how many are alive, and what was opened meanwhile.
struct Record {
  std::mutex mutex;
  int alive = 0;
  std::vector<ReadInput> files;
  std::set<std::pair<std::uint64_t, std::uint64_t>> seen;  // (device, inode) of files
};
Record& record() {
  static Record r;
  return r;
}

void note_input(const struct stat& st, const std::string& path, std::string_view what) {
  Record& r = record();
  const std::lock_guard lock(r.mutex);
  if (r.alive == 0) return;
  const auto device = static_cast<std::uint64_t>(st.st_dev);
  const auto inode = static_cast<std::uint64_t>(st.st_ino);
  if (r.seen.emplace(device, inode).second) {
    r.files.push_back({device, inode, path, std::string(what)});
  }
}

}  // namespace

InputRecord::InputRecord() {
  Record& r = record();
  const std::lock_guard lock(r.mutex);
  ++r.alive;
}

InputRecord::~InputRecord() {
  Record& r = record();
  const std::lock_guard lock(r.mutex);
  if (--r.alive == 0) {
    r.files.clear();
    r.seen.clear();
  }
}

std::vector<ReadInput> InputRecord::files() {
  Record& r = record();
  const std::lock_guard lock(r.mutex);
  return r.files;
}

InputFile::InputFile(const std::filesystem::path& file, std::string_view what)
    : path_(file.string()), what_(what) {
  if (path_.empty()) throw IoError(fmt::format("[{}] an empty file name", what));
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd_ < 0) {
    const int err = errno;
    throw IoError(
        fmt::format("[{}] {}: cannot open for reading: {}", what, path_, std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw IoError(fmt::format("[{}] {}: cannot stat: {}", what, path_, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw IoError(fmt::format("[{}] {}: is {}; only regular files are read", what, path_,
                              file_kind(st.st_mode)));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  note_input(st, path_, what_);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(std::size_t offset, char* out, std::size_t n) const {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw IoError(fmt::format("[{}] {}: read failed at byte {}: {}", what_, path_,
                                offset + done, std::strerror(err)));
    }
    if (r == 0) {
      throw IoError(fmt::format("[{}] {}: the file ends at byte {}, {} bytes were to be read",
                                what_, path_, offset + done, n - done));
    }
    done += static_cast<std::size_t>(r);
  }
}

std::string read_input_file(const std::filesystem::path& file, std::string_view what,
                            std::size_t max_bytes) {
  const InputFile in(file, what);
  if (in.size() > max_bytes) {
    throw IoError(fmt::format("[{}] {}: {} is larger than the {} this reader accepts", what,
                              file.string(), format_bytes(static_cast<std::int64_t>(in.size())),
                              format_bytes(static_cast<std::int64_t>(max_bytes))));
  }
  // Read to the end, not to the size seen by fstat: a file that grows meanwhile is read up to
  // the bound and refused past it.
  std::string text(in.size(), '\0');
  std::size_t got = 0;
  for (;;) {
    if (got == text.size()) {
      if (text.size() >= max_bytes + 1) break;
      // At the size fstat gave: look for more through a small buffer first, so that a file
      // that does not grow is held once, not in a buffer twice its size (a trace of 78 MB).
      char probe[4096];
      const ssize_t more = ::read(in.fd(), probe, sizeof probe);
      if (more < 0 && errno == EINTR) continue;
      if (more < 0) {
        const int err = errno;
        throw IoError(fmt::format("[{}] {}: read failed: {}", what, file.string(),
                                  std::strerror(err)));
      }
      if (more == 0) break;
      text.resize(std::min(max_bytes + 1, std::max<std::size_t>(4096, text.size() * 2)));
      const std::size_t keep = std::min(static_cast<std::size_t>(more), text.size() - got);
      std::memcpy(text.data() + got, probe, keep);
      got += keep;
      continue;
    }
    const ssize_t r = ::read(in.fd(), text.data() + got, text.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw IoError(fmt::format("[{}] {}: read failed: {}", what, file.string(),
                                std::strerror(err)));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  if (got > max_bytes) {
    throw IoError(fmt::format("[{}] {}: the file is larger than the {} this reader accepts", what,
                              file.string(), format_bytes(static_cast<std::int64_t>(max_bytes))));
  }
  text.resize(got);
  return text;
}

}  // namespace shardplan::detail
