// The caching allocator model against sequences worked by hand from PyTorch's rules
// (c10/cuda/CUDACachingAllocator.cpp; docs/training.md, "Reserved bytes"), and over a compiled
// program's steps (reserved_bytes, allocation_events.hpp).
#include "caching_allocator.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "allocation_events.hpp"
#include "shardplan/error.hpp"
#include "shardplan/ops.hpp"
#include "shardplan/sjit.hpp"
#include "test_util.hpp"

namespace shardplan::detail {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

AllocEvent alloc(std::int64_t id, std::int64_t bytes, AllocStream s = AllocStream::kDefault) {
  return {AllocEvent::Kind::kAllocate, id, bytes, s};
}
AllocEvent release(std::int64_t id) { return {AllocEvent::Kind::kFree, id, 0, {}}; }

CachingAllocatorResult run(const std::vector<AllocEvent>& e, CachingAllocatorOptions o = {}) {
  return simulate_caching_allocator(e, o);
}

TEST(CachingAllocator, RoundsToMultiplesOf512Bytes) {
  EXPECT_EQ(allocator_round_size(1), 512);
  EXPECT_EQ(allocator_round_size(512), 512);
  EXPECT_EQ(allocator_round_size(513), 1024);
  const CachingAllocatorResult r = run({alloc(1, 1), alloc(2, 1000)});
  EXPECT_EQ(r.requested_peak, 1001);
  EXPECT_EQ(r.allocated_peak, 512 + 1024);
  EXPECT_EQ(r.reserved_peak, 2 * kMiB);  // both in one small segment
  EXPECT_EQ(r.segments_peak, 1);
}

TEST(CachingAllocator, SegmentSizes) {
  EXPECT_EQ(allocator_segment_size(kMiB), 2 * kMiB);
  EXPECT_EQ(allocator_segment_size(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(allocator_segment_size(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(allocator_segment_size(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(allocator_segment_size(11 * kMiB + 512), 12 * kMiB);
}

TEST(CachingAllocator, A3MiBRequestReserves20MiBThatServesTheNextOnes) {
  // 3 MiB: a 20 MiB segment, split (17 MiB left); the next 3 MiB and 9 MiB come from it.
  const CachingAllocatorResult r = run({alloc(1, 3 * kMiB), alloc(2, 3 * kMiB), alloc(3, 9 * kMiB)});
  EXPECT_EQ(r.reserved_peak, 20 * kMiB);
  EXPECT_EQ(r.allocated_peak, 15 * kMiB);
  EXPECT_EQ(r.segments_peak, 1);
}

TEST(CachingAllocator, LargeBlocksSplitOnlyForARemainderOverOneMiB) {
  // A cached 12 MiB segment: 11 MiB leaves exactly 1 MiB, not split (the block is allocated
  // whole); 10.5 MiB leaves 1.5 MiB, split.
  const auto second = [](std::int64_t bytes) {
    return run({alloc(1, 12 * kMiB), release(1), alloc(2, bytes), alloc(3, kMiB + 512)});
  };
  const CachingAllocatorResult whole = second(11 * kMiB);
  EXPECT_EQ(whole.allocated_peak, 12 * kMiB + kMiB + 512);
  EXPECT_EQ(whole.reserved_peak, 32 * kMiB);  // the 1 MiB + 512 request needs a new segment
  const CachingAllocatorResult split = second(10 * kMiB + kMiB / 2);
  EXPECT_EQ(split.reserved_peak, 12 * kMiB);  // its remainder holds the 1 MiB + 512 request
  EXPECT_EQ(split.allocated_peak, 12 * kMiB);
}

TEST(CachingAllocator, SmallBlocksSplitForARemainderOf512Bytes) {
  const CachingAllocatorResult r =
      run({alloc(1, kMiB - 512), alloc(2, kMiB), alloc(3, 512), alloc(4, 1)});
  // 2 MiB = (1 MiB - 512) + 1 MiB + 512: the third fills the segment, the fourth takes another.
  EXPECT_EQ(r.reserved_peak, 4 * kMiB);
  EXPECT_EQ(r.segments_peak, 2);
}

TEST(CachingAllocator, FreeNeighboursCoalesce) {
  // One 20 MiB segment holds 3 + 3 + 9 + 5 MiB. Freed, the two 3 MiB blocks join: 5 MiB fits.
  std::vector<AllocEvent> e{alloc(1, 3 * kMiB), alloc(2, 3 * kMiB), alloc(3, 9 * kMiB),
                            alloc(4, 5 * kMiB), release(1),         release(2)};
  e.push_back(alloc(5, 5 * kMiB));
  const CachingAllocatorResult r = run(e);
  EXPECT_EQ(r.reserved_peak, 20 * kMiB);
  EXPECT_EQ(r.segments_peak, 1);
  // Freeing only the first leaves a 3 MiB hole: 5 MiB takes a new segment.
  const CachingAllocatorResult apart =
      run({alloc(1, 3 * kMiB), alloc(2, 3 * kMiB), alloc(3, 9 * kMiB), alloc(4, 5 * kMiB),
           release(1), alloc(5, 5 * kMiB)});
  EXPECT_EQ(apart.reserved_peak, 40 * kMiB);
}

TEST(CachingAllocator, AFreedBlockServesItsOwnStreamOnly) {
  const CachingAllocatorResult same = run({alloc(1, 12 * kMiB), release(1), alloc(2, 12 * kMiB)});
  EXPECT_EQ(same.reserved_peak, 12 * kMiB);
  const CachingAllocatorResult other =
      run({alloc(1, 12 * kMiB), release(1), alloc(2, 12 * kMiB, AllocStream::kAllGather)});
  EXPECT_EQ(other.reserved_peak, 24 * kMiB);
  EXPECT_EQ(other.segments_peak, 2);
}

TEST(CachingAllocator, AtTheCapacityCachedWholeSegmentsAreFreedAndTheRequestRetried) {
  CachingAllocatorOptions o;
  o.capacity = 40 * kMiB;
  const CachingAllocatorResult r = run({alloc(1, 12 * kMiB), release(1), alloc(2, 30 * kMiB)}, o);
  EXPECT_EQ(r.reserved_peak, 30 * kMiB);  // 12 MiB released, then 30 MiB
  EXPECT_EQ(r.retries, 1);
  EXPECT_FALSE(r.out_of_memory);
  EXPECT_EQ(run({alloc(1, 12 * kMiB), release(1), alloc(2, 30 * kMiB)}).reserved_peak,
            42 * kMiB);  // no capacity: kept
  // A segment still holding an allocation is not released: out of memory.
  const CachingAllocatorResult split =
      run({alloc(1, 3 * kMiB), alloc(2, 3 * kMiB), release(1), alloc(3, 30 * kMiB)}, o);
  EXPECT_EQ(split.retries, 1);
  EXPECT_TRUE(split.out_of_memory);
}

TEST(CachingAllocator, ExpandableSegmentsGrowByPages) {
  CachingAllocatorOptions o;
  o.expandable_segments = true;
  // 3 MiB maps one 20 MiB page; 25 MiB needs 8 MiB past the free 17: one more page.
  const std::vector<AllocEvent> e{alloc(1, 3 * kMiB), alloc(2, 25 * kMiB), release(1),
                                  alloc(3, 2 * kMiB)};
  const CachingAllocatorResult r = run(e, o);
  EXPECT_EQ(r.reserved_peak, 40 * kMiB);  // the 2 MiB request reuses the freed 3 MiB
  EXPECT_EQ(r.segments_peak, 1);
  // Without: a 20 MiB segment, then 26 MiB (25 rounded up to 2 MiB).
  EXPECT_EQ(run(e).reserved_peak, 46 * kMiB);
}

TEST(CachingAllocator, ExpandableSegmentPrefersAnyOtherFreeBlockToItsEnd) {
  CachingAllocatorOptions o;
  o.expandable_segments = true;
  // Blocks 4 | 2 | 4 MiB, the middle one freed; the end holds 10 MiB free. 2 MiB takes the
  // hole; then 11 MiB needs one more page at the end (10 + 20 free there).
  const CachingAllocatorResult r =
      run({alloc(1, 4 * kMiB), alloc(2, 2 * kMiB), alloc(3, 4 * kMiB), release(2),
           alloc(4, 2 * kMiB), alloc(5, 11 * kMiB)},
          o);
  EXPECT_EQ(r.reserved_peak, 40 * kMiB);
  EXPECT_EQ(r.allocated_peak, 21 * kMiB);
}

TEST(CachingAllocator, ZeroBytesHoldNothing) {
  const CachingAllocatorResult r = run({alloc(1, 0), release(1)});
  EXPECT_EQ(r.reserved_peak, 0);
}

TEST(CachingAllocator, BadSequencesAreErrors) {
  EXPECT_THROW_WITH(run({alloc(1, 8), alloc(1, 8)}), Error, "allocation 1 is made twice");
  EXPECT_THROW_WITH(run({release(7)}), Error, "free of 7, not allocated");
}

// reserved_bytes: the caching allocator model over a compiled program's steps as FSDP2 runs them
// (docs/training.md, "Reserved bytes"). w [1536, 2048] f32 arrives split over data:4 (3 MiB a
// device), is gathered whole (12 MiB) and added to itself (12 MiB). By hand, a segment per
// cudaMalloc: the shard takes a 20 MiB segment (17 MiB left); the gather stages 12 MiB on the
// all-gather stream (a 12 MiB segment) and the gathered weight takes 12 of the 17 MiB; the sum
// needs a new 12 MiB segment: 44 MiB. Expandable: one 20 MiB page for the shard, one on the
// all-gather stream, the gathered weight in the first page's free 17 MiB, then the sum past the
// 5 MiB left: one more page: 60 MiB.
TEST(ReservedBytes, AGatheredWeightAndASumByHand) {
  const Mesh mesh = Mesh::parse("data:4", 4);
  auto f = sjit(
      mesh,
      [](const Array& w) {
        const Array g = with_sharding_constraint(w, P());
        return g + g;
      },
      SjitOptions{.in_shardings = RuleTree::list({RuleTree(P("data"))})});
  const Lowered low = f.lower(TensorSpec{Shape{1536, 2048}, DType::kF32});
  const ProgramCost& c = low.cost();
  ASSERT_EQ(c.timeline.live_bytes.size(), 2u);  // the gather, the sum
  EXPECT_EQ(c.peak_bytes[0], 27 * kMiB);
  const ReservedBytes r = reserved_bytes(program_of(low));
  EXPECT_EQ(r.segments, 44 * kMiB);
  EXPECT_EQ(r.expandable, 60 * kMiB);
}

}  // namespace
}  // namespace shardplan::detail
