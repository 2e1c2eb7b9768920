#pragma once
// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), run over a
// sequence of allocations and frees: what it reserves from the device (segments), beside what is
// allocated. Its constants and rules are PyTorch's, nothing fitted; docs/training.md, "Reserved
// bytes: the caching allocator model", gives each rule with its source. Private to the library.

#include <cstdint>
#include <vector>

namespace shardplan::detail {

/// PyTorch's constants (CUDACachingAllocator.cpp).
inline constexpr std::int64_t kAllocMinBlockSize = 512;          // every size rounded to it
inline constexpr std::int64_t kAllocSmallSize = 1 << 20;         // largest "small" request
inline constexpr std::int64_t kAllocSmallBuffer = 2 << 20;       // small requests' segments
inline constexpr std::int64_t kAllocLargeBuffer = 20 << 20;      // segment of a 1-10 MiB request
inline constexpr std::int64_t kAllocMinLargeAlloc = 10 << 20;    // from here: its own segment
inline constexpr std::int64_t kAllocRoundLarge = 2 << 20;        // a large segment's rounding

/// The stream an allocation is made on: a freed block serves later requests of its stream only.
/// FSDP2 makes its all-gather buffers on its all-gather stream and its reduce-scatter buffers on
/// its reduce-scatter stream.
enum class AllocStream : std::uint8_t { kDefault, kAllGather, kReduceScatter };

/// One allocation (`bytes` > 0, by `id`, on `stream`) or the free of an earlier one by id.
struct AllocEvent {
  enum class Kind : std::uint8_t { kAllocate, kFree };
  Kind kind = Kind::kAllocate;
  std::int64_t id = 0;
  std::int64_t bytes = 0;
  AllocStream stream = AllocStream::kDefault;
  friend bool operator==(const AllocEvent&, const AllocEvent&) = default;
};

struct CachingAllocatorOptions {
  /// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: one segment per stream and pool that
  /// grows by pages (20 MiB large, 2 MiB small) instead of a segment per cudaMalloc.
  bool expandable_segments = false;
  /// The device's bytes (0: none): a segment that would pass it frees the cached segments that
  /// hold no allocation and retries, as PyTorch does on a failed cudaMalloc.
  std::int64_t capacity = 0;
};

struct CachingAllocatorResult {
  std::int64_t reserved_peak = 0;   // reserved_bytes.all.peak: the segments' bytes
  std::int64_t allocated_peak = 0;  // allocated_bytes.all.peak: the blocks' (rounded) bytes
  std::int64_t requested_peak = 0;  // requested_bytes.all.peak: the bytes asked for
  std::int64_t segments_peak = 0;   // the most segments held at once
  std::int64_t retries = 0;         // cached segments freed to stay within `capacity`
  bool out_of_memory = false;       // a request passed `capacity` even after the retry
  friend bool operator==(const CachingAllocatorResult&, const CachingAllocatorResult&) = default;
};

/// The size a request is served with: at least 512 B, a multiple of 512 B.
std::int64_t allocator_round_size(std::int64_t bytes);
/// The bytes of the segment cudaMalloc'd for a rounded request no cached block serves: 2 MiB
/// for a small one, 20 MiB below 10 MiB, else rounded up to 2 MiB.
std::int64_t allocator_segment_size(std::int64_t rounded);

/// Runs `events` through the allocator. Throws Error on an id allocated twice or freed unknown.
CachingAllocatorResult simulate_caching_allocator(const std::vector<AllocEvent>& events,
                                                  const CachingAllocatorOptions& options = {});

}  // namespace shardplan::detail
