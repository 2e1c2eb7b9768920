// Offline conversions: a checkpoint's tensors copied, as they are, into new safetensors files
// through one bounded buffer: consolidate_checkpoint (plain Hugging Face) and reshard_checkpoint
// (a shardplan record for another mesh, decided by rules).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>

#include "checkpoint_impl.hpp"
#include "checkpoint_index.hpp"
#include "shardplan/detail/printable.hpp"
#include "shardplan/detail/utf8.hpp"
#include "shardplan/error.hpp"
#include "shardplan/safetensors.hpp"

namespace shardplan {

namespace fs = std::filesystem;
using detail::File;
using detail::file_name;
using detail::Hasher;
using detail::kIndexName;
using detail::kNewFile;
using detail::kStageBytes;
using detail::plan_files;
using detail::sharding_text;
using detail::structure_of;
using detail::tree_of;

namespace {

/// Copies every tensor of `info`, in its order, into new safetensors files in `dst` (written as
/// save_checkpoint writes: the run's own hidden directory, fsync, index last, rename without
/// replacing), through one bounded buffer. `record`, when given, becomes the index's shardplan
/// record (its "files" filled here).
void copy_tensors(const CheckpointInfo& info, const fs::path& dst_in,
                  std::optional<nlohmann::json> record, const ConvertOptions& options) {
  std::vector<std::int64_t> sizes;
  for (const auto& t : info.tensors) sizes.push_back(t.spec.bytes());
  const auto files = plan_files(sizes, options.max_file_bytes);
  const std::int64_t total = info.total_bytes();
  std::int64_t done = 0;
  detail::OutputDir out_dir(dst_in, "checkpoint");  // removed unless committed
  const fs::path& dst = out_dir.path();
  const fs::path& tmp = out_dir.temp();
  {
    std::vector<char> buf(static_cast<std::size_t>(kStageBytes));
    // The tensors come file by file: one source open at a time (a checkpoint may have more
    // files than a process may open).
    std::string source_name;
    std::unique_ptr<File> source;
    nlohmann::json weight_map = nlohmann::json::object();
    nlohmann::json sums = nlohmann::json::object();
    for (std::size_t f = 0; f < files.size(); ++f) {
      const std::string name = file_name(f, files.size());
      std::vector<std::pair<std::string, TensorSpec>> specs;
      for (const std::size_t i : files[f])
        specs.emplace_back(info.tensors[i].name, info.tensors[i].spec);
      const std::string header = safetensors_header_bytes(dst / name, specs, {{"format", "pt"}});
      const File out(tmp / name, kNewFile, dst / name);
      Hasher h;
      out.write_at(header.data(), static_cast<std::int64_t>(header.size()), 0);
      h.update(header.data(), header.size());
      std::int64_t at = static_cast<std::int64_t>(header.size());
      for (const std::size_t i : files[f]) {
        const CheckpointTensor& t = info.tensors[i];
        if (!source || source_name != t.file) {
          source.reset();
          source = std::make_unique<File>(info.dir / t.file, O_RDONLY);
          source_name = t.file;
        }
        const auto& in = source;
        for (std::int64_t off = 0; off < t.spec.bytes();) {
          const std::int64_t n = std::min(kStageBytes, t.spec.bytes() - off);
          in->read_at(buf.data(), n, t.offset + off);
          out.write_at(buf.data(), n, at);
          out.start_writeback(at, n);
          h.update(buf.data(), static_cast<std::size_t>(n));
          off += n;
          at += n;
          done += n;
          if (options.progress) options.progress(done, total);
        }
        weight_map[t.name] = name;
      }
      out.sync();
      sums[name] = {{"xxh3", fmt::format("{:016x}", h.digest())}};
    }
    nlohmann::json index;
    index["metadata"]["total_size"] = total;
    if (record) {
      (*record)["files"] = sums;
      index["metadata"]["shardplan"] = *record;
    }
    index["weight_map"] = weight_map;
    std::string text;
    try {
      text = index.dump(1) + "\n";
    } catch (const nlohmann::json::exception&) {
      throw IoError(
          fmt::format("[checkpoint] {}: a tensor name or the mesh's axis names are not valid UTF-8",
                      dst.string()));
    }
    {
      const File out(tmp / kIndexName, kNewFile, dst / kIndexName);
      out.write_at(text.data(), static_cast<std::int64_t>(text.size()), 0);
      out.sync();
    }
  }
  out_dir.commit();
}

}  // namespace

void consolidate_checkpoint(const fs::path& src, const fs::path& dst,
                            const ConvertOptions& options) {
  const CheckpointInfo info = read_checkpoint_info(src);
  if (info.shardplan) verify_checkpoint(info);
  copy_tensors(info, dst, std::nullopt, options);
}

void reshard_checkpoint(const fs::path& src, const fs::path& dst, const MeshShardingHelper& helper,
                        const RuleTree& rules, const ConvertOptions& options) {
  const CheckpointInfo info = read_checkpoint_info(src);
  if (info.shardplan) verify_checkpoint(info);
  std::vector<std::pair<std::string, TensorSpec>> named;
  for (const auto& t : info.tensors) named.emplace_back(t.name, t.spec);
  const Tree<TensorSpec> data = tree_of(named, info.name_separator, src);
  // Decided (and checked: axes, divisibility) before anything is written.
  const Tree<MaybeSharding> decided = helper.match(rules, data);
  const auto leaves = decided.flatten();
  nlohmann::json record;
  record["version"] = detail::kCheckpointFormatVersion;
  record["mesh"] = helper.mesh().to_string();
  record["names"] = info.name_separator == '.' ? "dotted" : "tree paths";
  // The leaves of `data` are in tree order, the tensors in file order: match them by path.
  const auto data_paths = data.paths();
  std::map<std::string, std::size_t> by_path;
  for (std::size_t i = 0; i < data_paths.size(); ++i) by_path[data_paths[i]] = i;
  std::map<std::string, std::string> name_at;  // tree path -> tensor name
  for (const auto& t : info.tensors) {
    const std::string p = tree_path_of_name(t.name, info.name_separator);
    const auto it = by_path.find(p);
    if (it == by_path.end()) {
      throw IoError(fmt::format("[checkpoint] {}: tensor '{}' has no place in the tree",
                                src.string(), t.name));
    }
    name_at[p] = t.name;
    const MaybeSharding& s = leaves[it->second].second;
    record["tensors"][t.name] = {
        {"sharding", sharding_text(s.value_or(NamedSharding(helper.mesh(), P())))},
        {"dtype", std::string(safetensors_name(t.spec.dtype))}};
  }
  const Tree<std::string> names =
      data.map_with_path([&](const std::string& p, const TensorSpec&) { return name_at.at(p); });
  std::string path;
  record["structure"] = structure_of(names, path);
  // The index is JSON: checked before anything is written. (Tensor names come from headers the
  // JSON reader checked; the mesh's axis names come from the user.)
  if (const std::string mesh = helper.mesh().to_string(); !detail::is_utf8(mesh)) {
    throw SpecError(fmt::format(
        "[checkpoint] mesh {}: an axis name is not valid UTF-8, which the index (JSON) cannot hold",
        detail::printable(mesh)));
  }
  copy_tensors(info, dst, record, options);
}

}  // namespace shardplan
