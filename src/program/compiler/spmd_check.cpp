#include "spmd_check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "shardplan/detail/agreement.hpp"
#include "shardplan/detail/hash.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"

namespace shardplan::detail {

void check_same_program(std::string_view entry, const std::string* program, std::uint64_t extra,
                        std::string_view extra_what, std::exception_ptr failed) {
  // A tag, then the hash, then 0 or 1 + the failure's message: a process that is in another
  // collective (a to_host, say, that only some processes called) sends something else, and is
  // named.
  constexpr std::uint64_t kTag = 0x736a69745f737064ull;  // "sjit_spd"
  std::string mine(2 * sizeof(std::uint64_t), '\0');
  std::uint64_t h = 0;
  if (failed) {
    mine += '1';
    mine += fmt::format("[{}] tracing and compiling the call: {}", entry,
                        distributed::detail::describe(failed));
  } else {
    h = std::hash<std::string>()(*program);
    h = hash_combine(h, extra);
    mine += '0';
  }
  std::memcpy(mine.data(), &kTag, sizeof kTag);
  std::memcpy(mine.data() + sizeof kTag, &h, sizeof h);
  const auto all = distributed::allgather_bytes(std::as_bytes(std::span(mine.data(), mine.size())));
  constexpr std::size_t kHead = 2 * sizeof(std::uint64_t) + 1;
  for (std::size_t p = 0; p < all.size(); ++p) {
    std::uint64_t tag = 0;
    if (all[p].size() >= kHead) std::memcpy(&tag, all[p].data(), sizeof tag);
    if (tag != kTag) {
      throw DistributedError(fmt::format(
          "[distributed] process {} is not calling this {} program with the others: it is in "
          "another collective (every process must make the same calls that span processes, "
          "such as sjit calls and to_host, in the same order)",
          p, entry));
    }
  }
  // Every process failed: each throws its own error, as in one process (nobody waits).
  const auto failed_on = [&](const std::vector<std::byte>& v) {
    return static_cast<char>(v[kHead - 1]) == '1';
  };
  if (std::all_of(all.begin(), all.end(), failed_on)) std::rethrow_exception(failed);
  const int me = distributed::process_index();
  for (std::size_t p = 0; p < all.size(); ++p) {
    if (!failed_on(all[p])) continue;
    const int who = static_cast<int>(p);
    distributed::detail::throw_failed(
        who, static_cast<int>(all.size()),
        std::string(reinterpret_cast<const char*>(all[p].data()) + kHead, all[p].size() - kHead),
        who == me ? failed : nullptr);
  }
  for (const auto& other : all) {
    if (other != all.front()) {
      // Every process is here (they all see the hashes differ): compare the texts, which names
      // what differs; when they are the same, `extra` differs.
      distributed::check_same(
          fmt::format("the {} program (argument shapes, dtypes and shardings, and the traced "
                      "program)",
                      entry),
          *program);
      throw DistributedError(fmt::format(
          "[distributed] the processes disagree on {} of a {} call (their values differ between "
          "processes; the traced programs are the same)",
          extra_what, entry));
    }
  }
}

}  // namespace shardplan::detail
