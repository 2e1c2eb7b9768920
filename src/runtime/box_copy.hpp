#pragma once
// Copying a box (a hyper-rectangle) between two row-major arrays: the one data movement the
// runtime is made of (device_put, to_host, collectives and reshard).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace shardplan::detail {

/// One row-major array: its base address and dimensions.
struct BoxView {
  const std::byte* data;
  const std::int64_t* dims;
};

/// Copies the box of `extent` starting at `src_origin` in `src` to `dst_origin` in `dst` (both
/// row-major, `rank` dimensions, `elem`-byte elements). Trailing dimensions that both arrays
/// cover in full are merged, so the inner loop is one memcpy per contiguous run.
inline void copy_box(const std::byte* src, const std::int64_t* src_dims,
                     const std::int64_t* src_origin, std::byte* dst, const std::int64_t* dst_dims,
                     const std::int64_t* dst_origin, const std::int64_t* extent, int rank,
                     std::size_t elem) {
  for (int d = 0; d < rank; ++d) {
    if (extent[d] == 0) return;
  }
  if (rank == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  // Strides in bytes.
  std::int64_t src_stride[16];
  std::int64_t dst_stride[16];
  std::vector<std::int64_t> big_src, big_dst;
  std::int64_t* ss = src_stride;
  std::int64_t* ds = dst_stride;
  if (rank > 16) {
    big_src.resize(static_cast<std::size_t>(rank));
    big_dst.resize(static_cast<std::size_t>(rank));
    ss = big_src.data();
    ds = big_dst.data();
  }
  ss[rank - 1] = static_cast<std::int64_t>(elem);
  ds[rank - 1] = static_cast<std::int64_t>(elem);
  for (int d = rank - 1; d > 0; --d) {
    ss[d - 1] = ss[d] * src_dims[d];
    ds[d - 1] = ds[d] * dst_dims[d];
  }
  // The contiguous run: the last dimension, widened over dimensions covered in full.
  int inner = rank - 1;
  std::int64_t run = extent[rank - 1] * static_cast<std::int64_t>(elem);
  while (inner > 0 && extent[inner] == src_dims[inner] && extent[inner] == dst_dims[inner]) {
    --inner;
    run *= extent[inner];
  }
  const std::byte* s0 = src;
  std::byte* d0 = dst;
  for (int d = 0; d < rank; ++d) {
    s0 += src_origin[d] * ss[d];
    d0 += dst_origin[d] * ds[d];
  }
  if (inner == 0) {
    std::memcpy(d0, s0, static_cast<std::size_t>(run));
    return;
  }
  // Odometer over dimensions [0, inner).
  std::vector<std::int64_t> idx(static_cast<std::size_t>(inner), 0);
  while (true) {
    const std::byte* s = s0;
    std::byte* t = d0;
    for (int d = 0; d < inner; ++d) {
      s += idx[static_cast<std::size_t>(d)] * ss[d];
      t += idx[static_cast<std::size_t>(d)] * ds[d];
    }
    std::memcpy(t, s, static_cast<std::size_t>(run));
    int d = inner - 1;
    while (d >= 0 && ++idx[static_cast<std::size_t>(d)] == extent[d]) {
      idx[static_cast<std::size_t>(d)] = 0;
      --d;
    }
    if (d < 0) break;
  }
}

}  // namespace shardplan::detail
