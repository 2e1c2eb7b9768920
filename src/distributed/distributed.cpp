// The process group on Open MPI (or a group of one). See shardplan/distributed.hpp.
//
// The group is the one piece of process-wide state in the library: MPI is started once per
// process and finished when the process exits (a static's destructor), as MPI requires.
#include "shardplan/distributed.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include "shardplan/detail/agreement.hpp"

#if defined(SHARDPLAN_HAVE_MPI)
// The C API only: mpi.h would otherwise pull in Open MPI's removed C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace shardplan::distributed {
namespace {

struct Group {
  int index = 0;
  int count = 1;
  bool mpi = false;  // MPI was started here (and is finished at exit)
#if defined(SHARDPLAN_HAVE_MPI)
  ~Group() {
    int finalized = 0;
    if (mpi && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
  }
#endif
};

Group& group() {
  static Group g;
  return g;
}

#if !defined(SHARDPLAN_HAVE_MPI)
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 0 && n <= INT_MAX ? static_cast<int>(n) : fallback;
}
#endif

#if defined(SHARDPLAN_HAVE_MPI)
/// Throws a DistributedError for a failed MPI call, with MPI's own text.
void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw DistributedError(fmt::format("[distributed] {} failed on process {} of {}: {}", call,
                                     group().index, group().count, std::string(text, len)));
}

/// Seconds a collective may wait for the other processes: SHARDPLAN_COLLECTIVE_TIMEOUT
/// (seconds, 0 for no limit), 600 by default.
double timeout_seconds() {
  static const double seconds = [] {
    const char* v = std::getenv("SHARDPLAN_COLLECTIVE_TIMEOUT");
    if (v == nullptr || *v == '\0') return 600.0;
    char* end = nullptr;
    const double t = std::strtod(v, &end);
    return *end == '\0' && t >= 0 ? t : 600.0;
  }();
  return seconds;
}

/// Waits for `requests`. A wait past the timeout means a process never reached the collective
/// (it failed outside one, or died): the job is aborted with a message naming this process and
/// the collective, instead of hanging.
void wait_all(std::vector<MPI_Request>& requests, const char* what) {
  const double limit = timeout_seconds();
  const int n = static_cast<int>(requests.size());
  if (limit <= 0) {
    check(MPI_Waitall(n, requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    return;
  }
  const double start = MPI_Wtime();
  for (unsigned polls = 0;; ++polls) {
    int done = 0;
    check(MPI_Testall(n, requests.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    if (polls % 1024 == 1023 && MPI_Wtime() - start > limit) {
      std::fprintf(stderr,
                   "[distributed] process %d of %d: %s did not complete within %g s "
                   "(SHARDPLAN_COLLECTIVE_TIMEOUT): another process never reached it or died; "
                   "aborting the job\n",
                   group().index, group().count, what, limit);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    // Polling is what moves a large message along (the shared-memory transport copies it in
    // pieces as both sides poll), as MPI_Waitall does inside: no sleeping here.
    if (polls % 64 == 63) std::this_thread::yield();
  }
}

void wait_one(MPI_Request request, const char* what) {
  std::vector<MPI_Request> r{request};
  wait_all(r, what);
}

/// An element count as MPI's int, or a DistributedError naming what is too large.
int mpi_count(std::size_t n, std::string_view what) {
  if (n > static_cast<std::size_t>(INT_MAX)) {
    throw DistributedError(
        fmt::format("[distributed] {}: {} elements in one exchange; at most {} are supported", what,
                    n, INT_MAX));
  }
  return static_cast<int>(n);
}

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}
#endif

/// Every process's count, in process order.
std::vector<std::int64_t> allgather_count(std::int64_t mine) {
  const Group& g = group();
  std::vector<std::int64_t> all(static_cast<std::size_t>(g.count), mine);
#if defined(SHARDPLAN_HAVE_MPI)
  if (g.mpi) {
    MPI_Request r;
    check(MPI_Iallgather(&mine, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD, &r),
          "MPI_Iallgather");
    wait_one(r, "an all-gather of sizes");
  }
#endif
  return all;
}

/// "process 0, 2: 4; process 1: 5" for the distinct values of `all`.
template <class T, class Show>
std::string by_value(const std::vector<T>& all, Show&& show) {
  std::map<T, std::vector<int>> who;
  for (std::size_t p = 0; p < all.size(); ++p) who[all[p]].push_back(static_cast<int>(p));
  std::vector<std::pair<int, std::string>> parts;  // ordered by first process
  for (const auto& [value, procs] : who) {
    parts.emplace_back(procs.front(), fmt::format("process{} {}: {}", procs.size() > 1 ? "es" : "",
                                                  fmt::join(procs, ", "), show(value)));
  }
  std::sort(parts.begin(), parts.end());
  std::string out;
  for (const auto& [first, text] : parts) out += (out.empty() ? "" : "; ") + text;
  return out;
}

template <class T>
void allreduce_sum_impl(std::span<T> data) {
  initialize();
  const Group& g = group();
  const auto counts = allgather_count(static_cast<std::int64_t>(data.size()));
  for (std::int64_t c : counts) {
    if (c != counts[0]) {
      throw DistributedError(
          fmt::format("[distributed] allreduce_sum: processes pass different element counts ({})",
                      by_value(counts, [](std::int64_t v) { return fmt::format("{}", v); })));
    }
  }
  if (g.count == 1 || data.empty()) return;
#if defined(SHARDPLAN_HAVE_MPI)
  // Slice p of every process goes to process p, which adds the slices in process order; then
  // every process gathers the sums. Each element is added in the same order wherever it is.
  const std::size_t n = data.size();
  const auto p_count = static_cast<std::size_t>(g.count);
  std::vector<int> len(p_count), off(p_count);
  for (std::size_t p = 0; p < p_count; ++p) {
    const std::size_t b = n * p / p_count, e = n * (p + 1) / p_count;
    off[p] = mpi_count(b, "allreduce_sum");
    len[p] = mpi_count(e - b, "allreduce_sum");
  }
  const auto me = static_cast<std::size_t>(g.index);
  const std::size_t mine = static_cast<std::size_t>(len[me]);
  std::vector<T> parts(mine * p_count);
  std::vector<int> recv_len(p_count, len[me]), recv_off(p_count);
  for (std::size_t p = 0; p < p_count; ++p) recv_off[p] = mpi_count(p * mine, "allreduce_sum");
  MPI_Request r;
  check(MPI_Ialltoallv(data.data(), len.data(), off.data(), mpi_type<T>(), parts.data(),
                       recv_len.data(), recv_off.data(), mpi_type<T>(), MPI_COMM_WORLD, &r),
        "MPI_Ialltoallv");
  wait_one(r, "allreduce_sum (its exchange of slices)");
  std::vector<T> sum(parts.begin(), parts.begin() + static_cast<std::ptrdiff_t>(mine));
  for (std::size_t p = 1; p < p_count; ++p) {
    const T* from = parts.data() + p * mine;
    for (std::size_t i = 0; i < mine; ++i) sum[i] += from[i];
  }
  check(MPI_Iallgatherv(sum.data(), len[me], mpi_type<T>(), data.data(), len.data(), off.data(),
                        mpi_type<T>(), MPI_COMM_WORLD, &r),
        "MPI_Iallgatherv");
  wait_one(r, "allreduce_sum (its gather of sums)");
#endif
}

}  // namespace

bool built_with_mpi() {
#if defined(SHARDPLAN_HAVE_MPI)
  return true;
#else
  return false;
#endif
}

bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

void initialize() {
  static std::once_flag once;
  static std::exception_ptr failed;
  std::call_once(once, [] {
    if (!launched_by_mpirun()) return;
#if defined(SHARDPLAN_HAVE_MPI)
    Group& g = group();
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Serialized: the group's calls may come from any thread, one at a time.
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        failed = std::make_exception_ptr(
            DistributedError("[distributed] MPI_Init_thread failed (started by mpirun)"));
        return;
      }
      g.mpi = true;
    }
    // Errors come back as codes (turned into DistributedError), not an abort of the job.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g.index);
    MPI_Comm_size(MPI_COMM_WORLD, &g.count);
#else
    const int size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    if (size > 1) {
      failed = std::make_exception_ptr(DistributedError(fmt::format(
          "[distributed] started by mpirun as one of {} processes, but this build of shardplan "
          "has no MPI (configure with -DSHARDPLAN_WITH_MPI=ON and Open MPI installed); each "
          "process would compute the whole job alone",
          size)));
    }
#endif
  });
  if (failed) std::rethrow_exception(failed);
}

int process_index() {
  initialize();
  return group().index;
}

int process_count() {
  initialize();
  return group().count;
}

std::vector<int> local_devices(int global_devices) {
  const int p = process_count();
  if (global_devices <= 0 || global_devices % p != 0) {
    throw DistributedError(fmt::format(
        "[distributed] a mesh of {} devices does not split evenly over {} processes (each "
        "process holds the same number of devices)",
        global_devices, p));
  }
  const int local = global_devices / p;
  std::vector<int> out(static_cast<std::size_t>(local));
  for (int i = 0; i < local; ++i) out[static_cast<std::size_t>(i)] = process_index() * local + i;
  return out;
}

int process_of_device(int device, int global_devices) {
  const int local = static_cast<int>(local_devices(global_devices).size());
  if (device < 0 || device >= global_devices) {
    throw DistributedError(fmt::format("[distributed] device {} is not in a mesh of {} devices",
                                       device, global_devices));
  }
  return device / local;
}

ExampleRange process_examples(std::int64_t n, bool drop_remainder) {
  if (n < 0) {
    throw DistributedError(fmt::format("[distributed] a dataset of {} examples", n));
  }
  const std::int64_t p = process_index(), count = process_count();
  if (drop_remainder) {
    const std::int64_t each = n / count;
    return {p * each, (p + 1) * each};
  }
  // p * n / count without forming p * n (n may be near INT64_MAX).
  auto start = [&](std::int64_t q) { return q * (n / count) + q * (n % count) / count; };
  return {start(p), start(p + 1)};
}

std::vector<std::int64_t> process_example_order(std::int64_t n, std::uint64_t seed,
                                                std::int64_t epoch, bool drop_remainder) {
  const ExampleRange mine = process_examples(n, drop_remainder);
  // Fisher-Yates over 0..n-1 with SplitMix64 seeded from (seed, epoch): every process draws the
  // same permutation and keeps its range of it.
  std::uint64_t state = seed ^ (0x9E3779B97F4A7C15ull * (static_cast<std::uint64_t>(epoch) + 1));
  auto next = [&state] {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  for (std::int64_t i = n - 1; i > 0; --i) {
    // An unbiased draw in [0, i]: reject the top of the range that does not divide evenly.
    const auto bound = static_cast<std::uint64_t>(i) + 1;
    const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    std::uint64_t r = next();
    while (r >= limit) r = next();
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(r % bound)]);
  }
  return std::vector<std::int64_t>(order.begin() + mine.begin, order.begin() + mine.end);
}

void barrier() {
  initialize();
#if defined(SHARDPLAN_HAVE_MPI)
  if (group().mpi) {
    MPI_Request r;
    check(MPI_Ibarrier(MPI_COMM_WORLD, &r), "MPI_Ibarrier");
    wait_one(r, "a barrier");
  }
#endif
}

std::vector<std::vector<std::byte>> allgather_bytes(std::span<const std::byte> mine) {
  initialize();
  const Group& g = group();
  if (g.count == 1) return {std::vector<std::byte>(mine.begin(), mine.end())};
  std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(g.count));
#if defined(SHARDPLAN_HAVE_MPI)
  const auto sizes = allgather_count(static_cast<std::int64_t>(mine.size()));
  std::vector<int> len(sizes.size()), off(sizes.size());
  std::size_t total = 0;
  for (std::size_t p = 0; p < sizes.size(); ++p) {
    off[p] = mpi_count(total, "allgather_bytes");
    len[p] = mpi_count(static_cast<std::size_t>(sizes[p]), "allgather_bytes");
    total += static_cast<std::size_t>(sizes[p]);
  }
  mpi_count(total, "allgather_bytes");
  // A large gather (a whole array for to_host) may not fit on some process: every process knows
  // the total, so from 1 MiB on they all agree that each allocated before anything crosses (a
  // process that could not is named everywhere; the others would wait in the gather). Below,
  // the agreement's round trip would cost more than the allocation risks.
  std::vector<std::byte> all;
  if (total < static_cast<std::size_t>(detail::kAgreeOnHostAllocationsFrom)) {
    all.resize(total);
  } else {
    std::exception_ptr failed;
    try {
      detail::allocation_fault_point();
      all.resize(total);
    } catch (...) {
      failed = std::current_exception();
    }
    detail::agree(failed, failed ? fmt::format("[distributed] allgather_bytes of {} bytes", total)
                                 : std::string());
  }
  MPI_Request r;
  check(MPI_Iallgatherv(mine.data(), len[static_cast<std::size_t>(g.index)], MPI_BYTE, all.data(),
                        len.data(), off.data(), MPI_BYTE, MPI_COMM_WORLD, &r),
        "MPI_Iallgatherv");
  wait_one(r, "an all-gather");
  for (std::size_t p = 0; p < sizes.size(); ++p) {
    out[p].assign(all.begin() + off[p], all.begin() + off[p] + len[p]);
  }
#endif
  return out;
}

std::vector<std::vector<std::byte>> gather_bytes(std::span<const std::byte> mine, int root) {
  initialize();
  const Group& g = group();
  if (root < 0 || root >= g.count) {
    throw DistributedError(fmt::format("[distributed] gather_bytes to process {} of a group of {}",
                                       root, g.count));
  }
  if (g.count == 1) return {std::vector<std::byte>(mine.begin(), mine.end())};
  std::vector<std::vector<std::byte>> out;
#if defined(SHARDPLAN_HAVE_MPI)
  const auto sizes = allgather_count(static_cast<std::int64_t>(mine.size()));
  std::vector<int> len(sizes.size()), off(sizes.size());
  std::size_t total = 0;
  for (std::size_t p = 0; p < sizes.size(); ++p) {
    off[p] = mpi_count(total, "gather_bytes");
    len[p] = mpi_count(static_cast<std::size_t>(sizes[p]), "gather_bytes");
    total += static_cast<std::size_t>(sizes[p]);
  }
  mpi_count(total, "gather_bytes");
  const bool at_root = g.index == root;
  // Only the root allocates; every process knows the total, so all agree alike (allgather_bytes).
  std::vector<std::byte> all;
  std::exception_ptr failed;
  try {
    if (at_root && total >= static_cast<std::size_t>(detail::kAgreeOnHostAllocationsFrom)) {
      detail::allocation_fault_point();
    }
    if (at_root) all.resize(total);
  } catch (...) {
    failed = std::current_exception();
  }
  if (total >= static_cast<std::size_t>(detail::kAgreeOnHostAllocationsFrom)) {
    detail::agree(failed, failed ? fmt::format("[distributed] gather_bytes of {} bytes", total)
                                 : std::string());
  } else if (failed) {
    std::rethrow_exception(failed);
  }
  MPI_Request r;
  check(MPI_Igatherv(mine.data(), len[static_cast<std::size_t>(g.index)], MPI_BYTE, all.data(),
                     len.data(), off.data(), MPI_BYTE, root, MPI_COMM_WORLD, &r),
        "MPI_Igatherv");
  wait_one(r, "a gather");
  if (at_root) {
    out.resize(sizes.size());
    for (std::size_t p = 0; p < sizes.size(); ++p) {
      out[p].assign(all.begin() + off[p], all.begin() + off[p] + len[p]);
    }
  }
#else
  (void)mine;
#endif
  return out;
}

void exchange(const std::vector<Message>& sends, const std::vector<Message>& receives) {
  initialize();
  const Group& g = group();
  for (const auto* list : {&sends, &receives}) {
    for (const Message& m : *list) {
      if (m.peer < 0 || m.peer >= g.count || m.peer == g.index) {
        throw DistributedError(fmt::format(
            "[distributed] exchange: a message {} process {} (this is process {} of {})",
            list == &sends ? "to" : "from", m.peer, g.index, g.count));
      }
    }
  }
#if defined(SHARDPLAN_HAVE_MPI)
  // A message of more than INT_MAX bytes goes as several, cut the same way on both sides.
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  std::vector<MPI_Request> requests;
  auto post = [&](const Message& m, bool send) {
    for (std::size_t at = 0; at < m.bytes || (at == 0 && m.bytes == 0); at += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, m.bytes - at));
      MPI_Request r;
      if (send) {
        check(MPI_Isend(m.data + at, n, MPI_BYTE, m.peer, 0, MPI_COMM_WORLD, &r), "MPI_Isend");
      } else {
        check(MPI_Irecv(m.data + at, n, MPI_BYTE, m.peer, 0, MPI_COMM_WORLD, &r), "MPI_Irecv");
      }
      requests.push_back(r);
      if (m.bytes == 0) break;
    }
  };
  for (const Message& m : receives) post(m, false);
  for (const Message& m : sends) post(m, true);
  wait_all(requests, "an exchange of shards between processes");
#endif
}

void allreduce_sum(std::span<float> data) { allreduce_sum_impl(data); }
void allreduce_sum(std::span<double> data) { allreduce_sum_impl(data); }

namespace {

/// The lines of `text` ('\n' apart).
std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> out;
  for (std::size_t at = 0;;) {
    const std::size_t end = text.find('\n', at);
    out.push_back(text.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at));
    if (end == std::string_view::npos) return out;
    at = end + 1;
  }
}

}  // namespace

void check_same(std::string_view what, std::string_view value) {
  const auto all = allgather_bytes(std::as_bytes(std::span(value.data(), value.size())));
  std::vector<std::string> values;
  for (const auto& v : all) values.emplace_back(reinterpret_cast<const char*>(v.data()), v.size());
  if (std::all_of(values.begin(), values.end(), [&](const std::string& v) { return v == values[0]; })) {
    return;
  }
  const auto quote = [](std::string_view s) {
    return fmt::format("'{}'", s.size() > 200 ? std::string(s.substr(0, 200)) + "..." : s);
  };
  // Values of several lines (a tree's tensors, a program's nodes): the first line where any two
  // differ, each process's line there.
  std::vector<std::vector<std::string_view>> lines;
  for (const std::string& v : values) lines.push_back(lines_of(v));
  std::size_t first = 0;
  const auto same_at = [&](std::size_t k) {
    for (const auto& l : lines) {
      if (k >= l.size() || k >= lines[0].size() || l[k] != lines[0][k]) return false;
    }
    return true;
  };
  while (same_at(first)) ++first;
  const bool multi_line = std::any_of(lines.begin(), lines.end(), [](const auto& l) { return l.size() > 1; });
  if (!multi_line) {
    throw DistributedError(fmt::format("[distributed] the processes disagree on {}: {}", what,
                                       by_value(values, quote)));
  }
  throw DistributedError(fmt::format(
      "[distributed] the processes disagree on {}, first at line {}: {}", what, first + 1,
      by_value(values, [&](const std::string& s) {
        const std::vector<std::string_view> l = lines_of(s);
        return first < l.size() ? quote(l[first]) : std::string("(no such line)");
      })));
}

namespace detail {

namespace {
// The test-only fault: allocations left before the failing one (0: none fails).
std::atomic<int> allocations_before_fault{0};
}  // namespace

void fail_collective_allocation(int nth) { allocations_before_fault.store(std::max(0, nth)); }

void allocation_fault_point() {
  if (allocations_before_fault.load() > 0 && allocations_before_fault.fetch_sub(1) == 1) {
    throw std::bad_alloc();
  }
}

std::string describe(std::exception_ptr failed) {
  try {
    std::rethrow_exception(failed);
  } catch (const std::bad_alloc& e) {
    return fmt::format("out of host memory ({})", e.what());
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

void throw_failed(int process, int count, const std::string& message, std::exception_ptr own) {
  const DistributedError error(
      fmt::format("[distributed] process {} of {} failed: {}", process, count, message));
  if (own) {
    try {
      std::rethrow_exception(own);
    } catch (...) {
      std::throw_with_nested(error);
    }
  }
  throw error;
}

void agree(std::exception_ptr failed, const std::string& context) {
  initialize();
  std::string message;
  if (failed) message = context.empty() ? describe(failed) : context + ": " + describe(failed);
  // A number per process: 0 for success, else 1 + the length of its message. Only when some
  // process failed do the messages cross (every process sees that from the numbers).
  const auto status = allgather_count(failed ? 1 + static_cast<std::int64_t>(message.size()) : 0);
  if (std::all_of(status.begin(), status.end(), [](std::int64_t s) { return s == 0; })) return;
  const auto all = allgather_bytes(std::as_bytes(std::span(message.data(), message.size())));
  const int me = group().index;
  for (std::size_t p = 0; p < status.size(); ++p) {
    if (status[p] == 0) continue;
    const int who = static_cast<int>(p);
    throw_failed(who, static_cast<int>(status.size()),
                 std::string(reinterpret_cast<const char*>(all[p].data()), all[p].size()),
                 who == me ? failed : nullptr);
  }
}

}  // namespace detail

void all_succeed(const std::function<void()>& step) {
  std::exception_ptr mine;
  try {
    step();
  } catch (...) {
    mine = std::current_exception();
  }
  detail::agree(mine);
}

}  // namespace shardplan::distributed
