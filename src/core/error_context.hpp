#pragma once
// Context added to an error on its way up, without changing its type: a TreeError stays a
// TreeError (callers catch by type), only its message gains where it happened.

#include <fmt/format.h>

#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

#include "shardplan/error.hpp"

namespace shardplan::detail {

/// Call inside a catch handler: rethrows the exception being handled as the same shardplan
/// error type with "{context}: " before its message (a DeviceError keeps its device and nests
/// the original). Exceptions of other types (and Error subclasses this does not know) are
/// rethrown unchanged.
[[noreturn]] inline void rethrow_with_context(std::string_view context) {
  const auto with = [&](const std::exception& e) {
    return fmt::format("{}: {}", context, e.what());
  };
  try {
    throw;
  } catch (const TreeError& e) {
    throw TreeError(with(e));
  } catch (const SpecError& e) {
    throw SpecError(with(e));
  } catch (const RuleError& e) {
    throw RuleError(with(e));
  } catch (const IoError& e) {
    throw IoError(with(e));
  } catch (const ArrayError& e) {
    throw ArrayError(with(e));
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(with(e));
  } catch (const DistributedError& e) {
    throw DistributedError(with(e));
  } catch (const DeviceError& e) {
    std::throw_with_nested(DeviceError(e.device(), with(e)));
  } catch (const Error& e) {
    if (typeid(e) != typeid(Error)) throw;  // a subclass this does not know keeps its type
    throw Error(with(e));
  }
}

}  // namespace shardplan::detail
