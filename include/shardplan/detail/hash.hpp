#pragma once
// The one way the library folds hashes together: boost::hash_combine's formula with the 64-bit
// golden ratio. Every key's hash (attributes' fields, sjit's and the eager cache's keys, reshard
// costs, tree structures, tensor specs) combines its parts with it; equality decides, the hash
// only picks a bucket.

#include <cstddef>

namespace shardplan::detail {

constexpr std::size_t hash_combine(std::size_t seed, std::size_t h) {
  return seed ^ (h + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

}  // namespace shardplan::detail
