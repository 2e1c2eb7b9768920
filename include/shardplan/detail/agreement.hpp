#pragma once
// The failure agreement under distributed::all_succeed, for the library's own collectives and
// programs (not a public API), and a test-only fault to exercise it.
#include <cstdint>
#include <exception>
#include <string>

namespace shardplan::distributed::detail {

/// Collective: tells every process whether every process succeeded, where this process's
/// outcome is already known: `failed` is its exception, or null. When one failed, every process
/// throws a DistributedError naming the lowest failed process and its message ("context: " put
/// before the message when `context` is not empty); the failed process's own exception is
/// nested in its error. One all-gather of a number per process when every process succeeded
/// (the messages cross only after a failure).
void agree(std::exception_ptr failed, const std::string& context = {});

/// The message of a failure as it crosses to the other processes (a std::bad_alloc says the host
/// ran out of memory).
std::string describe(std::exception_ptr failed);

/// Throws the DistributedError every process throws when process `process` of `count` failed
/// with `message`: on that process (`own` set) its own exception is nested in it.
[[noreturn]] void throw_failed(int process, int count, const std::string& message,
                               std::exception_ptr own);

/// Test-only fault: the `nth` (1-based) allocation from now on that this process makes for a
/// collective over processes (an output shard or a buffer a collective receives into, a gather
/// of 1 MiB or more in allgather_bytes or to_host) throws std::bad_alloc, as a host out of
/// memory would; 0 turns the fault off. Lets a test make one process run out of memory at a
/// chosen allocation of a reshard.
void fail_collective_allocation(int nth);

/// Called before each such allocation: throws std::bad_alloc when the fault says so.
void allocation_fault_point();

/// Allocations of at least this many bytes made for a gather of host data (allgather_bytes,
/// to_host) are agreed on before the gather; every process decides alike from sizes they all
/// know. Smaller ones are not worth the round trip.
inline constexpr std::int64_t kAgreeOnHostAllocationsFrom = std::int64_t{1} << 20;

}  // namespace shardplan::distributed::detail
