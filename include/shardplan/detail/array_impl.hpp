#pragma once
// What an Array holds (not part of the public API): built by name (designated initialisers) in
// src/runtime/array.cpp and src/program/ir/array_access.hpp. In a header because Array's accessors
// are inline (each is a load, called in every op).
// Included by shardplan/array.hpp after the class.

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

namespace shardplan {

struct Array::Impl {
  // Always set but for the tracers of a call with no arrays (lower() on TensorSpecs): no
  // executor is known there.
  std::optional<Executor> executor;
  Shape shape;
  DType dtype;
  NamedSharding sharding;
  Shape shard_shape;
  // By device id (shared: programs reuse them).
  std::shared_ptr<const std::vector<Block>> blocks = {};
  Pending pending = {};
  // By device id. Mutable only for donation (sjit's donate_argnums), which takes them.
  mutable std::vector<std::shared_ptr<Buffer>> buffers = {};
  // Set by the one sjit call that takes the buffers (an atomic exchange: of two calls donating
  // the same array at once, exactly one wins); cleared when a failed call gives them back.
  struct DonationFlag {
    DonationFlag() = default;
    DonationFlag(const DonationFlag& o) : set(o.set.load()) {}
    DonationFlag& operator=(const DonationFlag& o) {
      set.store(o.set.load());
      return *this;
    }
    mutable std::atomic<bool> set{false};
  };
  DonationFlag donated = {};
  // Tracers: the trace they belong to and their node in its graph (no buffers).
  const void* trace = nullptr;
  int node = -1;
};

inline bool Array::is_tracer() const { return impl().trace != nullptr; }
inline const Shape& Array::shape() const { return impl().shape; }
inline DType Array::dtype() const { return impl().dtype; }
inline const NamedSharding& Array::sharding() const { return concrete("sharding").sharding; }
inline const Mesh& Array::mesh() const { return impl().sharding.mesh(); }
inline const Executor& Array::executor() const {
  const Impl& i = impl();
  if (!i.executor) no_executor();
  return *i.executor;
}
inline const Pending& Array::pending() const { return impl().pending; }
inline bool Array::is_pending() const { return !impl().pending.empty(); }
inline const Shape& Array::shard_shape() const { return impl().shard_shape; }

}  // namespace shardplan
