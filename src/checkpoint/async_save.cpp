// AsyncCheckpointer: SaveJob's steps (save.cpp) with the writing on a background thread; the
// steps that communicate (begin, the agreement, commit) stay on the caller's thread.
#include <cstdio>
#include <exception>
#include <memory>
#include <thread>

#include "checkpoint_impl.hpp"
#include "shardplan/distributed.hpp"

namespace shardplan {

namespace fs = std::filesystem;
using detail::on_first_process;

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
