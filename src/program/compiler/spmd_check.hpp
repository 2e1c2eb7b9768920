#pragma once
// The check every program entry point makes before running a program whose mesh spans processes
// (sjit calls, eager shard_map calls): every process is about to run the same program, or the
// failure of a process that could not trace or compile it is named on every process.
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

namespace shardplan::detail {

/// Collective over the processes: each passes the text of the program it is about to run
/// (`program`: the call's signature and traced program, the same on every process for the same
/// call, no addresses) and a hash of what else must agree (`extra`: sjit's static arguments), or,
/// in `failed` (`program` then null), the failure that kept it from getting there. One
/// all-gather of a tag, a hash and a status per process (the texts cross only when the hashes
/// differ). Throws on every process:
/// - when some processes failed: a DistributedError naming the lowest of them and its message,
///   prefixed "[`entry`] tracing and compiling the call: " (its own error nested on that
///   process); when every process failed, each its own error, of its own type, as one process;
/// - when the programs differ: check_same's DistributedError naming each process's text; when
///   only `extra` differs, a DistributedError saying `extra_what` differ;
/// - when a process is in another collective: a DistributedError naming it.
void check_same_program(std::string_view entry, const std::string* program, std::uint64_t extra,
                        std::string_view extra_what, std::exception_ptr failed);

}  // namespace shardplan::detail
