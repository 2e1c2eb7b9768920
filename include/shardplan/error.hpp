#pragma once

#include <stdexcept>
#include <string>

namespace shardplan {

/// Base of every exception shardplan throws. Messages read `[where] what, with the values`.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A tree whose structure does not match another (prefix match, unflatten, struct conversion).
class TreeError : public Error {
 public:
  using Error::Error;
};

/// A bad mesh, partition spec, dtype or shape (including a dimension that does not divide).
class SpecError : public Error {
 public:
  using Error::Error;
};

/// A sharding rule that cannot be built or that cannot decide a leaf.
class RuleError : public Error {
 public:
  using Error::Error;
};

/// A file that cannot be read or parsed: safetensors headers, model descriptions, rule files.
class IoError : public Error {
 public:
  using Error::Error;
};

}  // namespace shardplan
