#pragma once
// Bad usage found after parsing (a file that does not exist, an unknown preset, a bad size):
// the command prints it and exits with 2.
#include <stdexcept>

namespace shardplan::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace shardplan::cli
