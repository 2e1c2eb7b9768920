#pragma once

#include <stdexcept>
#include <string>

namespace shardplan {

/// Base of every exception shardplan throws. Messages read `[where] what, with the values`.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A tree whose structure does not match another (prefix match, unflatten, struct conversion).
class TreeError : public Error {
 public:
  using Error::Error;
};

/// A bad mesh, partition spec, dtype or shape (including a dimension that does not divide).
class SpecError : public Error {
 public:
  using Error::Error;
};

/// A sharding rule that cannot be built or that cannot decide a leaf.
class RuleError : public Error {
 public:
  using Error::Error;
};

/// A file that cannot be read or parsed: safetensors headers, model descriptions, rule files.
class IoError : public Error {
 public:
  using Error::Error;
};

/// A task that failed on one device of an Executor. The message names the device and holds the
/// original message; the original exception is nested (std::rethrow_if_nested gets it back).
class DeviceError : public Error {
 public:
  DeviceError(int device, const std::string& what) : Error(what), device_(device) {}
  int device() const { return device_; }

 private:
  int device_;
};

/// A value an op refuses, found when its kernel runs on a device: a loss's label outside
/// [0, classes) that is not its ignore_index (check_labels). It reaches the caller nested in the
/// DeviceError naming the device (over processes, named in every process's DistributedError).
class ValueError : public Error {
 public:
  using Error::Error;
};

/// An allocation past a device's memory limit. Names the device, the bytes asked for, the bytes in
/// use and the limit.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

/// Arrays that cannot meet in one operation (different meshes, executors or device orders), or an
/// operation the arrays' state does not allow.
class ArrayError : public Error {
 public:
  using Error::Error;
};

/// A failure of the process group: a process that failed (named), processes that disagree on
/// what must be the same everywhere, or a group that cannot start.
class DistributedError : public Error {
 public:
  using Error::Error;
};

}  // namespace shardplan
