// Restoring: each device of this process reads only the byte ranges of its block, straight into
// its buffer, or through a bounded staging buffer when the ranges are small (read_runs).
// restore_leaves serves restore_checkpoint (shardings or a template) and load_checkpoint
// (load.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "../runtime/box_copy.hpp"
#include "../runtime/numeric.hpp"
#include "checkpoint_impl.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {
namespace {

namespace fs = std::filesystem;

// A restore reads at most this many files at once (a checkpoint may have more files than the
// process may open: 1024 by default).
constexpr std::size_t kMaxOpenFiles = 64;

/// The halves in the upper half of `buf` (n of them, at byte 2n) become floats over the whole
/// buffer, front to back: element i is read before bytes [4i, 4i + 4) are written, and those
/// never reach an unread half (4i + 4 <= 2n + 2i + 2 for i < n).
void widen_halves_in_place(std::byte* buf, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint16_t h = 0;
    std::memcpy(&h, buf + 2 * n + 2 * i, 2);
    const float f = half_to_float(h);
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

// The checkpoint's tensor `w` names, as `w` wants it (its shape and dtype when given). Throws
// IoError when it holds none of that name (naming a few it holds), SpecError when it differs.
const CheckpointTensor& wanted_tensor(
    const CheckpointInfo& info,
    const std::unordered_map<std::string_view, const CheckpointTensor*>& by_name,
    const Wanted& w) {
  const auto found = by_name.find(w.name);
  if (found == by_name.end()) {
    std::string some;
    for (std::size_t i = 0; i < info.tensors.size() && i < 5; ++i) {
      some += (i ? ", '" : "'") + info.tensors[i].name + "'";
    }
    throw IoError(fmt::format("[checkpoint] {}: no tensor '{}' (it holds {} tensors{}{})",
                              info.dir.string(), w.name, info.tensors.size(),
                              some.empty() ? "" : ": ", some));
  }
  const CheckpointTensor& t = *found->second;
  if (w.like && (w.like->shape != t.spec.shape || w.like->dtype != t.spec.dtype)) {
    throw SpecError(fmt::format("[checkpoint] tensor '{}' in {} is {}{}, the target wants {}{}",
                                w.name, (info.dir / t.file).string(), name(t.spec.dtype),
                                t.spec.shape.to_string(), name(w.like->dtype),
                                w.like->shape.to_string()));
  }
  return t;
}

}  // namespace

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
      const CheckpointTensor* t = &wanted_tensor(info, by_name, w);
      const fs::path file = info.dir / t->file;
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
        // The block's rows; a padded block's buffer is zeros after them (an f16 zero widens
        // to an f32 zero).
        std::vector<std::int64_t> origin, rows, zero(static_cast<std::size_t>(rank), 0);
        std::int64_t valid = 1;
        for (const auto& sl : blocks[static_cast<std::size_t>(d)]) {
          origin.push_back(sl.start);
          rows.push_back(sl.size);
          valid *= sl.size;
        }
        std::byte* dst = buffers[static_cast<std::size_t>(d)]->data();
        if (valid != shard.numel()) std::memset(dst, 0, static_cast<std::size_t>(bytes + image));
        detail::for_each_run(shape.begin(), origin.data(), shard.begin(), zero.data(),
                             rows.data(), rank, elem,
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

}  // namespace shardplan::detail

namespace shardplan {

namespace fs = std::filesystem;
using detail::restore_leaves;
using detail::Wanted;

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

}  // namespace shardplan
