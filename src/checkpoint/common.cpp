// What the checkpoint's sources share (checkpoint_impl.hpp): files read and written with
// pread/pwrite, checksums, the files' layout and names, steps run over processes.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "../formats/input_file.hpp"
#include "checkpoint_impl.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/model_loader.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace shardplan::detail {

namespace fs = std::filesystem;

void io_fail(const fs::path& file, std::string_view what, int err) {
  throw IoError(fmt::format("[checkpoint] {}: {}{}", file.string(), what,
                            err != 0 ? fmt::format(" ({})", std::strerror(err)) : std::string()));
}

File::File(const fs::path& path, int flags, const fs::path& shown)
    : path_(shown.empty() ? path : shown) {
  fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd_ < 0) io_fail(path_, "cannot open", errno);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_at(const void* data, std::int64_t bytes, std::int64_t offset) const {
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

void File::read_at(void* data, std::int64_t bytes, std::int64_t offset) const {
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

void File::start_writeback(std::int64_t offset, std::int64_t bytes) const {
  if (bytes >= (std::int64_t{1} << 20)) {
    ::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes),
                      SYNC_FILE_RANGE_WRITE);
  }
}

void File::sync() const {
  if (::fsync(fd_) != 0) io_fail(path_, "fsync failed", errno);
}

void File::truncate(std::int64_t size) const {
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
    io_fail(path_, fmt::format("cannot size to {} bytes", size), errno);
  }
}

Hasher::Hasher() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Hasher::~Hasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Hasher::update(const void* data, std::size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

std::uint64_t Hasher::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

std::uint64_t file_checksum(const fs::path& path) {
  const InputFile f(path, "checkpoint");
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

std::string file_name(std::size_t f, std::size_t count) {
  return count == 1 ? std::string("model.safetensors")
                    : fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, count);
}

void collectively(const std::function<void()>& step) {
  if (distributed::process_count() == 1) {
    step();
  } else {
    distributed::all_succeed(step);
  }
}

void on_first_process(const std::function<void()>& step) {
  collectively([&] {
    if (distributed::process_index() == 0) step();
  });
}

std::string sharding_text(const NamedSharding& s) {
  return fmt::format("{} on {}", s.spec().to_string(), s.mesh().to_string());
}

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

}  // namespace shardplan::detail
