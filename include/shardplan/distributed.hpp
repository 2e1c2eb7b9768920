#pragma once
// The process group: one controller per process, as jax.distributed (process_index,
// process_count, local devices), on Open MPI when the program is started by mpirun and a group
// of one otherwise, with no change to the program. A global mesh of N devices over P processes
// gives each process N / P consecutive devices in mesh order.
//
// Every function here is collective where it says so: each process of the group must call it,
// in the same order. A collective never leaves one process waiting on a failure of another: the
// failure is exchanged and every process throws a DistributedError naming the process that
// failed (see all_succeed).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardplan/error.hpp"  // DistributedError

namespace shardplan {

namespace distributed {

/// True when the library was built with MPI (the CMake option SHARDPLAN_WITH_MPI).
bool built_with_mpi();

/// True when this process was started by mpirun (Open MPI's environment says so).
bool launched_by_mpirun();

/// Starts the group once per process (later calls do nothing): MPI when launched by mpirun, a
/// group of one otherwise. Every function below calls it first. Throws DistributedError when
/// started by mpirun with more than one process but built without MPI (each process would think
/// it is alone and compute the whole job).
void initialize();

/// This process's index in the group, 0 .. process_count() - 1 (MPI's rank).
int process_index();
/// The number of processes in the group (1 when not launched by mpirun).
int process_count();

/// The global device ids this process holds in a mesh of `global_devices` devices: the
/// process_index()-th run of global_devices / process_count() consecutive ids. Throws
/// DistributedError when the devices do not split evenly over the processes.
std::vector<int> local_devices(int global_devices);
/// The process that holds global device `device` of `global_devices`.
int process_of_device(int device, int global_devices);

/// This process's part of a dataset of `n` examples, as Grain's ShardByJaxProcess: process p
/// takes the consecutive examples [begin, end) = [p * n / P, (p + 1) * n / P), so the parts
/// differ by at most one example; with `drop_remainder` every part has n / P examples (the
/// last n % P examples go unused). Throws DistributedError for a negative n.
struct ExampleRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
  friend bool operator==(const ExampleRange&, const ExampleRange&) = default;
};
ExampleRange process_examples(std::int64_t n, bool drop_remainder = false);

/// An epoch's example order for this process, as PyTorch's DistributedSampler with shuffling:
/// one permutation of 0 .. n-1 drawn from (seed, epoch), the same on every process without any
/// message, cut as process_examples cuts 0 .. n-1; this process's part, in order. Every example
/// goes to exactly one process (with `drop_remainder`, the last n % P of the permutation to
/// none).
std::vector<std::int64_t> process_example_order(std::int64_t n, std::uint64_t seed,
                                                std::int64_t epoch, bool drop_remainder = false);

/// Collective: waits for every process.
void barrier();

/// Collective: every process's bytes, in process order (sizes may differ between processes).
std::vector<std::vector<std::byte>> allgather_bytes(std::span<const std::byte> mine);

/// Collective: every process's bytes to process `root` only, in process order (sizes may differ);
/// the other processes get an empty list. As allgather_bytes, a gather of 1 MiB or more is agreed
/// on before anything crosses (root allocates first; a root that cannot fails on every process).
/// Throws DistributedError for a root outside the group.
std::vector<std::vector<std::byte>> gather_bytes(std::span<const std::byte> mine, int root);

/// One message of exchange(): `bytes` bytes at `data`, to or from process `peer`.
struct Message {
  int peer = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};
/// Collective: sends and receives the given messages, all at once, and returns when all are
/// done. Messages between two processes are matched in the order each side lists them (so both
/// must list them in the same order: the runtime derives the lists from the shardings, which
/// every process knows). A message to or from this process itself is an error.
void exchange(const std::vector<Message>& sends, const std::vector<Message>& receives);

/// Collective: the elementwise sum over processes of each process's `data`, into `data`, added
/// in process order ((x0 + x1) + x2) + ... for every element, so the bits do not depend on how
/// the group is laid out or on timing. Every process passes the same number of elements
/// (checked: a DistributedError names the processes and their counts). The bytes cross the group
/// as in a reduce-scatter then an all-gather: each process sums one slice.
void allreduce_sum(std::span<float> data);
void allreduce_sum(std::span<double> data);

/// Collective: checks that every process passes the same `value` for `what` (a program's
/// signature, shapes, static arguments). Otherwise every process throws a DistributedError that
/// names `what` and each distinct value with the processes that passed it (values of several
/// lines: the first line where any two differ, as each process has it).
void check_same(std::string_view what, std::string_view value);

/// Collective: runs `step` on this process, then tells every process whether every process's
/// step succeeded. When one failed, every process throws a DistributedError naming the lowest
/// failed process and its message (the failed process's own exception is nested in its error).
/// This is how a step that may fail on some processes only (a bad file, a shape) ends the same
/// way everywhere instead of leaving the others waiting in the next collective.
void all_succeed(const std::function<void()>& step);

}  // namespace distributed
}  // namespace shardplan
