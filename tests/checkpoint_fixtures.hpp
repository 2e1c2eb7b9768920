#pragma once
// Helpers shared by the checkpoint tests (library and command).
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "shardplan/checkpoint.hpp"

namespace shardplan::test {

/// The bytes of every tensor of a checkpoint, by name, read with std::ifstream at the offsets
/// its headers give (not through the library's reader).
inline std::map<std::string, std::string> checkpoint_tensor_bytes(
    const std::filesystem::path& dir) {
  const CheckpointInfo info = read_checkpoint_info(dir);
  std::map<std::string, std::string> out;
  for (const auto& t : info.tensors) {
    std::ifstream in(info.dir / t.file, std::ios::binary);
    in.seekg(t.offset);
    std::string bytes(static_cast<std::size_t>(t.spec.bytes()), '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out[t.name] = bytes;
  }
  return out;
}

}  // namespace shardplan::test
