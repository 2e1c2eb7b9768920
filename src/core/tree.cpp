#include "shardplan/tree.hpp"

namespace shardplan {

std::string_view to_string(NodeKind kind) {
  switch (kind) {
    case NodeKind::kNone: return "none";
    case NodeKind::kLeaf: return "leaf";
    case NodeKind::kDict: return "dict";
    case NodeKind::kList: return "list";
  }
  return "?";
}

std::string escape_key(std::string_view key) {
  if (key.find_first_of("~/") == std::string_view::npos) return std::string(key);
  std::string out;
  out.reserve(key.size() + 4);
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string unescape_key(std::string_view escaped) {
  std::string out;
  out.reserve(escaped.size());
  for (std::size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] != '~') {
      out += escaped[i];
      continue;
    }
    if (i + 1 >= escaped.size() || (escaped[i + 1] != '0' && escaped[i + 1] != '1')) {
      throw TreeError("[tree] bad escape in path segment '" + std::string(escaped) + "' at " +
                      std::to_string(i) + ": '~' must be followed by 0 or 1");
    }
    out += escaped[i + 1] == '0' ? '~' : '/';
    ++i;
  }
  return out;
}

std::string join_path(std::string_view prefix, std::string_view escaped_segment) {
  if (prefix.empty()) return std::string(escaped_segment);
  std::string out;
  out.reserve(prefix.size() + 1 + escaped_segment.size());
  out.append(prefix).append(1, '/').append(escaped_segment);
  return out;
}

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> out;
  if (path.empty()) return out;
  std::size_t start = 0;
  while (true) {
    std::size_t slash = path.find('/', start);
    out.push_back(unescape_key(path.substr(start, slash - start)));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return out;
}

std::string tree_path_of_name(std::string_view name, char separator) {
  std::string path;
  std::size_t start = 0;
  while (true) {
    const std::size_t stop = name.find(separator, start);
    path = join_path(path, escape_key(name.substr(start, stop - start)));
    if (stop == std::string_view::npos) return path;
    start = stop + 1;
  }
}

}  // namespace shardplan
