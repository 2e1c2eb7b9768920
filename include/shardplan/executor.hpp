#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace shardplan {

/// One device's memory, as accounted by its Executor.
struct DeviceMemory {
  int device = 0;
  std::int64_t in_use = 0;  // bytes held by live buffers
  std::int64_t peak = 0;    // most bytes held at once since creation or reset_peak()
  std::int64_t limit = 0;   // 0: no limit
  friend bool operator==(const DeviceMemory&, const DeviceMemory&) = default;
};

namespace detail {
struct DeviceAccounts;
}  // namespace detail

/// A block of one device's memory (64-byte aligned), counted in its executor's accounts while it
/// lives. Move-only; the memory is returned to the accounts when the buffer is destroyed.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  std::int64_t size() const { return size_; }
  int device() const { return device_; }

 private:
  friend class Executor;
  void release() noexcept;

  std::byte* data_ = nullptr;
  std::int64_t size_ = 0;
  int device_ = -1;
  std::shared_ptr<detail::DeviceAccounts> accounts_;
};

/// A borrowed callable `void(int device)`: what Executor::run calls, without allocating.
class DeviceTask {
 public:
  // The callable must outlive the call it is passed to (a temporary lambda does).
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, DeviceTask> && std::is_invocable_v<F&, int>)
      DeviceTask(F&& f)  // NOLINT: implicit, like std::function_ref
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, int d) { (*static_cast<std::remove_reference_t<F>*>(o))(d); }) {}
  void operator()(int device) const { call_(object_, device); }

 private:
  void* object_;
  void (*call_)(void*, int);
};

/// N virtual devices that run one task each per step, in parallel on a thread pool (oneTBB; a
/// std::thread or serial backend is chosen at configure time for ThreadSanitizer builds), with
/// per-device memory accounting and an optional per-device memory limit.
///
/// A handle: copies refer to the same devices. Safe to use from several host threads at once.
///
///   Executor exec(8);
///   exec.run([&](int device) { /* this device's kernel */ });
class Executor {
 public:
  /// `num_devices` >= 1 (throws SpecError otherwise). `memory_limit` bytes per device, 0 for none.
  ///
  /// The devices are global: in a program started by mpirun as P processes
  /// (shardplan/distributed.hpp), each process holds num_devices / P consecutive ids of them
  /// (local_devices()), runs its own devices' tasks and allocates only on them; the same
  /// program with one process holds them all. num_devices must then be a multiple of P (a
  /// SpecError names both).
  explicit Executor(int num_devices = default_device_count(), std::int64_t memory_limit = 0);

  /// SHARDPLAN_DEVICES if set (a positive integer; anything else throws SpecError naming it),
  /// else the number of hardware threads times the number of processes.
  static int default_device_count();
  /// `num_devices` devices that all belong to this process, whatever the process group: for
  /// work one process does alone (a reference run, a host-side computation) in a program
  /// started by mpirun.
  static Executor process_local(int num_devices, std::int64_t memory_limit = 0);
  /// "tbb", "threads" or "serial": the backend this library was configured with.
  static std::string_view backend();

  /// How many device tasks run at once at most (the pool's threads; 1 for the serial backend).
  int concurrency() const;
  /// The global number of devices (of every process).
  int num_devices() const;
  /// The devices this process holds, in order (all of them with one process).
  const std::vector<int>& local_devices() const;
  /// True when this process holds `device`.
  bool is_local(int device) const;
  /// The process that holds `device` (0 with one process).
  int process_of(int device) const;
  /// True when this process holds every one of `devices` (a mesh's devices, say): work on
  /// them needs no other process.
  bool holds_all(const std::vector<int>& devices) const;

  /// Runs task(device) once for every local device, in parallel, and returns when all are done.
  /// When a task throws, devices that have not started are skipped, and once the running ones
  /// finish a DeviceError naming the lowest failed device is thrown, with the original nested.
  /// The executor stays usable.
  void run(DeviceTask task) const;
  /// Runs task(device) for the listed devices that are local (another process runs the others).
  void run(const std::vector<int>& devices, DeviceTask task) const;
  /// As run(devices, task), on the calling thread one device after another when `parallel` is
  /// false (tiny steps, where waking the pool costs more than the work); errors alike.
  void run(const std::vector<int>& devices, DeviceTask task, bool parallel) const;

  /// A buffer of `bytes` on `device`. Throws OutOfMemoryError past the device's limit (naming the
  /// device, the bytes asked for, in use and the limit), SpecError for a bad device or one that
  /// another process holds.
  Buffer allocate(int device, std::int64_t bytes) const;

  /// A local device's memory (SpecError for a device another process holds).
  DeviceMemory memory(int device) const;
  /// Every local device's memory.
  std::vector<DeviceMemory> memory() const;
  /// The per-device limit in bytes (0: none); applies to later allocations.
  void set_memory_limit(std::int64_t bytes) const;
  /// Freed buffers are kept per device for reuse (up to a cache limit, 1 GiB per device by
  /// default), so that repeated steps do not fault in fresh pages; they do not count as in use.
  /// The bytes `device` keeps cached now.
  std::int64_t cached_bytes(int device) const;
  /// Returns every cached block to the system.
  void release_cached() const;
  /// The most bytes each device keeps cached (0: none, and the cache is emptied).
  void set_cache_limit(std::int64_t bytes) const;
  /// Starts the peaks again from the bytes in use now.
  void reset_peak() const;
  /// A table: device, in use, peak, limit (human-readable sizes).
  std::string memory_report() const;

  /// An address naming these devices (equal for copies of the handle).
  const void* identity() const { return impl_.get(); }

  /// State a higher layer keeps per executor (the program layer's compiled one-op programs), so
  /// that it lives and dies with the executor instead of the process: made by `create` on first
  /// use under `key` (the address of a static object of the layer that owns it). The state must
  /// not hold arrays or buffers of this executor (they would keep it alive).
  std::shared_ptr<void> attachment(const void* key, std::shared_ptr<void> (*create)()) const;

  /// True when both handles refer to the same devices.
  friend bool operator==(const Executor& a, const Executor& b) { return a.impl_ == b.impl_; }

 private:
  struct Private {};
  explicit Executor(Private) {}
  static Executor make(int num_devices, std::int64_t memory_limit, bool process_local);
  struct Impl;
  template <class F>
  friend void for_each_index(Impl& impl, int count, F& one);
  std::shared_ptr<Impl> impl_;
};

}  // namespace shardplan
