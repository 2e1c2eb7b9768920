#pragma once
// Copying a box (a hyper-rectangle) between two row-major arrays: the one data movement the
// runtime is made of (device_put, to_host, collectives and reshard).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace shardplan::detail {

/// Calls f(src_offset, dst_offset, run_bytes) for each contiguous run of the box of `extent`
/// starting at `src_origin` in an array of `src_dims` and at `dst_origin` in one of `dst_dims`
/// (row-major, `rank` dimensions, `elem`-byte elements). Trailing dimensions both arrays cover in
/// full are merged into one run.
template <class F>
void for_each_run(const std::int64_t* src_dims, const std::int64_t* src_origin,
                  const std::int64_t* dst_dims, const std::int64_t* dst_origin,
                  const std::int64_t* extent, int rank, std::size_t elem, F&& f) {
  for (int d = 0; d < rank; ++d) {
    if (extent[d] == 0) return;
  }
  if (rank == 0) {
    f(std::int64_t{0}, std::int64_t{0}, static_cast<std::int64_t>(elem));
    return;
  }
  std::vector<std::int64_t> ss(static_cast<std::size_t>(rank));
  std::vector<std::int64_t> ds(static_cast<std::size_t>(rank));
  ss[static_cast<std::size_t>(rank - 1)] = static_cast<std::int64_t>(elem);
  ds[static_cast<std::size_t>(rank - 1)] = static_cast<std::int64_t>(elem);
  for (int d = rank - 1; d > 0; --d) {
    ss[static_cast<std::size_t>(d - 1)] = ss[static_cast<std::size_t>(d)] * src_dims[d];
    ds[static_cast<std::size_t>(d - 1)] = ds[static_cast<std::size_t>(d)] * dst_dims[d];
  }
  // The contiguous run: the last dimension, widened over dimensions covered in full.
  int inner = rank - 1;
  std::int64_t run = extent[rank - 1] * static_cast<std::int64_t>(elem);
  while (inner > 0 && extent[inner] == src_dims[inner] && extent[inner] == dst_dims[inner]) {
    --inner;
    run *= extent[inner];
  }
  std::int64_t s0 = 0;
  std::int64_t d0 = 0;
  for (int d = 0; d < rank; ++d) {
    s0 += src_origin[d] * ss[static_cast<std::size_t>(d)];
    d0 += dst_origin[d] * ds[static_cast<std::size_t>(d)];
  }
  if (inner == 0) {
    f(s0, d0, run);
    return;
  }
  // Odometer over dimensions [0, inner).
  std::vector<std::int64_t> idx(static_cast<std::size_t>(inner), 0);
  while (true) {
    std::int64_t s = s0;
    std::int64_t t = d0;
    for (int d = 0; d < inner; ++d) {
      s += idx[static_cast<std::size_t>(d)] * ss[static_cast<std::size_t>(d)];
      t += idx[static_cast<std::size_t>(d)] * ds[static_cast<std::size_t>(d)];
    }
    f(s, t, run);
    int d = inner - 1;
    while (d >= 0 && ++idx[static_cast<std::size_t>(d)] == extent[d]) {
      idx[static_cast<std::size_t>(d)] = 0;
      --d;
    }
    if (d < 0) break;
  }
}

/// Copies the box of `extent` at `src_origin` in `src` to `dst_origin` in `dst`.
inline void copy_box(const std::byte* src, const std::int64_t* src_dims,
                     const std::int64_t* src_origin, std::byte* dst, const std::int64_t* dst_dims,
                     const std::int64_t* dst_origin, const std::int64_t* extent, int rank,
                     std::size_t elem) {
  for_each_run(src_dims, src_origin, dst_dims, dst_origin, extent, rank, elem,
               [&](std::int64_t s, std::int64_t d, std::int64_t n) {
                 std::memcpy(dst + d, src + s, static_cast<std::size_t>(n));
               });
}

}  // namespace shardplan::detail
