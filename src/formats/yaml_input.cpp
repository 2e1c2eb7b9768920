// What the YAML readers (rule files, hardware files) share: yaml_input.hpp.
#include "yaml_input.hpp"

#include <fmt/format.h>

#include "shardplan/error.hpp"

namespace shardplan::detail {

// An upper bound on the nesting at each point: a line's indentation and its leading "- " / "? "
// / ": " indicators (block levels take at least one column each), plus the open flow brackets.
// Quoted text and comments are skipped.
void check_yaml_depth(std::string_view text, std::string_view what, std::string_view source) {
  int flow = 0;
  int line = 1;
  int block = 0;
  bool line_start = true;
  char quote = 0;
  auto fail = [&] {
    throw IoError(
        fmt::format("[{}] {}:{}: nesting deeper than {} levels", what, source, line, kMaxYamlDepth));
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const char next = i + 1 < text.size() ? text[i + 1] : '\n';
    if (c == '\n') {
      ++line;
      block = 0;
      line_start = true;
      continue;
    }
    if (quote != 0) {
      if (quote == '"' && c == '\\') {
        ++i;
      } else if (c == quote) {
        if (quote == '\'' && next == '\'') {
          ++i;
        } else {
          quote = 0;
        }
      }
      continue;
    }
    if (line_start) {
      if (c == ' ' || c == '\t') {
        ++block;
        continue;
      }
      if ((c == '-' || c == '?' || c == ':') && (next == ' ' || next == '\t' || next == '\n')) {
        block += 2;
        if (next != '\n') ++i;
        if (block + flow > kMaxYamlDepth) fail();
        continue;
      }
      line_start = false;
      if (block + flow > kMaxYamlDepth) fail();
    }
    if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t')) {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if ((c == '"' || c == '\'') && (i == 0 || std::string_view(" \t[{,:").find(
                                                         text[i - 1]) != std::string_view::npos)) {
      quote = c;  // a quoted scalar starts a token; a quote inside a plain scalar is text
    } else if (c == '[' || c == '{') {
      if (block + ++flow > kMaxYamlDepth) fail();
    } else if ((c == ']' || c == '}') && flow > 0) {
      --flow;
    }
  }
}

}  // namespace shardplan::detail
