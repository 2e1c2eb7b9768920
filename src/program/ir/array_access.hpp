#pragma once
// What the program layer may see of an Array beyond its public face: tracers (the stand-ins a
// traced function computes with) and the raw buffer handles.

#include <memory>
#include <string_view>
#include <vector>

#include "shardplan/array.hpp"
#include "graph.hpp"

namespace shardplan::detail {

/// shard_map does not take padded arrays (Uneven::kPad over a dimension its axes do not divide:
/// its body would see the pad rows as data): the SpecError of NamedSharding::check_divides,
/// "[where]" naming `name`, the shape and the axes. Tracers pass.
inline void refuse_padded(const Array& a, std::string_view where, std::string_view name) {
  if (a.is_tracer() || !a.sharding().is_padded(a.shape())) return;
  a.sharding().check_divides(a.shape(), where, name,
                             "; shard_map does not take padded arrays (its body would see the "
                             "pad rows): reshard it onto a sharding that divides first");
}

struct ArrayAccess {
  /// A tracer of `type` for node `node` of the trace `trace` (no buffers).
  static Array tracer(const std::optional<Executor>& executor, const Mesh& mesh,
                      const TensorType& type, const void* trace, int node) {
    // No blocks, buffers or pending reduction: a tracer has none.
    auto impl =
        std::make_shared<Array::Impl>(Array::Impl{.executor = executor,
                                                  .shape = type.shape,
                                                  .dtype = type.dtype,
                                                  .sharding = NamedSharding(mesh, PartitionSpec()),
                                                  .shard_shape = type.shape,
                                                  .trace = trace,
                                                  .node = node});
    Array a;
    a.impl_ = std::move(impl);
    return a;
  }
  static const void* trace(const Array& a) { return a.impl().trace; }
  /// The array's executor; none for a tracer of a call without arrays.
  static const std::optional<Executor>& executor(const Array& a) { return a.impl().executor; }
  static int node(const Array& a) { return a.impl().node; }
  static const std::vector<std::shared_ptr<Buffer>>& buffers(const Array& a) {
    return a.impl().buffers;
  }
  /// A new handle owning `a`'s buffers; `a` (and every copy of it) is left donated: any use of
  /// it afterwards is an ArrayError. Returns an empty Array when `a` was donated already (by
  /// another call, maybe on another thread: the exchange makes exactly one of them win).
  static Array take(const Array& a) {
    const Array::Impl& impl = a.impl();
    if (impl.donated.set.exchange(true, std::memory_order_acq_rel)) return Array();
    auto taken = std::make_shared<Array::Impl>(impl);
    taken->donated.set.store(false);
    impl.buffers.clear();
    Array out;
    out.impl_ = std::move(taken);
    return out;
  }
  /// Undoes take(): `a` gets the buffers of `taken` back (a call that failed before using them).
  static void give_back(const Array& a, Array& taken) {
    const Array::Impl& impl = a.impl();
    impl.buffers = taken.impl().buffers;
    taken = Array();
    impl.donated.set.store(false, std::memory_order_release);
  }
  static bool is_donated(const Array& a) {
    return a.impl().donated.set.load(std::memory_order_acquire);
  }
  /// The sharding without the checks of sharding() (a donated array still has one).
  static const NamedSharding& sharding(const Array& a) { return a.impl().sharding; }
  /// Identity of the array's storage (arrays sharing it are the same value).
  static const void* identity(const Array& a) { return a.impl_.get(); }
};

}  // namespace shardplan::detail
