#include "shardplan/executor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "shardplan/detail/checked.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/format_bytes.hpp"

#if defined(SHARDPLAN_EXECUTOR_TBB)
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>
#endif

namespace shardplan {
namespace detail {

// One cache line per device, so devices allocating at once do not share a line.
struct alignas(64) DeviceAccount {
  std::atomic<std::int64_t> in_use{0};
  std::atomic<std::int64_t> peak{0};
};

// Freed blocks kept for reuse, per device: a step that allocates what the last one freed (every
// training step, every benchmark iteration) then touches memory that is already mapped, instead
// of faulting in fresh pages. Blocks are matched by their rounded size.
struct BlockCache {
  std::mutex mu;
  std::unordered_map<std::size_t, std::vector<void*>> blocks;  // rounded size -> blocks
  std::size_t bytes = 0;
};

struct DeviceAccounts {
  explicit DeviceAccounts(int n)
      : num_devices(n),
        accounts(new DeviceAccount[static_cast<std::size_t>(n)]),
        caches(new BlockCache[static_cast<std::size_t>(n)]) {}
  ~DeviceAccounts() {
    for (int d = 0; d < num_devices; ++d) drop_cache(d);
  }
  int num_devices;
  std::unique_ptr<DeviceAccount[]> accounts;
  std::unique_ptr<BlockCache[]> caches;
  std::atomic<std::int64_t> limit{0};
  std::atomic<std::int64_t> cache_limit{std::int64_t{1} << 30};  // per device

  static std::size_t rounded(std::int64_t bytes) {
    const auto b = static_cast<std::size_t>(bytes);
    const std::size_t unit = b >= (std::size_t{1} << 16) ? 4096 : 64;
    return (b + unit - 1) / unit * unit;
  }

  // A block of at least `bytes`, from the cache when one of the same rounded size is there.
  void* take(int device, std::int64_t bytes) {
    const std::size_t size = rounded(bytes);
    BlockCache& c = caches[static_cast<std::size_t>(device)];
    {
      std::lock_guard<std::mutex> lock(c.mu);
      auto it = c.blocks.find(size);
      if (it != c.blocks.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        c.bytes -= size;
        return p;
      }
    }
    return std::aligned_alloc(64, size);
  }
  void give_back(int device, void* p, std::int64_t bytes) noexcept {
    const std::size_t size = rounded(bytes);
    BlockCache& c = caches[static_cast<std::size_t>(device)];
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.bytes + size <= static_cast<std::size_t>(cache_limit.load(std::memory_order_relaxed))) {
        c.blocks[size].push_back(p);
        c.bytes += size;
        return;
      }
    }
    std::free(p);
  }
  std::int64_t cached(int device) {
    BlockCache& c = caches[static_cast<std::size_t>(device)];
    std::lock_guard<std::mutex> lock(c.mu);
    return static_cast<std::int64_t>(c.bytes);
  }
  void drop_cache(int device) noexcept {
    BlockCache& c = caches[static_cast<std::size_t>(device)];
    std::lock_guard<std::mutex> lock(c.mu);
    for (auto& [size, list] : c.blocks) {
      for (void* p : list) std::free(p);
    }
    c.blocks.clear();
    c.bytes = 0;
  }

  DeviceAccount& operator[](int device) { return accounts[static_cast<std::size_t>(device)]; }

  // Counts `bytes` on `device` and returns the bytes then in use, or throws when that would pass
  // the limit (or int64).
  std::int64_t reserve(int device, std::int64_t bytes) {
    DeviceAccount& a = (*this)[device];
    const std::int64_t lim = limit.load(std::memory_order_relaxed);
    std::int64_t cur = a.in_use.load(std::memory_order_relaxed);
    std::int64_t next = 0;
    do {
      // cur + bytes is checked: near INT64_MAX a plain sum would wrap below the limit.
      const bool fits = detail::checked_add(cur, bytes, &next);
      if (!fits) {
        throw OutOfMemoryError(fmt::format(
            "[executor] out of memory on device {}: asked for {} ({} bytes) with {} ({} bytes) in "
            "use; the sum overflows int64",
            device, format_bytes(bytes), bytes, format_bytes(cur), cur));
      }
      if (lim > 0 && next > lim) {
        throw OutOfMemoryError(fmt::format(
            "[executor] out of memory on device {}: asked for {} ({} bytes) with {} in use and a "
            "limit of {} per device",
            device, format_bytes(bytes), bytes, format_bytes(cur), format_bytes(lim)));
      }
    } while (!a.in_use.compare_exchange_weak(cur, next, std::memory_order_relaxed));
    return next;
  }
  // Raises the device's peak to `now` (called once the reserved memory is really there).
  void record_peak(int device, std::int64_t now) {
    DeviceAccount& a = (*this)[device];
    std::int64_t p = a.peak.load(std::memory_order_relaxed);
    while (now > p && !a.peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  void unreserve(int device, std::int64_t bytes) noexcept {
    (*this)[device].in_use.fetch_sub(bytes, std::memory_order_relaxed);
  }
};

}  // namespace detail

// ---- Buffer ----

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, -1)),
      accounts_(std::move(other.accounts_)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
    accounts_ = std::move(other.accounts_);
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() noexcept {
  if (accounts_) {
    accounts_->unreserve(device_, size_);
    accounts_->give_back(device_, data_, size_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  size_ = 0;
  accounts_.reset();
}

// ---- Executor ----

struct Executor::Impl {
  explicit Impl(int n) : accounts(std::make_shared<detail::DeviceAccounts>(n)) {}
  std::shared_ptr<detail::DeviceAccounts> accounts;
  int per_process = 0;     // devices each process holds
  int process = -1;        // for a process-local executor: this process (holds them all)
  std::vector<int> local;  // this process's: [first, first + per_process)
  std::mutex attachments_mu;
  std::map<const void*, std::shared_ptr<void>> attachments;  // see Executor::attachment
#if defined(SHARDPLAN_EXECUTOR_TBB)
  tbb::task_arena arena{static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))};
#endif
};

std::shared_ptr<void> Executor::attachment(const void* key,
                                           std::shared_ptr<void> (*create)()) const {
  std::lock_guard<std::mutex> lock(impl_->attachments_mu);
  std::shared_ptr<void>& slot = impl_->attachments[key];
  if (!slot) slot = create();
  return slot;
}

Executor::Executor(int num_devices, std::int64_t memory_limit)
    : impl_(make(num_devices, memory_limit, /*process_local=*/false).impl_) {}

Executor Executor::process_local(int num_devices, std::int64_t memory_limit) {
  return make(num_devices, memory_limit, /*process_local=*/true);
}

Executor Executor::make(int num_devices, std::int64_t memory_limit, bool process_local) {
  if (num_devices < 1) {
    throw SpecError(fmt::format("[executor] needs at least one device, got {}", num_devices));
  }
  if (memory_limit < 0) {
    throw SpecError(
        fmt::format("[executor] memory limit must be >= 0 bytes, got {}", memory_limit));
  }
  const int processes = process_local ? 1 : distributed::process_count();
  if (num_devices % processes != 0) {
    throw SpecError(fmt::format(
        "[executor] {} devices do not split evenly over {} processes (each process holds the "
        "same number of devices)",
        num_devices, processes));
  }
  Executor e(Private{});
  e.impl_ = std::make_shared<Impl>(num_devices);
  e.impl_->accounts->limit = memory_limit;
  e.impl_->per_process = num_devices / processes;
  e.impl_->process = process_local ? distributed::process_index() : -1;
  const int first = process_local ? 0 : distributed::process_index() * e.impl_->per_process;
  for (int i = 0; i < e.impl_->per_process; ++i) e.impl_->local.push_back(first + i);
  return e;
}

int Executor::default_device_count() {
  if (const char* env = std::getenv("SHARDPLAN_DEVICES"); env != nullptr) {
    const std::string text(env);
    int n = 0;
    bool ok = !text.empty() && text.size() <= 6;
    for (const char c : text) {
      ok = ok && c >= '0' && c <= '9';
      if (ok) n = n * 10 + (c - '0');
    }
    if (!ok || n < 1) {
      throw SpecError(fmt::format(
          "[executor] SHARDPLAN_DEVICES='{}' is not a device count (a positive integer)", text));
    }
    return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) *
         distributed::process_count();
}

std::string_view Executor::backend() {
#if defined(SHARDPLAN_EXECUTOR_TBB)
  return "tbb";
#elif defined(SHARDPLAN_EXECUTOR_THREADS)
  return "threads";
#else
  return "serial";
#endif
}

int Executor::concurrency() const {
#if defined(SHARDPLAN_EXECUTOR_TBB)
  return impl_->arena.max_concurrency();
#elif defined(SHARDPLAN_EXECUTOR_THREADS)
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#else
  return 1;
#endif
}

int Executor::num_devices() const { return impl_->accounts->num_devices; }

const std::vector<int>& Executor::local_devices() const { return impl_->local; }

bool Executor::is_local(int device) const {
  return device >= impl_->local.front() && device <= impl_->local.back();
}

bool Executor::holds_all(const std::vector<int>& devices) const {
  return std::all_of(devices.begin(), devices.end(), [this](int d) { return is_local(d); });
}

int Executor::process_of(int device) const {
  const int n = num_devices();
  if (device < 0 || device >= n) {
    throw SpecError(fmt::format("[executor] no device {} (this executor has {})", device, n));
  }
  return impl_->process >= 0 ? impl_->process : device / impl_->per_process;
}

namespace {

/// The SpecError for a device that is not this process's (or not a device at all).
void check_local(const Executor& e, int device) {
  const int n = e.num_devices();
  if (device < 0 || device >= n) {
    throw SpecError(fmt::format("[executor] no device {} (this executor has {})", device, n));
  }
  if (!e.is_local(device)) {
    throw SpecError(fmt::format(
        "[executor] device {} is held by process {}; this is process {}, which holds devices "
        "{}-{}",
        device, e.process_of(device), distributed::process_index(), e.local_devices().front(),
        e.local_devices().back()));
  }
}

}  // namespace

namespace {

// What the tasks of one step share: the first failures and whether to stop.
class StepErrors {
 public:
  bool stopped() const { return stopped_.load(std::memory_order_relaxed); }
  void record(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_ || device < device_) {
      device_ = device;
      error_ = std::current_exception();
    }
    stopped_.store(true, std::memory_order_relaxed);
  }
  // Throws the failure of the lowest device, if any.
  void rethrow() const {
    if (!error_) return;
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    try {
      std::rethrow_exception(error_);
    } catch (...) {
      std::throw_with_nested(
          DeviceError(device_, fmt::format("[executor] device {} failed: {}", device_, what)));
    }
  }

 private:
  std::mutex mu_;
  std::atomic<bool> stopped_{false};
  int device_ = 0;
  std::exception_ptr error_;
};

}  // namespace

// Calls one(i) for i in [0, count) on the backend's threads.
template <class F>
void for_each_index(Executor::Impl& impl, int count, F& one) {
#if defined(SHARDPLAN_EXECUTOR_TBB)
  if (count == 1) {
    one(0);
  } else if (count > 1) {
    impl.arena.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<int>(0, count, 1),
          [&](const tbb::blocked_range<int>& r) {
            for (int i = r.begin(); i != r.end(); ++i) one(i);
          },
          tbb::simple_partitioner());
    });
  }
#elif defined(SHARDPLAN_EXECUTOR_THREADS)
  (void)impl;
  const int workers =
      std::min(count, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::atomic<int> next{0};
  auto loop = [&] {
    for (int i = next.fetch_add(1); i < count; i = next.fetch_add(1)) one(i);
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < workers; ++i) threads.emplace_back(loop);
  loop();
  for (auto& t : threads) t.join();
#else
  (void)impl;
  for (int i = 0; i < count; ++i) one(i);
#endif
}

void Executor::run(DeviceTask task) const {
  StepErrors errors;
  auto one = [&](int d) {
    if (errors.stopped()) return;
    try {
      task(d);
    } catch (...) {
      errors.record(d);
    }
  };
  const int first = impl_->local.front();
  auto local_one = [&](int i) { one(first + i); };
  for_each_index(*impl_, static_cast<int>(impl_->local.size()), local_one);
  errors.rethrow();
}

void Executor::run(const std::vector<int>& devices, DeviceTask task, bool parallel) const {
  if (parallel) {
    run(devices, task);
    return;
  }
  const int n = num_devices();
  for (const int d : devices) {
    if (d < 0 || d >= n) {
      throw SpecError(fmt::format("[executor] no device {} (this executor has {})", d, n));
    }
  }
  StepErrors errors;
  for (const int d : devices) {
    if (!is_local(d)) continue;  // another process runs it
    try {
      task(d);
    } catch (...) {
      errors.record(d);
      break;
    }
  }
  errors.rethrow();
}

void Executor::run(const std::vector<int>& devices, DeviceTask task) const {
  const int n = num_devices();
  for (const int d : devices) {
    if (d < 0 || d >= n) {
      throw SpecError(fmt::format("[executor] no device {} (this executor has {})", d, n));
    }
  }
  // Another process runs the devices it holds.
  const std::vector<int>* run_devices = &devices;
  std::vector<int> local;
  if (static_cast<int>(impl_->local.size()) != n) {
    for (const int d : devices) {
      if (is_local(d)) local.push_back(d);
    }
    run_devices = &local;
  }
  StepErrors errors;
  auto one = [&](int i) {
    const int d = (*run_devices)[static_cast<std::size_t>(i)];
    if (errors.stopped()) return;
    try {
      task(d);
    } catch (...) {
      errors.record(d);
    }
  };
  for_each_index(*impl_, static_cast<int>(run_devices->size()), one);
  errors.rethrow();
}

Buffer Executor::allocate(int device, std::int64_t bytes) const {
  check_local(*this, device);
  if (bytes < 0) {
    throw SpecError(fmt::format("[executor] cannot allocate {} bytes on device {}", bytes, device));
  }
  Buffer b;
  b.device_ = device;
  if (bytes == 0) return b;
  const std::int64_t now = impl_->accounts->reserve(device, bytes);
  void* p = impl_->accounts->take(device, bytes);
  if (p == nullptr) {
    impl_->accounts->unreserve(device, bytes);
    throw OutOfMemoryError(fmt::format("[executor] the host could not allocate {} for device {}",
                                       format_bytes(bytes), device));
  }
  impl_->accounts->record_peak(device, now);
  b.data_ = static_cast<std::byte*>(p);
  b.size_ = bytes;
  b.accounts_ = impl_->accounts;
  return b;
}

DeviceMemory Executor::memory(int device) const {
  check_local(*this, device);
  auto& a = (*impl_->accounts)[device];
  return DeviceMemory{device, a.in_use.load(), a.peak.load(), impl_->accounts->limit.load()};
}

std::vector<DeviceMemory> Executor::memory() const {
  std::vector<DeviceMemory> out;
  for (const int d : impl_->local) out.push_back(memory(d));
  return out;
}

void Executor::set_memory_limit(std::int64_t bytes) const {
  if (bytes < 0) {
    throw SpecError(fmt::format("[executor] memory limit must be >= 0 bytes, got {}", bytes));
  }
  impl_->accounts->limit = bytes;
}

std::int64_t Executor::cached_bytes(int device) const {
  memory(device);  // checks the device
  return impl_->accounts->cached(device);
}

void Executor::release_cached() const {
  for (int d = 0; d < num_devices(); ++d) impl_->accounts->drop_cache(d);
}

void Executor::set_cache_limit(std::int64_t bytes) const {
  if (bytes < 0) {
    throw SpecError(fmt::format("[executor] cache limit must be >= 0 bytes, got {}", bytes));
  }
  impl_->accounts->cache_limit = bytes;
  if (bytes == 0) release_cached();
}

void Executor::reset_peak() const {
  for (int d = 0; d < num_devices(); ++d) {
    auto& a = (*impl_->accounts)[d];
    a.peak.store(a.in_use.load());
  }
}

std::string Executor::memory_report() const {
  std::string out =
      fmt::format("{:>6}  {:>12}  {:>12}  {:>12}\n", "device", "in use", "peak", "limit");
  for (const DeviceMemory& m : memory()) {
    out += fmt::format("{:>6}  {:>12}  {:>12}  {:>12}\n", m.device, format_bytes(m.in_use),
                       format_bytes(m.peak), m.limit > 0 ? format_bytes(m.limit) : "none");
  }
  return out;
}

}  // namespace shardplan
