// CheckpointManager: numbered steps under one root, the last `keep` kept; what saves or
// removals cut short leave is removed by the next save.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "checkpoint_impl.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"

namespace shardplan {

namespace fs = std::filesystem;
using detail::io_fail;
using detail::kIndexName;
using detail::on_first_process;

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

}  // namespace shardplan
