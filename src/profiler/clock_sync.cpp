// The processes' clocks against process 0's (Cristian's algorithm over distributed::exchange):
// see profiler.hpp, estimate_clock_offsets.
#include <fmt/format.h>

#include <cstring>
#include <limits>

#include "recorder.hpp"
#include "shardplan/distributed.hpp"
#include "shardplan/error.hpp"
#include "shardplan/profiler.hpp"

namespace shardplan::profiler {
namespace {

using distributed::Message;

std::byte* bytes_of(std::int64_t& v) { return reinterpret_cast<std::byte*>(&v); }

// A bound this tight ends the round trips once `rounds` are done; a looser one (the processes
// descheduled on a loaded or oversubscribed host: best round trips of 230 us were seen with 4
// processes on 2 cores) keeps process 0 trying, up to kMoreRounds times `rounds` round trips or
// kMoreTime, whichever ends first. Every extra round trip can only tighten the estimate.
constexpr std::int64_t kTightBoundNs = 10'000;
constexpr int kMoreRounds = 16;
constexpr std::int64_t kMoreTimeNs = 100'000'000;
constexpr std::int64_t kEnd = -1;  // the ping that ends the peer's answers

// Process 0's side of the round trips with `peer`: the one with the least round trip.
ClockOffset measure(int peer, int rounds) {
  ClockOffset best{peer, 0, 0, std::numeric_limits<std::int64_t>::max()};
  const std::int64_t start = detail::now_ns();
  for (int k = 0;; ++k) {
    const bool enough = k >= rounds && (best.error_bound_ns <= kTightBoundNs ||
                                        k >= std::int64_t{kMoreRounds} * rounds ||
                                        detail::now_ns() - start >= kMoreTimeNs);
    if (enough) break;
    std::int64_t ping = k, reading = 0;
    const std::int64_t t0 = detail::now_ns();
    // The reply's receive is posted with the ping: nothing but the peer's turnaround in between.
    distributed::exchange({Message{peer, bytes_of(ping), sizeof ping}},
                          {Message{peer, bytes_of(reading), sizeof reading}});
    const std::int64_t t1 = detail::now_ns();
    const std::int64_t rtt = t1 - t0;
    if (rtt < best.round_trip_ns) {
      best.round_trip_ns = rtt;
      best.offset_ns = reading - (t0 + rtt / 2);
      best.error_bound_ns = (rtt + 1) / 2;
    }
  }
  std::int64_t end = kEnd;
  distributed::exchange({Message{peer, bytes_of(end), sizeof end}}, {});
  return best;
}

// The peer's side: each ping answered with this clock's reading, taken after it arrived, until
// process 0 sends the end.
void answer() {
  for (;;) {
    std::int64_t ping = 0;
    distributed::exchange({}, {Message{0, bytes_of(ping), sizeof ping}});
    if (ping == kEnd) return;
    std::int64_t reading = detail::now_ns();
    distributed::exchange({Message{0, bytes_of(reading), sizeof reading}}, {});
  }
}

}  // namespace

std::vector<ClockOffset> estimate_clock_offsets(int rounds) {
  if (rounds < 1) {
    throw SpecError(fmt::format(
        "[profiler] estimate_clock_offsets: {} rounds; give at least one round trip", rounds));
  }
  const int me = distributed::process_index(), count = distributed::process_count();
  std::vector<ClockOffset> offsets(static_cast<std::size_t>(count));
  for (int p = 0; p < count; ++p) offsets[static_cast<std::size_t>(p)].process = p;
  if (count == 1) return offsets;
  // Process 0 measures each process in turn; the others wait for their turn in their first
  // receive. A warm-up round trip first (the first messages set up the transport).
  for (int p = 1; p < count; ++p) {
    if (me == 0) {
      (void)measure(p, 1);
      offsets[static_cast<std::size_t>(p)] = measure(p, rounds);
    } else if (me == p) {
      answer();  // the warm-up's
      answer();
    }
  }
  // Process 0 tells every process what it found.
  std::vector<std::int64_t> table;
  if (me == 0) {
    for (const ClockOffset& o : offsets) {
      table.insert(table.end(), {o.offset_ns, o.error_bound_ns, o.round_trip_ns});
    }
  }
  const auto all = distributed::allgather_bytes(std::as_bytes(std::span(table)));
  const std::vector<std::byte>& from0 = all[0];
  if (from0.size() != offsets.size() * 3 * sizeof(std::int64_t)) {
    throw DistributedError("[profiler] estimate_clock_offsets: process 0 sent a table of " +
                           std::to_string(from0.size()) + " bytes");
  }
  for (std::size_t p = 0; p < offsets.size(); ++p) {
    std::int64_t v[3];
    std::memcpy(v, from0.data() + p * sizeof v, sizeof v);
    offsets[p].offset_ns = v[0];
    offsets[p].error_bound_ns = v[1];
    offsets[p].round_trip_ns = v[2];
  }
  return offsets;
}

}  // namespace shardplan::profiler
