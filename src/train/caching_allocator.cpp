#include "caching_allocator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>
#include <tuple>
#include <unordered_map>

#include "shardplan/error.hpp"

namespace shardplan::detail {

std::int64_t allocator_round_size(std::int64_t bytes) {
  if (bytes < kAllocMinBlockSize) return kAllocMinBlockSize;
  return kAllocMinBlockSize * ((bytes + kAllocMinBlockSize - 1) / kAllocMinBlockSize);
}

std::int64_t allocator_segment_size(std::int64_t rounded) {
  if (rounded <= kAllocSmallSize) return kAllocSmallBuffer;
  if (rounded < kAllocMinLargeAlloc) return kAllocLargeBuffer;
  return kAllocRoundLarge * ((rounded + kAllocRoundLarge - 1) / kAllocRoundLarge);
}

namespace {

/// A block of a segment: allocated or cached, linked to its neighbours in the segment.
struct Block {
  std::int64_t addr = 0, size = 0, requested = 0;
  int prev = -1, next = -1;
  int pool = 0;  // stream * 2 + small
  bool allocated = false;
};

/// An expandable segment (one per stream and pool): pages mapped from `base` up to `mapped`,
/// `last` the block that ends there (-1: none yet).
struct Arena {
  bool exists = false;
  std::int64_t base = 0, mapped = 0;
  int last = -1;
};

class Simulator {
 public:
  explicit Simulator(const CachingAllocatorOptions& o) : o_(o) {}

  void allocate(std::int64_t id, std::int64_t bytes, AllocStream stream);
  void free(std::int64_t id);
  const CachingAllocatorResult& result() const { return r_; }

 private:
  // The cached blocks, best fit first: by pool, size, then address (as PyTorch's
  // BlockComparatorSize: stream, size, pointer).
  using Key = std::tuple<int, std::int64_t, std::int64_t, int>;
  Key key(int b) const { return {blocks_[b].pool, blocks_[b].size, blocks_[b].addr, b}; }
  int new_block(const Block& b);
  void drop_block(int b) { unused_.push_back(b); }
  int find_cached(int pool, std::int64_t size) const;
  int new_segment(int pool, std::int64_t size);
  int expand(int pool, std::int64_t size);
  bool fits(std::int64_t more) const { return o_.capacity == 0 || reserved_ + more <= o_.capacity; }
  void release_cached();
  void grow_reserved(std::int64_t bytes);
  bool tail(int b) const { return o_.expandable_segments && arenas_[blocks_[b].pool].last == b; }
  void merge_into(int dst, int src);

  CachingAllocatorOptions o_;
  CachingAllocatorResult r_;
  std::vector<Block> blocks_;
  std::vector<int> unused_;
  std::set<Key> cached_;
  std::unordered_map<std::int64_t, int> live_;
  std::array<Arena, 6> arenas_{};
  std::int64_t reserved_ = 0, allocated_ = 0, requested_ = 0, segments_ = 0;
  std::int64_t next_addr_ = 0;
};

int Simulator::new_block(const Block& b) {
  if (!unused_.empty()) {
    const int i = unused_.back();
    unused_.pop_back();
    blocks_[static_cast<std::size_t>(i)] = b;
    return i;
  }
  blocks_.push_back(b);
  return static_cast<int>(blocks_.size() - 1);
}

// PyTorch's get_free_block: the smallest cached block of the pool that holds `size`. In an
// expandable segment the block at its end counts as large as it can grow, so it serves only
// when no other block does.
int Simulator::find_cached(int pool, std::int64_t size) const {
  auto it = cached_.lower_bound(Key{pool, size, INT64_MIN, -1});
  if (it == cached_.end() || std::get<0>(*it) != pool) return -1;
  const int b = std::get<3>(*it);
  if (tail(b)) {
    const auto next = std::next(it);
    if (next != cached_.end() && std::get<0>(*next) == pool) return std::get<3>(*next);
  }
  return b;
}

void Simulator::grow_reserved(std::int64_t bytes) {
  if (!fits(bytes)) {
    // A failed cudaMalloc: free the cached segments that hold nothing, retry (PyTorch's
    // release_cached_blocks); still too large is an out-of-memory error.
    ++r_.retries;
    release_cached();
    if (!fits(bytes)) r_.out_of_memory = true;
  }
  reserved_ += bytes;
  r_.reserved_peak = std::max(r_.reserved_peak, reserved_);
}

void Simulator::release_cached() {
  std::vector<int> whole;
  for (const Key& k : cached_) {
    const int b = std::get<3>(k);
    const Block& x = blocks_[static_cast<std::size_t>(b)];
    if (!o_.expandable_segments && x.prev < 0 && x.next < 0) whole.push_back(b);
    if (tail(b)) whole.push_back(b);
  }
  for (const int b : whole) {
    Block& x = blocks_[static_cast<std::size_t>(b)];
    cached_.erase(key(b));
    if (!o_.expandable_segments) {
      reserved_ -= x.size;
      --segments_;
      drop_block(b);
      continue;
    }
    // Unmap the whole pages at the segment's end that the free block covers.
    Arena& a = arenas_[static_cast<std::size_t>(x.pool)];
    const std::int64_t page = x.pool % 2 == 1 ? kAllocSmallBuffer : kAllocLargeBuffer;
    const std::int64_t start = a.base + (x.addr - a.base + page - 1) / page * page;
    const std::int64_t unmapped = a.base + a.mapped - start;
    a.mapped -= unmapped;
    reserved_ -= unmapped;
    x.size -= unmapped;
    if (x.size > 0) {
      cached_.insert(key(b));
    } else {
      a.last = x.prev;
      if (x.prev >= 0) blocks_[static_cast<std::size_t>(x.prev)].next = -1;
      drop_block(b);
    }
  }
}

int Simulator::new_segment(int pool, std::int64_t size) {
  const std::int64_t bytes = allocator_segment_size(size);
  grow_reserved(bytes);
  r_.segments_peak = std::max(r_.segments_peak, ++segments_);
  const int b = new_block(Block{.addr = next_addr_, .size = bytes, .pool = pool});
  next_addr_ += bytes + kAllocLargeBuffer;  // segments are never neighbours
  return b;
}

// PyTorch's try_allocate_expandable_block: map pages at the segment's end, joined to the free
// block there, until `size` fits.
int Simulator::expand(int pool, std::int64_t size) {
  Arena& a = arenas_[static_cast<std::size_t>(pool)];
  if (!a.exists) {
    a.exists = true;
    a.base = next_addr_;
    next_addr_ += std::int64_t{1} << 50;  // the address space reserved for the segment
    r_.segments_peak = std::max(r_.segments_peak, ++segments_);
  }
  const std::int64_t page = pool % 2 == 1 ? kAllocSmallBuffer : kAllocLargeBuffer;
  const bool free_tail = a.last >= 0 && !blocks_[static_cast<std::size_t>(a.last)].allocated;
  const std::int64_t have = free_tail ? blocks_[static_cast<std::size_t>(a.last)].size : 0;
  const std::int64_t more = (size - have + page - 1) / page * page;
  grow_reserved(more);
  // The retry may have unmapped the free tail: look again.
  const bool still_free = a.last >= 0 && !blocks_[static_cast<std::size_t>(a.last)].allocated;
  int b = -1;
  if (still_free) {
    b = a.last;
    cached_.erase(key(b));
    blocks_[static_cast<std::size_t>(b)].size += more;  // it ends where the new pages begin
  } else {
    b = new_block(Block{.addr = a.base + a.mapped, .size = more, .prev = a.last, .pool = pool});
    if (a.last >= 0) blocks_[static_cast<std::size_t>(a.last)].next = b;
    a.last = b;
  }
  a.mapped += more;
  return b;
}

void Simulator::allocate(std::int64_t id, std::int64_t bytes, AllocStream stream) {
  if (live_.count(id) != 0) {
    throw Error(fmt::format("[allocator] allocation {} is made twice", id));
  }
  if (bytes <= 0) {  // PyTorch hands out no block for 0 bytes
    live_[id] = -1;
    return;
  }
  const std::int64_t size = allocator_round_size(bytes);
  const bool small = size <= kAllocSmallSize;
  const int pool = static_cast<int>(stream) * 2 + (small ? 1 : 0);
  int b = find_cached(pool, size);
  if (b >= 0) {
    cached_.erase(key(b));
  } else {
    b = o_.expandable_segments ? expand(pool, size) : new_segment(pool, size);
  }
  // should_split: a small pool's (or an expandable segment's) remainder of 512 B or more, a
  // large pool's of more than 1 MiB.
  const std::int64_t remaining = blocks_[static_cast<std::size_t>(b)].size - size;
  const bool split = small || o_.expandable_segments ? remaining >= kAllocMinBlockSize
                                                     : remaining > kAllocSmallSize;
  if (split) {
    Block& rest = blocks_[static_cast<std::size_t>(b)];
    const int front = new_block(Block{.addr = rest.addr, .size = size, .prev = rest.prev,
                                      .next = b, .pool = pool});
    Block& r = blocks_[static_cast<std::size_t>(b)];  // new_block may have moved it
    if (r.prev >= 0) blocks_[static_cast<std::size_t>(r.prev)].next = front;
    r.prev = front;
    r.addr += size;
    r.size -= size;
    cached_.insert(key(b));
    b = front;
  }
  Block& x = blocks_[static_cast<std::size_t>(b)];
  x.allocated = true;
  x.requested = bytes;
  live_[id] = b;
  allocated_ += x.size;
  requested_ += bytes;
  r_.allocated_peak = std::max(r_.allocated_peak, allocated_);
  r_.requested_peak = std::max(r_.requested_peak, requested_);
}

// try_merge_blocks: `src`, a free neighbour of `dst`, joins it.
void Simulator::merge_into(int dst, int src) {
  Block& d = blocks_[static_cast<std::size_t>(dst)];
  const Block s = blocks_[static_cast<std::size_t>(src)];
  cached_.erase(key(src));
  if (d.prev == src) {
    d.addr = s.addr;
    d.prev = s.prev;
    if (s.prev >= 0) blocks_[static_cast<std::size_t>(s.prev)].next = dst;
  } else {
    d.next = s.next;
    if (s.next >= 0) blocks_[static_cast<std::size_t>(s.next)].prev = dst;
    if (o_.expandable_segments && arenas_[static_cast<std::size_t>(s.pool)].last == src) {
      arenas_[static_cast<std::size_t>(s.pool)].last = dst;
    }
  }
  d.size += s.size;
  drop_block(src);
}

void Simulator::free(std::int64_t id) {
  const auto it = live_.find(id);
  if (it == live_.end()) throw Error(fmt::format("[allocator] free of {}, not allocated", id));
  const int b = it->second;
  live_.erase(it);
  if (b < 0) return;
  Block& x = blocks_[static_cast<std::size_t>(b)];
  x.allocated = false;
  allocated_ -= x.size;
  requested_ -= x.requested;
  for (const int n : {x.prev, x.next}) {
    if (n >= 0 && !blocks_[static_cast<std::size_t>(n)].allocated) merge_into(b, n);
  }
  cached_.insert(key(b));
}

}  // namespace

CachingAllocatorResult simulate_caching_allocator(const std::vector<AllocEvent>& events,
                                                  const CachingAllocatorOptions& options) {
  Simulator sim(options);
  for (const AllocEvent& e : events) {
    if (e.kind == AllocEvent::Kind::kAllocate) {
      sim.allocate(e.id, e.bytes, e.stream);
    } else {
      sim.free(e.id);
    }
  }
  return sim.result();
}

}  // namespace shardplan::detail
