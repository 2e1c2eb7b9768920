#include "shardplan/shard_and_gather.hpp"

#include <fmt/format.h>

#include "shardplan/error.hpp"

namespace shardplan {

ShardAndGatherFns make_shard_and_gather_fns(const Tree<MaybeSharding>& shardings,
                                            const Executor& executor) {
  ShardAndGatherFns out;
  out.shard_fns = shardings.map_with_path(
      [&](const std::string& path, const MaybeSharding& s) -> ShardAndGatherFns::ShardFn {
        if (!s) {
          return [path](const Tensor& t) -> Array {
            throw SpecError(fmt::format(
                "[shard_fn] leaf '{}' (tensor {}{}) has no sharding: the rule tree left it "
                "Unspecified",
                path, name(t.dtype()), t.shape().to_string()));
          };
        }
        return [path, sharding = *s, executor](const Tensor& t) {
          try {
            return device_put(t, sharding, executor);
          } catch (const SpecError& e) {
            throw SpecError(fmt::format("{} (leaf '{}')", e.what(), path));
          }
        };
      });
  out.gather_fns = shardings.map([](const MaybeSharding&) -> ShardAndGatherFns::GatherFn {
    return [](const Array& a) { return a.to_host(); };
  });
  return out;
}

ShardAndGatherFns make_shard_and_gather_fns(const Tree<NamedSharding>& shardings,
                                            const Executor& executor) {
  return make_shard_and_gather_fns(
      shardings.map([](const NamedSharding& s) { return MaybeSharding(s); }), executor);
}

Tree<Array> ShardAndGatherFns::shard(const Tree<Tensor>& tensors) const {
  return map_prefix<Array>(
      shard_fns, tensors, [](const std::string& path, const ShardFn* f, const Tree<Tensor>& sub) {
        if (f == nullptr && sub.num_leaves() > 0) {
          throw TreeError(
              fmt::format("[shard] no shard function for the subtree at '{}' (a none "
                          "node of the sharding tree)",
                          path));
        }
        return sub.map([&](const Tensor& t) { return (*f)(t); });
      });
}

Tree<Tensor> ShardAndGatherFns::gather(const Tree<Array>& arrays) const {
  return map_prefix<Tensor>(
      gather_fns, arrays, [](const std::string& path, const GatherFn* f, const Tree<Array>& sub) {
        if (f == nullptr && sub.num_leaves() > 0) {
          throw TreeError(fmt::format(
              "[gather] no gather function for the subtree at '{}' (a none node of the sharding "
              "tree)",
              path));
        }
        return sub.map([&](const Array& a) { return (*f)(a); });
      });
}

}  // namespace shardplan
