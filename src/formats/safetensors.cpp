#include "shardplan/safetensors.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <unordered_set>

#include "input_file.hpp"
#include "json_impl.hpp"
#include "output_file.hpp"
#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"

namespace shardplan {
namespace {

namespace json = detail::json;

/// The format caps the header at 100 MB; a larger length is a corrupt or hostile file.
constexpr std::int64_t kMaxHeaderSize = 100'000'000;

[[noreturn]] void fail(std::string_view source, const std::string& what) {
  throw IoError(fmt::format("[safetensors] {}: {}", source, what));
}

SafetensorsEntry parse_entry(std::string_view source, std::string_view name, const json::Value& v,
                             std::int64_t data_size) {
  if (!v.is_object()) {
    fail(source, fmt::format("tensor '{}': expected an object with dtype, shape and data_offsets, "
                             "got {}",
                             name, v.type_name()));
  }
  std::optional<json::Value> dtype, shape, offsets;
  for (auto it = v.begin(); it != v.end(); ++it) {
    std::optional<json::Value>* slot = it.key() == "dtype"          ? &dtype
                                       : it.key() == "shape"        ? &shape
                                       : it.key() == "data_offsets" ? &offsets
                                                                    : nullptr;
    if (slot == nullptr) {
      fail(source, fmt::format("tensor '{}': unknown field '{}' (expected dtype, shape, "
                               "data_offsets)",
                               name, it.key()));
    }
    if (*slot) fail(source, fmt::format("tensor '{}': field '{}' appears twice", name, it.key()));
    *slot = it.value();
  }
  if (!dtype || !dtype->is_string()) {
    fail(source, fmt::format("tensor '{}': 'dtype' must be a string", name));
  }
  SafetensorsEntry e;
  e.name = std::string(name);
  try {
    e.spec.dtype = parse_dtype(dtype->str());
  } catch (const SpecError&) {
    fail(source, fmt::format("tensor '{}': unknown dtype '{}'", name, dtype->str()));
  }
  if (!shape || !shape->is_array()) {
    fail(source, fmt::format("tensor '{}': 'shape' must be a list of non-negative integers", name));
  }
  std::vector<std::int64_t> dims;
  dims.reserve(shape->size());
  for (auto it = shape->begin(); it != shape->end(); ++it) {
    const json::Value d = *it;
    if (!d.is_uint()) {
      fail(source, fmt::format("tensor '{}': shape {} is not a list of non-negative integers", name,
                               shape->source_text()));
    }
    if (d.as_uint() > static_cast<std::uint64_t>(INT64_MAX)) {
      fail(source, fmt::format("tensor '{}': dimension {} is too large", name, d.as_uint()));
    }
    dims.push_back(static_cast<std::int64_t>(d.as_uint()));
  }
  std::uint64_t range[2] = {0, 0};
  bool offsets_ok = offsets && offsets->is_array() && offsets->size() == 2;
  if (offsets_ok) {
    int k = 0;
    for (auto it = offsets->begin(); it != offsets->end(); ++it, ++k) {
      if (!(*it).is_uint()) offsets_ok = false;
      range[k] = (*it).as_uint();
    }
  }
  if (!offsets_ok) {
    fail(source,
         fmt::format("tensor '{}': 'data_offsets' must be two non-negative integers, got {}", name,
                     offsets ? offsets->source_text() : std::string("nothing")));
  }
  const std::uint64_t begin = range[0];
  const std::uint64_t end = range[1];
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
  std::optional<json::Document> parsed;
  try {
    parsed.emplace(text);
  } catch (const json::SyntaxError& e) {
    fail(source,
         fmt::format("header is not valid JSON (at byte {} of the header): {}", e.byte, e.what()));
  }
  const json::Value doc = parsed->root();
  if (!doc.is_object()) {
    fail(source, fmt::format("header must be a JSON object, got {}", doc.type_name()));
  }
  json::KeySet seen(doc.size());
  h.tensors.reserve(doc.size());
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (!seen.insert(it.key())) {
      fail(source, fmt::format("key '{}' appears twice in the header", it.key()));
    }
    if (it.key() == "__metadata__") {
      const json::Value meta = it.value();
      if (!meta.is_object()) fail(source, "'__metadata__' must be an object of strings");
      for (auto m = meta.begin(); m != meta.end(); ++m) {
        if (!m.value().is_string()) {
          fail(source, fmt::format("'__metadata__' value of '{}' must be a string, got {}", m.key(),
                                   m.value().type_name()));
        }
        h.metadata[std::string(m.key())] = std::string(m.value().str());
      }
      continue;
    }
    h.tensors.push_back(parse_entry(source, it.key(), it.value(), h.data_size));
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
  const detail::InputFile in(file, "safetensors");
  const std::size_t size = in.size();
  std::string prefix(std::min<std::size_t>(8, size), '\0');
  in.read_at(0, prefix.data(), prefix.size());
  if (prefix.size() < 8) {
    return parse_safetensors_header(prefix, static_cast<std::int64_t>(size), source);
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(prefix[static_cast<std::size_t>(i)]);
  // Read no more than the header, and never more than the file or the format's cap.
  const std::uint64_t want = std::min<std::uint64_t>(
      n, std::min<std::uint64_t>(static_cast<std::uint64_t>(kMaxHeaderSize) + 1, size - 8));
  prefix.resize(8 + want);
  in.read_at(8, prefix.data() + 8, static_cast<std::size_t>(want));
  return parse_safetensors_header(prefix, static_cast<std::int64_t>(size), source);
}

std::string safetensors_header_bytes(const std::filesystem::path& file,
                                     const std::vector<std::pair<std::string, TensorSpec>>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  // Written by hand, in the given order (an ordered_json object looks keys up linearly).
  std::string text = "{";
  if (!metadata.empty()) {
    try {
      text += "\"__metadata__\":" + nlohmann::json(metadata).dump();
    } catch (const nlohmann::json::exception&) {
      throw IoError(fmt::format("[safetensors] {}: metadata is not valid UTF-8", file.string()));
    }
  }
  std::unordered_set<std::string_view> seen;
  seen.reserve(tensors.size());
  std::int64_t offset = 0;
  for (const auto& [name, spec] : tensors) {
    if (name == "__metadata__" || !seen.insert(name).second) {
      throw IoError(fmt::format("[safetensors] {}: duplicate or reserved tensor name '{}'",
                                file.string(), name));
    }
    const std::int64_t bytes = spec.bytes();
    if (text.size() > 1) text += ',';
    std::string key;
    try {
      key = nlohmann::json(name).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    } catch (const nlohmann::json::exception&) {
      throw IoError(fmt::format("[safetensors] {}: tensor name '{}' is not valid UTF-8",
                                file.string(), name));
    }
    text += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", key,
                        safetensors_name(spec.dtype), fmt::join(spec.shape.dims(), ","), offset,
                        offset + bytes);
    offset += bytes;
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  std::string out(8, '\0');
  const auto n = static_cast<std::uint64_t>(text.size());
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

void write_safetensors_skeleton(const std::filesystem::path& file,
                                const std::vector<std::pair<std::string, TensorSpec>>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header_bytes(file, tensors, metadata);
  std::int64_t data = 0;
  for (const auto& t : tensors) data += t.second.bytes();
  detail::OutputFile out(file, "safetensors");
  out.write(header);
  out.resize(static_cast<std::int64_t>(header.size()) + data);
  out.commit();
}

}  // namespace shardplan
