#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/tensor_spec.hpp"

namespace shardplan {

/// One tensor of a safetensors header: its name, spec and byte range in the data section.
struct SafetensorsEntry {
  std::string name;
  TensorSpec spec;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  friend bool operator==(const SafetensorsEntry&, const SafetensorsEntry&) = default;
};

/// A parsed safetensors header (the file format: 8-byte little-endian header length N, N bytes
/// of JSON mapping names to {dtype, shape, data_offsets}, then the raw data).
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in header order
  std::map<std::string, std::string> metadata;
  std::int64_t header_size = 0;  // N
  std::int64_t data_size = 0;    // bytes after the header
};

/// Parses a header from the first bytes of a file of `file_size` bytes (`prefix` holds at least
/// 8 + N bytes, or the whole file when shorter). Validates the length, the JSON, every dtype and
/// shape, and that offsets are in range, ordered and sized numel x dtype size. Throws IoError
/// naming `source`, the tensor and the values. Never reads past `prefix`.
SafetensorsHeader parse_safetensors_header(std::string_view prefix, std::int64_t file_size,
                                           std::string_view source = "<memory>");

/// Reads only the header of a .safetensors file (never the weights). Throws IoError.
SafetensorsHeader read_safetensors_header(const std::filesystem::path& file);

/// The first bytes of a safetensors file holding these tensors in this order: the 8-byte length,
/// then the JSON header (data offsets assigned in order, padded with spaces so that the data
/// section starts at a multiple of 8). `file` names the file in errors. Throws IoError for a
/// duplicate or reserved name, or text that is not UTF-8.
std::string safetensors_header_bytes(const std::filesystem::path& file,
                                     const std::vector<std::pair<std::string, TensorSpec>>& tensors,
                                     const std::map<std::string, std::string>& metadata = {});

/// Writes a safetensors file with these tensors; the data section is zeros, written sparsely
/// (seek and truncate), so a multi-gigabyte model costs no disk. Offsets are assigned in order.
/// Writes to a new hidden temporary file beside `file` and renames it over `file` (an existing
/// regular file is replaced; a directory or symbolic link there is an error), so a failure
/// leaves nothing half-written. Throws IoError naming `file`.
void write_safetensors_skeleton(const std::filesystem::path& file,
                                const std::vector<std::pair<std::string, TensorSpec>>& tensors,
                                const std::map<std::string, std::string>& metadata = {});

}  // namespace shardplan
