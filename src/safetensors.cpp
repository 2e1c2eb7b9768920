#include "shardplan/safetensors.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"

namespace shardplan {
namespace {

using Json = nlohmann::ordered_json;

/// The format caps the header at 100 MB; a larger length is a corrupt or hostile file.
constexpr std::int64_t kMaxHeaderSize = 100'000'000;

[[noreturn]] void fail(std::string_view source, const std::string& what) {
  throw IoError(fmt::format("[safetensors] {}: {}", source, what));
}

SafetensorsEntry parse_entry(std::string_view source, const std::string& name, const Json& v,
                             std::int64_t data_size) {
  if (!v.is_object()) {
    fail(source, fmt::format("tensor '{}': expected an object with dtype, shape and data_offsets, "
                             "got {}",
                             name, v.type_name()));
  }
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets") {
      fail(source, fmt::format("tensor '{}': unknown field '{}' (expected dtype, shape, "
                               "data_offsets)",
                               name, it.key()));
    }
  }
  auto dtype_it = v.find("dtype");
  if (dtype_it == v.end() || !dtype_it->is_string()) {
    fail(source, fmt::format("tensor '{}': 'dtype' must be a string", name));
  }
  SafetensorsEntry e;
  e.name = name;
  try {
    e.spec.dtype = parse_dtype(dtype_it->get<std::string>());
  } catch (const SpecError&) {
    fail(source, fmt::format("tensor '{}': unknown dtype '{}'", name, dtype_it->get<std::string>()));
  }
  auto shape_it = v.find("shape");
  if (shape_it == v.end() || !shape_it->is_array()) {
    fail(source, fmt::format("tensor '{}': 'shape' must be a list of non-negative integers", name));
  }
  std::vector<std::int64_t> dims;
  for (const Json& d : *shape_it) {
    if (!d.is_number_integer() || (d.is_number_integer() && !d.is_number_unsigned() &&
                                   d.get<std::int64_t>() < 0)) {
      fail(source, fmt::format("tensor '{}': shape {} is not a list of non-negative integers", name,
                               shape_it->dump()));
    }
    if (d.is_number_unsigned() && d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      fail(source, fmt::format("tensor '{}': dimension {} is too large", name, d.dump()));
    }
    dims.push_back(d.get<std::int64_t>());
  }
  auto off_it = v.find("data_offsets");
  if (off_it == v.end() || !off_it->is_array() || off_it->size() != 2 ||
      !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
    fail(source, fmt::format("tensor '{}': 'data_offsets' must be two non-negative integers, got {}",
                             name, off_it == v.end() ? std::string("nothing") : off_it->dump()));
  }
  const auto begin = (*off_it)[0].get<std::uint64_t>();
  const auto end = (*off_it)[1].get<std::uint64_t>();
  if (begin > end) {
    fail(source, fmt::format("tensor '{}': data_offsets [{}, {}] begin after end", name, begin, end));
  }
  if (end > static_cast<std::uint64_t>(data_size)) {
    fail(source, fmt::format("tensor '{}': data_offsets [{}, {}] end past the data section ({} "
                             "bytes)",
                             name, begin, end, data_size));
  }
  std::int64_t want = 0;
  try {  // the element count and bytes must fit in int64 (Shape and byte_size check them)
    e.spec.shape = Shape(dims);
    want = byte_size(e.spec.shape, e.spec.dtype);
  } catch (const SpecError& err) {
    fail(source, fmt::format("tensor '{}': {}", name, err.what()));
  }
  if (static_cast<std::uint64_t>(want) != end - begin) {
    fail(source, fmt::format("tensor '{}': data_offsets [{}, {}] hold {} bytes but shape {} of {} "
                             "needs {}",
                             name, begin, end, end - begin, e.spec.shape.to_string(),
                             safetensors_name(e.spec.dtype), want));
  }
  e.begin = static_cast<std::int64_t>(begin);
  e.end = static_cast<std::int64_t>(end);
  return e;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::string_view prefix, std::int64_t file_size,
                                           std::string_view source) {
  if (file_size < 8 || prefix.size() < 8) {
    fail(source, fmt::format("file is {} bytes, shorter than the 8-byte header length",
                             std::min<std::int64_t>(file_size, static_cast<std::int64_t>(prefix.size()))));
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(prefix[static_cast<std::size_t>(i)]);
  if (n > static_cast<std::uint64_t>(kMaxHeaderSize)) {
    fail(source, fmt::format("header length {} is larger than the format's limit of {} bytes", n,
                             kMaxHeaderSize));
  }
  if (static_cast<std::int64_t>(n) > file_size - 8) {
    fail(source, fmt::format("header length {} is past the end of the file ({} bytes)", n, file_size));
  }
  if (prefix.size() < 8 + n) {
    fail(source, fmt::format("header length {} but only {} bytes were read", n, prefix.size() - 8));
  }
  SafetensorsHeader h;
  h.header_size = static_cast<std::int64_t>(n);
  h.data_size = file_size - 8 - h.header_size;
  const std::string_view text = prefix.substr(8, n);
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    fail(source, fmt::format("header is not valid JSON (at byte {} of the header): {}", e.byte,
                             e.what()));
  } catch (const Json::exception& e) {
    fail(source, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!doc.is_object()) {
    fail(source, fmt::format("header must be a JSON object, got {}", doc.type_name()));
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) fail(source, "'__metadata__' must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          fail(source, fmt::format("'__metadata__' value of '{}' must be a string, got {}", m.key(),
                                   m->type_name()));
        }
        h.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(source, it.key(), *it, h.data_size));
  }
  // Byte ranges may not overlap (empty tensors occupy nothing).
  std::vector<const SafetensorsEntry*> order;
  for (const auto& e : h.tensors) {
    if (e.end > e.begin) order.push_back(&e);
  }
  std::sort(order.begin(), order.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < order.size(); ++i) {
    if (order[i]->begin < order[i - 1]->end) {
      fail(source, fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", order[i - 1]->name,
                               order[i - 1]->begin, order[i - 1]->end, order[i]->name,
                               order[i]->begin, order[i]->end));
    }
  }
  return h;
}

SafetensorsHeader read_safetensors_header(const std::filesystem::path& file) {
  const std::string source = file.string();
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec) fail(source, fmt::format("cannot read: {}", ec.message()));
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(source, "cannot open for reading");
  std::string prefix(8, '\0');
  in.read(prefix.data(), 8);
  const auto got = static_cast<std::size_t>(in.gcount());
  if (got < 8) {
    return parse_safetensors_header(std::string_view(prefix).substr(0, got),
                                    static_cast<std::int64_t>(size), source);
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(prefix[static_cast<std::size_t>(i)]);
  // Read no more than the header, and never more than the file or the format's cap.
  const std::uint64_t want = std::min<std::uint64_t>(
      n, std::min<std::uint64_t>(static_cast<std::uint64_t>(kMaxHeaderSize) + 1, size - 8));
  prefix.resize(8 + want);
  in.read(prefix.data() + 8, static_cast<std::streamsize>(want));
  prefix.resize(8 + static_cast<std::size_t>(in.gcount()));
  return parse_safetensors_header(prefix, static_cast<std::int64_t>(size), source);
}

void write_safetensors_skeleton(const std::filesystem::path& file,
                                const std::vector<std::pair<std::string, TensorSpec>>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::int64_t offset = 0;
  for (const auto& [name, spec] : tensors) {
    if (name == "__metadata__" || header.contains(name)) {
      throw IoError(fmt::format("[safetensors] {}: duplicate or reserved tensor name '{}'",
                                file.string(), name));
    }
    const std::int64_t bytes = spec.bytes();
    header[name] = Json{{"dtype", std::string(safetensors_name(spec.dtype))},
                        {"shape", spec.shape.dims()},
                        {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  std::array<char, 8> len{};
  auto n = static_cast<std::uint64_t>(text.size());
  for (int i = 0; i < 8; ++i) len[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);

  const std::filesystem::path tmp = file.string() + fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError(fmt::format("[safetensors] {}: cannot open for writing", tmp.string()));
    out.write(len.data(), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) {
      std::filesystem::remove(tmp);
      throw IoError(fmt::format("[safetensors] {}: write failed", tmp.string()));
    }
  }
  std::error_code ec;
  std::filesystem::resize_file(tmp, 8 + text.size() + static_cast<std::uint64_t>(offset), ec);
  if (!ec) std::filesystem::rename(tmp, file, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw IoError(fmt::format("[safetensors] {}: {}", file.string(), ec.message()));
  }
}

}  // namespace shardplan
