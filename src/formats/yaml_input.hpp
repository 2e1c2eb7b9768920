#pragma once
// What the YAML readers (rule files, hardware files) share, before yaml-cpp sees the text.
#include <string_view>

namespace shardplan::detail {

/// Deeper nesting than this is rejected before yaml-cpp parses the text: yaml-cpp recurses once
/// per level (its own guard stops at 2000 levels, deeper than a small or sanitized stack holds).
/// Rule files nest four or five levels, hardware files two.
inline constexpr int kMaxYamlDepth = 128;

/// Throws IoError "[WHAT] SOURCE:LINE: nesting deeper than 128 levels" when `text` may nest
/// deeper than kMaxYamlDepth (an upper bound: indentation, block indicators, flow brackets).
void check_yaml_depth(std::string_view text, std::string_view what, std::string_view source);

}  // namespace shardplan::detail
