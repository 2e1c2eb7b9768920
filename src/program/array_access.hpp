#pragma once
// What the program layer may see of an Array beyond its public face: tracers (the stand-ins a
// traced function computes with) and the raw buffer handles.

#include <memory>
#include <vector>

#include "shardplan/array.hpp"
#include "shardplan/graph.hpp"

namespace shardplan::detail {

struct ArrayAccess {
  /// A tracer of `type` for node `node` of the trace `trace` (no buffers).
  static Array tracer(const Executor& executor, const Mesh& mesh, const TensorType& type,
                      const void* trace, int node) {
    auto impl = std::make_shared<Array::Impl>(Array::Impl{executor,
                                                          type.shape,
                                                          type.dtype,
                                                          NamedSharding(mesh, PartitionSpec()),
                                                          type.shape,
                                                          {},
                                                          {},
                                                          {},
                                                          false,
                                                          trace,
                                                          node});
    Array a;
    a.impl_ = std::move(impl);
    return a;
  }
  static const void* trace(const Array& a) { return a.impl().trace; }
  static int node(const Array& a) { return a.impl().node; }
  static const std::vector<std::shared_ptr<Buffer>>& buffers(const Array& a) {
    return a.impl().buffers;
  }
  /// A new handle owning `a`'s buffers; `a` (and every copy of it) is left donated: any use of
  /// it afterwards is an ArrayError.
  static Array donate(const Array& a) {
    const Array::Impl& impl = a.concrete("buffers");
    auto taken = std::make_shared<Array::Impl>(impl);
    impl.buffers.clear();
    impl.donated = true;
    Array out;
    out.impl_ = std::move(taken);
    return out;
  }
  /// Identity of the array's storage (arrays sharing it are the same value).
  static const void* identity(const Array& a) { return a.impl_.get(); }
};

}  // namespace shardplan::detail
