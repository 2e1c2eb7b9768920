// Loading Hugging Face weights (or any checkpoint) by rules: the tensors' names make a tree
// (tree_from_names), the rules decide each leaf's sharding, restore_leaves reads them (f16
// widened to f32).
#include <fmt/format.h>

#include <map>

#include "checkpoint_impl.hpp"
#include "shardplan/error.hpp"

namespace shardplan {

namespace fs = std::filesystem;

Tree<Array> load_checkpoint(const fs::path& path, const MeshShardingHelper& helper,
                            const RuleTree& rules, const Executor& executor,
                            const RestoreOptions& options) {
  const CheckpointInfo info = read_checkpoint_info(path);
  const char separator = info.name_separator;
  std::vector<std::pair<std::string, TensorSpec>> named;
  std::map<std::string, std::string> name_of;  // tree path -> tensor name
  for (const auto& t : info.tensors) {
    named.emplace_back(t.name, t.spec);
    const std::string p = tree_path_of_name(t.name, separator);
    name_of[p] = t.name;
  }
  const Tree<TensorSpec> data = detail::tree_of(named, separator, path);
  const Tree<MaybeSharding> decided = helper.match(rules, data);
  std::vector<detail::Wanted> wanted;
  for (const auto& [p, s] : decided.flatten()) {
    const auto it = name_of.find(p);
    if (it == name_of.end()) {
      throw IoError(fmt::format("[checkpoint] {}: no tensor for tree path '{}'", path.string(), p));
    }
    wanted.push_back(
        {it->second, s.value_or(NamedSharding(helper.mesh(), P())), std::nullopt, true});
  }
  return detail::restore_leaves(info, wanted, executor, options, [&](std::vector<Array> leaves) {
    return decided.unflatten(std::move(leaves));
  });
}

}  // namespace shardplan
