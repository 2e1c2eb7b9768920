#pragma once
// The check every option that names a file or directory to read goes through: an input that is
// not there is bad usage (exit 2), as an output path against the outputs contract is.
#include <fmt/format.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "shardplan/detail/printable.hpp"
#include "usage_error.hpp"

namespace shardplan::cli {

/// Throws UsageError "OPTION: no such file or directory 'PATH'HINT" when `path` does not exist.
/// Anything else (a link loop, a permission, a FIFO) is the reader's to name, with the file.
inline void require_input(std::string_view option, const std::string& path,
                          std::string_view hint = "") {
  std::error_code ec;
  (void)std::filesystem::status(path, ec);
  if (ec == std::errc::no_such_file_or_directory) {
    throw UsageError(fmt::format("{}: no such file or directory '{}'{}", option,
                                 detail::printable(path), hint));
  }
}

}  // namespace shardplan::cli
