// plan_concurrently (train_plan.hpp): the configurations of a comparison planned on every core,
// the plans and the first failure as a loop would give them.
#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "shardplan/train_plan.hpp"

namespace shardplan {

std::vector<TrainPlan> plan_concurrently(std::size_t n,
                                         const std::function<TrainPlan(std::size_t)>& plan,
                                         int threads) {
  std::size_t workers = threads > 0 ? static_cast<std::size_t>(threads)
                                    : std::max(1u, std::thread::hardware_concurrency());
  workers = std::min(workers, n);
  std::vector<TrainPlan> plans(n);
  if (workers <= 1) {
    for (std::size_t i = 0; i < n; ++i) plans[i] = plan(i);
    return plans;
  }
  // Calls are taken in order, so when call i fails every call before it has started: the
  // first failure in order is the one a loop would have stopped at.
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  std::size_t failed_at = n;  // guarded by mu
  std::exception_ptr failure;
  const auto work = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= n) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (i > failed_at) return;  // a loop would have stopped before it
      }
      try {
        plans[i] = plan(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < failed_at) {
          failed_at = i;
          failure = std::current_exception();
        }
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  try {
    for (std::size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  } catch (...) {  // no thread to start: the calls left run on this one
  }
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  return plans;
}

}  // namespace shardplan
