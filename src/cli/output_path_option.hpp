#pragma once
// The check every option that names a file or directory to write goes through.
#include <CLI/CLI.hpp>
#include <string>

namespace shardplan::cli {

/// An empty name is bad usage (exit 2) rather than a silently skipped output or a filesystem
/// error later; everything else about the path is checked where it is written.
inline CLI::Validator non_empty_output_path() {
  return CLI::Validator(
      [](std::string& v) { return v.empty() ? std::string("the path is empty") : std::string(); },
      "");
}

}  // namespace shardplan::cli
