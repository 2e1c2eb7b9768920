#include "output_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>

#include "input_file.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(std::string_view what, const fs::path& dst, std::string_view text,
                       int err = 0) {
  throw IoError(fmt::format("[{}] {}: {}{}", what, dst.string(), text,
                            err != 0 ? fmt::format(": {}", std::strerror(err)) : std::string()));
}

/// The message of a no-replace rename that found its destination taken.
[[noreturn]] void fail_appeared(std::string_view what, const fs::path& dst) {
  fail(what, dst,
       "appeared while this run was writing it (another run writing the same destination?); it "
       "was left as it is and this run's output removed");
}

}  // namespace

fs::path output_path(const fs::path& dst, std::string_view what) {
  if (dst.empty()) throw IoError(fmt::format("[{}] the destination path is empty", what));
  std::error_code ec;
  fs::path p = fs::absolute(dst, ec);
  if (ec) fail(what, dst, "cannot make the path absolute", ec.value());
  p = p.lexically_normal();
  while (!p.has_filename() && p.has_relative_path()) p = p.parent_path();  // "out/" is "out"
  if (!p.has_filename()) fail(what, dst, "not a name that can be written (no last part)");
  const std::size_t length = p.filename().native().size();
  if (length > NAME_MAX) {
    fail(what, dst,
         fmt::format("the name '{}...' is {} bytes, longer than a file name may be ({} bytes)",
                     p.filename().native().substr(0, 32), length, NAME_MAX));
  }
  return p;
}

std::string unique_suffix() {
  std::uint64_t bits = 0;
  if (::getrandom(&bits, sizeof bits, 0) != static_cast<ssize_t>(sizeof bits)) {
    // No entropy source: the time, the process and a counter still differ between runs.
    static std::atomic<std::uint64_t> counter{0};
    bits = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           (static_cast<std::uint64_t>(::getpid()) << 40) ^ (counter++ * 0x9e3779b97f4a7c15ull);
  }
  std::string out(10, '0');
  for (char& c : out) {
    c = "0123456789abcdefghijklmnopqrstuvwxyz"[bits % 36];
    bits /= 36;
  }
  return out;
}

fs::path temp_name_for(const fs::path& dst, std::string_view kind) {
  std::string name = dst.filename().string();
  const std::string tail = fmt::format(".{}-{}", kind, unique_suffix());
  const std::size_t room = NAME_MAX - 1 - tail.size();
  if (name.size() > room) name.resize(room);
  return dst.parent_path() / ("." + name + tail);
}

bool is_temp_name_of(std::string_view name, std::string_view stem, std::string_view kind) {
  const std::string prefix = fmt::format(".{}.{}", stem, kind);
  if (!name.starts_with(prefix)) return false;
  const std::string_view rest = name.substr(prefix.size());
  if (rest.empty()) return true;  // the fixed name of earlier versions
  if (rest.size() != 11 || rest[0] != '-') return false;
  for (const char c : rest.substr(1)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'))) return false;
  }
  return true;
}

int rename_no_replace(const fs::path& from, const fs::path& to) noexcept {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  const int err = errno;
  if (err != EINVAL && err != ENOSYS && err != ENOTSUP) return err;
  // A file system without RENAME_NOREPLACE: plain rename(2) would replace an empty directory,
  // so take the name first with an exclusive mkdir and replace only that (ours) directory.
  if (::mkdir(to.c_str(), 0700) != 0) return errno;
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int e = errno;
    ::rmdir(to.c_str());
    return e;
  }
  return 0;
}

bool remove_abandoned_temp(const fs::path& temp, std::string_view what) {
  // O_NONBLOCK: a FIFO planted under such a name is not waited on (and is not ours: kept).
  const int fd = ::open(temp.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return true;
    if (errno == ELOOP) return false;  // a symbolic link: not ours
    fail(what, temp, "cannot open an unfinished temporary", errno);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode))) {
    ::close(fd);
    return false;
  }
  // Held while removing: the run that made the directory checks, once it has the lock, that the
  // name is still its directory (see OutputDir), so a removal never takes one being written.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    // A live run's; or a file system without locks, where no run can be told dead: kept.
    ::close(fd);
    return false;
  }
  std::error_code ec;
  if (S_ISDIR(st.st_mode)) {
    fs::remove_all(temp, ec);
  } else if (::unlink(temp.c_str()) != 0 && errno != ENOENT) {
    ec.assign(errno, std::generic_category());
  }
  ::close(fd);
  if (ec) fail(what, temp, "cannot remove an unfinished temporary", ec.value());
  return true;
}

namespace {

/// Removes what runs writing `dst` left when killed (remove_abandoned_temp on each unique
/// temporary name of `dst`; the fixed `.NAME.partial` of earlier versions may be a user's).
void remove_abandoned_temps_of(const fs::path& dst, std::string_view what) {
  const std::string stem = dst.filename().string();
  std::vector<fs::path> abandoned;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dst.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (is_temp_name_of(name, stem, "partial") && name != "." + stem + ".partial") {
      abandoned.push_back(e.path());
    }
  }
  for (const auto& p : abandoned) remove_abandoned_temp(p, what);
}

/// Locks `temp` (just made by this run) through a new descriptor, for as long as this run
/// writes it. Returns the descriptor; -EEXIST when another run's remove_abandoned_temp took the
/// name between its creation and here (it is gone, locked, or leads elsewhere: try another
/// name); -errno when the lock cannot be had at all (out of descriptors): the caller removes what
/// it made and fails with that. On a file system without locks it goes on unlocked (there no run
/// removes another's temporary).
int lock_new_temp(const fs::path& temp) {
  int fd = ::open(temp.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == EACCES) {  // a file the umask left write-only
    fd = ::open(temp.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  }
  if (fd < 0) return errno == ENOENT || errno == ELOOP ? -EEXIST : -errno;
  struct stat mine {};
  struct stat named {};
  if ((::flock(fd, LOCK_EX | LOCK_NB) == 0 || errno != EWOULDBLOCK) && ::fstat(fd, &mine) == 0 &&
      ::stat(temp.c_str(), &named) == 0 && mine.st_dev == named.st_dev &&
      mine.st_ino == named.st_ino) {
    return fd;
  }
  ::close(fd);
  return -EEXIST;
}

}  // namespace

void sync_directory(const fs::path& dir, std::string_view what) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(what, dir, "cannot open the directory to sync it", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail(what, dir, "fsync of the directory failed", err);
}

// ---- OutputDir ------------------------------------------------------------------------------

OutputDir::OutputDir(const fs::path& dst, std::string_view what)
    : what_(what), dst_(output_path(dst, what)) {
  struct stat st {};
  if (::lstat(dst_.c_str(), &st) == 0) {
    fail(what_, dst_, "already exists; write to a new directory (or remove it first)");
  }
  if (errno != ENOENT && errno != ENOTDIR) fail(what_, dst_, "cannot check it", errno);
  // The missing parents, innermost first; ENOTDIR: a part above is a file, found further up.
  std::vector<fs::path> missing;
  for (fs::path p = dst_.parent_path();; p = p.parent_path()) {
    if (::stat(p.c_str(), &st) == 0) {  // a symbolic link to a directory is a parent too
      if (!S_ISDIR(st.st_mode)) {
        fail(what_, dst_,
             fmt::format("{} is {}, not a directory", p.string(), file_kind(st.st_mode)));
      }
      break;
    }
    if (errno != ENOENT && errno != ENOTDIR) {
      fail(what_, dst_, fmt::format("cannot reach {}", p.string()), errno);
    }
    missing.push_back(p);
    if (p == p.root_path()) break;
  }
  try {
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (::mkdir(it->c_str(), 0777) == 0) {
        made_parents_.push_back(*it);
      } else if (const int err = errno;
                 !(err == EEXIST && ::stat(it->c_str(), &st) == 0 && S_ISDIR(st.st_mode))) {
        fail(what_, dst_, fmt::format("cannot create the directory {}", it->string()), err);
      }  // else made meanwhile by another run: not ours to remove
    }
    // What runs for this destination killed before their commit left (a live run's is locked).
    remove_abandoned_temps_of(dst_, what_);
    for (int attempt = 0;; ++attempt) {
      temp_ = temp_name_for(dst_, "partial");
      int err = ::mkdir(temp_.c_str(), 0777) == 0 ? 0 : errno;
      if (err == 0) {
        const int lock = lock_new_temp(temp_);
        if (lock >= 0) {
          lock_fd_ = lock;
          break;
        }
        err = -lock;  // EEXIST: taken by another run's removal, another name
        if (err != EEXIST) ::rmdir(temp_.c_str());  // ours, still empty
      }
      temp_.clear();  // not ours (or removed above): discard() leaves it
      if ((err != EEXIST && err != ENOENT) || attempt == 100) {
        fail(what_, dst_,
             fmt::format("cannot create a temporary directory in {}", dst_.parent_path().string()),
             err);
      }
    }
  } catch (...) {
    temp_.clear();
    discard();
    throw;
  }
}

OutputDir::~OutputDir() { discard(); }

void OutputDir::commit() {
  if (done_) fail(what_, dst_, "committed or discarded already");
  try {
    sync_directory(temp_, what_);
  } catch (...) {
    discard();
    throw;
  }
  const int err = rename_no_replace(temp_, dst_);
  if (err != 0) {
    discard();
    if (err == EEXIST || err == ENOTEMPTY) fail_appeared(what_, dst_);
    fail(what_, dst_, "cannot rename the finished directory into place", err);
  }
  done_ = true;
  made_parents_.clear();
  ::close(lock_fd_);
  lock_fd_ = -1;
  sync_directory(dst_.parent_path(), what_);
}

void OutputDir::discard() noexcept {
  if (done_) return;
  done_ = true;
  std::error_code ec;
  if (!temp_.empty()) fs::remove_all(temp_, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);
  lock_fd_ = -1;
  // Only the parents made here, innermost first, and only while empty (rmdir refuses otherwise:
  // another run may be writing into one by now).
  for (auto it = made_parents_.rbegin(); it != made_parents_.rend(); ++it) ::rmdir(it->c_str());
  made_parents_.clear();
}

// ---- OutputFile -----------------------------------------------------------------------------

namespace {

/// Whether `p` names a directory by its form: "out/", "out/.", "..".
bool names_a_directory(const fs::path& p) {
  return !p.empty() && (!p.has_filename() || p.filename() == "." || p.filename() == "..");
}

}  // namespace

OutputFile::OutputFile(const fs::path& dst, std::string_view what)
    : what_(what), dst_(output_path(dst, what)) {
  if (names_a_directory(dst)) {
    fail(what_, dst, "names a directory (it ends in '/'); name a file to write");
  }
  struct stat st {};
  if (::lstat(dst_.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      fail(what_, dst_,
           fmt::format("is {}; only a regular file is replaced", file_kind(st.st_mode)));
    }
  } else if (errno != ENOENT) {
    fail(what_, dst_, "cannot write", errno);
  }
  remove_abandoned_temps_of(dst_, what_);
  for (int attempt = 0;; ++attempt) {
    temp_ = temp_name_for(dst_, "partial");
    // O_EXCL: a name nobody has, not even as a symbolic link planted to redirect the write.
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    int err = errno;
    if (fd_ >= 0) {
      const int lock = lock_new_temp(temp_);  // (its own descriptor: held past fd_'s close)
      if (lock >= 0) {
        lock_fd_ = lock;
        break;
      }
      ::close(fd_);
      fd_ = -1;
      err = -lock;  // EEXIST: taken by another run's removal, another name
      if (err != EEXIST) ::unlink(temp_.c_str());  // ours, and empty
    }
    if (err != EEXIST || attempt == 100) {
      done_ = true;
      fail(what_, dst_, fmt::format("cannot create a file in {}", dst_.parent_path().string()),
           err);
    }
  }
}

OutputFile::~OutputFile() { discard(); }

void OutputFile::write(std::string_view bytes) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      discard();
      fail(what_, dst_,
           fmt::format("write of {} bytes failed after {}", bytes.size(), bytes.size() - left),
           err);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void OutputFile::resize(std::int64_t bytes) {
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    discard();
    fail(what_, dst_, fmt::format("cannot make the file {} bytes long", bytes), err);
  }
}

void OutputFile::close_written() {
  if (done_) fail(what_, dst_, "committed or discarded already");
  if (::fsync(fd_) != 0) {
    const int err = errno;
    discard();
    fail(what_, dst_, "fsync failed", err);
  }
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    const int err = errno;
    discard();
    fail(what_, dst_, "close failed", err);
  }
}

void OutputFile::commit() {
  close_written();
  if (::rename(temp_.c_str(), dst_.c_str()) != 0) {
    const int err = errno;
    discard();
    fail(what_, dst_, "cannot rename the finished file into place", err);
  }
  done_ = true;
  ::close(lock_fd_);
  lock_fd_ = -1;
  sync_directory(dst_.parent_path(), what_);
}

void OutputFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (done_) return;
  done_ = true;
  ::unlink(temp_.c_str());
  if (lock_fd_ >= 0) ::close(lock_fd_);
  lock_fd_ = -1;
}

// ---- OutputFiles ----------------------------------------------------------------------------

namespace {

[[noreturn]] void refuse(const NamedOutput& o, const std::string& why) {
  throw OutputPathError(fmt::format("{} '{}': {}", o.option, o.path.string(), why));
}

/// The output contract's checks of OutputFiles, before anything is made.
void check_outputs(const std::vector<NamedOutput>& outputs) {
  const std::vector<ReadInput> inputs = InputRecord::files();
  struct Seen {
    const NamedOutput* output;
    fs::path resolved;
    bool exists;
    struct stat st;
  };
  std::vector<Seen> seen;
  for (const NamedOutput& o : outputs) {
    if (o.path.empty()) refuse(o, "the path is empty");
    if (names_a_directory(o.path)) {
      refuse(o, "names a directory (it ends in '/'); name a file to write");
    }
    Seen s{&o, {}, false, {}};
    s.exists = ::stat(o.path.c_str(), &s.st) == 0;
    if (s.exists && S_ISDIR(s.st.st_mode)) refuse(o, "is a directory; name a file to write");
    if (s.exists) {
      for (const ReadInput& in : inputs) {
        if (in.device == static_cast<std::uint64_t>(s.st.st_dev) &&
            in.inode == static_cast<std::uint64_t>(s.st.st_ino)) {
          refuse(o, fmt::format("is an input of this command (the {} {}); an output may not "
                                "be an input",
                                in.what, in.path));
        }
      }
    }
    std::error_code ec;
    s.resolved = fs::weakly_canonical(fs::absolute(o.path, ec), ec);
    if (ec) s.resolved = fs::absolute(o.path, ec).lexically_normal();
    for (const Seen& t : seen) {
      const bool same_file = s.exists && t.exists && s.st.st_dev == t.st.st_dev &&
                             s.st.st_ino == t.st.st_ino;
      if (same_file || (!s.resolved.empty() && s.resolved == t.resolved)) {
        refuse(o, fmt::format("is the same file as {} '{}'; each output of a command is a "
                              "different file",
                              t.output->option, t.output->path.string()));
      }
    }
    seen.push_back(s);
  }
}

}  // namespace

OutputFiles::OutputFiles(const std::vector<NamedOutput>& outputs) {
  check_outputs(outputs);
  for (const NamedOutput& o : outputs) {
    files_.push_back(std::make_unique<OutputFile>(o.path, o.option));
  }
}

OutputFiles::~OutputFiles() { discard(); }

void OutputFiles::discard() noexcept {
  for (auto& f : files_) f->discard();
}

void OutputFiles::commit() {
  try {
    for (auto& f : files_) f->close_written();
  } catch (...) {
    discard();
    throw;
  }
  // Each destination in turn; a regular file it replaces is first kept under a hidden name
  // (a hard link, locked as a temporary is), so that a later failure can put it back.
  struct Renamed {
    OutputFile* file;
    fs::path backup;  // empty: nothing was replaced (or, without hard links, nothing kept)
    int backup_lock = -1;
  };
  std::vector<Renamed> renamed;
  const auto undo = [&] {
    for (auto it = renamed.rbegin(); it != renamed.rend(); ++it) {
      if (it->backup.empty()) {
        ::unlink(it->file->dst_.c_str());
      } else {
        ::rename(it->backup.c_str(), it->file->dst_.c_str());
      }
      if (it->backup_lock >= 0) ::close(it->backup_lock);
    }
    discard();
  };
  const bool several = files_.size() > 1;
  for (auto& f : files_) {
    Renamed r{f.get(), {}, -1};
    struct stat st {};
    if (several && ::lstat(f->dst_.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      r.backup = temp_name_for(f->dst_, "partial");
      if (::link(f->dst_.c_str(), r.backup.c_str()) != 0) {
        const int err = errno;
        if (err == EPERM || err == EOPNOTSUPP || err == ENOSYS || err == EMLINK) {
          r.backup.clear();  // a file system without hard links: replaced without a way back
        } else {
          undo();
          fail(f->what_, f->dst_,
               "cannot keep the file it replaces until every output is written", err);
        }
      }
      if (!r.backup.empty()) {
        r.backup_lock = ::open(r.backup.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (r.backup_lock >= 0) (void)::flock(r.backup_lock, LOCK_EX | LOCK_NB);
      }
    }
    if (::rename(f->temp_.c_str(), f->dst_.c_str()) != 0) {
      const int err = errno;
      if (!r.backup.empty()) ::unlink(r.backup.c_str());
      if (r.backup_lock >= 0) ::close(r.backup_lock);
      undo();
      fail(f->what_, f->dst_,
           several ? "cannot rename the finished file into place (no output of this command was "
                     "written)"
                   : "cannot rename the finished file into place",
           err);
    }
    renamed.push_back(r);
  }
  for (Renamed& r : renamed) {
    if (!r.backup.empty()) ::unlink(r.backup.c_str());
    if (r.backup_lock >= 0) ::close(r.backup_lock);
    r.file->done_ = true;
    ::close(r.file->lock_fd_);
    r.file->lock_fd_ = -1;
  }
  for (const Renamed& r : renamed) sync_directory(r.file->dst_.parent_path(), r.file->what_);
}

}  // namespace shardplan::detail
